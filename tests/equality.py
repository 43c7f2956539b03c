"""Greedy equality with the near-tie explanation (engine/numerics.py)."""
from __future__ import annotations

from typing import Sequence

from localspec.engine.llama_model import LlamaModel
from localspec.engine.numerics import first_difference, top2_gap


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
