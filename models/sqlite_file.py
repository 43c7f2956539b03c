"""Opening the project's SQLite files (the n-gram store, the chat history) one way.

The file and its folder are private to the user (0600 / 0700; SQLite gives its -wal and -shm files
the file's permissions). WAL with ``synchronous=FULL``: a write is on disk when the call returns.
``secure_delete``: what is deleted (a forgotten conversation) leaves no trace in the file.
Migrations are ordered and named, recorded in ``schema_version``, each committed together with
its record; a file from a newer localspec is refused rather than guessed at.
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Callable, Sequence

from localspec.models.errors import LocalspecError


def open_sqlite(path: Path, migrations: Sequence[tuple[str, str]], *, what: str,
                unusable: Callable[[Path, sqlite3.DatabaseError], LocalspecError],
                pragmas: Sequence[str] = ()) -> sqlite3.Connection:
    """A connection to `path` (created if needed) with every migration applied. `what` names the
    file in errors ("Chat history"); `unusable` builds the error for a damaged file; `pragmas`
    are set after the common ones."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        path.touch(mode=0o600)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
        for pragma in pragmas:
            conn.execute(f"PRAGMA {pragma}")
        _migrate(conn, path, migrations, what)
    except sqlite3.DatabaseError as err:
        conn.close()
        raise unusable(path, err) from None
    except LocalspecError:
        conn.close()
        raise
    return conn


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
