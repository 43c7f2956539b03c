"""The scripts under dev/ as modules, for the tests of their logic (dev/ is not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DEV = Path(__file__).resolve().parents[1] / "dev"


def load(name: str) -> ModuleType:
    """dev/NAME.py, imported once as the module NAME."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DEV / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module     # dataclasses look their module up while a class is made
    spec.loader.exec_module(module)
    return module
