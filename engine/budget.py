"""Online choice of each round's tree: speculate only where it pays, on this machine.

An arm is a tree budget: a node count (0 = a plain round: the root alone) and whether the model
drafters take part or only the free ones (Max-Gram, personal n-grams). Per arm the bandit keeps
exponentially decayed sums of tokens emitted and wall seconds spent (drafting + verification +
bookkeeping), so its estimate is measured throughput, not a model of it. It plays the arm with the
best estimate and probes the others now and then so estimates follow the text as it changes
character (prose vs. a repeated code block): an arm close to the best is probed every
`EXPLORE_EVERY` rounds, one far below it rarely (`probe_gap`: the interval grows with the square
of how far), because on a slow CPU a single probe of a big tree costs many plain rounds. A probe
of an arm without models plays it `PROBE_ROUNDS` rounds in a row and estimates age slowly with
their arm's own plays (`ARM_DECAY`): one free round yields either 1 token or several, so one
unlucky round must not decide. When speculation loses to plain decoding on this machine, the
plain arm (with a calibration: the free arm, its rounds pruned to their root) wins and
speculation stays off but for the probes. The constants are engine/tuning.py's.

Greedy output does not depend on the arm. Sampled output stays exactly distributed, but which
random draws happen depends on tree shapes, so a seed reproduces output only with a fixed budget.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import tuning


@dataclass(frozen=True)
class Arm:
    nodes: int            # tree nodes below the root; 0 = plain
    models: bool = True   # model drafters take part (False: only the free drafters)

    @property
    def drafts_with_models(self) -> bool:
        return self.models and self.nodes > 0

    def __str__(self) -> str:
        return f"{self.nodes}" + ("" if self.models or self.nodes == 0 else " free")


def probe_gap(every: int, behind: float, most: int) -> int:
    """Rounds until the next try of a choice that trails (an arm, a free stage that does not pay):
    `every` times the square of how far behind it is (`behind` >= 1: the best's rate over its
    own), at most `most`. The one probe schedule of the bandit and the stages' worth: rarely where
    a try costs many plain rounds, often where it nearly pays."""
    return min(most, int(every * behind * behind))


class AdaptiveBudget:
    def __init__(self, arms: tuple[Arm, ...], explore_every: int | None = None) -> None:
        """explore_every: tuning.EXPLORE_EVERY unless given (a test that wants probes often)."""
        if not arms:
            raise ValueError("at least one arm")
        self.arms = arms
        self.explore_every = tuning.EXPLORE_EVERY if explore_every is None else explore_every
        self._tokens = [0.0] * len(arms)
        self._seconds = [0.0] * len(arms)
        self._plays = [0] * len(arms)
        self._next_probe = [0] * len(arms)
        self._round = 0
        self._burst = (0, 0)              # (arm, rounds left) of the probe being played
        # when a list: the rounds played, run-length encoded as [arm, rounds, tokens, seconds,
        # every arm's estimated tok/s when the run began] (the bench's record of the choices)
        self.trace: list | None = None

    def rate(self, arm: int) -> float:
        return self._tokens[arm] / self._seconds[arm] if self._seconds[arm] > 0 else 0.0

    def _best(self) -> int:
        return max(range(len(self.arms)), key=self.rate)

    def choose(self) -> int:
        """Index of the arm to play this round."""
        self._round += 1
        for arm, plays in enumerate(self._plays):   # measure every arm once first
            if plays == 0:
                return arm
        arm, left = self._burst
        if left > 0:
            self._burst = (arm, left - 1)
            return arm
        best = self._best()
        due = [a for a in range(len(self.arms)) if a != best and self._next_probe[a] <= self._round]
        if due:
            arm = min(due, key=lambda a: self._next_probe[a])
            ratio = self.rate(best) / max(self.rate(arm), 1e-9)
            every = (tuning.CHEAP_EVERY if self.arms[best].drafts_with_models
                     and not self.arms[arm].drafts_with_models else self.explore_every)
            self._next_probe[arm] = self._round + probe_gap(every, ratio, tuning.MAX_PROBE_GAP)
            if not self.arms[arm].drafts_with_models:   # a model arm's probe: one round only
                self._burst = (arm, tuning.PROBE_ROUNDS - 1)
            return arm
        return best

    def update(self, arm: int, tokens: int, seconds: float) -> None:
        if self.trace is not None:
            if self.trace and self.trace[-1][0] == arm:
                run = self.trace[-1]
                run[1], run[2], run[3] = run[1] + 1, run[2] + tokens, run[3] + seconds
            else:
                self.trace.append([arm, 1, tokens, seconds,
                                   [round(self.rate(a), 1) for a in range(len(self.arms))]])
        decay = tuning.ARM_DECAY
        self._tokens[arm] = self._tokens[arm] * decay + tokens
        self._seconds[arm] = self._seconds[arm] * decay + seconds
        self._plays[arm] += 1

    def state(self) -> dict:
        """The estimates, by arm name, to carry to the next run (learnt.py)."""
        return {str(a): [self._tokens[i], self._seconds[i], self._plays[i]] for i, a in enumerate(self.arms)}

    def load(self, state: dict) -> None:
        """Start from a previous run's estimates for the arms that still exist; loaded arms count
        as measured, so the first rounds go to the best one instead of measuring each again."""
        for i, arm in enumerate(self.arms):
            entry = state.get(str(arm))
            if entry and len(entry) == 3 and entry[1] > 0:
                self._tokens[i], self._seconds[i] = float(entry[0]), float(entry[1])
                self._plays[i] = max(1, int(entry[2]))
        best = self._best()
        for i in range(len(self.arms)):   # probes resume on the schedule their gap earns
            if i != best and self._plays[i]:
                ratio = self.rate(best) / max(self.rate(i), 1e-9)
                self._next_probe[i] = probe_gap(self.explore_every, ratio, tuning.MAX_PROBE_GAP)

    def summary(self) -> dict:
        return {str(a): {"tok_s": round(self.rate(i), 2), "rounds": self._plays[i]}
                for i, a in enumerate(self.arms)}
