"""Hostile SQLite files: damaged pages (valid header) in the history and the n-gram store, and a
data dir that refuses writes. Each ends within BOUND with one LocalspecError (the CLI: exit 2,
title/cause/fix, no traceback) that tells "cannot write" (keep the file) from "damaged" (move it
aside), and the file is left as it was.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.app.history import History, history_path
from localspec.engine.errors import LocalspecError
from localspec.models.ngram_store import NgramStore, store_path

BOUND = 10.0          # seconds, start to exit, for a CLI case on a loaded 2-core machine
DROP_WRITE = ["setpriv", "--inh-caps=-all",
              "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable", "--"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damage(path: Path, table: str) -> None:
    """Overwrite the pages of `table`'s b-tree but its root with garbage; the header and the
    schema stay valid, so the file still opens."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_schema WHERE name = ?", (table,)).fetchone()[0]
        pages = [p for (p,) in db.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,))]
    victims = [p for p in pages if p != root] or pages
    with path.open("r+b") as fh:
        for p in victims:
            fh.seek((p - 1) * page)
            fh.write(bytes([0x5A]) * page)


def cli(*args: str, env: dict, prefix: list[str] = ()) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([*prefix, sys.executable, "-m", "localspec.app.cli", *args], env=env,
                          capture_output=True, text=True, timeout=BOUND * 6, stdin=subprocess.DEVNULL)
    return proc, time.perf_counter() - t0


def clean_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "fix:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture()
def data_env(tmp_path) -> dict:
    env = dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    return env


def a_history(path: Path, n: int = 400) -> None:
    with History.open(path) as h:
        conv = h.new_conversation("long")
        for i in range(n):
            h.add_message(conv.id, "user", f"message {i} " + "words " * 60)


def test_a_damaged_history_page_is_found_at_open(tmp_path):
    path = tmp_path / "history.sqlite"
    a_history(path)
    damage(path, "messages")
    before = digest(path)
    t0 = time.perf_counter()
    with pytest.raises(LocalspecError) as err:
        History.open(path)
    assert time.perf_counter() - t0 < BOUND
    assert "damaged" in err.value.cause and "aside" in err.value.fix
    assert "Delete" not in err.value.fix and digest(path) == before


def test_chat_with_a_damaged_history_exits_2(data_env):
    path = history_path(Path(data_env["LOCALSPEC_DATA_DIR"]))
    a_history(path)
    damage(path, "messages")
    before = digest(path)
    proc, seconds = cli("chat", env=data_env)
    clean_exit_2(proc, "Chat history is unusable", "damaged", "aside")
    assert seconds < BOUND and digest(path) == before


def test_a_damaged_ngram_page_is_reported_at_the_first_read(tmp_path):
    path = tmp_path / "store.sqlite"
    with NgramStore.open("k", path=path) as store:
        store.add("file", "notes", [i % 1000 for i in range(20_000)])
    damage(path, "ngrams")
    before = digest(path)
    with pytest.raises(LocalspecError) as err:
        with NgramStore.open("k", path=path) as store:     # opening reads the meta table only
            store.lookup([[1, 2, 3], [500, 501]])
    assert "damaged" in err.value.cause and "--no-personal" in err.value.fix
    assert digest(path) == before


@pytest.fixture()
def write_refused(tmp_path):
    """A folder this process may read but not write, root included (capabilities dropped)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to drop the capability to write anywhere")
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o500)
    refused = subprocess.run([*DROP_WRITE, "touch", str(probe / "x")], capture_output=True)
    if refused.returncode == 0:
        pytest.skip("this machine does not let setpriv drop the write capability")
    return DROP_WRITE


def test_a_read_only_data_dir_says_cannot_write_never_delete(data_env, write_refused, tiny):
    data = Path(data_env["LOCALSPEC_DATA_DIR"])
    a_history(history_path(data), n=3)
    from localspec.models.ngram_store import vocab_key
    key = vocab_key(tiny.target_gguf)
    with NgramStore.open(key, path=store_path(key, data)) as store:
        store.add("conversation", "c-1", [1, 2, 3, 4, 5])
    for folder in (data, data / "ngrams"):
        for f in folder.glob("*-*"):                       # -wal/-shm: as after a clean close
            f.unlink()
    files = {p: digest(p) for p in data.rglob("*.sqlite")}
    for folder in (data / "ngrams", data):
        folder.chmod(0o500)
    try:
        proc, seconds = cli("chat", env=data_env, prefix=write_refused)
        clean_exit_2(proc, "Chat history cannot be written", "writable")
        assert "Delete" not in proc.stderr and seconds < BOUND
        proc, seconds = cli("generate", "hi", "--raw", "--model", str(tiny.target_gguf),
                            "--max-tokens", "4", env=data_env, prefix=write_refused)
        clean_exit_2(proc, "Personal n-gram store cannot be written", "keep the file")
        assert "Delete" not in proc.stderr and seconds < BOUND * 3
    finally:
        for folder in (data, data / "ngrams"):
            folder.chmod(0o700)
    assert {p: digest(p) for p in data.rglob("*.sqlite")} == files
