"""Where localspec keeps the user's data: one rule, in the bottom layer, importing nothing native
(the chat UI process, the engine process and every command agree on it); and a path the user
names, made absolute with its links followed, or refused with the cause (a symlink loop)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from localspec.models.errors import LocalspecError


def data_dir() -> Path:
    """Where localspec keeps user data: $LOCALSPEC_DATA_DIR, else the platform's user data dir."""
    override = os.environ.get("LOCALSPEC_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir("localspec"))


def resolved(value: str | Path, title: str) -> Path:
    """`value` (~ expanded) absolute, its links followed; LocalspecError with `title` where that
    cannot be done (a symlink loop: Path.resolve raises RuntimeError, or OSError ELOOP)."""
    path = Path(value).expanduser()
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:
        raise LocalspecError(title, f"'{value}' cannot be followed to a file: "
                                    f"{getattr(err, 'strerror', None) or err}",
                             "Pass a path without a symlink loop (ls -l shows where each link "
                             "points)") from None
