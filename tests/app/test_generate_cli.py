"""`localspec generate` end to end on the tiny real model: --json fields, streaming text equal to
the JSON text, stop strings, and --no-speculation giving the same greedy tokens."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def generate(tiny, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec.app.cli", "generate", "--model",
                           str(tiny.target_gguf), "--draft", str(tiny.draft_gguf), "--ctx", "512",
                           *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_json_and_stream_agree_and_match_plain(tiny):
    spec = generate(tiny, "def add(a, b):\n", "--raw", "--json", "--max-tokens", "24")
    assert spec.returncode == 0, spec.stderr
    out = json.loads(spec.stdout)
    assert set(out) == {"text", "tokens", "finish_reason", "stats"}
    assert out["stats"]["target_calls"] <= len(out["tokens"]) + 1
    assert {s["name"] for s in out["stats"]["stages"]} >= {"maxgram", "gguf-draft"}
    plain = json.loads(generate(tiny, "def add(a, b):\n", "--raw", "--json", "--max-tokens", "24",
                                "--no-speculation").stdout)
    assert plain["tokens"] == out["tokens"]
    streamed = generate(tiny, "--raw", "--max-tokens", "24", "--stats", stdin="def add(a, b):\n")
    assert streamed.returncode == 0 and streamed.stdout == out["text"] + "\n"   # CLI ends the line
    assert "tokens per call" in streamed.stderr


def test_stop_string_ends_the_text_before_it(tiny):
    full = json.loads(generate(tiny, "def add(a, b):\n", "--raw", "--json", "--max-tokens", "24").stdout)
    # a word from inside the model's own text (which words the tiny model writes depends on the
    # library versions it was trained with)
    stop = next((w for w in full["text"].split()[1:] if len(w) >= 3), None)
    assert stop, full["text"]
    cut = json.loads(generate(tiny, "def add(a, b):\n", "--raw", "--json", "--max-tokens", "24",
                              "--stop", stop).stdout)
    assert cut["text"] == full["text"].split(stop)[0] and cut["finish_reason"] == "stop"
    assert 0 < len(cut["text"]) < len(full["text"])


def test_chat_template_is_applied_unless_raw(tiny):
    out = json.loads(generate(tiny, "Say hello to Bob.", "--json", "--max-tokens", "16").stdout)
    assert out["stats"]["prompt_tokens"] > 8 and out["text"].strip()


@pytest.mark.slow
def test_head_option_drafts_with_the_head_and_keeps_greedy_output(tiny, tiny_head):
    args = ("class Person:\n    def __init__(self, name, age):\n", "--raw", "--json", "--max-tokens", "32")
    # (--fixed-budget: on this tiny target a head step costs more than the target's, so the
    # adaptive budget rightly leaves the head out: here it must draft)
    spec = generate(tiny, *args, "--head", str(tiny_head), "--no-personal", "--fixed-budget")
    assert spec.returncode == 0, spec.stderr
    out = json.loads(spec.stdout)
    # the head takes the draft model's place (one neural stage, one cost curve)
    assert {s["name"] for s in out["stats"]["stages"]} == {"maxgram", "head"}
    assert next(s for s in out["stats"]["stages"] if s["name"] == "head")["proposed"]
    plain = json.loads(generate(tiny, *args, "--no-speculation").stdout)
    assert plain["tokens"] == out["tokens"]
    bad = generate(tiny, *args, "--head", str(tiny.target_gguf))   # not a head file
    assert bad.returncode == 2 and "Not a usable draft head" in bad.stderr and "head train" in bad.stderr
