"""Where speculative and plain greedy output part, and whether that is a numerical near-tie.

llama.cpp's logits shift slightly with batch composition (docs/exact-numerics.md),
so greedy speculation is exact with respect to the logits the target computed, and a difference
from a plain run is explained only if plain decoding itself stood at a near-tie there: a small gap
between its two best logits at the first differing position. The bench reports that gap and the
tests demand it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .llama_model import LlamaModel


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first differing token; -1 when equal; the shorter length for a prefix."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def top2_gap(model: LlamaModel, tokens: Sequence[int]) -> float:
    """Gap between the two best logits after `tokens`, evaluated plainly (clears the cache)."""
    model.clear()
    model.prefill(list(tokens), 0)
    row = np.partition(model.logits()[-1], -2)[-2:]      # two largest, unordered
    return float(abs(row[1] - row[0]))
