"""Hostile stores: damaged pages (valid header) in the SQLite history and n-gram store, a data
dir that refuses writes, and the models' manifest made hostile (not a regular file, too big, too
deep, of the wrong shape, of a newer version). Each ends within BOUND with one LocalspecError (the
CLI: exit 2, title/cause/fix, no traceback) that tells "cannot write" (keep the file) from
"damaged" (move it aside), and the file is left as it was. And `rm` deletes nothing another model
uses or that lies outside the store; a symlink loop given as a path is explained.
"""
from __future__ import annotations

import hashlib
import json
import os
import select
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
from localspec.models.own_files import MANIFEST_MAX_BYTES
from test_hostile_own_files import HOSTILE, WHY   # tests/system is on sys.path under pytest

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


def cli(*args: str, env: dict, prefix: list[str] = (), tty: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """The command's run and its seconds. tty: on a pseudo-terminal for stdin and stderr, as the
    chat screen needs one (what it wrote there comes back as stderr)."""
    t0 = time.perf_counter()
    cmd = [*prefix, sys.executable, "-m", "localspec.app.cli", *args]
    if not tty:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND * 6,
                              stdin=subprocess.DEVNULL)
        return proc, time.perf_counter() - t0
    master, slave = os.openpty()
    run = subprocess.Popen(cmd, env=env, stdin=slave, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out, end = b"", time.monotonic() + BOUND * 6
    try:
        while time.monotonic() < end:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:      # it exited and the terminal closed
                    break
                if not chunk:
                    break
                out += chunk
            elif run.poll() is not None:
                break
        code = run.wait(timeout=max(1.0, end - time.monotonic()))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        os.close(master)
    text = out.decode(errors="replace").replace("\r\n", "\n")
    return subprocess.CompletedProcess(cmd, code, "", text), time.perf_counter() - t0


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
    proc, seconds = cli("chat", env=data_env, tty=True)
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
        proc, seconds = cli("chat", env=data_env, prefix=write_refused, tty=True)
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


# ---- the models' manifest and `rm` (issue 45) ----------------------------------------------------
def manifest_in(env: dict) -> Path:
    path = Path(env["LOCALSPEC_DATA_DIR"]) / "models" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_manifest_is_explained_at_once(data_env, case):
    path = manifest_in(data_env)
    HOSTILE[case](path, MANIFEST_MAX_BYTES)
    proc, seconds = cli("list", env=data_env)
    clean_exit_2(proc, "Model manifest is unreadable", str(path), WHY[case], "aside")
    assert "this is a bug" not in proc.stderr and seconds < BOUND


def _entry(path: str, size: object = 1) -> dict:
    return {"target": {"path": path, "size": size, "owned": False, "quantization": "F32",
                       "vocab_size": 512}, "draft": None, "added_at": 0}


@pytest.mark.parametrize("body, cause", [
    ({"version": 1, "models": []}, "does not hold"),
    ([1, 2], "does not hold"),
    ({"version": "one", "models": {}}, "does not hold"),
    ({"version": 1, "models": {"m": 5}}, "bad entry"),
    ({"version": 1, "models": {"m": _entry("/x.gguf", 1e400)}}, "OverflowError"),   # inf
    ({"version": 1, "models": {"m": _entry("/x.gguf", "big")}}, "bad entry"),
])
def test_a_damaged_manifest_is_malformed_not_a_bug(data_env, body, cause):
    path = manifest_in(data_env)
    path.write_text(json.dumps(body))
    proc, seconds = cli("list", env=data_env)
    clean_exit_2(proc, "Model manifest is malformed", str(path), cause)
    assert "this is a bug" not in proc.stderr and seconds < BOUND


def test_a_manifest_of_a_newer_version_is_refused_never_rewritten(data_env, tiny):
    path = manifest_in(data_env)
    path.write_text(json.dumps({"version": 2, "models": {}, "groups": {"work": ["m"]}}))
    before = digest(path)
    for args in (("list",), ("import", "t", str(tiny.target_gguf)), ("rm", "t")):
        proc, seconds = cli(*args, env=data_env)
        clean_exit_2(proc, "Model manifest is from a newer localspec", "version 2", "Upgrade localspec")
        assert seconds < BOUND
    assert digest(path) == before


def test_rm_keeps_a_store_file_another_model_uses(data_env, tiny, tmp_path):
    """`import B <store>/A/target.gguf` (by path) and C through a hard link to it: `rm A` forgets A
    and keeps the file both use; the last user's `rm` still never deletes what it imported."""
    proc, _ = cli("import", "a", str(tiny.target_gguf), "--copy", env=data_env)
    assert proc.returncode == 0, proc.stderr
    owned = Path(data_env["LOCALSPEC_DATA_DIR"]) / "models" / "a" / tiny.target_gguf.name
    hard = tmp_path / "hard.gguf"
    os.link(owned, hard)
    for name, path in (("b", owned), ("c", hard)):
        proc, _ = cli("import", name, str(path), env=data_env)
        assert proc.returncode == 0, proc.stderr
    before = digest(owned)
    proc, _ = cli("rm", "a", env=data_env)
    assert proc.returncode == 0, proc.stderr
    assert owned.is_file() and digest(owned) == before
    proc, _ = cli("list", env=data_env)
    rows = [line.split()[0] for line in proc.stdout.splitlines()
            if line[:1].isalnum() and not line.startswith(("free:", "NAME"))]
    assert proc.returncode == 0 and rows == ["b", "c"] and "missing file" not in proc.stdout, proc.stdout
    proc, _ = cli("generate", "def f", "--raw", "--model", "b", "--max-tokens", "2", env=data_env)
    assert proc.returncode == 0, proc.stderr


def test_rm_of_a_manifest_entry_named_out_of_the_store_touches_nothing_outside(data_env, tmp_path):
    """An entry a hand (or a hostile program) wrote as `../../outside`, owning a file outside the
    store: `rm` forgets it and deletes nothing outside (not the empty folder its name points at,
    not the file)."""
    outside = tmp_path / "outside"          # <data>/models/../../outside
    outside.mkdir()
    victim = tmp_path / "victim.gguf"
    victim.write_bytes(b"GGUF keep me")
    entry = _entry(str(victim), victim.stat().st_size)
    entry["target"]["owned"] = True
    path = manifest_in(data_env)
    path.write_text(json.dumps({"version": 1, "models": {"../../outside": entry}}))
    proc, seconds = cli("rm", "../../outside", env=data_env)
    assert proc.returncode == 0, proc.stderr
    assert outside.is_dir() and victim.read_bytes() == b"GGUF keep me" and seconds < BOUND
    assert json.loads(path.read_text())["models"] == {}
    proc, _ = cli("rm", "../../outside", env=data_env)          # gone: a bad name again
    clean_exit_2(proc, "Bad model name")


# ---- symlink loops where a path is given ---------------------------------------------------------
@pytest.mark.parametrize("command, title", [
    (("import", "{loop}"), "Cannot import the model"),
    (("import", "t", "{target}", "--draft", "{loop}"), "Cannot import the draft"),
    (("generate", "hi", "--raw", "--model", "{target}", "--draft", "{loop}"), "Draft model not found"),
    (("ngram", "add-file", "{loop}", "--model", "{target}"), "Cannot learn from the file"),
    (("ngram", "forget", "file", "{loop}"), "Unknown n-gram source"),
])
def test_a_symlink_loop_given_as_a_path_is_explained(data_env, tiny, tmp_path, command, title):
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop.name)
    args = [a.format(loop=loop, target=tiny.target_gguf) for a in command]
    proc, seconds = cli(*args, env=data_env)
    clean_exit_2(proc, title, str(loop))
    assert "this is a bug" not in proc.stderr and seconds < BOUND
