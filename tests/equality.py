"""Greedy equality with the near-tie explanation (../shared/docs/METHOD.md, "Numerics").

Speculative greedy output must equal plain greedy output; llama.cpp's logits shift slightly with
batch composition, so a difference is acceptable only where plain decoding itself stood at a
near-tie: the top-2 logit gap at the first differing position must be below `max_gap`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from localspec.engine.llama_model import LlamaModel


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def top2_gap(model: LlamaModel, tokens: Sequence[int]) -> float:
    """Gap between the two best logits after `tokens`, evaluated plainly."""
    model.clear()
    model.prefill(list(tokens), 0)
    row = np.sort(model.logits()[-1])
    return float(row[-1] - row[-2])


def check_same_or_near_tie(model: LlamaModel, prompt: Sequence[int], plain: Sequence[int],
                           spec: Sequence[int], max_gap: float) -> str:
    """'' when identical; a description when they differ at a near-tie; AssertionError otherwise."""
    i = first_difference(plain, spec)
    if i < 0:
        return ""
    if i == min(len(plain), len(spec)):
        raise AssertionError(f"one output is a prefix of the other (lengths {len(plain)}, {len(spec)})")
    gap = top2_gap(model, list(prompt) + list(plain[:i]))
    assert gap < max_gap, (f"outputs differ at token {i} ({plain[i]} vs {spec[i]}) where plain "
                           f"decoding had a clear top-2 gap of {gap:.4f}: not a near-tie")
    return f"differ at token {i}: near-tie, top-2 gap {gap:.4f}"
