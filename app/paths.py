"""Model paths given on the command line: an existing file (or a transformers folder for a draft),
or the name of an installed model."""
from __future__ import annotations

import os
from pathlib import Path

from localspec.engine.errors import LocalspecError


def model_path(value: str, what: str) -> Path:
    path = Path(value).expanduser()
    if path.exists():
        return path
    raise LocalspecError(f"{what} not found", f"'{value}' is not an existing file or folder",
                         "Pass the path of a .gguf file (a transformers folder for a PyTorch "
                         "draft); named models arrive with `localspec pull`")


def head_path(head: str | None) -> Path | None:
    """A --head argument as a path (checked when the engine loads it)."""
    return Path(head).expanduser() if head else None


def resolve_models(model: str, draft: str | None) -> tuple[Path, Path | None]:
    """--model / --draft as given: an existing path is used as before; otherwise --model may be an
    installed model's name (localspec import / pull), whose registered draft is used unless --draft
    is given."""
    if Path(model).expanduser().exists() or not looks_like_name(model):
        return model_path(model, "Model"), (model_path(draft, "Draft model") if draft else None)
    from localspec.models import library

    entry = library.get_model(model)
    if entry is None:
        raise library.not_installed(model)
    files = [entry.target] + ([entry.draft] if entry.draft and not draft else [])
    for path in (p for f in files for p in f.files):
        if not path.is_file():
            raise LocalspecError(f"Model '{model}' is missing a file",
                                 f"'{path}' no longer exists",
                                 f"Run: localspec rm {model}, then import or pull it again")
    if draft:
        return entry.target.path, model_path(draft, "Draft model")
    return entry.target.path, entry.draft.path if entry.draft else None


def looks_like_name(value: str) -> bool:
    """A bare name (no path separator, not a .gguf file name) rather than a path."""
    return "/" not in value and os.sep not in value and not value.lower().endswith(".gguf")
