"""Hostile input, round two (issue 45): the shared machine. Two processes measuring one model,
or one measuring while another generates with it.

Two `calibrate --refresh` at once took 5 to 60 s each instead of 0.4 s and each kept what it
measured under the other's load. A process that must measure a model now takes the model's lock
(engine/model_lock.py): one that finds it held says so and waits, then uses the calibration just
written; a holder killed with SIGKILL leaves no stale lock. A measurement waits for replies in
flight elsewhere and keeps nothing measured under one; a generation waits for a measurement.
Each case ends within RUN_S.
"""
from __future__ import annotations

import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_hostile_cli import CLI, RUN_S

HOLD = """
import sys, time
from pathlib import Path
from localspec.engine.calibrate import default_cache_dir
from localspec.engine.model_lock import measuring
with measuring(Path(sys.argv[1]), default_cache_dir()):
    print("held", flush=True)
    time.sleep(600)
"""

GENERATE = """
import sys, time
from pathlib import Path
from localspec.engine.calibrate import default_cache_dir
from localspec.engine.model_lock import InUse
with InUse(Path(sys.argv[1]), default_cache_dir()).generating():   # as each Session.generate
    print("generating", flush=True)
    time.sleep(600)
"""


def _env(tmp_path: Path) -> dict:
    return dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data"))


def _calibrate(model: Path, env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "calibrate", "--refresh", "--model", str(model), "--ctx", "256",
                             "--no-head"], env=env, **popen)


def test_a_calibration_waits_for_another_process_measuring_and_says_so(tiny, tmp_path):
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny.target_gguf, model)
    env = _env(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(model)], env=env, stdout=subprocess.PIPE)
    master, slave = pty.openpty()            # progress is shown on a terminal only
    try:
        assert holder.stdout.readline() == b"held\n"
        proc = _calibrate(model, env, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        seen, deadline = b"", time.monotonic() + RUN_S
        while b"Waiting for another localspec process measuring this model" not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen
            seen += os.read(master, 4096)
        time.sleep(1.0)
        assert proc.poll() is None           # still waiting: nothing measured under the other's load
        holder.send_signal(signal.SIGKILL)   # a killed holder's lock goes with it
        out, _ = proc.communicate(timeout=RUN_S)
        assert proc.returncode == 0 and b"target " in out, out
    finally:
        holder.kill()
        holder.wait()
        os.close(master)


def test_two_calibrations_at_once_both_end(tiny, tmp_path):
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny.target_gguf, model)
    env = _env(tmp_path)
    procs = [_calibrate(model, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=RUN_S)
        assert proc.returncode == 0 and b"target " in out, err
    assert list((tmp_path / "data" / "calibration" / "locks").iterdir())   # the lock file, never removed


def test_a_calibration_while_another_process_generates_waits_then_keeps_nothing(tiny, tmp_path):
    from localspec.engine.model_lock import BUSY_WAIT_S

    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny.target_gguf, model)
    env = _env(tmp_path)
    replying = subprocess.Popen([sys.executable, "-c", GENERATE, str(model)], env=env, stdout=subprocess.PIPE)
    master, slave = pty.openpty()
    try:
        assert replying.stdout.readline() == b"generating\n"
        t0 = time.monotonic()
        proc = _calibrate(model, env, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        seen = b""
        while b"Waiting for another localspec process's reply with this model to end" not in seen:
            assert time.monotonic() - t0 < RUN_S and proc.poll() is None, seen
            seen += os.read(master, 4096)
        out, _ = proc.communicate(timeout=RUN_S)
        assert proc.returncode == 0 and b"target " in out and b"Not kept" in out, out
        assert time.monotonic() - t0 >= BUSY_WAIT_S                       # it waited for the reply first
        assert not list((tmp_path / "data" / "calibration").glob("*.json"))   # nothing measured was kept
    finally:
        replying.kill()
        replying.wait()
        os.close(master)
    # with the reply ended, the same calibration keeps what it measures
    out = subprocess.run([*CLI, "calibrate", "--refresh", "--model", str(model), "--ctx", "256", "--no-head"],
                         env=env, capture_output=True, timeout=RUN_S)
    assert out.returncode == 0 and b"Not kept" not in out.stdout, out
    assert list((tmp_path / "data" / "calibration").glob("*.json"))


def test_a_generation_waits_while_another_process_measures(tiny, tmp_path, monkeypatch):
    import threading

    from localspec.engine.calibrate import default_cache_dir
    from localspec.engine.model_lock import InUse

    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny.target_gguf, model)
    env = _env(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(model)], env=env, stdout=subprocess.PIPE)
    entered = threading.Event()
    try:
        assert holder.stdout.readline() == b"held\n"
        monkeypatch.setenv("LOCALSPEC_DATA_DIR", env["LOCALSPEC_DATA_DIR"])
        use = InUse(model, default_cache_dir())

        def generate() -> None:
            with use.generating():
                entered.set()
        threading.Thread(target=generate, daemon=True).start()
        assert not entered.wait(1.0)          # held off while the other process measures
        holder.send_signal(signal.SIGKILL)
        assert entered.wait(RUN_S)
        use.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_generation_ending_while_the_session_closes_never_unlocks_a_closed_file(tmp_path):
    """`close` and a generation's end on another thread, raced many times: the end lets go of the
    lock only while the file is open (an fd closed under it, or reused by then, is never touched)."""
    import threading

    from localspec.engine.model_lock import InUse

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    errors = []
    for _ in range(300):
        use = InUse(model, tmp_path / "locks")
        started = threading.Event()

        def generate() -> None:
            try:
                with use.generating():
                    started.set()
            except OSError as err:
                errors.append(err)
        thread = threading.Thread(target=generate)
        thread.start()
        started.wait(5)
        use.close()
        thread.join(5)
    assert errors == []
