"""The layers, enforced: app -> engine -> models, with the errors/paths leaf at the bottom.

* models imports no engine or app module (read from the source: every import statement, the ones
  inside functions too);
* engine imports no app module and never Textual;
* the errors/paths leaf loads nothing native, so raising LocalspecError costs no llama.cpp;
* the chat UI process (the TUI, history, settings, paths, the engine process's parent side and the
  command line's parser) imports no llama_cpp, torch or numpy, seen by `python -X importtime`;
* a process that runs a model loads llama.cpp's libraries before numpy and torch (engine/native.py).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = {"llama_cpp", "torch", "numpy"}

UI_MODULES = sorted({f"localspec.app.tui.{p.stem}" for p in (ROOT / "app" / "tui").glob("*.py")}
                    | {"localspec.app.history", "localspec.app.settings", "localspec.app.paths",
                       "localspec.app.engine_proc", "localspec.models.library"})   # the first-run screen's


def imported_names(folder: str) -> list[tuple[str, str]]:
    """(file, module) for every import statement under `folder`, relative ones resolved."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        package = ["localspec", *path.relative_to(ROOT).parent.parts]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                module = ".".join(part for part in (base, node.module) if part)
                names = [f"{module}.{alias.name}" for alias in node.names] if node.module is None else [module]
                found += [(str(path.relative_to(ROOT)), name) for name in names]
    return found


def test_the_import_reader_sees_relative_and_local_imports():
    names = {name for file, name in imported_names("engine") if file == "engine/calibrate.py"}
    assert {"localspec.engine.native", "localspec.engine.llama_model", "localspec.models.paths"} <= names


def test_models_imports_no_engine_or_app_module():
    wrong = [(f, m) for f, m in imported_names("models") if m.startswith(("localspec.engine", "localspec.app"))]
    assert wrong == []


def test_engine_imports_no_app_module_and_never_textual():
    wrong = [(f, m) for f, m in imported_names("engine")
             if m.startswith("localspec.app") or m.split(".")[0] == "textual"]
    assert wrong == []


def importtime(code: str, *args: str) -> list[str]:
    """The modules a fresh interpreter imports running `code` (or `-m ...` with args), in the
    order their imports finished, from `python -X importtime`."""
    run = subprocess.run([sys.executable, "-X", "importtime", *(["-c", code] if code else []), *args],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[1].strip() for line in lines[1:]]   # the first line is the header


def top_level(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_the_errors_and_paths_leaf_loads_nothing_native():
    modules = importtime("import localspec.models.errors, localspec.models.paths, localspec.engine.errors\n"
                         "from localspec.engine.errors import LocalspecError")
    assert "localspec.models.errors" in modules
    assert not top_level(modules) & (NATIVE | {"gguf", "textual"})


def test_the_chat_ui_process_imports_no_llama_cpp_torch_or_numpy():
    code = "\n".join(f"import {m}" for m in UI_MODULES)
    code += "\nfrom localspec.app.cli import build_parser\nbuild_parser().parse_args(['chat'])"
    modules = importtime(code)
    assert set(UI_MODULES) <= set(modules) and "textual" in top_level(modules)
    assert not top_level(modules) & NATIVE


def first_native(modules: list[str]) -> str:
    """Which of llama.cpp's libraries (llama_cpp.llama_cpp loads them), numpy and torch a process
    finished importing first."""
    return next(m for m in modules if m in ("llama_cpp.llama_cpp", "numpy", "torch"))


@pytest.mark.parametrize("code", ["from localspec.engine.session import Session",
                                  "import localspec.app.engine_main",
                                  "from localspec.engine.llama_model import LlamaModel",
                                  "import localspec.engine.calibrate"])
def test_modules_that_run_models_load_llama_cpp_before_numpy(code):
    assert first_native(importtime(code)) == "llama_cpp.llama_cpp"


def test_generate_loads_llama_cpp_before_numpy(tiny):
    modules = importtime("", "-m", "localspec.app.cli", "generate", "--model", str(tiny.target_gguf),
                         "--no-speculation", "--max-tokens", "1", "--raw", "def")
    assert first_native(modules) == "llama_cpp.llama_cpp"
