"""A free stage's one gate: whether it drafts this round, and how many nodes it may add.

A free stage costs no model call, but not nothing: the personal n-gram stage looks up fresh
contexts in its store and scores each node it grows, a head on a CPU steps once a tree level.
That is a large part of a GPU's target step and next to nothing of a CPU's. Per stage this keeps
decayed means of the seconds its `propose` took and of the tokens it got accepted per round it
ran; a stage runs while those tokens, at the price of a plain target step, are worth its seconds.
A stage that does not pay is tried again now and then (budget.probe_gap, the bandit's schedule),
so one that starts to pay (a chat turning to what the user wrote before) is noticed. A round
whose stage's own tokens paid for its own time lets it run the next round too, and so on while
that holds: the means alone, moved a little a round, would take a dozen such rounds to reopen
the gate.

A stage that runs grows at most about twice what pruning kept of it lately: nodes grown only to
be pruned cost Python time and return nothing. The constants are engine/tuning.py's.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import tuning
from .budget import probe_gap


class StageWorth:
    def __init__(self, n_stages: int, step_seconds: float) -> None:
        """step_seconds: a plain target step, the price of an accepted token."""
        # plain lists: a round touches two or three numbers, where numpy's per-call overhead
        # would be a visible part of a GPU's plain step
        self.seconds = [0.0] * n_stages
        self.tokens = [1.0] * n_stages      # optimistic until measured
        self.step = step_seconds
        self.rounds = 0
        self._next_try = [0] * n_stages
        self._ran: list[float | None] = [None] * n_stages   # this round: seconds of each propose
        self._paid = [False] * n_stages      # its last round's tokens paid for that propose
        self._kept_mean = np.zeros(n_stages)   # nodes pruning kept of each: decayed mean
        self._kept_last = np.zeros(n_stages)   # and the last round's count

    def allows(self, stage: int) -> int:
        """The most nodes `stage` may add this round: 0 while it does not pay (but when a try is
        due), else GROW_FACTOR times what pruning kept of it lately, plus GROW_MARGIN."""
        worth, cost = self.tokens[stage] * self.step, self.seconds[stage]
        if not (worth >= cost or self._paid[stage]):
            if self.rounds < self._next_try[stage]:
                return 0
            self._next_try[stage] = self.rounds + probe_gap(tuning.WORTH_EVERY, cost / max(worth, 1e-9),
                                                            tuning.WORTH_MAX_GAP)
        kept = max(self._kept_mean[stage], self._kept_last[stage])
        return math.ceil(tuning.GROW_FACTOR * kept + tuning.GROW_MARGIN)

    def ran(self, stage: int, seconds: float) -> None:
        """`stage` proposed this round, in `seconds`."""
        self._ran[stage] = seconds
        if self.seconds[stage] == 0.0:   # the first measurement stands for itself
            self.seconds[stage] = seconds
        else:
            d = tuning.WORTH_DECAY
            self.seconds[stage] = d * self.seconds[stage] + (1 - d) * seconds

    def observe(self, accepted: Sequence[float], kept: np.ndarray) -> None:
        """End of a round: `accepted` [stages] the tokens each got accepted (the stages that
        proposed this round, `ran`, are credited), `kept` [stages] the nodes of each verified."""
        d = tuning.WORTH_DECAY
        for s, seconds in enumerate(self._ran):
            if seconds is not None:
                self.tokens[s] = d * self.tokens[s] + (1 - d) * float(accepted[s])
                self._paid[s] = accepted[s] * self.step >= seconds > 0.0
                self._ran[s] = None
        self.rounds += 1
        k = tuning.KEPT_DECAY
        self._kept_mean = k * self._kept_mean + (1 - k) * kept
        self._kept_last = kept

    def state(self) -> dict:
        return {"seconds": list(self.seconds), "tokens": list(self.tokens)}

    def load(self, state: dict) -> None:
        """Start from `state()` of a run over the same stages (else keep the optimistic start)."""
        seconds, tokens = state.get("seconds"), state.get("tokens")
        n = len(self.seconds)
        if (isinstance(seconds, list) and isinstance(tokens, list) and len(seconds) == n == len(tokens)
                and all(type(v) in (int, float) and math.isfinite(v) and v >= 0
                        for v in seconds + tokens)):
            self.seconds, self.tokens = [float(v) for v in seconds], [float(v) for v in tokens]
