"""Whether a free stage is worth its Python time this round, on this machine.

A free stage costs no model call, but not nothing: the personal n-gram stage looks up fresh
contexts in its store and scores each node it grows, a fraction of a millisecond a round and
several when it misses its cache. That is a large part of a GPU's target step and next to nothing
of a CPU's. Per stage this keeps decayed means of the seconds its `propose` took and of the tokens
it got accepted per round it ran; a stage runs while those tokens, at the price of a plain target
step, are worth its seconds. A stage that does not pay is tried again now and then, so one that
starts to pay (a chat turning to what the user wrote before) is noticed: after `EXPLORE` rounds
times the square of how far it fell short, at most `MAX_INTERVAL` (the schedule of budget.py's
probes). A round whose stage's own tokens paid for its own time lets it run the next round too,
and so on while that holds: the means alone, moved a twentieth a round, would take a dozen such
rounds to reopen the gate.
"""
from __future__ import annotations

import math
from typing import Sequence


class StageWorth:
    EXPLORE = 16
    MAX_INTERVAL = 512

    def __init__(self, n_stages: int, step_seconds: float, decay: float = 0.95) -> None:
        """step_seconds: a plain target step, the price of an accepted token."""
        # plain lists: a round touches two or three numbers, where numpy's per-call overhead
        # would be a visible part of a GPU's plain step
        self.seconds = [0.0] * n_stages
        self.tokens = [1.0] * n_stages      # optimistic until measured
        self.step = step_seconds
        self.decay = decay
        self.rounds = 0
        self._next_try = [0] * n_stages
        self._ran: list[float | None] = [None] * n_stages   # this round: seconds of each propose
        self._paid = [False] * n_stages      # its last round's tokens paid for that propose

    def runs(self, stage: int) -> bool:
        """Whether `stage` proposes this round."""
        worth, cost = self.tokens[stage] * self.step, self.seconds[stage]
        if worth >= cost or self._paid[stage]:
            return True
        if self.rounds < self._next_try[stage]:
            return False
        short = cost / max(worth, 1e-9)
        self._next_try[stage] = self.rounds + min(self.MAX_INTERVAL, int(self.EXPLORE * short * short))
        return True

    def ran(self, stage: int, seconds: float) -> None:
        """`stage` proposed this round, in `seconds`."""
        self._ran[stage] = seconds
        if self.seconds[stage] == 0.0:   # the first measurement stands for itself
            self.seconds[stage] = seconds
        else:
            self.seconds[stage] = self.decay * self.seconds[stage] + (1 - self.decay) * seconds

    def credit(self, accepted: Sequence[float]) -> None:
        """End of a round: `accepted` [stages] the tokens each got accepted; the stages that
        proposed this round (`ran`) are credited."""
        d = self.decay
        for s, seconds in enumerate(self._ran):
            if seconds is not None:
                self.tokens[s] = d * self.tokens[s] + (1 - d) * float(accepted[s])
                self._paid[s] = accepted[s] * self.step >= seconds > 0.0
                self._ran[s] = None
        self.rounds += 1

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
