"""`localspec ask` on the tiny real model: piped stdin joins the question as a fenced block and the
answer equals `generate` of that composed prompt; settings supply the model, flags override them;
no model configured is a clean error naming the fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from localspec.app.ask import compose_question
from localspec.engine.errors import LocalspecError

QUESTION = "Write a function that returns the largest number in a list."
PIPED = "def largest(xs):\n    return max(xs)\n"


def cli(*args: str, stdin: str | None = None, config_dir=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if config_dir is not None:
        env["LOCALSPEC_CONFIG_DIR"] = str(config_dir)
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300, env=env)


def test_compose_question_fences_piped_text():
    assert compose_question("explain", "x = 1\n") == "explain\n\n```\nx = 1\n```"
    assert compose_question("explain", None) == "explain"
    assert compose_question(None, "x = 1") == "```\nx = 1\n```"
    assert compose_question("q", "a ``` b\n").startswith("q\n\n````\n")   # fence outgrows the text's
    with pytest.raises(LocalspecError, match="Empty question"):
        compose_question("  ", "  \n")


def test_ask_with_piped_stdin_equals_generate(tiny, tmp_path):
    model = ["--model", str(tiny.target_gguf), "--draft", str(tiny.draft_gguf), "--ctx", "1024",
             "--max-tokens", "48"]
    asked = cli("ask", QUESTION, *model, "--stats", stdin=PIPED, config_dir=tmp_path)
    assert asked.returncode == 0, asked.stderr
    assert "tokens per call" in asked.stderr
    composed = compose_question(QUESTION, PIPED)
    generated = cli("generate", composed, *model, "--json")
    assert generated.returncode == 0, generated.stderr
    text = json.loads(generated.stdout)["text"]
    assert text and asked.stdout == text + ("" if text.endswith("\n") else "\n")


def test_settings_supply_the_model_and_flags_override_them(tiny, tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps(
        {"model": str(tiny.target_gguf), "max_tokens": 3, "stages": []}))
    short = cli("ask", QUESTION, "--ctx", "1024", config_dir=tmp_path, stdin="")
    longer = cli("ask", QUESTION, "--ctx", "1024", "--max-tokens", "48", config_dir=tmp_path, stdin="")
    assert short.returncode == 0 and longer.returncode == 0, short.stderr + longer.stderr
    assert longer.stdout.startswith(short.stdout.rstrip("\n")) and len(longer.stdout) > len(short.stdout)


def test_no_model_configured_names_the_fix(tmp_path):
    proc = cli("ask", "hello", config_dir=tmp_path / "empty", stdin="")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "No model configured" in proc.stderr
    for fix in ("--model", "localspec pull", "localspec import"):
        assert fix in proc.stderr
