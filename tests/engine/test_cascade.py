"""Vertical cascade: the draft checks a cheaper stage's chain in the same forward as the node above it.

On a repetitive prompt Max-Gram proposes long chains; with the cascade on, the draft model needs fewer
forwards for the same trees, and output stays the target's own greedy output (llama.cpp and PyTorch
drafts).
"""
from __future__ import annotations

import pytest
from localspec.engine.config import DraftLimits, TreeBudget
from localspec.engine.session import Session
from localspec.engine.options import Options

_BLOCK = ("def total(items):\n    result = 0\n    for item in items:\n        result += item\n"
          "    return result\n\n\n")
PROMPT = _BLOCK + _BLOCK + "def total(items):\n"   # the tiny target repeats the block


def _run(tiny, draft, chain: int) -> tuple[list[int], int, int]:
    session = Session(Options(tiny.target_gguf, draft=draft, n_ctx=512, n_threads=1,
                                   budget=TreeBudget(max_nodes=16),
                                   draft_limits=DraftLimits(max_depth=8, branching=2, width=2, chain=chain)))
    drafter = session.stages[-1]
    counts = {"forwards": 0, "nodes": 0}
    evaluate = drafter.evaluate

    def counting(tree, nodes):
        counts["forwards"] += 1
        counts["nodes"] += len(nodes)
        return evaluate(tree, nodes)

    drafter.evaluate = counting
    try:
        result = session.run(session.raw_prompt(PROMPT), max_tokens=40)
    finally:
        session.close()
    return result.tokens, counts["forwards"], counts["nodes"]


@pytest.mark.parametrize("kind", ["gguf", "torch"])
def test_cascade_checks_chains_in_fewer_forwards_and_keeps_output(tiny, kind):
    draft = tiny.draft_gguf if kind == "gguf" else tiny.draft_torch
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    try:
        expect = plain.run(plain.raw_prompt(PROMPT), max_tokens=40).tokens
    finally:
        plain.close()
    off_tokens, off_forwards, _ = _run(tiny, draft, chain=0)
    on_tokens, on_forwards, on_nodes = _run(tiny, draft, chain=8)
    assert off_tokens == expect and on_tokens == expect
    assert on_nodes > on_forwards * 2, "chains should ride along: more than width nodes per forward"
    assert on_forwards < off_forwards, (on_forwards, off_forwards)
