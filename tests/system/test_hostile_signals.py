"""Ctrl+C and SIGTERM at random moments of `localspec generate` (issue 20).

Where a signal lands matters (Python importing, llama.cpp loading and calling back into Python
for its log, a first calibration, the decode loop, the n-gram store's and the calibration cache's
writes, the exit), so the moments are drawn at random, seeded, from the duration of one measured
run on the tiny models (a fresh data dir: calibration included), after the time Python itself
takes to start (a Ctrl+C while it imports `site` is Python's to report, out of localspec's
reach). Every run must end within `END_S` of its signal: SIGINT with status 130 and
"interrupted" (or killed by it, before Python handles it or while it exits), SIGTERM by the
signal itself (the shell's 143), or 0 where the run finished first; never a traceback. Its
stdout is a prefix of the uninterrupted run's (greedy output is deterministic: nothing but
generated text), and the data dir it used is intact: every SQLite file passes integrity_check
and opens as the target's n-gram store, every JSON file parses, and a last run in the shared
data dir gives the same output. (A signal between a cache file's temporary write and its rename
may leave the `.tmp`; it is never read, so it is not checked for.)
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from test_hostile_cli import CLI, RUN_S, stderr_of

from localspec.models.ngram_store import NgramStore

SEED = 20
N_RUNS = 6
END_S = 20          # from the signal to the exit, on a loaded 2-core machine
PROMPT = "def total(items):"


def start(tiny, data: Path) -> subprocess.Popen:
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(data)}
    return subprocess.Popen([*CLI, "generate", PROMPT, "--raw", "--model", str(tiny.target_gguf),
                             "--draft", str(tiny.draft_gguf), "--max-tokens", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def store_keys(data: Path) -> set[str]:
    keys = set()
    for path in data.rglob("*.sqlite"):
        with NgramStore.open_existing(path) as store:
            keys.add(store.key)
    return keys


def assert_intact(data: Path, key: str) -> None:
    """`key`: the target's n-gram store key. A store interrupted between its creation and its
    first write has none yet (an empty store; the next open writes it)."""
    for path in data.rglob("*.sqlite"):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",), path
    assert store_keys(data) <= {key, ""}, data
    for path in data.rglob("*.json"):
        json.loads(path.read_text())


def test_signals_at_random_moments(tiny, tmp_path):
    shared = tmp_path / "shared"
    began = time.monotonic()
    reference = start(tiny, shared)
    want, err = reference.communicate(timeout=RUN_S)
    duration = time.monotonic() - began
    assert reference.returncode == 0 and want and not err, err
    (key,) = store_keys(shared)
    assert key

    began = time.monotonic()                    # Python's own start: before any localspec code
    subprocess.run([*CLI[:1], "-c", ""], check=True, timeout=RUN_S)
    interpreter = time.monotonic() - began

    rng = random.Random(SEED)
    outcomes = []
    for run in range(N_RUNS):
        sig = (signal.SIGINT, signal.SIGTERM)[run % 2]
        data = shared if rng.random() < 0.5 else tmp_path / f"fresh-{run}"
        delay = rng.uniform(interpreter, duration)
        proc = start(tiny, data)
        time.sleep(delay)
        sent = time.monotonic()
        proc.send_signal(sig)
        out, err_bytes = proc.communicate(timeout=END_S)
        ended = time.monotonic() - sent
        err = err_bytes.decode("utf-8", "replace")
        case = f"run {run}: {sig.name} after {delay:.2f} s, {data.name}, status {proc.returncode}"
        outcomes.append(case)
        assert ended < END_S, case
        assert "Traceback" not in err and "Exception ignored" not in err, (case, err)
        if proc.returncode != 0:
            assert proc.returncode in (128 + sig, -sig), (case, err)      # the shell's 128 + N
            assert proc.returncode != 130 or "interrupted" in err, (case, err)
        assert want.startswith(out), (case, out)
        assert_intact(data, key)

    again = start(tiny, shared)
    out, err = again.communicate(timeout=RUN_S)
    assert again.returncode == 0 and out == want, (outcomes, stderr_of(again))


def test_an_interrupt_before_run_command_ends_as_one_after():
    """The window `run_command` does not cover (the command line importing): an uncaught
    KeyboardInterrupt there exits 130 with "interrupted"; any other uncaught error keeps
    Python's own report."""
    raise_in_import = "import localspec.app; raise {}"
    interrupted = subprocess.run([CLI[0], "-c", raise_in_import.format("KeyboardInterrupt")],
                                 capture_output=True, timeout=RUN_S)
    assert (interrupted.returncode, interrupted.stderr) == (130, b"\ninterrupted\n")
    other = subprocess.run([CLI[0], "-c", raise_in_import.format("ValueError('x')")],
                           capture_output=True, timeout=RUN_S)
    assert other.returncode == 1 and b"Traceback" in other.stderr and b"ValueError: x" in other.stderr
