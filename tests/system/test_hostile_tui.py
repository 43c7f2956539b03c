"""Hostile input at the chat screen (issue 20), in a real pseudo-terminal: bytes that are not UTF-8
typed or pasted into the prompt, and SIGTERM. Each case ends within TIMEOUT_S.

Textual's own driver decoded keyboard input strictly: one such byte killed the app (exit 0) and
the unsent text with it; SIGTERM left the terminal raw, on the alternate screen.
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

TIMEOUT_S = 60
ALT_SCREEN_OFF = b"\x1b[?1049l"      # what restoring the terminal writes last


class Terminal:
    """`localspec chat ARGS` on a pseudo-terminal of 100x30; what it wrote so far in `output`.
    `popen`: Popen's arguments over these (another stdout, a preexec_fn)."""

    def __init__(self, *args: str, **popen) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
        self.proc = subprocess.Popen([sys.executable, "-m", "localspec.app.cli", "chat", *args],
                                     **{"stdin": slave, "stdout": slave, "stderr": slave,
                                        "env": env, "start_new_session": True, **popen})
        os.close(slave)
        self.output = b""

    def read_until(self, needle: bytes, timeout: float = TIMEOUT_S) -> bool:
        end = time.monotonic() + timeout
        while needle not in self.output and time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:      # the app exited and the terminal closed
                    break
        return needle in self.output

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def test_non_utf8_bytes_typed_into_the_chat_keep_the_app_and_the_text(tiny):
    term = Terminal("--model", str(tiny.target_gguf), "--ctx", "256")
    try:
        assert term.read_until(b"Esc stops a reply"), term.output[-2000:]
        term.type(b"caf\xe9 \xff\xfe bytes")               # Latin-1 and stray bytes, unsent
        assert term.read_until("caf\ufffd \ufffd\ufffd bytes".encode()), term.output[-2000:]
        assert term.proc.poll() is None                      # still running, the text on screen
        term.proc.send_signal(signal.SIGTERM)
        assert term.proc.wait(timeout=TIMEOUT_S) == 128 + signal.SIGTERM
        term.read_until(ALT_SCREEN_OFF, timeout=5)
        assert ALT_SCREEN_OFF in term.output and b"Traceback" not in term.output
    finally:
        term.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_restore_the_terminal_on_the_first_run_screen(signum):
    term = Terminal()   # no model anywhere: the first-run screen
    try:
        assert term.read_until(b"localspec import"), term.output[-2000:]
        term.proc.send_signal(signum)
        assert term.proc.wait(timeout=TIMEOUT_S) == 128 + signum
        term.read_until(ALT_SCREEN_OFF, timeout=5)
        assert ALT_SCREEN_OFF in term.output and b"Traceback" not in term.output
    finally:
        term.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_a_message_longer_than_the_context_stays_unsent(tmp_path):
    from tui_support import demo_app

    from localspec.app.inputs import prompt_limit

    app = demo_app(tmp_path)
    async with app.run_test(size=(110, 34)) as pilot:
        await pilot.pause()
        before = len(app.history.conversations())
        prompt = app.chat.query_one("#prompt")
        pasted = "y\n" * (prompt_limit(app.base_spec.n_ctx) // 2 + 1)     # `yes` pasted in
        prompt.text = pasted
        await pilot.press("enter")
        notice = app.chat.query_one("#notice")
        assert notice.display and "longer than the context" in str(notice.render())
        assert prompt.text == pasted                                    # kept, not lost
        assert len(app.history.conversations()) == before and not app.engine.requests
