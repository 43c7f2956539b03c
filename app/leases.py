"""Which chat window may write a conversation: one at a time, by an advisory lock per conversation.

Two `localspec chat` windows on one data dir would otherwise interleave their messages and replies
in one conversation (each appends at the end it last saw). The rule: a window holds the lease of
the conversation it has open (and of one a reply of its is still streaming into); another window
that opens it shows it read-only, says which process holds it, and writes nothing to it until the
lease is free.

Why `flock` on a file per conversation rather than a row in history.sqlite: the kernel drops the
lock when its holder dies, kill -9 included, so a dead window never blocks a conversation and no
heartbeat or expiry has to be guessed. `flock` locks belong to the open file, so two History
objects in one process exclude each other as two processes do. The holder writes its process id
into the file, only so that the other window can name it. A file is removed (under its lock) when
its conversation is deleted; whoever locks a file checks that it is still the one at its path, so
a lock taken on a file just removed is never mistaken for the lease.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from localspec.models.errors import LocalspecError
from localspec.models.own_files import Unreadable, read_bytes

_PID_BYTES = 32      # a lease file holds one process id in decimal


class Leases:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held: dict[str, int] = {}       # conversation id -> the locked file's descriptor

    def claim(self, conversation_id: str) -> bool:
        """Hold the conversation's lease (kept until `release`); False: another holder has it."""
        if conversation_id in self._held:
            return True
        path = self._path(conversation_id)
        while True:
            fd = self._open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if _same_file(fd, path):
                break
            os.close(fd)                      # removed by a delete meanwhile: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._held[conversation_id] = fd
        return True

    def holds(self, conversation_id: str) -> bool:
        return conversation_id in self._held

    def holder(self, conversation_id: str) -> int | None:
        """The process id the holder wrote (None: unknown, or no file)."""
        try:      # a regular file of a process id only (models/own_files.py): never a FIFO's wait
            text = read_bytes(self._path(conversation_id), _PID_BYTES).decode("ascii", "replace")
        except (FileNotFoundError, Unreadable):
            return None
        return int(text) if text.strip().isdigit() else None

    def release(self, conversation_id: str) -> None:
        fd = self._held.pop(conversation_id, None)
        if fd is not None:
            os.close(fd)                      # closing the last descriptor drops the lock

    def forget(self, conversation_id: str) -> None:
        """The conversation was deleted: remove its file, then the lease."""
        if conversation_id in self._held:
            self._path(conversation_id).unlink(missing_ok=True)
        self.release(conversation_id)

    def close(self) -> None:
        for conversation_id in list(self._held):
            self.release(conversation_id)

    def _path(self, conversation_id: str) -> Path:
        return self.folder / conversation_id

    def _open(self, path: Path) -> int:
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise LocalspecError(
                "Chat history cannot be written", f"'{path}': {err.strerror or err}",
                f"Make '{self.folder.parent}' and the files in it writable for you, or set "
                "LOCALSPEC_DATA_DIR to a writable folder (a matter of permissions, not damage: "
                "keep the files)"
                if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else
                f"Check the disk that holds '{self.folder}'") from None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
