"""`localspec serve` started as a user starts it, for the serve tests: a child process on
127.0.0.1 and a free port (--port 0: the address is read from the banner it prints)."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx

CLI = [sys.executable, "-m", "localspec.app.cli"]
START_S = 120          # to the banner, on a loaded 2-core machine (a first calibration included)
STOP_S = 20            # from a signal to the exit


@dataclass
class Served:
    proc: subprocess.Popen
    url: str                               # http://127.0.0.1:PORT/v1
    log: Path                              # its stderr: one line per request
    lines: list[str] = field(default_factory=list)   # its stdout

    @property
    def host(self) -> str:
        return self.url.split("//")[1].split("/")[0]

    @property
    def port(self) -> int:
        return int(self.host.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send `sig`, wait for the exit; its status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"serve did not exit within {STOP_S} s of {signal.Signals(sig).name}")

    def healthy(self) -> bool:
        r = httpx.get(f"http://{self.host}/health", timeout=10)
        return r.status_code == 200 and r.json()["status"] == "ok"


def start_server(tiny, *args: str, model: Path | None = None, env: dict | None = None) -> Served:
    """Serve the tiny pair, or `model` alone, on 127.0.0.1 and a free port, with `args`."""
    pair = ["--model", str(model)] if model else ["--model", str(tiny.target_gguf), "--draft", str(tiny.draft_gguf)]
    log = Path(tempfile.mkstemp(prefix="localspec-serve-", suffix=".log")[1])
    with open(log, "wb") as err:
        proc = subprocess.Popen([*CLI, "serve", *pair, "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, **(env or {})})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] and None, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if m := re.search(r"listening on (http://\S+/v1)", line):
            return Served(proc, m.group(1), log, seen)
    proc.kill()
    proc.wait()
    raise AssertionError(f"serve did not start: {seen}\n{log.read_text(errors='replace')[-3000:]}")
