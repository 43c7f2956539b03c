"""The personal n-gram store: counts of the user's own token n-grams, on disk, private, forgettable.

Why it is shaped so:

* **One SQLite file per tokenizer** (the key is the target's vocabulary fingerprint, `vocab_key`):
  token ids mean nothing across vocabularies, so stores never mix. SQLite in WAL mode with
  ``synchronous=FULL`` makes every update one atomic, durable transaction: a kill -9 at any
  moment leaves the old or the new state, never half of one.
* **Per-source rows, no aggregate table.** ``ngrams(context, next, source, count)`` keeps each
  source's counts apart, so forgetting a source is ``DELETE ... WHERE source = ?`` and subtracts
  exactly its counts; there is no shared total to drift. Lookups sum over sources
  (``GROUP BY next``) along the primary key, which is cheap because few sources share a context,
  and the drafter caches what it looked up. ``context`` is the n-1 preceding tokens packed as
  little-endian int32 (empty for unigrams), so one index serves every order.
* **Bounded size.** Each source row records how many n-gram rows it owns; when the total passes
  ``max_rows`` the least-used rows go (lowest count, then longest context, then oldest source)
  down to 90% of the cap, inside the same transaction. Back-off probabilities are computed from
  the counts a lookup returns, so pruning never leaves them inconsistent.
* **Private.** The folder is 0700 and the file 0600; ``secure_delete`` overwrites forgotten rows
  and a WAL checkpoint after forget/wipe keeps no stale copy in the log.
* Ordered, named migrations recorded in ``schema_version``; a ``revision`` counter in ``meta``
  moves with every write and an ``erasures`` counter with every forget/wipe, so readers (the
  drafter's cache) notice, even across processes.
"""
from __future__ import annotations

import hashlib
import sqlite3
import struct
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from localspec.models.errors import LocalspecError
from localspec.models.paths import data_dir
from localspec.models.sqlite_file import explained, open_sqlite

KINDS = ("conversation", "file")
DEFAULT_MAX_N = 4
DEFAULT_MAX_ROWS = 2_000_000
PRUNE_TO = 0.9  # after pruning, rows <= PRUNE_TO * max_rows (hysteresis: not every add prunes)

MIGRATIONS: tuple[tuple[str, str], ...] = (
    ("0001_sources_and_ngrams", """
        CREATE TABLE sources (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('conversation', 'file')),
            name TEXT NOT NULL,
            added_at REAL NOT NULL,
            n_tokens INTEGER NOT NULL,
            n_rows INTEGER NOT NULL,          -- n-gram rows this source owns (for the size cap)
            UNIQUE (kind, name));
        CREATE TABLE ngrams (
            context BLOB NOT NULL,            -- n-1 tokens, little-endian int32; b'' for unigrams
            next INTEGER NOT NULL,
            source INTEGER NOT NULL REFERENCES sources (id),
            count INTEGER NOT NULL CHECK (count > 0),
            PRIMARY KEY (context, next, source)) WITHOUT ROWID;
        CREATE INDEX ngrams_by_source ON ngrams (source);
    """),
    ("0002_meta", """
        CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('revision', '0');
    """),
)


def store_dir(root: Path | None = None) -> Path:
    return (root or data_dir()) / "ngrams"


def store_path(key: str, root: Path | None = None) -> Path:
    return store_dir(root) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sqlite"


def store_paths(root: Path | None = None) -> list[Path]:
    folder = store_dir(root)
    return sorted(folder.glob("*.sqlite")) if folder.is_dir() else []


def pack(context: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(context)}i", *context)


def ngram_counts(tokens: Sequence[int], max_n: int) -> Counter:
    """(packed context, next token) -> count, for every n-gram of order 1..max_n in `tokens`."""
    toks = [int(t) for t in tokens]
    raw = pack(toks)
    counts: Counter = Counter()
    for n in range(1, max_n + 1):
        counts.update((raw[4 * (i - n + 1):4 * i], toks[i]) for i in range(n - 1, len(toks)))
    return counts


@dataclass(frozen=True)
class SourceInfo:
    id: int
    kind: str
    name: str
    added_at: float
    n_tokens: int
    n_ngrams: int


@dataclass(frozen=True)
class StoreInfo:
    path: Path
    key: str
    label: str          # what the vocabulary came from (model file name), "" if unknown
    max_n: int
    max_rows: int
    n_sources: int
    n_ngrams: int
    bytes: int          # database plus its WAL on disk
    sources: tuple[SourceInfo, ...]


WHAT = "Personal n-gram store"


def _damaged_fix(path: Path) -> str:
    return (f"Delete '{path}' (it only holds statistics learnt from your conversations; it is "
            "rebuilt as you chat), or run with --no-personal")


class NgramStore:
    def __init__(self, conn: sqlite3.Connection, path: Path, max_rows: int) -> None:
        self._conn, self.path, self.max_rows = conn, path, max_rows
        self._lock = threading.RLock()  # one connection, shared by the app and engine threads
        self.key = self._meta("key") or ""
        self.max_n = int(self._meta("max_n") or DEFAULT_MAX_N)

    # ---- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, key: str, path: str | Path | None = None, *, max_n: int = DEFAULT_MAX_N,
             max_rows: int = DEFAULT_MAX_ROWS, label: str | None = None) -> NgramStore:
        """Open (creating if needed) the store for vocabulary `key`. `max_n` applies at creation."""
        if not 1 <= max_n <= 16:
            raise ValueError("max_n must be in 1..16")
        if max_rows < 1:
            raise ValueError("max_rows must be positive")
        path = Path(path) if path is not None else store_path(key)
        store = cls(_connect(path), path, max_rows)
        stored = store._meta("key")
        if stored is not None and stored != key:
            store.close()
            raise LocalspecError("N-gram store belongs to another vocabulary",
                                 f"'{path}' was built for key {stored}, not {key}",
                                 "Use the model the store was built with, or another path")
        if stored is None or (label and store._meta("label") != label):
            with store._write():
                if stored is None:
                    store._set_meta("key", key)
                    store._set_meta("max_n", str(max_n))
                if label:
                    store._set_meta("label", label)
        store.key, store.max_n = key, int(store._meta("max_n") or max_n)
        return store

    @classmethod
    def open_existing(cls, path: str | Path, *, max_rows: int = DEFAULT_MAX_ROWS) -> NgramStore:
        path = Path(path)
        if not path.is_file():
            raise LocalspecError("N-gram store not found", f"'{path}' does not exist",
                                 "List the stores with: localspec ngram show")
        return cls(_connect(path), path, max_rows)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> NgramStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- writing ------------------------------------------------------------------------------
    def add(self, source_kind: str, source_name: str, tokens: Sequence[int]) -> int:
        """Count `tokens` as source (kind, name), replacing its earlier counts; its id."""
        _check_kind(source_kind)
        counts = sorted(ngram_counts(tokens, self.max_n).items())  # key order: local b-tree writes
        with self._write() as db:
            row = db.execute("SELECT id FROM sources WHERE kind = ? AND name = ?",
                             (source_kind, source_name)).fetchone()
            if row is None:
                sid = db.execute("INSERT INTO sources (kind, name, added_at, n_tokens, n_rows) "
                                 "VALUES (?, ?, 0, 0, 0)", (source_kind, source_name)).lastrowid
            else:
                sid = row[0]
                db.execute("DELETE FROM ngrams WHERE source = ?", (sid,))
            db.executemany("INSERT INTO ngrams (context, next, source, count) VALUES (?, ?, ?, ?)",
                           ((ctx, nxt, sid, c) for (ctx, nxt), c in counts))
            db.execute("UPDATE sources SET added_at = ?, n_tokens = ?, n_rows = ? WHERE id = ?",
                       (time.time(), len(tokens), len(counts), sid))
            self._prune(db)
        return int(sid)

    def forget(self, source_kind: str, source_name: str) -> bool:
        """Remove one source and exactly its counts; False if there was no such source."""
        _check_kind(source_kind)
        with self._write() as db:
            row = db.execute("SELECT id FROM sources WHERE kind = ? AND name = ?",
                             (source_kind, source_name)).fetchone()
            if row is not None:
                db.execute("DELETE FROM ngrams WHERE source = ?", (row[0],))
                db.execute("DELETE FROM sources WHERE id = ?", (row[0],))
                _count_erasure(db)
        if row is not None:
            self._checkpoint()
        return row is not None

    def wipe(self) -> None:
        """Forget everything; the file is compacted so no forgotten page lingers."""
        with self._write() as db:
            db.execute("DELETE FROM ngrams")
            db.execute("DELETE FROM sources")
            _count_erasure(db)
        with self._read() as db:
            db.execute("VACUUM")
        self._checkpoint()

    def _prune(self, db: sqlite3.Connection) -> None:
        total = db.execute("SELECT COALESCE(SUM(n_rows), 0) FROM sources").fetchone()[0]
        if total <= self.max_rows:
            return
        drop = total - int(self.max_rows * PRUNE_TO)
        db.execute("DELETE FROM ngrams WHERE (context, next, source) IN (SELECT context, next, "
                   "source FROM ngrams ORDER BY count, length(context) DESC, source LIMIT ?)",
                   (drop,))
        db.execute("UPDATE sources SET n_rows = (SELECT COUNT(*) FROM ngrams "
                   "WHERE ngrams.source = sources.id)")

    # ---- reading ------------------------------------------------------------------------------
    def lookup(self, contexts: Iterable[Sequence[int]]) -> dict[tuple[int, ...], dict[int, int]]:
        """For each context: {next token: count summed over sources}, most frequent first.
        Contexts never seen map to {}. The empty context gives the unigram counts."""
        wanted = {pack(c): tuple(int(t) for t in c) for c in contexts}
        out: dict[tuple[int, ...], dict[int, int]] = {ctx: {} for ctx in wanted.values()}
        if not wanted:
            return out
        marks = ",".join("?" * len(wanted))
        with self._read() as db:
            rows = db.execute(
                f"SELECT context, next, SUM(count) AS c FROM ngrams WHERE context IN ({marks}) "
                "GROUP BY context, next ORDER BY context, c DESC, next", list(wanted)).fetchall()
        for ctx, nxt, c in rows:
            out[wanted[ctx]][nxt] = c
        return out

    def continuations(self, context: Sequence[int], max_n: int | None = None
                      ) -> list[tuple[int, dict[int, int]]]:
        """(order, {next: count}) for each suffix of `context`, longest first, down to order 1."""
        max_n = min(max_n or self.max_n, self.max_n, len(context) + 1)
        ctxs = [tuple(context[len(context) - (n - 1):]) if n > 1 else () for n in
                range(max_n, 0, -1)]
        found = self.lookup(ctxs)
        return [(len(ctx) + 1, found[tuple(int(t) for t in ctx)]) for ctx in ctxs]

    def revision(self) -> int:
        """Moves with every committed write, from any process."""
        return int(self._meta("revision") or 0)

    def erasures(self) -> int:
        """Moves with every forget and wipe, from any process: caches must drop what they hold."""
        return int(self._meta("erasures") or 0)

    def info(self) -> StoreInfo:
        with self._read() as db:
            rows = db.execute("SELECT id, kind, name, added_at, n_tokens, n_rows FROM "
                              "sources ORDER BY added_at, id").fetchall()
        sources = tuple(SourceInfo(*r) for r in rows)
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        return StoreInfo(path=self.path, key=self.key, label=self._meta("label") or "",
                         max_n=self.max_n, max_rows=self.max_rows, n_sources=len(sources),
                         n_ngrams=sum(s.n_ngrams for s in sources), bytes=size, sources=sources)

    def integrity_ok(self) -> bool:
        with self._read() as db:
            return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    # ---- plumbing -----------------------------------------------------------------------------
    def _meta(self, name: str) -> str | None:
        with self._read() as db:
            row = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, name: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; an SQLite failure becomes a LocalspecError."""
        with self._lock, explained(self.path, WHAT, _damaged_fix(self.path)):
            yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, bumping the revision; ROLLBACK if the body raises."""
        with self._lock, explained(self.path, WHAT, _damaged_fix(self.path)):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 "
                                   "WHERE name = 'revision'")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _checkpoint(self) -> None:
        with self._read() as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _count_erasure(db: sqlite3.Connection) -> None:
    db.execute("INSERT INTO meta VALUES ('erasures', '1') ON CONFLICT (name) "
               "DO UPDATE SET value = CAST(value AS INTEGER) + 1")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise LocalspecError("Unknown n-gram source kind", f"'{kind}'",
                             f"Use one of: {', '.join(KINDS)}")


def _connect(path: Path) -> sqlite3.Connection:
    # no check_pages: every engine start would read a store near its row cap whole; a damaged
    # page is reported by the first read that meets it (_read, _write)
    return open_sqlite(path, MIGRATIONS, what=WHAT, damaged_fix=_damaged_fix(path),
                       check_pages=False)


def learn(store: NgramStore, conversation_id: str, tokens: Sequence[int]) -> int:
    """After each finished exchange: the whole conversation so far replaces its earlier counts."""
    return store.add("conversation", conversation_id, tokens)


def vocab_key(model) -> str:
    """A fingerprint of a GGUF model's vocabulary (tokenizer model + token texts), cheap to take:
    the tokens array is hashed straight from the file's header, no tensor is read.
    `model` is a .gguf path or anything with a `.path` to one (a LlamaModel)."""
    from localspec.models.gguf_file import file_vocabulary

    return file_vocabulary(Path(getattr(model, "path", model))).fingerprint
