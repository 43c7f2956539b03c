"""Text files the user points at (issue 45): a file with NUL bytes only past its first pages is
binary all the same, for `/file` in the chat and `ngram add-file`, as the README promises; and
`ngram show/add-file --model` take an installed model's name as every other `--model` does.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.app.tui.attach import attachment_block
from localspec.engine.errors import LocalspecError

BOUND_S = 60


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", *args], env=env,
                          capture_output=True, text=True, timeout=BOUND_S, stdin=subprocess.DEVNULL)


@pytest.fixture()
def data_env(tmp_path) -> dict:
    (tmp_path / "data").mkdir()
    return dict(os.environ, LOCALSPEC_DATA_DIR=str(tmp_path / "data"))


def late_nul(path: Path) -> Path:
    """Text for 64 KiB, then one NUL byte: binary past what a probe of the first pages sees."""
    path.write_bytes(b"def f():\n    return 1\n" * 3000 + b"\0tail\n")
    return path


def test_attaching_a_file_with_a_nul_past_its_first_pages_is_refused(tmp_path):
    with pytest.raises(LocalspecError) as err:
        attachment_block(str(late_nul(tmp_path / "notes.py")))
    assert err.value.title == "Cannot attach the file" and "binary" in err.value.cause


def test_add_file_with_a_nul_past_its_first_pages_is_refused(tiny, data_env, tmp_path):
    proc = cli("ngram", "add-file", str(late_nul(tmp_path / "notes.py")), "--model",
               str(tiny.target_gguf), env=data_env)
    assert proc.returncode == 2 and "binary" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not list((Path(data_env["LOCALSPEC_DATA_DIR"]) / "ngrams").glob("*.sqlite"))


def test_ngram_takes_an_installed_models_name(tiny, data_env, tmp_path):
    proc = cli("import", "tiny", str(tiny.target_gguf), env=data_env)
    assert proc.returncode == 0, proc.stderr
    notes = tmp_path / "notes.txt"
    notes.write_text("def add(a, b):\n    return a + b\n" * 20)
    proc = cli("ngram", "add-file", str(notes), "--model", "tiny", env=data_env)
    assert proc.returncode == 0 and "Added file" in proc.stdout, proc.stderr
    proc = cli("ngram", "show", "--model", "tiny", env=data_env)
    assert proc.returncode == 0 and str(notes) in proc.stdout, proc.stderr
    proc = cli("ngram", "show", "--model", "absent", env=data_env)
    assert proc.returncode == 2 and "Model 'absent' is not installed" in proc.stderr, proc.stderr
