"""Stage kinds (engine/drafters/stage.py): what stages need adds up as the target must open, and
the builder names no drafter: every stage goes through its kind's hooks."""
from __future__ import annotations

import ast
from pathlib import Path

from localspec.engine.drafters import registry
from localspec.engine.drafters.stage import Needs, StageKind


def test_needs_add_up_as_the_target_opens():
    head = Needs(hidden=True, taps=(2, 1), tail=16, runtime="torch")
    both = registry.needs_of([Needs(), head, Needs(runtime="transformers")])
    assert both == Needs(hidden=True, taps=(2, 1), tail=16, runtime="transformers")   # taps in the head's order
    assert registry.needs_of([]) == Needs() and registry.needs_of([Needs(), head]) == head


def test_every_stage_name_has_a_kind_and_the_builder_names_none():
    assert all(isinstance(kind, StageKind) for kind in registry.DRAFTERS.values())
    source = Path(registry.__file__).parents[1] / "build.py"
    tree = ast.parse(source.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    literals = {node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}
    assert not literals & set(registry.DRAFTERS), literals & set(registry.DRAFTERS)
