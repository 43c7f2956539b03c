"""One measurement of a model at a time on this machine: a lock per model file, held while a
process measures what the model's batches cost (calibrate, at `localspec calibrate` or at an
engine's first start).

Two processes measuring the same model at once each time the other's load as well (0.4 s of
batches took 5 to 60 s), and each kept what it measured. So a process that must measure takes
this lock first; one that finds it held says so and waits, then reads the calibration the other
has just written instead of measuring again.

The lock is flock(2) on a file named for the model file's device and inode (a model imported in
place and by path share it) under the calibration folder: the kernel releases it when its holder
exits or is killed, so no lock is ever left stale, and nothing is written into the file. Where
the folder cannot be written (a read-only data dir) the process measures without the lock: it
cannot keep what it measures there either.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

WAITING = "waiting for another localspec process measuring this model"


def lock_path(model_path: Path, folder: Path) -> Path:
    st = os.stat(model_path)
    return folder / "locks" / f"{st.st_dev}-{st.st_ino}.lock"


@contextmanager
def measuring(model_path: Path, folder: Path, note: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold the model's measuring lock for the block; yields whether this process waited for
    another (which has then just measured). `note` is told WAITING before a wait."""
    path = lock_path(model_path, folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:     # a data dir this user cannot write: no calibration is kept there either
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            if note is not None:
                note(WAITING)
            fcntl.flock(fd, fcntl.LOCK_EX)     # Ctrl+C interrupts the wait (EINTR raises)
            waited = True
        yield waited
    finally:
        os.close(fd)                           # releases the lock
