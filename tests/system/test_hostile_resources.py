"""Hostile input, round two (issue 45): resources a user can set, and the machine's own limits.

`--threads 100000` segfaulted (exit 139), 50000 failed in libgomp, 4096 took a minute for five
tokens: a thread count is now at most the cores this process may use, refused before anything
loads. Each case ends within its subprocess timeout.
"""
from __future__ import annotations

import os
import resource

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


# ---- a low limit on open files -----------------------------------------------------------------
def _open_files_limit(n: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return set_limit


def test_chat_screen_says_the_engine_cannot_start_under_a_low_open_file_limit(tiny):
    """`ulimit -n` so low that the chat screen opens but starting the engine process fails with
    EMFILE: the screen died with a Textual traceback; now it says why and how to fix it, and F5
    tries again without one. How many files the screen itself holds varies by machine: the limits around it
    are tried until one lets the screen open and stops the engine; none may end in a traceback."""
    from test_hostile_tui import Terminal

    for limit in (16, 15, 17, 14, 18, 19, 20, 22, 24):
        term = Terminal("--model", str(tiny.target_gguf), "--ctx", "256",
                        preexec_fn=_open_files_limit(limit))
        try:
            term.read_until(b"Esc stops a reply", timeout=QUICK_S)
            shown = term.read_until(b"Cannot start the engine process", timeout=10)
            assert b"Traceback" not in term.output, term.output[-3000:]
            if shown:
                assert term.read_until(b"ulimit -n"), term.output[-3000:]
                term.type(b"\x1b[15~")                        # F5: tries again
                term.read_until(b"Traceback", timeout=3)
                assert b"Traceback" not in term.output and term.proc.poll() is None   # the chat goes on
                print(f"the engine could not start under ulimit -n {limit}")
                return
        finally:
            term.close()
    pytest.fail("no limit let the chat screen open and stopped the engine")


def test_a_limit_too_low_for_the_screen_is_said(tiny):
    """Below what the screen itself needs: the command ends with the limit named in the fix."""
    proc = run_cli("chat", "--line", "--model", str(tiny.target_gguf), stdin=b"hi\n",
                   preexec_fn=_open_files_limit(8), timeout=QUICK_S)
    assert_clean_error(proc, "Too many open files", "ulimit -n")
