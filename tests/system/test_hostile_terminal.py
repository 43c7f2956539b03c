"""Hostile input, round two (issue 45): the terminal localspec writes to.

The chat screen without a terminal ends at once, naming line mode, instead of spinning. Each case
ends within its subprocess timeout.
"""
from __future__ import annotations

import os
import signal
import subprocess

import pytest
from test_hostile_cli import CLI, QUICK_S, assert_clean_error


# ---- the chat screen without a terminal --------------------------------------------------------
@pytest.mark.parametrize("stdin", [b"hi\n", subprocess.DEVNULL])
def test_chat_screen_without_a_terminal_names_line_mode(stdin):
    """`echo hi | localspec chat`, `localspec chat </dev/null`: spun at 100% CPU writing escape
    codes until killed; now refused at once, nothing written to stdout."""
    proc = subprocess.run([*CLI, "chat", "--ctx", "256"], capture_output=True, timeout=QUICK_S,
                          **({"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}))
    assert_clean_error(proc, "needs a terminal", "stdin and stderr are not", "localspec chat --line")
    assert proc.stdout == b""


def test_chat_screen_drawn_into_a_file_names_line_mode(tmp_path):
    """Keys from a terminal, but stderr (where Textual draws the screen) redirected: the screen
    went into the file and the terminal stayed blank, waiting for keys."""
    master, slave = os.openpty()
    try:
        with open(tmp_path / "log", "wb") as log:
            proc = subprocess.run([*CLI, "chat"], stdin=slave, stdout=slave, stderr=log,
                                  timeout=QUICK_S)
    finally:
        os.close(master)
        os.close(slave)
    assert proc.returncode == 2
    err = (tmp_path / "log").read_text()
    assert "needs a terminal" in err and "stderr is not" in err and "localspec chat --line" in err


def test_chat_screen_with_stdout_redirected_still_opens(tiny, tmp_path):
    """stdout is not where the screen goes: `localspec chat > file` is a working chat."""
    from test_hostile_tui import Terminal

    with open(tmp_path / "out", "wb") as out:
        term = Terminal("--model", str(tiny.target_gguf), "--ctx", "256", stdout=out)
        try:
            assert term.read_until(b"Esc stops a reply"), term.output[-2000:]
            term.proc.send_signal(signal.SIGTERM)
            assert term.proc.wait(timeout=QUICK_S) == 128 + signal.SIGTERM
        finally:
            term.close()
    assert (tmp_path / "out").read_bytes() == b""
