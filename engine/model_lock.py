"""One measurement of a model at a time on this machine, and none under another process's load.

A process measures what the model's batches cost (calibrate, at `localspec calibrate` or at an
engine's first start). Two processes measuring the same model at once each time the other's load
as well, and each kept what it measured; so did one measuring while another generated with the
model. So:
- a process that must measure takes the model's measuring lock first; one that finds it held says
  so and waits, then reads the calibration the other has just written instead of measuring again;
- every generation holds the model's use lock shared (`InUse.generating`), and a measurement holds
  it exclusively: a generation elsewhere waits for the measurement (seconds), and a measurement
  waits BUSY_WAIT_S for the replies in flight to end, saying so; if one is still running it
  measures for this run only and keeps nothing (`Held.quiet` False), since a busy server's
  replies may never pause.

Both locks are flock(2) on files named for the model file's device and inode (a model imported in
place and by path share them) under the calibration folder: the kernel releases them when their
holder exits or is killed, so no lock is ever left stale, and nothing is written into the files.
Where the folder cannot be written (a read-only data dir) the process measures without the locks:
it cannot keep what it measures there either.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

WAITING = "waiting for another localspec process measuring this model"
REPLYING = "waiting for another localspec process's reply with this model to end"
NOT_KEPT = ("another localspec process is generating with this model: its costs are measured "
            "for this run only, not kept")
BUSY_WAIT_S = 5.0     # how long a measurement waits for replies in flight elsewhere to end
_POLL_S = 0.1


def lock_path(model_path: Path, folder: Path, kind: str = "lock") -> Path:
    """The model's measuring lock ("lock") or use lock ("use")."""
    st = os.stat(model_path)
    return folder / "locks" / f"{st.st_dev}-{st.st_ino}.{kind}"


@dataclass(frozen=True)
class Held:
    waited: bool = False    # another process measured the model while this one waited
    quiet: bool = True      # no other process generated with it while this one measures: keep it


def _open(path: Path) -> int | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:     # a data dir this user cannot write: no calibration is kept there either
        return None


@contextmanager
def measuring(model_path: Path, folder: Path, note: Callable[[str], None] | None = None) -> Iterator[Held]:
    """Hold the model's measuring lock, then its use lock exclusively, for the block (see the
    module's rules). `note` is told WAITING or REPLYING before a wait, NOT_KEPT when replies
    elsewhere outlast BUSY_WAIT_S."""
    fd = _open(lock_path(model_path, folder))
    if fd is None:
        yield Held()
        return
    use = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            if note is not None:
                note(WAITING)
            fcntl.flock(fd, fcntl.LOCK_EX)     # Ctrl+C interrupts the wait (EINTR raises)
            waited = True
        use = _open(lock_path(model_path, folder, "use"))
        quiet = use is None or _exclusive(use, note)
        if not quiet and note is not None:
            note(NOT_KEPT)
        yield Held(waited, quiet)
    finally:
        if use is not None:
            os.close(use)
        os.close(fd)                           # releases the locks


def _exclusive(fd: int, note: Callable[[str], None] | None) -> bool:
    """The use lock exclusively, waiting up to BUSY_WAIT_S for shared holders (generations) to let
    go; False if they do not (polled: a waiting exclusive lock would also hold off the generations
    that come after it, and a reply that never pauses would hold this one forever)."""
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if deadline is None:
                deadline = time.monotonic() + BUSY_WAIT_S
                if note is not None:
                    note(REPLYING)
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)


class InUse:
    """A loaded model's use lock: each generation holds it shared (`generating`), so a
    measurement elsewhere neither runs under it nor keeps what it measured under it."""

    def __init__(self, model_path: Path, folder: Path) -> None:
        self._fd = None
        self._guard = threading.Lock()   # a generation's end and `close` may race (threads)
        try:
            self._fd = _open(lock_path(model_path, folder, "use"))
        except OSError:       # the model file is gone: nothing to measure it by either
            pass

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Hold the lock shared for the block: waits while a measurement holds it (seconds). A
        generation still open when the session closes (a caller that dropped it) lets go with
        the file (`close`)."""
        fd = self._fd
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            yield
        finally:
            with self._guard:
                if self._fd == fd:       # still open: closing released it already otherwise
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
