"""Whether a free drafter is worth its Python time this round, on this machine.

A free drafter costs no model call, but not nothing: the personal n-gram stage looks up fresh
contexts in its store, a fraction of a millisecond a round and several when it misses its cache,
which is a sizeable part of a GPU's target step and next to nothing of a CPU's. Per stage this
keeps decayed means of the seconds its `propose` took and of the tokens it got accepted per
round it ran; a stage runs while those tokens, at the price of a plain target step, are worth its
seconds. A stage that does not pay is tried again now and then, so one that starts to pay (a chat
turning to what the user wrote before) is noticed: after `EXPLORE` rounds times the square of
how far it fell short, at most `MAX_INTERVAL` (the schedule of budget.py's probes).
"""
from __future__ import annotations

from typing import Sequence


class StageWorth:
    EXPLORE = 16
    MAX_INTERVAL = 512

    def __init__(self, n_stages: int, decay: float = 0.95) -> None:
        # plain lists: a round touches two or three numbers, where numpy's per-call overhead
        # would be a visible part of a GPU's plain step
        self.seconds = [0.0] * n_stages
        self.tokens = [1.0] * n_stages      # optimistic until measured
        self.decay = decay
        self.rounds = 0
        self._next_try = [0] * n_stages

    def runs(self, stage: int, token_seconds: float) -> bool:
        worth, cost = self.tokens[stage] * token_seconds, self.seconds[stage]
        if worth >= cost:
            return True
        if self.rounds < self._next_try[stage]:
            return False
        short = cost / max(worth, 1e-9)
        self._next_try[stage] = self.rounds + min(self.MAX_INTERVAL, int(self.EXPLORE * short * short))
        return True

    def ran(self, stage: int, seconds: float) -> None:
        if self.seconds[stage] == 0.0:   # the first measurement stands for itself
            self.seconds[stage] = seconds
        else:
            self.seconds[stage] = self.decay * self.seconds[stage] + (1 - self.decay) * seconds

    def credit(self, ran: Sequence[bool], accepted: Sequence[float]) -> None:
        """End of a round: `ran` [stages] whether each ran, `accepted` [stages] tokens each got
        accepted."""
        d = self.decay
        for s, did in enumerate(ran):
            if did:
                self.tokens[s] = d * self.tokens[s] + (1 - d) * float(accepted[s])
        self.rounds += 1
