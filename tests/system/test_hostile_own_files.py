"""Hostile files of localspec's own (issue 45): settings, calibrations, draft heads and kept
training corpora made a FIFO, a link to /dev/zero, a symlink loop, a file over its kind's cap, or
JSON nested far deeper than Python's stack. Every one goes through the one bounded reader
(models/own_files.py) and ends within BOUND, never in a hang or a growing process: settings fall
back to the defaults with a note (the chat still starts), a calibration is measured again, and
anything else is one title/cause/fix error (exit 2) naming the file. The manifest's cases are in
test_hostile_stores.py.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from localspec.app.settings import Settings, load_settings_or_default
from localspec.models import own_files
from localspec.models.own_files import Unreadable

BOUND = 20.0          # seconds, start to exit, for a CLI case on a loaded 2-core machine
DEEP = "[" * 200_000 + "]" * 200_000     # json's parser recursed into this: RecursionError


def fifo(path: Path, cap: int) -> None:
    os.mkfifo(path)


def dev_zero(path: Path, cap: int) -> None:
    path.symlink_to("/dev/zero")


def link_loop(path: Path, cap: int) -> None:
    path.symlink_to(path.name)


def deep(path: Path, cap: int) -> None:
    path.write_text(DEEP)


def over_cap(path: Path, cap: int) -> None:
    with path.open("wb") as fh:          # sparse: nothing is written but the size
        fh.truncate(cap + 1)


HOSTILE: dict[str, Callable[[Path, int], None]] = {
    "fifo": fifo, "dev-zero": dev_zero, "link-loop": link_loop, "deep": deep, "over-cap": over_cap}
WHY = {"fifo": "FIFO", "dev-zero": "character device", "link-loop": "symbolic links",
       "deep": "nests deeper", "over-cap": "at most"}


def within(seconds: float, call: Callable[[], object]) -> object:
    """call() run in a thread: its value or its exception, or a test failure if it is still running
    after `seconds` (a FIFO read would block for ever)."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as err:   # handed back to the test as is
            out["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still reading after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def cli(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "localspec.app.cli", *args], env=env,
                          capture_output=True, text=True, timeout=BOUND * 6, stdin=subprocess.DEVNULL)
    return proc, time.perf_counter() - t0


def clean_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "this is a bug" not in proc.stderr, proc.stderr
    assert "fix:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


# ---- the reader ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(HOSTILE))
def test_the_reader_refuses_each_hostile_file_at_once_naming_it(tmp_path, case):
    path = tmp_path / "own.json"
    HOSTILE[case](path, own_files.SETTINGS_MAX_BYTES)
    with pytest.raises(Unreadable) as err:
        within(BOUND, lambda: own_files.read_json(path, own_files.SETTINGS_MAX_BYTES))
    assert str(path) in str(err.value) and WHY[case] in str(err.value)


def test_the_reader_refuses_a_socket_and_a_folder_and_passes_a_missing_file_on(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.json"))
        with pytest.raises(Unreadable, match="socket"):
            within(BOUND, lambda: own_files.read_bytes(tmp_path / "s.json", 1 << 20))
    finally:
        sock.close()
    with pytest.raises(Unreadable, match="folder"):
        own_files.read_bytes(tmp_path, 1 << 20)
    with pytest.raises(FileNotFoundError):          # "none yet" for the callers
        own_files.read_bytes(tmp_path / "missing.json", 1 << 20)


def test_what_localspec_writes_passes_the_reader(tmp_path):
    """The caps refuse what no localspec wrote, not its own files: strings holding brackets, and
    nesting up to the cap."""
    path = tmp_path / "ok.json"
    depth = own_files.MAX_JSON_DEPTH
    nested = "[" * (depth - 1) + "]" * (depth - 1)
    path.write_text('{"prompt": "[[[[{{{{ \\" ]]", "deep": ' + nested + "}")   # `depth` levels
    assert own_files.read_json(path, 1 << 20)["prompt"] == '[[[[{{{{ " ]]'
    path.write_text("[[" + nested + "]]")
    with pytest.raises(Unreadable, match="nests deeper"):
        own_files.read_json(path, 1 << 20)


# ---- settings: the defaults, with a note ---------------------------------------------------------
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_settings_fall_back_to_the_defaults_with_a_note(tmp_path, case):
    path = tmp_path / "settings.json"
    HOSTILE[case](path, own_files.SETTINGS_MAX_BYTES)
    settings, notice = within(BOUND, lambda: load_settings_or_default(path))
    assert settings == Settings() and notice is not None
    assert notice.title == "Settings file is unreadable" and str(path) in notice.cause
    assert WHY[case] in notice.cause and str(path) in notice.fix


def test_ask_with_settings_nested_too_deep_is_explained(tiny, tmp_path):
    """`ask` reads the chat's settings: deep nesting was RecursionError, "this is a bug"."""
    config = tmp_path / "config"
    config.mkdir()
    deep(config / "settings.json", 0)
    env = dict(os.environ, LOCALSPEC_CONFIG_DIR=str(config))
    proc, seconds = cli("ask", "hi", "--model", str(tiny.target_gguf), "--max-tokens", "2", env=env)
    clean_exit_2(proc, "Settings file is unreadable", "nests deeper", str(config / "settings.json"))
    assert seconds < BOUND


def test_the_chat_starts_with_a_note_when_settings_json_is_a_fifo(tiny, tmp_path, monkeypatch):
    from test_hostile_tui import Terminal    # a real pseudo-terminal (tests/system is on sys.path)

    config = tmp_path / "config"
    config.mkdir()
    os.mkfifo(config / "settings.json")
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(config))
    term = Terminal("--model", str(tiny.target_gguf), "--ctx", "256")
    try:
        assert term.read_until(b"Settings file is unreadable"), term.output[-2000:]
        assert term.proc.poll() is None                  # the chat runs on
        term.type(b"\x11")                              # Ctrl+Q
        assert term.proc.wait(timeout=BOUND) == 0
    finally:
        term.close()


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_lease_file_names_no_holder(tmp_path, case):
    """The chat reads who holds a conversation from its lease file (app/leases.py)."""
    from localspec.app.leases import Leases

    HOSTILE[case](tmp_path / "c-1", 64)
    assert within(BOUND, lambda: Leases(tmp_path).holder("c-1")) is None


# ---- calibrations: measured again ----------------------------------------------------------------
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_calibration_file_reads_as_none_yet(tmp_path, case):
    from localspec.engine.calibrate import read_json

    path = tmp_path / "calibration.json"
    HOSTILE[case](path, own_files.CALIBRATION_MAX_BYTES)
    assert within(BOUND, lambda: read_json(path)) == {}


def test_calibrate_over_hostile_cache_files_measures_again_and_replaces_them(tiny, tmp_path):
    data = tmp_path / "data"
    env = dict(os.environ, LOCALSPEC_DATA_DIR=str(data))
    run = ("calibrate", "--model", str(tiny.target_gguf), "--ctx", "256", "--threads", "1")
    proc, _ = cli(*run, env=env)
    assert proc.returncode == 0, proc.stderr
    cached = sorted((data / "calibration").glob("*.json"))
    assert cached
    for case in ("fifo", "deep"):                   # a hang; "this is a bug"
        for path in cached:
            path.unlink()
            HOSTILE[case](path, own_files.CALIBRATION_MAX_BYTES)
        proc, seconds = cli(*run, env=env)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert seconds < BOUND * 3
        assert all(p.is_file() and own_files.read_json(p, own_files.CALIBRATION_MAX_BYTES)
                   for p in cached)


# ---- draft heads and kept corpora ----------------------------------------------------------------
@pytest.mark.parametrize("case", ["fifo", "dev-zero", "link-loop", "over-cap"])
def test_head_info_on_a_hostile_head_file_is_refused_at_once(tmp_path, case):
    from localspec.models.head_file import MAX_HEAD_FILE_BYTES

    path = tmp_path / "head.npz"
    HOSTILE[case](path, MAX_HEAD_FILE_BYTES)
    proc, seconds = cli("head", "info", str(path))
    clean_exit_2(proc, "Not a usable draft head", str(path), "localspec head train")
    assert seconds < BOUND


def test_a_head_whose_meta_nests_too_deep_is_refused(tiny_head, tmp_path):
    import numpy as np

    from localspec.models.head_file import read_head

    meta, arrays = read_head(tiny_head)
    path = tmp_path / "deep-meta.npz"
    np.savez(path, **arrays, meta=np.array(DEEP))
    proc, seconds = cli("head", "info", str(path))
    clean_exit_2(proc, "Not a usable draft head", "nests deeper")
    assert seconds < BOUND


@pytest.mark.parametrize("case", ["fifo", "dev-zero"])
def test_head_train_from_a_hostile_kept_corpus_is_refused(tiny, tmp_path, case):
    corpus = tmp_path / "corpus.npz"
    HOSTILE[case](corpus, 0)
    proc, seconds = cli("head", "train", "--model", str(tiny.target_gguf), "--corpus", str(corpus),
                        "--out", str(tmp_path / "head.npz"))
    clean_exit_2(proc, "Not a usable training corpus", str(corpus))
    assert seconds < BOUND * 2 and not (tmp_path / "head.npz").exists()
