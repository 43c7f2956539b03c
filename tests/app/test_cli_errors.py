"""Bad input gets a clear error naming the fix: exit status 2, no traceback, nothing written."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "fix:" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


def test_missing_model(tmp_path):
    assert_clean_error(run_cli("generate", "hi", "--model", str(tmp_path / "nope.gguf")),
                       "not found", "nope.gguf")


def test_non_gguf_model(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is not a model\n" * 10)
    assert_clean_error(run_cli("generate", "hi", "--model", str(bogus)), "Not a GGUF model file")


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_model(tmp_path, tiny, keep):
    data = Path(tiny.target_gguf).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    assert_clean_error(run_cli("generate", "hi", "--model", str(cut)), "truncated", "Re-download")


def test_truncated_inside_header(tmp_path, tiny):
    cut = tmp_path / "head.gguf"
    cut.write_bytes(Path(tiny.target_gguf).read_bytes()[:4000])
    assert_clean_error(run_cli("generate", "hi", "--model", str(cut)), "truncated")


@pytest.mark.parametrize("kind", ["gguf", pytest.param("torch", marks=pytest.mark.slow)])
def test_draft_vocabulary_mismatch_names_both_sizes(tiny, kind):
    other = tiny.other_vocab_gguf if kind == "gguf" else tiny.other_vocab_torch
    proc = run_cli("generate", "hi", "--raw", "--model", str(tiny.target_gguf), "--draft", str(other))
    from localspec.engine.llama_model import LlamaModel
    target = LlamaModel(tiny.target_gguf, n_ctx=64)
    try:
        sizes = (str(target.vocab_size),)
    finally:
        target.close()
    assert_clean_error(proc, "vocabulary does not match", *sizes)
    import re
    numbers = set(re.findall(r"(\d+) tokens", proc.stderr))
    assert len(numbers) == 2, proc.stderr   # both vocabulary sizes named


def test_prompt_longer_than_context(tiny):
    prompt = "def f(x):\n    return x\n" * 200
    proc = run_cli("generate", "--raw", "--model", str(tiny.target_gguf), "--ctx", "128", stdin=prompt)
    assert_clean_error(proc, "longer than the context", "--ctx")


def test_empty_prompt(tiny):
    assert_clean_error(run_cli("generate", "--model", str(tiny.target_gguf), stdin="  \n"), "Empty prompt")


def test_bad_sampling_option(tiny):
    assert_clean_error(run_cli("generate", "hi", "--model", str(tiny.target_gguf), "--top-p", "0"),
                       "--top-p", "0 < top-p <= 1")


@pytest.mark.parametrize("flags, needles", [
    (("--temperature", "nan"), ("--temperature nan", "finite number >= 0")),
    (("--tree-nodes", "0"), ("--tree-nodes 0", "from 1 to 64")),
    (("--tree-nodes", "100000"), ("--tree-nodes 100000", "from 1 to 64")),
    (("--ctx", "-1"), ("--ctx -1", "from 0 to")),
    (("--seed", "-1", "--temperature", "0.7"), ("--seed -1", "integer >= 0")),
    (("--top-k", "-1"), ("--top-k -1", "integer >= 0")),
    (("--max-tokens", "0"), ("--max-tokens 0", "integer >= 1")),
])
def test_bad_option_values_name_the_flag_and_the_range(tiny, flags, needles):
    proc = run_cli("generate", "hi", "--model", str(tiny.target_gguf), *flags)
    assert_clean_error(proc, *needles)
    assert "Lower --ctx" not in proc.stderr


def test_every_command_refuses_a_bad_value_in_the_same_words(tiny, tmp_path):
    model = str(tiny.target_gguf)
    runs = {"generate": ("generate", "hi"), "ask": ("ask", "hi"), "chat": ("chat",),
            "chat --line": ("chat", "--line"), "bench": ("bench", "--out", str(tmp_path / "b")),
            "calibrate": ("calibrate",)}
    errors = {}
    for name, argv in runs.items():
        proc = run_cli(*argv, "--model", model, "--temperature", "nan", stdin="")
        assert_clean_error(proc, "--temperature nan")
        errors[name] = proc.stderr
    assert len(set(errors.values())) == 1, errors
