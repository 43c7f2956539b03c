"""The adaptive budget's policy on scripted throughputs (a unit test of the rule, no model):
it settles on the fastest arm, turns speculation off when plain decoding is fastest (probing the
losing arms rarely), and follows a change."""
from localspec.engine import tuning
from localspec.engine.budget import AdaptiveBudget, Arm
from localspec.engine.config import TreeBudget


def leader(ctrl: AdaptiveBudget) -> Arm:
    """The arm with the best measured throughput: the one the bandit plays between probes."""
    return max(ctrl.arms, key=lambda arm: ctrl.rate(ctrl.arms.index(arm)))


def play(ctrl: AdaptiveBudget, rates: dict[Arm, float], rounds: int) -> list[Arm]:
    chosen = []
    for _ in range(rounds):
        i = ctrl.choose()
        arm = ctrl.arms[i]
        tokens = max(1, round(rates[arm] * 0.1))   # 0.1 s per round at the arm's rate
        ctrl.update(i, tokens, tokens / rates[arm])
        chosen.append(arm)
    return chosen


def test_turns_speculation_off_where_it_loses():
    arms = TreeBudget(max_nodes=16, adaptive=True).arms()
    ctrl = AdaptiveBudget(arms)
    rates = {a: 12.0 if a.nodes == 0 else 12.0 * (0.9 if not a.models else 0.5) - a.nodes * 0.2
             for a in arms}
    late = play(ctrl, rates, 600)[200:]
    assert leader(ctrl) == Arm(0)
    assert sum(a.nodes == 0 for a in late) / len(late) > 0.85   # plain, bar the probes
    tokens = [max(1, round(rates[a] * 0.1)) for a in late]          # as play() scores them
    rate = sum(tokens) / sum(t / rates[a] for t, a in zip(tokens, late))
    assert rate > 0.92 * rates[Arm(0)], rate      # probing six losing arms costs under 8%


def test_picks_the_fastest_tree_and_follows_a_change():
    arms = (Arm(0), Arm(8, models=False), Arm(8), Arm(16))
    ctrl = AdaptiveBudget(arms)
    play(ctrl, {Arm(0): 500.0, Arm(8, False): 900.0, Arm(8): 700.0, Arm(16): 600.0}, 200)
    assert leader(ctrl) == Arm(8, models=False)
    play(ctrl, {Arm(0): 500.0, Arm(8, False): 480.0, Arm(8): 300.0, Arm(16): 250.0}, 400)
    assert leader(ctrl) == Arm(0)                                  # the text stopped repeating


def test_arms_of_fixed_and_adaptive_budgets():
    assert TreeBudget(max_nodes=8).arms() == (Arm(8),)
    assert TreeBudget(max_nodes=8, adaptive=True).arms() == (Arm(0), Arm(4, False), Arm(8, False),
                                                             Arm(4), Arm(8))
    assert TreeBudget(max_nodes=8, adaptive=True).arms(with_models=False) == (
        Arm(0), Arm(4, False), Arm(8, False))
    # pruned rounds pick the free drafters' size themselves, down to a plain step: one free arm,
    # which stands in for plain decoding on every machine; models stop at 16
    assert TreeBudget(max_nodes=32, adaptive=True).arms(pruned=True) == (
        Arm(32, False), Arm(4), Arm(8), Arm(16))
    assert str(Arm(32, False)) == "32 free" and str(Arm(8)) == "8" and str(Arm(0)) == "0"
    assert TreeBudget(max_nodes=32, adaptive=True).arms(pruned=True, with_free=False) == (
        Arm(0), Arm(4), Arm(8), Arm(16))


def test_a_resumed_controller_plays_the_known_best_without_measuring_again():
    arms = TreeBudget(max_nodes=16, adaptive=True).arms()
    rates = {a: 12.0 if a.nodes == 0 else 6.0 for a in arms}
    first = AdaptiveBudget(arms)
    play(first, rates, 300)
    second = AdaptiveBudget(arms)
    second.load(first.state())
    early = play(second, rates, 40)
    assert early == [Arm(0)] * 40      # losing arms are probed on their earned schedule, not at once
    assert leader(second) == Arm(0)


def test_while_a_model_arm_leads_the_free_arm_is_probed_often(monkeypatch):
    """A stretch where the draft model's arm leads (the free arm fell behind on hard text) ends
    soon after the free arm does better again: its probes cost no draft catch-up, so they come
    every few rounds, where the usual schedule would leave its stale estimate standing."""
    arms = (Arm(32, models=False), Arm(8))

    def stretch_end(cheap_every: int) -> tuple[int, int]:
        monkeypatch.setattr(tuning, "CHEAP_EVERY", cheap_every)
        ctrl = AdaptiveBudget(arms)
        play(ctrl, {arms[0]: 400.0, arms[1]: 220.0}, 100)
        assert leader(ctrl) == arms[0]
        play(ctrl, {arms[0]: 150.0, arms[1]: 250.0}, 300)
        assert leader(ctrl) == arms[1]
        chosen = play(ctrl, {arms[0]: 400.0, arms[1]: 250.0}, 200)
        runs = [i for i in range(1, 200) if chosen[i] == chosen[i - 1] == arms[1]]
        return (max(runs) if runs else 0), sum(a == arms[1] for a in chosen[150:])

    end, late = stretch_end(tuning.CHEAP_EVERY)
    assert end < 150 and late <= 2            # over, then only rare probes
    assert stretch_end(64)[0] > 190           # the usual schedule: still on the draft's arm


