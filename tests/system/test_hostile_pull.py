"""`localspec pull` from a mirror that streams for ever (issue 45): the file's bytes past its size,
the repo listing, a redirect's body. Each pull ends within BOUND with one error that says the hub
sent more than it announced (exit 2), and what it kept on disk is at most the file's size: before,
the listing and the redirect grew the process to the memory limit.
"""
from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import FakeHub
from test_pull import TINY, env_for     # tests/system is on sys.path under pytest

BOUND = 60                  # seconds: an unbounded read fills MEMORY_LIMIT well before this
MEMORY_LIMIT = 3 << 30      # address space for the pull, so that a regression cannot take the machine


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.parametrize("endless", ["file", "listing", "redirect"])
def test_a_mirror_that_streams_for_ever_ends_the_pull(tiny, tmp_path, endless):
    data = tmp_path / "data"
    with FakeHub() as hub:
        hub.add(TINY, {"target.gguf": Path(tiny.target_gguf)})
        if endless == "file":
            hub.fault(TINY, "target.gguf", endless=True)
        else:
            hub.endless = endless
        proc = subprocess.run([sys.executable, "-m", "localspec.app.cli", "pull", f"{TINY}:target.gguf",
                               "--no-draft"], env=env_for(data, hub), capture_output=True, text=True,
                              timeout=BOUND, preexec_fn=_limit_memory)
    assert proc.returncode == 2, proc.stderr
    assert "The hub sent more" in proc.stderr and "Out of memory" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "fix:" in proc.stderr, proc.stderr
    size = Path(tiny.target_gguf).stat().st_size
    assert all(p.stat().st_size <= size for p in data.rglob("*") if p.is_file())
    assert not (data / "models" / "manifest.json").exists()
