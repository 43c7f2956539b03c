"""Hostile input, round two (issue 45): a model file changed under a running process.

llama.cpp maps the weights from the file; one truncated or overwritten in place under a running
chat ended the process with a bus error and no message. Now a change between generations ends
the command before the next one with title/cause/fix (exit 2, engine/model_files.py), and a
change during one, which raises SIGBUS, is said in the same words (exit 2, app/bus_error.py), or
by the chat screen for its engine process. Each case ends within RUN_S; no core dump, no death by
the signal.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_hostile_cli import CLI, RUN_S

TITLE = "A model file changed while in use"


def _copy(tiny, tmp_path: Path) -> Path:
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny.target_gguf, model)
    return model


def _read_until(stream, needle: bytes, deadline: float) -> bytes:
    seen = b""
    while needle not in seen:
        assert time.monotonic() < deadline, seen
        chunk = os.read(stream.fileno(), 4096)
        assert chunk, seen
        seen += chunk
    return seen


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 3)


def _rewrite_in_place(path: Path) -> None:
    """Other bytes at the same size, in the same inode (what `cp other.gguf model.gguf` leaves)."""
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        fh.write(b"\0" * 4096)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))


@pytest.mark.parametrize("change, how", [(_truncate, "it shrank from"), (_rewrite_in_place, "it was written to")])
def test_chat_line_stops_before_the_next_reply_when_its_model_file_changed(tiny, tmp_path, change, how):
    model = _copy(tiny, tmp_path)
    proc = subprocess.Popen([*CLI, "chat", "--line", "--model", str(model), "--ctx", "256", "--max-tokens", "4",
                             "--no-speculation"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data")))
    try:
        deadline = time.monotonic() + RUN_S
        proc.stdin.write(b"hi\n")
        proc.stdin.flush()
        _read_until(proc.stdout, b"\n> ", deadline)          # the help line's prompt
        _read_until(proc.stdout, b"\n> ", deadline)          # the reply, then the next prompt
        change(model)
        proc.stdin.write(b"again\n")
        proc.stdin.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=RUN_S) == 2, err
    finally:
        proc.kill()
        proc.wait()
    assert TITLE in err and how in err and "rename it over" in err and "Traceback" not in err, err


def test_a_file_truncated_during_a_generation_is_said_not_a_bus_error(tiny, tmp_path):
    """The weights are read while each token is made: a truncation mid-reply raises SIGBUS."""
    model = _copy(tiny, tmp_path)
    # near-uniform sampling with a seed whose reply is long: greedy's is so short that a fast
    # decode can finish it before the truncation lands
    proc = subprocess.Popen([*CLI, "generate", "--model", str(model), "--raw", "--ctx", "2048",
                             "--max-tokens", "1900", "--no-speculation", "--temperature", "50",
                             "--top-k", "0", "--top-p", "1", "--seed", "1", "def main():"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data")))
    try:
        os.read(proc.stdout.fileno(), 1)                    # the reply has begun
        os.truncate(model, 4096)                            # the header stays, the weights go
        proc.stdout.read()
        err = proc.stderr.read().decode()
        status = proc.wait(timeout=RUN_S)
    finally:
        proc.kill()
        proc.wait()
    assert status == 2, (status, err)
    assert TITLE in err and "SIGBUS" in err and "rename it over" in err, err


def test_the_engine_process_killed_by_sigbus_is_explained():
    from localspec.app.engine_proc import Crashed

    reason = Crashed(-7, "", "").reason
    assert "SIGBUS" in reason and "truncated or overwritten while in use" in reason


def test_a_file_renamed_over_the_model_is_no_change(tiny, tmp_path):
    """What the fix advises: the running model keeps the old file's inode, whole."""
    from localspec.engine.model_files import ModelFiles

    model = _copy(tiny, tmp_path)
    files = ModelFiles([model])
    new = tmp_path / "new.gguf"
    shutil.copyfile(tiny.draft_gguf, new)
    os.replace(new, model)
    files.check()
    _truncate(model)
    files.check()          # the new file is not the one loaded
