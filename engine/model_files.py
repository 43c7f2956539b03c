"""The model files a loaded session reads from, checked for a change before each generation.

llama.cpp maps a GGUF's weights from the file (mmap) instead of reading them into memory. A file
overwritten in place (`cp other.gguf model.gguf`, a download into the same path) or truncated
while mapped gives the process other weights without a word or, where a page it reads is now past
the file's end, kills it with SIGBUS. So each file's identity (device, inode, size, modification
time) is taken at load and compared before every generation: the same inode with another size or
time ends the run with the cause and the fix. A file replaced by a rename (what `localspec pull`
and `import --copy` do, and what the fix advises) or deleted is no change for this process: the
mapping holds the old inode, whole, until the model is closed. A change during a generation
cannot be caught here; app/bus_error.py says what happened when it ends in SIGBUS.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import LocalspecError


@dataclass(frozen=True)
class FileIdentity:
    path: Path
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        st = os.stat(path)
        return cls(Path(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ModelFiles:
    """The identities of the files a session's models were loaded from."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.files = tuple(FileIdentity.of(p) for p in paths)

    def check(self) -> None:
        """LocalspecError where a file was changed in place since it was loaded."""
        for was in self.files:
            try:
                now = FileIdentity.of(was.path)
            except OSError:      # deleted or moved away: the mapping keeps the old file whole
                continue
            if (now.dev, now.ino) != (was.dev, was.ino):
                continue         # another file renamed over it: the same
            if (now.size, now.mtime_ns) != (was.size, was.mtime_ns):
                raise changed_error(was, now)


def changed_error(was: FileIdentity, now: FileIdentity) -> LocalspecError:
    how = (f"it shrank from {was.size:,} to {now.size:,} bytes" if now.size < was.size else
           f"it went from {was.size:,} to {now.size:,} bytes" if now.size != was.size else
           "it was written to")
    return LocalspecError("A model file changed while in use",
                          f"'{was.path}': {how} after it was loaded (its weights are read from the "
                          "file while the model runs)", CHANGED_FIX)


CHANGED_FIX = ("Do not overwrite a model file while localspec runs it: quit first, or write the new "
               "file beside it and rename it over (the running model keeps the old one). Then run "
               "the command again (re-download or re-import the model if the file is now damaged)")
