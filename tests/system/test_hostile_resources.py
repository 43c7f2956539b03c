"""Hostile input, round two (issue 45): resources a user can set, and the machine's own limits.

`--threads 100000` segfaulted (exit 139), 50000 failed in libgomp, 4096 took a minute for five
tokens: a thread count is now at most the cores this process may use, refused before anything
loads. Each case ends within its subprocess timeout.
"""
from __future__ import annotations

import os

import pytest
from test_hostile_cli import QUICK_S, assert_clean_error, assert_quiet_success, run_cli

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("command", [["generate", "hi"], ["ask", "hi"], ["chat", "--line"], ["chat"],
                                     ["calibrate"], ["bench", "--out", "/nonexistent/out"]])
@pytest.mark.parametrize("threads", [CORES + 1, 100_000])
def test_threads_past_the_cores_are_refused_with_the_range(tiny, command, threads):
    proc = run_cli(*command, "--model", str(tiny.target_gguf), "--threads", str(threads),
                   stdin=b"hi\n", timeout=QUICK_S)
    assert_clean_error(proc, f"--threads {threads}", f"<= {CORES} (the cores this process may use)")


def test_threads_at_the_cores_run(tiny):
    proc = run_cli("generate", "hi", "--model", str(tiny.target_gguf), "--threads", str(CORES),
                   "--max-tokens", "4", "--no-speculation")
    assert_quiet_success(proc)
