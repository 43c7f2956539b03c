"""Reading the files localspec keeps for itself (settings, the models' manifest, calibrations,
draft heads, training corpora): one bounded, non-blocking reader, so that a damaged or hostile
file (a symlink to /dev/zero, a FIFO, a file of gigabytes, JSON nested a million deep) is an
explained error, never a hang, a memory blow-up or a RecursionError.

* The path is opened once, with O_NONBLOCK (opening a FIFO without a writer returns at once), and
  the opened descriptor is checked with fstat: only a regular file is read, so a FIFO, a device or
  a socket is refused before a byte is read, and a path swapped after a check cannot slip through.
* Each kind of file has a size cap (below, each with its reason): a bigger file is refused from its
  fstat size, and one that grows while it is read stops one byte past the cap.
* JSON nesting is capped before parsing: json's parser recurses once per level and raises
  RecursionError near a thousand, and nothing localspec writes nests more than a few levels.
* Failures are `Unreadable`, a one-line cause naming the file; each caller words the title and the
  fix (settings fall back to defaults, a damaged manifest is moved aside, a calibration is measured
  again). A missing file stays FileNotFoundError: for most callers it means "none yet".
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

# settings: a dozen fields and a system prompt, which has to fit a context; more is not settings
SETTINGS_MAX_BYTES = 4 << 20
# the manifest: about 1 KiB per installed model, so this holds thousands
MANIFEST_MAX_BYTES = 16 << 20
# a calibration, its learnt estimates or a head's share: a few dozen numbers per curve
CALIBRATION_MAX_BYTES = 1 << 20
# deeper than anything localspec writes (the manifest nests four levels), far below json's recursion
MAX_JSON_DEPTH = 32

_CHUNK = 1 << 20
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)   # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class Unreadable(Exception):
    """A file of localspec's own that cannot be used; str() is the cause, naming the file, and
    `why` the same without the name."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"'{path}' {why}")
        self.path, self.why = path, why


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file (symlinks followed); Unreadable if it is
    anything else or cannot be opened; FileNotFoundError if nothing is there."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:      # a socket cannot be opened at all (ENXIO): say what it is
        mode = _mode_or_none(path)
        why = (f"is {_kind(mode)}, not a regular file" if mode is not None and not stat.S_ISREG(mode)
               else f"cannot be opened: {_strerror(err)}")
        raise Unreadable(path, why) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable(path, f"is {_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path, cap: int) -> bytes:
    """A regular file's bytes, if it holds at most `cap` (see open_regular for the errors)."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > cap:
            raise Unreadable(path, f"is {_size(size)}; a file of this kind is at most {_size(cap)}")
        try:
            data = read_bounded(fh, cap)
        except OSError as err:
            raise Unreadable(path, f"cannot be read: {_strerror(err)}") from None
    if data is None:
        raise Unreadable(path, f"grew past {_size(cap)} while being read")
    return data


def read_bounded(stream: BinaryIO, limit: int) -> bytes | None:
    """All of `stream` (to its end) if it holds at most `limit` bytes; None as soon as it holds
    more, without reading further (an endless pipe ends here too)."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = stream.read(min(_CHUNK, limit + 1 - size))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        size += len(chunk)
    return None


def read_json(path: Path, cap: int, max_depth: int = MAX_JSON_DEPTH) -> object:
    """A regular file's JSON value: at most `cap` bytes of UTF-8, nested at most `max_depth`."""
    try:
        text = read_bytes(path, cap).decode("utf-8")
    except UnicodeDecodeError as err:
        raise Unreadable(path, f"is not UTF-8 text (byte {err.start})") from None
    return parse_json(path, text, max_depth)


def parse_json(path: Path, text: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """JSON text read from `path` (or from inside it: a head file's meta), nested at most
    `max_depth`; Unreadable otherwise."""
    if nests_deeper(text, max_depth):
        raise Unreadable(path, f"nests deeper than {max_depth} levels: not a file localspec wrote")
    try:
        return json.loads(text)
    except ValueError as err:
        raise Unreadable(path, f"is not valid JSON ({err})") from None


def nests_deeper(text: str, limit: int) -> bool:
    """Whether the brackets outside JSON strings nest deeper than `limit` (for valid JSON, its
    depth; for anything else, what json's parser would recurse into before failing)."""
    depth = 0
    for ch in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        depth += 1 if ch in "[{" else -1
        if depth > limit:
            return True
    return False


def _mode_or_none(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _strerror(err: OSError) -> str:
    return err.strerror or str(err)


def _size(n: int) -> str:
    return (f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"
            if n >= 1 << 20 else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes")
