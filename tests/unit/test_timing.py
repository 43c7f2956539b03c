"""The round's stopwatch: each lap adds the time since the previous mark to its phase."""
from __future__ import annotations

import time

from localspec.engine.stats import PHASES
from localspec.engine.timing import Stopwatch


def test_laps_go_to_their_phase():
    seconds = {p: 0.0 for p in PHASES}
    watch = Stopwatch(seconds)
    for _ in range(3):
        watch.start()
        time.sleep(0.002)
        watch.lap("propose")
        watch.lap("verify")
        time.sleep(0.001)
        watch.lap("accept")
    assert seconds["propose"] >= 3 * 0.002 and seconds["accept"] >= 3 * 0.001
    assert seconds["verify"] < seconds["accept"] and seconds["prefill"] == seconds["commit"] == 0.0
    assert time.perf_counter() - watch.started >= 0.003   # the last round, from its start
