"""Online choice of each round's tree budget: speculate only where it pays, on this machine.

An arm is a node budget (0 = a plain round: the root alone). Per arm the controller keeps
exponentially decayed sums of tokens emitted and wall seconds spent (drafting + verification +
bookkeeping), so its estimate is measured throughput, not a model of it. It plays the arm with the
best estimate and re-tries every arm once per `explore_every` rounds, so estimates follow the
text as it changes character (prose vs. a repeated code block). When speculation loses to plain
decoding on this machine, the plain arm wins and speculation stays off except for the probes.

Greedy output does not depend on the budget. Sampled output stays exactly distributed, but which
random draws happen depends on tree shapes, so a seed reproduces output only with a fixed budget.
"""
from __future__ import annotations


class AdaptiveBudget:
    def __init__(self, arms: tuple[int, ...], explore_every: int = 64, decay: float = 0.95) -> None:
        if not arms:
            raise ValueError("at least one arm")
        self.arms = arms
        self.explore_every = explore_every
        self.decay = decay
        self._tokens = [0.0] * len(arms)
        self._seconds = [0.0] * len(arms)
        self._plays = [0] * len(arms)
        self._round = 0

    def rate(self, arm: int) -> float:
        return self._tokens[arm] / self._seconds[arm] if self._seconds[arm] > 0 else 0.0

    def choose(self) -> int:
        """Index of the arm to play this round."""
        self._round += 1
        for arm, plays in enumerate(self._plays):   # measure every arm once first
            if plays < 1:
                return arm
        slot = self._round % self.explore_every
        if slot < len(self.arms):                   # periodic probe of each arm in turn
            return slot
        return max(range(len(self.arms)), key=self.rate)

    def update(self, arm: int, tokens: int, seconds: float) -> None:
        self._tokens[arm] = self._tokens[arm] * self.decay + tokens
        self._seconds[arm] = self._seconds[arm] * self.decay + seconds
        self._plays[arm] += 1

    def best(self) -> int:
        return self.arms[max(range(len(self.arms)), key=self.rate)]

    def summary(self) -> dict:
        return {str(a): {"tok_s": round(self.rate(i), 2), "rounds": self._plays[i]}
                for i, a in enumerate(self.arms)}
