"""Where localspec keeps the user's data: one rule, in the bottom layer, importing nothing native
(the chat UI process, the engine process and every command agree on it)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    """Where localspec keeps user data: $LOCALSPEC_DATA_DIR, else the platform's user data dir."""
    override = os.environ.get("LOCALSPEC_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir("localspec"))
