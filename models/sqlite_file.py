"""Opening the project's SQLite files (the n-gram store, the chat history) one way.

The file and its folder are private to the user (0600 / 0700; SQLite gives its -wal and -shm files
the file's permissions). WAL with ``synchronous=FULL``: a write is on disk when the call returns.
``secure_delete``: what is deleted (a forgotten conversation) leaves no trace in the file.
Migrations are ordered and named, recorded in ``schema_version``, each committed together with
its record; a file from a newer localspec is refused rather than guessed at.

Errors say which of three things went wrong, because the fixes differ: the file cannot be
written (permissions, a read-only disk: nothing is damaged, and nothing should be deleted), it is
damaged (a corrupt page, not a database: move it aside), or it is in use. A damaged page is only
found when read, so a small file (the history) is checked whole at open with ``PRAGMA
quick_check``, which reads every page; a big one (an n-gram store near its row cap, which would
make every engine start read it whole) reports it at the first read that meets it.
"""
from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from localspec.models.errors import LocalspecError


def open_sqlite(path: Path, migrations: Sequence[tuple[str, str]], *, what: str, damaged_fix: str,
                check_pages: bool, pragmas: Sequence[str] = ()) -> sqlite3.Connection:
    """A connection to `path` (created if needed) with every migration applied. `what` names the
    file in errors ("Chat history"); `damaged_fix` is the fix for a damaged file; `check_pages`:
    read every page now (quick_check) so that a damaged one is reported at open; `pragmas` are
    set after the common ones."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            path.touch(mode=0o600)
    except OSError as err:
        raise _cannot_write(path, what, err.strerror or str(err)) from None
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    except sqlite3.Error as err:
        raise explain(path, what, err, damaged_fix) from None
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
        for pragma in pragmas:
            conn.execute(f"PRAGMA {pragma}")
        if check_pages:
            problem = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise _damaged(path, what, " ".join(problem.split()), damaged_fix)
        _migrate(conn, path, migrations, what)
    except sqlite3.Error as err:
        conn.close()
        raise explain(path, what, err, damaged_fix) from None
    except LocalspecError:
        conn.close()
        raise
    return conn


@contextmanager
def explained(path: Path, what: str, damaged_fix: str) -> Iterator[None]:
    """Turn an SQLite error in the body into the LocalspecError that says what to do."""
    try:
        yield
    except sqlite3.Error as err:
        raise explain(path, what, err, damaged_fix) from None


_CANNOT_WRITE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN}
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
_IN_USE = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


def explain(path: Path, what: str, err: sqlite3.Error, damaged_fix: str) -> LocalspecError:
    """The error for an SQLite failure on `path`, by its primary result code."""
    code = (err.sqlite_errorcode or 0) & 0xFF
    if code in _CANNOT_WRITE:
        return _cannot_write(path, what, str(err))
    if code in _DAMAGED:
        return _damaged(path, what, str(err), damaged_fix)
    if code in _IN_USE:
        return LocalspecError(f"{what} is in use", f"'{path}': {err}",
                              "Another localspec process holds it: close it, then try again")
    if code == sqlite3.SQLITE_FULL:
        return LocalspecError(f"{what} cannot be written", f"'{path}': the disk is full",
                              f"Free some space on the disk that holds '{path.parent}'")
    return LocalspecError(f"{what} could not be used", f"'{path}': {err}",
                          f"Check the disk that holds '{path.parent}' and the file's permissions; "
                          "nothing was changed")


def _cannot_write(path: Path, what: str, detail: str) -> LocalspecError:
    return LocalspecError(f"{what} cannot be written", f"'{path}': {detail}",
                          f"Make '{path.parent}' and the files in it writable for you, or set "
                          "LOCALSPEC_DATA_DIR to a writable folder (a matter of permissions, not "
                          "damage: keep the file)")


def _damaged(path: Path, what: str, detail: str, fix: str) -> LocalspecError:
    return LocalspecError(f"{what} is unusable", f"'{path}' is damaged: {detail}", fix)


def _migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[tuple[str, str]],
             what: str) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version "
                 "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)")
    done = {v for (v,) in conn.execute("SELECT version FROM schema_version")}
    if done and max(done) > len(migrations):
        raise LocalspecError(f"{what} is newer than this localspec",
                             f"'{path}' has schema version {max(done)}, this localspec knows "
                             f"{len(migrations)}", "Upgrade localspec (pip install -U localspec)")
    for version, (name, sql) in enumerate(migrations, start=1):
        if version not in done:   # the migration and its record commit together
            conn.executescript(f"BEGIN IMMEDIATE; {sql}; INSERT INTO schema_version VALUES "
                               f"({version}, '{name}', {time.time()}); COMMIT;")
