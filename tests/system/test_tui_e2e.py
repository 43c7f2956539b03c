"""End to end: the installed `localspec chat` in a real terminal (tmux, fixed size) on the tiny
model: type a message, see the reply stream in, quit with Ctrl+Q; and kill -9 the app after a
reply: the history holds it, complete, and the engine process does not outlive the app."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.app.history import History

LOCALSPEC = Path(sys.executable).parent / "localspec"
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """One private tmux server (its own socket) running one pane of a fixed size."""

    def __init__(self, name: str) -> None:
        self.socket = f"{name}-{os.getpid()}"

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True,
                              capture_output=True, text=True).stdout

    def start(self, command: str, env: dict[str, str], status_file: Path) -> None:
        """Run `command` under a shell that writes its exit status to `status_file` (tmux 3.3
        reports no status for a signal, and a TUI's last screen may hide a printed one)."""
        self.status_file = status_file
        self("new-session", "-d", "-s", "main", "-x", "110", "-y", "32")
        self("set-option", "-t", "main", "remain-on-exit", "on")
        self("set-option", "-t", "main", "window-size", "manual")
        self("resize-window", "-t", "main", "-x", "110", "-y", "32")
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        tmp = f"{status_file}.tmp"
        self("respawn-pane", "-k", "-t", "main",
             f"env {exports} {command}; echo $? > {tmp}; mv {tmp} {status_file}")

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "main")

    def wait_for(self, text: str, timeout: float = 60.0, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if screen.count(text) >= count:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared; the screen:\n{self.screen()}")

    def pane(self, fmt: str) -> str:
        return self("display-message", "-p", "-t", "main", fmt).strip()

    def exit_status(self, timeout: float = 20.0) -> int:
        """The app's exit status once it ended (128 + N: killed by signal N)."""
        deadline = time.monotonic() + timeout
        while not self.status_file.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"the app did not exit; the screen:\n{self.screen()}")
            time.sleep(0.1)
        return int(self.status_file.read_text())

    def app_pid(self) -> int:
        shell = self.pane("#{pane_pid}")
        return int(subprocess.run(["pgrep", "-P", shell], capture_output=True,
                                  text=True).stdout.split()[0])

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux():
    t = Tmux("localspec-e2e")
    yield t
    t.close()


def _start_chat(tmux: Tmux, tiny, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    tmux.start(f"{LOCALSPEC} chat --model {tiny.target_gguf} --ctx 1024",
               {"LOCALSPEC_DATA_DIR": str(data), "LOCALSPEC_CONFIG_DIR": str(tmp_path / "cfg")},
               tmp_path / "exit-status")
    # the engine is ready: after a first calibration of the model, which a busy machine slows
    # (over 60 s with another process keeping a core busy)
    tmux.wait_for("target.gguf · CPU", timeout=300.0)
    return data / "history.sqlite"


def test_chat_in_a_terminal_streams_a_reply_and_quits(tmux, tiny, tmp_path):
    history = _start_chat(tmux, tiny, tmp_path)
    tmux("send-keys", "-t", "main", "-l", "Say hello to Bob.")
    tmux("send-keys", "-t", "main", "Enter")
    tmux.wait_for("Hello, Bob!")
    tmux.wait_for("tok/call")                                  # the status bar has the numbers
    tmux("send-keys", "-t", "main", "C-q")
    assert tmux.exit_status() == 0
    with History.open(history) as h:
        (conv,) = h.conversations()
        assert [(m.role, m.state) for m in h.messages(conv.id)] == [("user", "complete"),
                                                                     ("assistant", "complete")]


def test_kill_minus_9_keeps_the_acknowledged_history(tmux, tiny, tmp_path):
    history = _start_chat(tmux, tiny, tmp_path)
    app_pid = tmux.app_pid()
    engine_pid = int(subprocess.run(["pgrep", "-P", str(app_pid)], capture_output=True,
                                    text=True).stdout.split()[0])
    for n, (text, reply) in enumerate([("Say hello to Bob.", "Hello, Bob!"),
                                       ("Write a function that adds 2 to a number.",
                                        "return x + 1")]):
        tmux("send-keys", "-t", "main", "-l", text)
        tmux("send-keys", "-t", "main", "Enter")
        tmux.wait_for(reply)                                   # shown as it streams in
        # shown complete: each finished reply's header has its numbers, and so has the status bar
        tmux.wait_for("tok/call", count=n + 2)
    os.kill(app_pid, signal.SIGKILL)
    assert tmux.exit_status() == 128 + signal.SIGKILL
    with History.open(history) as h:
        assert h.integrity_ok()
        (conv,) = h.conversations()
        rows = h.messages(conv.id)
    assert [(m.role, m.state) for m in rows] == [("user", "complete"), ("assistant", "complete")] * 2
    assert "Bob" in rows[1].content and "return x + 1" in rows[3].content
    deadline = time.monotonic() + 20
    while _running(engine_pid) and time.monotonic() < deadline:   # its stdin closed: it exits
        time.sleep(0.1)
    assert not _running(engine_pid)


def _running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
