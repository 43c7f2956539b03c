"""Whether a free drafter is worth its Python time this round, on this machine.

A free drafter costs no model call, but not nothing: the personal n-gram stage looks up fresh
contexts in its store every round, ~0.15-0.5 ms of Python, which is a quarter of a 2 ms target
step on an H200 and 0.5% of a 69 ms one on the 2-core CPU. Per stage this keeps decayed means of
the seconds its `propose` took and of the tokens it got accepted per round it ran; a stage runs
while those tokens, at the price of a plain target step, are worth its seconds, and every
`EXPLORE`-th round regardless, so a stage that starts to pay (a chat turning to what the user
wrote before) is noticed again.
"""
from __future__ import annotations

import numpy as np


class StageWorth:
    EXPLORE = 16

    def __init__(self, n_stages: int, decay: float = 0.95) -> None:
        self.seconds = np.zeros(n_stages)
        self.tokens = np.ones(n_stages)      # optimistic until measured
        self.decay = decay
        self.rounds = 0

    def runs(self, stage: int, token_seconds: float) -> bool:
        return (self.rounds % self.EXPLORE == 0
                or self.tokens[stage] * token_seconds >= self.seconds[stage])

    def ran(self, stage: int, seconds: float) -> None:
        self.seconds[stage] = self.decay * self.seconds[stage] + (1 - self.decay) * seconds

    def credit(self, ran: np.ndarray, accepted: np.ndarray) -> None:
        """End of a round: `ran` [stages] bool, `accepted` [stages] tokens each got accepted."""
        d = self.decay
        self.tokens[ran] = d * self.tokens[ran] + (1 - d) * accepted[ran]
        self.rounds += 1
