"""Under a memory limit (issue 20: `generate` and `ask` died with a MemoryError traceback), endless
input is refused by its size bound, and running out of memory anyway is one clear error, exit 2."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

LIMIT = 1500 << 20   # bytes of address space: a tiny model's run fits, a few GB of input does not


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run_on_zeros(*args: str) -> subprocess.CompletedProcess:
    with open("/dev/zero", "rb") as zeros:
        return subprocess.run([sys.executable, "-m", "localspec.app.cli", *args], stdin=zeros,
                              capture_output=True, text=True, timeout=60, preexec_fn=limited)


@pytest.mark.parametrize("command", ["generate", "ask"])
def test_endless_stdin_under_a_memory_limit_is_refused_by_its_bound(tiny, command):
    args = ["--model", str(tiny.target_gguf), "--max-tokens", "2"]
    run = run_on_zeros(command, *(["summarise"] if command == "ask" else []), *args)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "Prompt is longer than the context" in run.stderr


def test_running_out_of_memory_is_one_clear_error(tiny):
    """A bound larger than the memory (--ctx 2^31-1 allows ~16 GiB of text): the read meets the
    limit first, and the MemoryError ends as a message with the fix, not a traceback."""
    run = run_on_zeros("generate", "--model", str(tiny.target_gguf), "--max-tokens", "2",
                       "--ctx", "2147483647")
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "Out of memory" in run.stderr and "fix:" in run.stderr
    assert run.stdout == ""
