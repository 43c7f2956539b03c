"""Chat history: conversations and their messages in SQLite, under the user data dir.

Why it is shaped so:

* **Acknowledged means durable.** WAL mode with ``synchronous=FULL``: every write is one
  transaction that is on disk when the call returns, so a kill -9 at any moment keeps everything
  the UI has already shown as saved, and never leaves half a write.
* **Every streamed piece is saved before it is shown**, so a kill -9 of the app loses none of a
  reply's text on screen. Those checkpoints commit on a second connection at
  ``synchronous=NORMAL``: the commit is in the operating system's hands when the call returns
  (a killed process cannot lose it) but is not flushed to the disk, which is what made one per
  piece too dear at FULL. A power cut may lose the tail of a reply still streaming, never more,
  and never leaves the file inconsistent; the reply's final state is committed at FULL.
* **A reply is a row with a state.** ``streaming`` while tokens arrive (its text checkpointed
  piece by piece), then ``complete`` (committed *before* the UI marks it complete), ``stopped`` (the user
  pressed Esc), ``error`` (the engine failed or crashed). A ``streaming`` row found when the store
  opens belongs to a process that died mid-reply and becomes ``partial``: kept, marked, never lost.
* **One writer.** One connection behind a lock serves the app's threads; other processes wait on
  SQLite's write lock (``BEGIN IMMEDIATE``). Ordered, named migrations are recorded in
  ``schema_version``, as in the n-gram store.
* **One window per conversation.** Writing to a conversation takes its lease (app/leases.py) and
  keeps it until `release`; a conversation whose lease another History holds (another chat
  window) is refused with a LocalspecError, so two windows never interleave in one conversation.
  The chat screen claims a conversation when it opens it and shows it read-only when it cannot.
  A ``streaming`` row becomes ``partial`` at open only where no one holds the lease: another
  window may be streaming into it right now.
* Search is a plain ``LIKE`` over titles and message texts: a personal history is small, and
  ``LIKE`` needs no tokenizer that would miss code identifiers.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from localspec.app.leases import Leases
from localspec.engine.errors import LocalspecError
from localspec.models.paths import data_dir
from localspec.models.sqlite_file import explained, open_sqlite

STATES = ("streaming", "partial", "complete", "stopped", "error")
ROLES = ("user", "assistant")
DEFAULT_TITLE = "New chat"

MIGRATIONS: tuple[tuple[str, str], ...] = (
    ("0001_conversations_and_messages", """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,              -- also the personal n-gram store's source name
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL);
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,             -- order inside the conversation
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            state TEXT NOT NULL
                CHECK (state IN ('streaming', 'partial', 'complete', 'stopped', 'error')),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            stats TEXT,                       -- JSON: the engine's DecodeStats of a reply
            segments TEXT,                    -- JSON: [[text, source], ...] for token colouring
            UNIQUE (conversation_id, seq));
        CREATE INDEX conversations_by_update ON conversations (updated_at);
    """),
)


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: str
    seq: int
    role: str
    content: str
    state: str
    stats: dict | None = None
    segments: tuple[tuple[str, str], ...] = ()

    def as_chat(self) -> dict:
        return {"role": self.role, "content": self.content}


def history_path(root: Path | None = None) -> Path:
    return (root or data_dir()) / "history.sqlite"


class History:
    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn, self.path = conn, path
        self._lock = threading.RLock()
        self._stream = _stream_connection(path)   # checkpoints of streaming replies only
        self.leases = Leases(path.parent / f"{path.stem}.leases")

    @classmethod
    def open(cls, path: str | Path | None = None) -> History:
        """Open (creating if needed) the history; replies left `streaming` by a process that
        died become `partial` (not those of a window still writing them)."""
        path = Path(path) if path is not None else history_path()
        history = cls(_connect(path), path)
        with history._read() as db:
            streaming = [cid for (cid,) in db.execute(
                "SELECT DISTINCT conversation_id FROM messages WHERE state = 'streaming'")]
        for cid in streaming:
            if history.leases.claim(cid):
                with history._write() as db:
                    db.execute("UPDATE messages SET state = 'partial' "
                               "WHERE state = 'streaming' AND conversation_id = ?", (cid,))
                history.leases.release(cid)
        return history

    def close(self) -> None:
        with self._lock:
            self.leases.close()
            self._stream.close()
            self._conn.close()

    # ---- leases (app/leases.py) ---------------------------------------------------------------
    def claim(self, conversation_id: str) -> bool:
        """Hold the conversation for this History's writes; False: another window holds it."""
        with self._lock:
            return self.leases.claim(conversation_id)

    def release(self, conversation_id: str) -> None:
        with self._lock:
            self.leases.release(conversation_id)

    def holder(self, conversation_id: str) -> int | None:
        """The process id of the window that holds the conversation, where it is known."""
        return self.leases.holder(conversation_id)

    def _own(self, conversation_id: str) -> None:
        if not self.claim(conversation_id):
            raise held_elsewhere(conversation_id, self.holder(conversation_id))

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- conversations ------------------------------------------------------------------------
    def new_conversation(self, title: str = DEFAULT_TITLE) -> Conversation:
        now = time.time()
        conv = Conversation(f"c-{uuid.uuid4().hex[:16]}", _clean_title(title), now, now)
        self._own(conv.id)
        with self._write() as db:
            db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?)",
                       (conv.id, conv.title, now, now))
        return conv

    def conversations(self) -> list[Conversation]:
        """Most recently used first."""
        with self._read() as db:
            rows = db.execute("SELECT id, title, created_at, updated_at FROM conversations "
                              "ORDER BY updated_at DESC, rowid DESC").fetchall()
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: str) -> Conversation | None:
        with self._read() as db:
            row = db.execute("SELECT id, title, created_at, updated_at FROM conversations "
                             "WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(*row) if row else None

    def search(self, query: str) -> list[Conversation]:
        """Conversations whose title or any message contains `query` (case-insensitive)."""
        if not query.strip():
            return self.conversations()
        pattern = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._read() as db:
            rows = db.execute(
                "SELECT id, title, created_at, updated_at FROM conversations c "
                "WHERE title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE "
                "m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\') "
                "ORDER BY updated_at DESC, rowid DESC", (pattern,)).fetchall()
        return [Conversation(*r) for r in rows]

    def rename(self, conversation_id: str, title: str) -> None:
        self._own(conversation_id)
        with self._write() as db:
            _require(db.execute("UPDATE conversations SET title = ? WHERE id = ?",
                                (_clean_title(title), conversation_id)), conversation_id)

    def delete(self, conversation_id: str) -> None:
        self._own(conversation_id)
        with self._write() as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            _require(db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)),
                     conversation_id)
        with self._lock:
            self.leases.forget(conversation_id)

    # ---- messages -----------------------------------------------------------------------------
    def messages(self, conversation_id: str) -> list[Message]:
        with self._read() as db:
            rows = db.execute(
                "SELECT id, conversation_id, seq, role, content, state, stats, segments "
                "FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    def add_message(self, conversation_id: str, role: str, content: str,
                    state: str = "complete") -> Message:
        """Append a message; durable when this returns. A reply starts as `streaming`, ''."""
        if role not in ROLES or state not in STATES:
            raise ValueError(f"bad role/state {role!r}/{state!r}")
        now = time.time()
        self._own(conversation_id)
        with self._write() as db:
            (seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages "
                                "WHERE conversation_id = ?", (conversation_id,)).fetchone()
            try:
                mid = db.execute("INSERT INTO messages (conversation_id, seq, role, content, state, "
                                 "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (conversation_id, seq, role, content, state, now, now)).lastrowid
            except sqlite3.IntegrityError:
                raise _missing(conversation_id) from None
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        return Message(mid, conversation_id, seq, role, content, state)

    def begin_reply(self, conversation_id: str) -> Message:
        return self.add_message(conversation_id, "assistant", "", "streaming")

    def checkpoint(self, message_id: int, content: str,
                   segments: list[tuple[str, str]] | None = None) -> None:
        """Save a streaming reply's text so far (it stays `streaming`): safe from a kill -9 of
        this process when this returns, not flushed to the disk (see the module docstring)."""
        with self._lock, explained(self.path, WHAT, _damaged_fix(self.path)):
            self._stream.execute("UPDATE messages SET content = ?, segments = ?, updated_at = ? "
                                 "WHERE id = ? AND state = 'streaming'",
                                 (content, _json(segments), time.time(), message_id))

    def finish_reply(self, message_id: int, content: str, state: str, stats: dict | None = None,
                     segments: list[tuple[str, str]] | None = None) -> Message:
        """Final text and state of a reply, committed when this returns."""
        if state not in STATES or state == "streaming":
            raise ValueError(f"bad final state {state!r}")
        with self._write() as db:
            db.execute("UPDATE messages SET content = ?, state = ?, stats = ?, segments = ?, "
                       "updated_at = ? WHERE id = ?",
                       (content, state, _json(stats), _json(segments), time.time(), message_id))
            row = db.execute("SELECT id, conversation_id, seq, role, content, state, stats, "
                             "segments FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise LocalspecError("Message not found", f"message {message_id} is not in the history",
                                 "It was deleted meanwhile; start a new reply")
        return _message(row)

    def truncate(self, conversation_id: str, from_seq: int) -> None:
        """Delete the messages at `from_seq` and after (retry and edit-last rewrite the tail)."""
        self._own(conversation_id)
        with self._write() as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND seq >= ?",
                       (conversation_id, from_seq))

    def integrity_ok(self) -> bool:
        with self._read() as db:
            return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    # ---- plumbing -----------------------------------------------------------------------------
    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; an SQLite failure becomes a LocalspecError."""
        with self._lock, explained(self.path, WHAT, _damaged_fix(self.path)):
            yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (durable on return); ROLLBACK if the body raises."""
        with self._lock, explained(self.path, WHAT, _damaged_fix(self.path)):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")


def _message(row: tuple) -> Message:
    mid, cid, seq, role, content, state, stats, segments = row
    return Message(mid, cid, seq, role, content, state, json.loads(stats) if stats else None,
                   tuple((t, s) for t, s in json.loads(segments)) if segments else ())


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _clean_title(title: str) -> str:
    title = " ".join(title.split())
    return title[:80] if title else DEFAULT_TITLE


def _missing(conversation_id: str) -> LocalspecError:
    return LocalspecError("Conversation not found", f"'{conversation_id}' is not in the history",
                          "It was deleted meanwhile; pick or start another conversation")


def held_elsewhere(conversation_id: str, pid: int | None) -> LocalspecError:
    who = f"localspec process {pid}" if pid else "another localspec process"
    return LocalspecError("Conversation is open in another window",
                          f"'{conversation_id}' is being written by {who}",
                          "Continue it in that window (or close it there), or start a new "
                          "conversation here")


def _require(cursor: sqlite3.Cursor, conversation_id: str) -> None:
    if cursor.rowcount == 0:
        raise _missing(conversation_id)


WHAT = "Chat history"


def _damaged_fix(path: Path) -> str:
    return (f"Move '{path}' aside (a new, empty history is created; `sqlite3 FILE .recover` can "
            "salvage what is readable from the old one)")


def _stream_connection(path: Path) -> sqlite3.Connection:
    """A second connection to an opened history, for checkpoints: each statement commits on its
    own (isolation_level None) at synchronous=NORMAL."""
    with explained(path, WHAT, _damaged_fix(path)):
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _connect(path: Path) -> sqlite3.Connection:
    # check_pages: a personal history is small, so reading every page at open costs milliseconds
    return open_sqlite(path, MIGRATIONS, what=WHAT, damaged_fix=_damaged_fix(path),
                       check_pages=True, pragmas=("foreign_keys = ON",))
