"""Model paths given on the command line: an existing file (or a transformers folder for a draft)."""
from __future__ import annotations

from pathlib import Path

from localspec.engine.errors import LocalspecError


def model_path(value: str, what: str) -> Path:
    path = Path(value).expanduser()
    if path.exists():
        return path
    raise LocalspecError(f"{what} not found", f"'{value}' is not an existing file or folder",
                         "Pass the path of a .gguf file (a transformers folder for a PyTorch "
                         "draft); named models arrive with `localspec pull`")
