"""Wall time per phase of a round, for `DecodeStats.seconds`.

A stopwatch with laps: the loop marks the end of each phase by name and the time since the
previous mark is added to that phase, so a round's phases add up to the round. `started` is when
the round began: the adaptive policy charges a round from there (policy.py).
"""
from __future__ import annotations

import time


class Stopwatch:
    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds               # phase -> seconds so far (DecodeStats.seconds)
        self.started = self._mark = time.perf_counter()

    def start(self) -> None:
        """Begin a round: the next lap counts from now."""
        self.started = self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Add the time since the last mark to `phase`."""
        now = time.perf_counter()
        self.seconds[phase] += now - self._mark
        self._mark = now
