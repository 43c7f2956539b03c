"""What the engine reads of a calibration's curves (engine/calibrate.py, Costs): a batch never
priced below a smaller one, between and beyond the measured sizes."""
from __future__ import annotations

import pytest
from localspec.engine.costs import Costs

# an H200's calibration (ms): 2 rows timed below 1, 32 below 24
MEASURED = {1: 1.66, 2: 1.52, 3: 2.2, 4: 2.55, 8: 2.87, 16: 3.6, 24: 4.6, 32: 4.34}


def test_a_batch_costs_no_less_than_a_smaller_one():
    costs = Costs(MEASURED, {1: 0.5, 2: 0.4, 4: 0.6})
    prices = [costs.target_cost(n) for n in range(1, 41)]
    assert all(b >= a for a, b in zip(prices, prices[1:])), prices
    assert costs.target_cost(2) == costs.target_cost(1) == 1.66
    assert costs.target_cost(32) == 4.6 and costs.target_cost(40) == pytest.approx(4.6)
    assert costs.target_cost(20) == pytest.approx(3.6 + (4.6 - 3.6) * 4 / 8)
    assert costs.draft_cost(2) == 0.5 and costs.draft_cost(3) == pytest.approx(0.55)
    assert costs.target == MEASURED, "what was measured is kept as measured"
    assert costs.to_dict()["target_ms"][2] == pytest.approx(1520.0)


def test_growth_floor_prices_a_row_and_a_draft_step_in_plain_steps():
    costs = Costs({1: 30.0, 2: 33.0, 3: 36.0, 5: 42.0}, {1: 3.0, 4: 4.0})
    assert costs.growth_floor(1) == pytest.approx((3.0 + 3.0) / 30.0)
    assert costs.growth_floor(4) == pytest.approx(((42.0 - 30.0) / 4 + 3.0) / 30.0)
    assert Costs({1: 1.0, 2: 5.0}, {1: 1.0}).growth_floor(1) == 1.0, "a floor is a probability"
