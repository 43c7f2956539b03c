"""Online choice of each round's tree: speculate only where it pays, on this machine.

An arm is a tree budget: a node count (0 = a plain round: the root alone) and whether the model
drafters take part or only the free ones (Max-Gram, personal n-grams). Per arm the bandit keeps
exponentially decayed sums of tokens emitted and wall seconds spent (drafting + verification +
bookkeeping), so its estimate is measured throughput, not a model of it. It plays the arm with the
best estimate and probes the others now and then so estimates follow the text as it changes
character (prose vs. a repeated code block): an arm close to the best is probed every
`explore_every` rounds, one far below it rarely (the interval grows with the square of how far),
because on a slow CPU a single probe of a big tree costs many plain rounds. A probe of an arm
without models plays it `PROBE_ROUNDS` rounds in a row and estimates decay slowly (2% a play):
one free round yields either 1 token or several, so single probe rounds with a fast decay left
the free arm's estimate at the mercy of one unlucky round, and the bandit kept to plain where the
free arm was faster. When speculation loses to plain decoding on this machine, the plain arm (with
a calibration: the free arm, its rounds pruned to their root) wins and speculation stays off but
for the probes.

Greedy output does not depend on the arm. Sampled output stays exactly distributed, but which
random draws happen depends on tree shapes, so a seed reproduces output only with a fixed budget.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arm:
    nodes: int            # tree nodes below the root; 0 = plain
    models: bool = True   # model drafters take part (False: only the free drafters)

    @property
    def drafts_with_models(self) -> bool:
        return self.models and self.nodes > 0

    def __str__(self) -> str:
        return f"{self.nodes}" + ("" if self.models or self.nodes == 0 else " free")


class AdaptiveBudget:
    # While a model arm leads, the arms without models are probed this often (times the square of
    # how far they trail): probing them costs no draft catch-up, and a stale estimate of the free
    # arm kept a GPU on a draft arm for long stretches where Max-Gram alone was faster (easy
    # stretches lift whichever arm is being played). Estimates age only with their arm's own
    # plays: aged with the rounds gone by as well, one probe round after a long plain stretch set
    # the free arm's estimate alone, and the free arm was played far less than it paid.
    CHEAP_EVERY = 8
    # A probe of an arm without models plays it this many rounds in a row: one round says little
    # (a free round that verified a guess yields 1 token or several). A draft arm's probe stays
    # one round: its rounds cost several plain steps each, so bursts of them cost more than they
    # told.
    PROBE_ROUNDS = 4

    def __init__(self, arms: tuple[Arm, ...], explore_every: int = 64, decay: float = 0.98,
                 max_interval: int = 2048) -> None:
        if not arms:
            raise ValueError("at least one arm")
        self.arms = arms
        self.explore_every = explore_every
        self.decay = decay
        self.max_interval = max_interval
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
            every = (self.CHEAP_EVERY if self.arms[best].drafts_with_models
                     and not self.arms[arm].drafts_with_models else self.explore_every)
            self._next_probe[arm] = self._round + min(self.max_interval, int(every * ratio * ratio))
            if not self.arms[arm].drafts_with_models:   # a model arm's probe: one round only
                self._burst = (arm, self.PROBE_ROUNDS - 1)
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
        self._tokens[arm] = self._tokens[arm] * self.decay + tokens
        self._seconds[arm] = self._seconds[arm] * self.decay + seconds
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
                self._next_probe[i] = min(self.max_interval, int(self.explore_every * ratio * ratio))

    def summary(self) -> dict:
        return {str(a): {"tok_s": round(self.rate(i), 2), "rounds": self._plays[i]}
                for i, a in enumerate(self.arms)}
