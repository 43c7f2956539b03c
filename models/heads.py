"""Where installed draft heads live: `<data dir>/heads/<target fingerprint>.npz`, one per target.

Why it is shaped so: a head is trained for one model's weights, not for a name or a path, so it is
found by the target file's fingerprint (models/gguf_file.fingerprint: the header and samples of
the weights, read in a fraction of a second). The same weights imported twice, pulled again, moved
or copied find the same head, and a head can never be found for a model it was not trained for.
`localspec head train` writes here unless told `--out`, the engine uses the head found here unless
told `--head` or `--no-head` (engine/build.py), `localspec list` shows it and `localspec rm` removes
it with the last installed model of those weights (app/models_cmd.py).
"""
from __future__ import annotations

from pathlib import Path

from localspec.models.errors import LocalspecError
from localspec.models.gguf_file import fingerprint, read_gguf
from localspec.models.paths import data_dir

FOLDER = "heads"


def heads_dir(root: Path | None = None) -> Path:
    return (root or data_dir()) / FOLDER


def target_id(target_path: str | Path) -> str:
    """The fingerprint of a target GGUF (the first part of a split one); LocalspecError for a
    missing, truncated or non-GGUF file."""
    return fingerprint(read_gguf(target_path))


def default_head_path(target_path: str | Path, root: Path | None = None) -> Path:
    """Where the head for this target is installed (`localspec head train` writes it there)."""
    return heads_dir(root) / f"{target_id(target_path)}.npz"


def head_for(target_path: str | Path, root: Path | None = None) -> Path | None:
    """The installed head for this target file, if there is one."""
    path = default_head_path(target_path, root)
    return path if path.is_file() else None


def is_installed(head: str | Path, root: Path | None = None) -> bool:
    """Whether `head` is a file in the heads folder (found automatically, removed by `rm`) rather
    than one the user keeps elsewhere."""
    return Path(head).expanduser().resolve().parent == heads_dir(root).resolve()


def make_heads_dir(root: Path | None = None) -> Path:
    """The heads folder, created; LocalspecError naming the fix when the data dir is not writable."""
    folder = heads_dir(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise LocalspecError("Cannot create the folder for draft heads",
                             f"'{err.filename or folder}': {err.strerror or err}",
                             f"Make '{folder.parent}' writable for your user, set LOCALSPEC_DATA_DIR "
                             "to a writable folder, or pass --out FILE.npz") from None
    return folder


def installed_id(target_path: str | Path) -> str | None:
    """The fingerprint of an installed model's target, or None when its file is gone or damaged
    (`localspec list` reports that file as missing; no head can be found for it)."""
    try:
        return target_id(target_path)
    except LocalspecError:
        return None


def remove_head(removed: str, still_installed: set[str], root: Path | None = None) -> Path | None:
    """Delete the installed head of the weights `removed` (a fingerprint) once no installed model
    has them: the same weights installed under another name (imported twice, pulled and
    imported) share the head, which was trained for the weights, not for a name. The path
    deleted, or None (none installed, or still used)."""
    path = heads_dir(root) / f"{removed}.npz"
    if removed in still_installed or not path.is_file():
        return None
    try:
        path.unlink()
    except OSError as err:
        raise LocalspecError("The model is removed, but its draft head stays",
                             f"'{path}': {err.strerror or err}",
                             f"Delete '{path}' yourself once it is writable") from None
    return path
