"""The newcode workload is held out: none of its specs is a HumanEval problem or shares a line with one."""
import ast

from localspec.app.newcode import PROMPTS
from localspec.app.workloads import build, humaneval_problems


def test_newcode_specs_are_distinct_python_and_in_no_humaneval_problem():
    names = [name for name, _ in PROMPTS]
    assert len(set(names)) == len(names) == 24
    problems = humaneval_problems()
    he_lines = {line.strip() for p in problems for line in (p["prompt"] + p["canonical_solution"]).splitlines()
                if len(line.strip()) > 20}
    he_entry_points = {p["entry_point"] for p in problems}
    for name, text in PROMPTS:
        # a spec is a valid start of Python: a signature and docstring, completed by the model
        body = "        pass\n" if text.rstrip().endswith(":") else "    pass\n"   # a class's method, or a function
        tree = ast.parse(text + body)
        defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert defined and not defined & he_entry_points, name
        shared = [line for line in text.splitlines() if line.strip() in he_lines]
        assert not shared, (name, shared)


def test_newcode_workload_builds_raw_prompts_with_a_limit():
    seen = []
    prompts = build("newcode", 5, lambda text: seen.append(text) or [len(text), 1], lambda m: [0])
    assert [p.name for p in prompts] == [name for name, _ in PROMPTS[:5]]
    assert seen == [text for _, text in PROMPTS[:5]]
    assert all(p.problem is None and len(p.tokens) == 2 for p in prompts)
