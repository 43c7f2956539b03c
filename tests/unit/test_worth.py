"""A free drafter's gate (engine/worth.py): it runs while its accepted tokens pay for its Python
time, and grows about twice what pruning kept of it."""
from __future__ import annotations

import numpy as np
from localspec.engine import tuning
from localspec.engine.worth import StageWorth

STEP = 2e-3   # a plain target step on a GPU, seconds
KEPT_NONE = np.zeros(3, int)   # [stages] nodes pruning kept of each: none


def play(worth: StageWorth, seconds: list[float], tokens: list[float], rounds: int) -> np.ndarray:
    """Rounds each stage ran, of the last `rounds` // 2."""
    counts = np.zeros(len(seconds), int)
    for r in range(rounds):
        ran = np.array([worth.allows(s) > 0 for s in range(len(seconds))])
        for s in np.flatnonzero(ran):
            worth.ran(int(s), seconds[s])
        worth.observe(np.where(ran, tokens, 0.0), KEPT_NONE[:len(seconds)])
        if r >= rounds // 2:
            counts += ran
    return counts


def test_a_stage_that_costs_more_than_it_brings_runs_only_to_explore():
    worth = StageWorth(3, STEP)
    # stage 0: 10 us for 0.5 tokens a round (pays); stage 1: 60 us for 0.02 tokens (40 us worth);
    # stage 2: 400 us for the same 0.02 tokens
    costs, tokens = [10e-6, 60e-6, 400e-6], [0.5, 0.02, 0.02]
    play(worth, costs, tokens, 4096)                 # its estimates settle
    counts = play(worth, costs, tokens, 2048)
    assert counts[0] == 1024
    assert 1024 // 64 <= counts[1] <= 1024 // 24                    # 1.5x short: every ~36 rounds
    assert 1 <= counts[2] <= 1024 // tuning.WORTH_MAX_GAP + 1    # 10x short: as rarely as allowed


def test_on_a_slow_machine_the_same_stage_pays():
    worth = StageWorth(1, 69e-3)
    for _ in range(200):                          # a 69 ms CPU step: 0.02 tokens are worth 1.4 ms
        assert worth.allows(0)
        worth.ran(0, 400e-6)
        worth.observe(np.array([0.02]), KEPT_NONE[:1])


def test_a_stage_that_starts_paying_is_noticed_again():
    worth = StageWorth(1, STEP)
    play(worth, [400e-6], [0.0], 320)
    assert not worth.allows(0) or worth.rounds % tuning.WORTH_EVERY == 0
    counts = play(worth, [400e-6], [3.0], 320)    # explored rounds now bring 3 tokens
    assert counts[0] > 150


def test_a_retry_that_pays_keeps_the_stage_running_while_it_pays():
    worth = StageWorth(1, STEP)
    play(worth, [400e-6], [0.0], 2000)                # settled far below its cost: rare retries
    assert worth.tokens[0] * STEP < worth.seconds[0] / 2, "the means say it does not pay"
    while not worth.allows(0):                        # wait for the next retry
        worth.observe([0.0], KEPT_NONE[:1])
    worth.ran(0, 400e-6)
    worth.observe([3.0], KEPT_NONE[:1])               # it brought 3 tokens: 6 ms for 0.4 ms
    runs = 0
    for _ in range(10):                               # and goes on bringing them
        assert worth.allows(0)
        worth.ran(0, 400e-6)
        worth.observe([3.0], KEPT_NONE[:1])
        runs += 1
    assert runs == 10
    worth.ran(0, 400e-6)
    worth.observe([0.0], KEPT_NONE[:1])               # a round that does not pay
    assert worth.tokens[0] * STEP >= worth.seconds[0], "by now the means themselves say it pays"


def test_what_a_run_learnt_starts_the_next_and_a_bad_file_is_ignored():
    worth = StageWorth(2, STEP)
    play(worth, [10e-6, 400e-6], [0.5, 0.0], 300)
    again = StageWorth(2, STEP)
    again.load(worth.state())
    assert again.state() == worth.state()
    for bad in ({"seconds": [1.0], "tokens": [1.0]}, {"seconds": [float("nan"), 0.0], "tokens": [1.0, 1.0]},
                {"seconds": [True, 0.0], "tokens": [1.0, 1.0]}, {"seconds": "x"}):
        fresh = StageWorth(2, STEP)
        fresh.load(bad)
        assert fresh.state() == StageWorth(2, STEP).state(), bad


def test_a_running_stage_grows_about_twice_what_pruning_kept_of_it():
    worth = StageWorth(2, STEP)
    factor, margin, decay = tuning.GROW_FACTOR, tuning.GROW_MARGIN, tuning.KEPT_DECAY
    assert worth.allows(0) == worth.allows(1) == margin, "nothing kept yet: the margin"
    worth.observe([0.0, 0.0], np.array([6, 0]))
    assert (worth.allows(0), worth.allows(1)) == (factor * 6 + margin, margin)   # the last round's 6
    worth.observe([0.0, 0.0], np.array([0, 0]))
    mean = (1 - decay) * 6 * decay                    # a round that kept none: the decayed mean
    assert worth.allows(0) == int(-(-(factor * mean + margin) // 1)) > margin
