"""Offline by construction: a generation opens no socket, and only `pull` leaves the hub client
online.

The generation runs as a real `localspec generate` process with a `sitecustomize.py` on its
PYTHONPATH that installs an audit hook before any localspec code runs; the hook records every
socket.connect / socket.bind / socket.getaddrinfo / socket.sendto the process attempts, and at exit
whether huggingface_hub was loaded and, if so, whether it believed itself offline. The PyTorch
draft is used so that transformers and huggingface_hub are actually loaded. A control process
with the same hook that does connect shows the hook sees what it is meant to see.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from localspec.app.cli import ONLINE_COMMANDS, set_network_mode

SITECUSTOMIZE = '''
import atexit, json, os, sys

_EVENTS = ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
           "socket.sendmsg", "socket.gethostbyname")
_seen = []

def _hook(event, args):
    if event in _EVENTS:
        _seen.append([event, repr(args)[:200]])

sys.addaudithook(_hook)

def _report():
    hub = sys.modules.get("huggingface_hub.constants")
    with open(os.environ["SOCKET_AUDIT_OUT"], "w") as fh:
        json.dump({"events": _seen,
                   "hub_loaded": hub is not None,
                   "hub_offline": None if hub is None else bool(hub.HF_HUB_OFFLINE),
                   "transformers_loaded": "transformers" in sys.modules,
                   "env": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}},
                  fh)

atexit.register(_report)
'''


@pytest.fixture
def audited(tmp_path):
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = tmp_path / "audit.json"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")])),
               SOCKET_AUDIT_OUT=str(out), LOCALSPEC_DATA_DIR=str(tmp_path / "data"))

    def run(*argv: str) -> tuple[subprocess.CompletedProcess, dict]:
        proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                              timeout=300)
        return proc, json.loads(out.read_text())
    return run


def test_generation_opens_no_socket_and_the_hub_client_is_offline(audited, tiny):
    proc, audit = audited("-m", "localspec.app.cli", "generate", "def add(a, b):", "--raw",
                          "--model", str(tiny.target_gguf), "--draft", str(tiny.draft_torch),
                          "--max-tokens", "8", "--ctx", "512", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 8
    assert audit["events"] == []
    assert audit["transformers_loaded"] and audit["hub_loaded"]     # the client was there ...
    assert audit["hub_offline"] is True                              # ... and offline
    assert audit["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_the_audit_hook_does_see_a_connection(audited):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        proc, audit = audited("-c", f"import socket; socket.create_connection(('127.0.0.1', {port})).close()")
    assert proc.returncode == 0, proc.stderr
    assert "socket.connect" in {event for event, _ in audit["events"]}


def test_only_pull_is_online(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_TELEMETRY", raising=False)
    assert ONLINE_COMMANDS == {"pull"}
    for command in ("generate", "chat", "bench", "list", "import", "rm", "ngram", "some-new-one"):
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        set_network_mode(command)
        assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1", command
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    set_network_mode("pull")
    assert "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ
    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_importing_the_command_line_is_enough_to_be_offline():
    """A chat UI started another way than `localspec ...` imports the CLI module: offline too."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    code = ("import os, localspec.app.cli, huggingface_hub.constants as c; "
            "print(os.environ['HF_HUB_OFFLINE'], os.environ['TRANSFORMERS_OFFLINE'], c.HF_HUB_OFFLINE)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "True"]
