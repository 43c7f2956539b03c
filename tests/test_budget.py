"""The adaptive budget's policy on scripted throughputs (a unit test of the rule, no model):
it settles on the fastest arm, turns speculation off when plain decoding is fastest, and keeps
probing so it follows a change."""
from localspec.engine.budget import AdaptiveBudget
from localspec.engine.config import TreeBudget


def play(ctrl: AdaptiveBudget, rates: dict[int, float], rounds: int) -> list[int]:
    chosen = []
    for _ in range(rounds):
        arm = ctrl.choose()
        nodes = ctrl.arms[arm]
        tokens = max(1, round(rates[nodes] * 0.1))   # 0.1 s per round at the arm's rate
        ctrl.update(arm, tokens, tokens / rates[nodes])
        chosen.append(nodes)
    return chosen


def test_turns_speculation_off_where_it_loses():
    ctrl = AdaptiveBudget(TreeBudget(max_nodes=16, adaptive=True).arms())
    chosen = play(ctrl, {0: 12.0, 2: 10.0, 4: 9.0, 8: 7.0, 16: 5.0}, 240)
    late = chosen[120:]
    assert ctrl.best() == 0
    assert late.count(0) / len(late) > 0.75, late   # plain except for the periodic probes


def test_picks_the_fastest_tree_and_follows_a_change():
    ctrl = AdaptiveBudget((0, 4, 8, 16))
    play(ctrl, {0: 500.0, 4: 600.0, 8: 900.0, 16: 700.0}, 150)
    assert ctrl.best() == 8
    play(ctrl, {0: 500.0, 4: 300.0, 8: 250.0, 16: 200.0}, 300)  # the text stopped repeating
    assert ctrl.best() == 0


def test_fixed_budget_has_one_arm():
    assert TreeBudget(max_nodes=8).arms() == (8,)
    assert TreeBudget(max_nodes=8, adaptive=True).arms() == (0, 2, 4, 8)
