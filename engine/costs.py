"""The measured costs the engine prices its trees by: seconds per decode of n tokens for the target
and a model draft, read as rising curves, and what they rule out before a round is played.

The curve decides which tree budgets the adaptive policy may try at all. A budget whose best
case loses to plain decoding is dropped: best case means every drafted token accepted along a
chain as deep as the budget allows, with acceptance `tuning.OPTIMISTIC` per depth, against a verify cost
of n + 1 tokens plus the draft's forwards. On a slow CPU, where each extra row costs a good part
of a plain step, only small trees survive; on a GPU, where rows are nearly free, all of them do.
What survives is then chosen online by measured throughput (the bandit, `budget.py`). Why:
docs/decisions/0001; the measurement itself is calibrate.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

from . import tuning
from .budget import Arm
from .native import (CUDA_MMQ_WIDTHS, CUDA_MULTICOL_WIDTHS, CUDA_STREAM_WIDTHS, MULTICOL_MAX, MULTICOL_MIN,
                     TILED_MIN)


@dataclass(frozen=True)
class Costs:
    """Seconds per decode of n tokens (keys are n), for the target and the model draft."""

    target: dict[int, float]
    draft: dict[int, float]
    file: Path | None = None    # where they are cached (None: not cached)
    # seconds lost when the target's batch shape changes and changes back (a CUDA graph rebuilt
    # twice); 0 on a CPU. A speculative round entered from plain ones pays it.
    switch: float = 0.0
    # the fewest batch rows on ggml's tiled matmul that the curve was measured with and decodes
    # must run with (`tiled_floor`; a CPU with packaging/patches), None: ggml's own choice
    tiled_min: int | None = None
    # the fewest batch rows on packaging/patches' multi-column kernels, likewise (`one_row_kernels`:
    # 1 puts one-row decodes on them, 2 keeps those on ggml's), None: the patch's own choice
    multicol_min: int | None = None
    # the most batch rows on the multi-column kernels that the curve and the floor were measured
    # with, likewise (calibrate.MULTICOL_WIDEST), None: the patch's own bound
    multicol_max: int | None = None
    # on a GPU with packaging/patches, the batch widths (bit n-1: n rows, 1..16) the curve was
    # measured with and decodes must run with on the CUDA multi-column kernels, and on ggml's
    # mul_mat_q where ggml would take its mat-vec, and whose quantized matmuls take the streaming kernel
    # (`calibrate.cuda_widths`), None: the patch's own
    cuda_multicol_widths: int | None = None
    cuda_mmq_widths: int | None = None
    cuda_stream_widths: int | None = None

    @property
    def switches(self) -> dict[str, str]:
        """The numerics switches (native.py) these costs hold under: what a session enters around
        its decodes (native.switched), never left set in the process."""
        chosen = {TILED_MIN: self.tiled_min, MULTICOL_MIN: self.multicol_min, MULTICOL_MAX: self.multicol_max,
                  CUDA_MULTICOL_WIDTHS: self.cuda_multicol_widths, CUDA_MMQ_WIDTHS: self.cuda_mmq_widths,
                  CUDA_STREAM_WIDTHS: self.cuda_stream_widths}
        return {key: str(value) for key, value in chosen.items() if value is not None}

    @cached_property
    def _rising(self) -> tuple[dict[int, float], dict[int, float]]:
        """The target's and the draft's curves, each point at least the one before it: a batch
        costs no less than a smaller one, where a measurement (a burst of one size timed apart
        from the rest) can come out below its neighbour and make a row look free or the curve
        fall beyond its end."""
        return _rising(self.target), _rising(self.draft)

    @staticmethod
    def _at(curve: dict[int, float], n: int) -> float:
        sizes = sorted(curve)
        if n in curve:
            return curve[n]
        if n > sizes[-1]:   # beyond the measured range: extend the last slope
            a, b = sizes[-2], sizes[-1]
            return curve[b] + (curve[b] - curve[a]) / (b - a) * (n - b)
        hi = next(s for s in sizes if s > n)
        lo = max(s for s in sizes if s < n)
        return curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)

    def target_cost(self, n: int) -> float:
        return self._at(self._rising[0], n)

    @property
    def cheap_switch(self) -> bool:
        """A change of batch shape costs less than a plain step: then a GPU's batches can take
        whatever size a round needs instead of one padded size (llama.cpp built with
        packaging/patches keeps a CUDA graph per shape, well under a plain step; as shipped a
        change costs more than one). A stricter threshold would send a patched GPU to padded,
        held rounds, losing Max-Gram's gain (docs/decisions/0004)."""
        return self.switch <= self.target_cost(1)

    def draft_cost(self, n: int) -> float:
        return self._at(self._rising[1], n) if self.draft else 0.0

    def growth_floor(self, width: int) -> float:
        """The path probability a neural drafter's node must reach to pay here (DraftLimits.floor):
        what it costs, a verify row (the mean of the first `width` rows beyond the root's) and,
        alone at its depth, one drafter step, in plain target steps, the price of the token it
        saves when accepted."""
        width = max(1, width)
        row = (self.target_cost(1 + width) - self.target_cost(1)) / width
        return min(1.0, (row + self.draft_cost(1)) / self.target_cost(1))

    def best_case_rate(self, arm: Arm, width: int, max_depth: int) -> float:
        """Tokens per second of `arm` if drafts were accepted at tuning.OPTIMISTIC along a chain."""
        if arm.nodes == 0:
            return 1.0 / self.target_cost(1)
        depth = min(arm.nodes, max_depth) if arm.models else arm.nodes
        p = tuning.OPTIMISTIC
        tokens = (1 - p ** (depth + 1)) / (1 - p)
        seconds = self.target_cost(arm.nodes + 1)
        if arm.models and self.draft:
            forwards = 1 + math.ceil(arm.nodes / max(1, width))
            seconds += self.draft_cost(1) + (forwards - 1) * self.draft_cost(min(width, arm.nodes))
        return tokens / seconds

    def viable(self, arms: Sequence[Arm], width: int, max_depth: int) -> tuple[Arm, ...]:
        """The arms whose best case beats plain decoding (plain itself always stays)."""
        plain = 1.0 / self.target_cost(1)
        return tuple(a for a in arms
                     if a.nodes == 0 or self.best_case_rate(a, width, max_depth) > plain)

    def to_dict(self) -> dict:
        """The curves in ms, the shape change's price and the switches they were measured under."""
        out = {"target_ms": {n: round(1e3 * s, 2) for n, s in self.target.items()},
               "draft_ms": {n: round(1e3 * s, 2) for n, s in self.draft.items()},
               "switch_ms": round(1e3 * self.switch, 2)}
        rows = {"ggml_tiled_min_rows": self.tiled_min, "multicol_min_rows": self.multicol_min,
                "multicol_max_rows": self.multicol_max}
        widths = {"cuda_multicol_widths": self.cuda_multicol_widths, "cuda_mmq_widths": self.cuda_mmq_widths,
                  "cuda_stream_widths": self.cuda_stream_widths}
        return (out | {key: value for key, value in rows.items() if value is not None}
                | {key: _widths(mask) for key, mask in widths.items() if mask is not None})


def _rising(curve: dict[int, float]) -> dict[int, float]:
    out, top = {}, 0.0
    for n in sorted(curve):
        top = out[n] = max(top, curve[n])
    return out


def _widths(mask: int) -> list[int]:
    """The batch widths a per-width mask names (bit n-1: n rows)."""
    return [n for n in range(1, mask.bit_length() + 1) if mask >> (n - 1) & 1]
