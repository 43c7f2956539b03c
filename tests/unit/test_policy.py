"""The decode policy's choices on hand-built trees and hand-made cost curves (no model loaded):
which policy and arms an engine gets, the batch-shape mode and its padding and prices, held
choices, the stages a round runs, growth bounds, the free stages' worth, pruning, and what carries to
the next run."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pytest
from localspec.engine.budget import Arm
from localspec.engine.costs import Costs
from localspec.engine.config import DraftLimits, TreeBudget
from localspec.engine import tuning
from localspec.engine.policy import AdaptivePolicy, Batch, FixedPolicy, Plan, draft_order, make_policy
from localspec.engine.prune import AcceptanceModel
from localspec.engine.shapes import Shapes
from localspec.engine.tree import DraftTree


@dataclass(frozen=True)
class Stage:
    """What a policy reads of a drafter (a stand-in: a policy never calls its drafters)."""

    name: str
    uses_model: bool
    limits: DraftLimits = DraftLimits()
    copies: bool = False


FREE, OTHER_FREE, MODEL = Stage("maxgram", False, copies=True), Stage("ngram", False), Stage("draft", True)
# a draft model's step: a fifth of the target's (a head's of a tenth or less is a free stage)
CPU = Costs({1: 1.0, 2: 1.5, 9: 5.0, 17: 9.0, 33: 17.0}, {1: 0.2, 4: 0.3})   # each token: half a step
GPU = Costs({1: 1.0, 2: 1.01, 9: 1.1, 17: 1.2, 33: 1.4}, {1: 0.2, 4: 0.3}, switch=3.0)
CHEAP = replace(GPU, switch=0.5)          # llama.cpp keeping a CUDA graph per shape


def chain(tokens: tuple[int, ...], hint: int = 3, stage: int = 0) -> DraftTree:
    tree = DraftTree(40)
    tree.reset(5)
    node = 0
    for token in tokens:
        node = tree.add(node, token, 0.0, stage, hint=hint)
    return tree


def play(policy, rounds: int, tree: DraftTree | None = None) -> list[Arm]:
    """Rounds that verify `tree` (default: the root alone) and accept nothing; the arms played."""
    tree = tree if tree is not None else chain(())
    arms = []
    for _ in range(rounds):
        started = time.perf_counter()
        arms.append(policy.plan(room=64).arm)
        policy.observe(policy.select(tree, 64, None), (), [7], greedy=True, started=started - 1e-3)
    return arms


def test_plain_decoding_is_a_fixed_policy_with_no_stages():
    policy = make_policy(TreeBudget(max_nodes=16, adaptive=True), [], CPU, offloaded=False)
    assert isinstance(policy, FixedPolicy)
    assert policy.plan(room=100) == Plan(Arm(0), (), 0, 0)
    assert policy.summary() == {} and policy.learnt() == {}


def test_a_fixed_tree_without_costs_verifies_every_drafted_node_at_its_size():
    policy = make_policy(TreeBudget(max_nodes=8), [FREE, MODEL], None, offloaded=True)
    assert isinstance(policy, FixedPolicy) and policy.shapes is Shapes.FREE
    # the free stage fills half the tree, the model checks it along and spends the rest
    assert policy.plan(room=100) == Plan(Arm(8), (0, 1), 8, 4, free=(0,))
    assert policy.plan(room=5) == Plan(Arm(8), (0, 1), 5, 2, free=(0,))     # the context's end bounds it
    tree = chain((10, 11, 12), hint=0)
    assert policy.select(tree, 100, None) == Batch(tree)


def test_the_shape_mode_is_chosen_once_from_where_the_target_runs_and_its_calibration():
    assert Shapes.of(offloaded=False, costs=GPU) is Shapes.FREE
    assert Shapes.of(offloaded=True, costs=GPU) is Shapes.STABLE
    assert Shapes.of(offloaded=True, costs=CHEAP) is Shapes.BUCKETS
    assert Shapes.of(offloaded=True, costs=None) is Shapes.STABLE     # not measured: switches are dear
    budget = TreeBudget(max_nodes=16, adaptive=True)
    for offloaded, costs, mode in ((False, CPU, Shapes.FREE), (True, GPU, Shapes.STABLE),
                                   (True, CHEAP, Shapes.BUCKETS)):
        assert make_policy(budget, [FREE, MODEL], costs, offloaded).shapes is mode


def test_padding_by_shape_mode():
    for mode in Shapes:
        assert mode.padding(1, 16, 100) == (0, True)           # the root alone: one token, always
        assert mode.padding(5, 0, 100) == (0, True)            # a plain arm
    assert Shapes.FREE.padding(5, 16, 100) == (0, True)
    assert Shapes.STABLE.padding(5, 16, 100) == (18, True)     # the arm's full tree, and a spare row
    assert Shapes.STABLE.padding(5, 16, 9) == (9, True)        # never past the context's end
    assert Shapes.BUCKETS.padding(5, 16, 100) == (8, False)    # its bucket, rows only
    assert Shapes.BUCKETS.padding(17, 16, 100) == (17, False)  # never past the arm's full tree


def test_a_verify_is_priced_as_the_shape_mode_pads_it():
    c = GPU.target_cost
    assert Shapes.FREE.cost_table(GPU, 8, True, 4) == [0.0] + [c(k) for k in range(1, 10)]
    stable = Shapes.STABLE.cost_table(GPU, 8, True, 4)
    assert stable[:2] == [0.0, c(1)] and set(stable[2:]) == {c(10) + GPU.switch}
    assert set(Shapes.STABLE.cost_table(GPU, 8, False, 4)[2:]) == {c(10)}   # shape already current
    buckets = Shapes.BUCKETS.cost_table(CHEAP, 16, True, 20)
    assert len(buckets) == 21 and buckets[5] == c(8) + CHEAP.switch and buckets[17] == c(17) + CHEAP.switch


def test_arms_follow_the_machine_and_the_calibration_rules_out_losers():
    budget = TreeBudget(max_nodes=32, adaptive=True)
    # the free arm stands in for plain decoding, on a GPU as on a CPU: nothing to choose
    for costs, offloaded in ((GPU, True), (CPU, False)):
        policy = make_policy(budget, [FREE], costs, offloaded=offloaded)
        assert policy.arms == (Arm(32, models=False),) and policy.bandit is None
    # a steep curve and a slow draft: some model arms cannot beat plain decoding even if every
    # guess were taken; they are dropped before any round, the free ones never
    slow = replace(CPU, draft={1: 0.6, 4: 0.9})
    policy = make_policy(budget, [FREE, MODEL], slow, offloaded=False)
    everything = budget.arms(True, pruned=True, with_free=True)
    assert policy.dropped and all(a.models and a.nodes for a in policy.dropped)
    assert set(policy.arms) | set(policy.dropped) == set(everything)
    assert not set(slow.viable(policy.dropped, 4, 8)) and set(policy.arms) <= set(everything)


def test_each_arm_runs_its_own_stages():
    policy = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE, MODEL], CHEAP,
                         offloaded=True)
    plans = {}
    for _ in range(len(policy.arms)):                  # the bandit measures every arm once first
        plan = policy.plan(room=64)
        plans[plan.arm] = plan
        policy.observe(Batch(chain(())), (), [7], greedy=True, started=time.perf_counter() - 1e-3)
    assert replace(plans[Arm(32, models=False)], allowed=()) == Plan(Arm(32, models=False), (0, 1), 32, 32, free=(0, 1))
    assert replace(plans[Arm(8)], allowed=()) == Plan(Arm(8), (0, 1, 2), 8, 4, free=(0, 1))


def test_a_free_stage_grows_about_what_pruning_kept_of_it():
    policy = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE], CHEAP,
                         offloaded=True)
    arm = policy.plan(room=64).arm
    policy.observe(Batch(chain(())), (), [7], greedy=True, started=time.perf_counter())
    plan = policy.plan(room=64)
    factor, margin = tuning.GROW_FACTOR, tuning.GROW_MARGIN
    assert plan.allowed == (margin, margin), "nothing kept yet: the margin"
    # stage 0 proposes a chain of 5 that all pays on a flat curve; stage 1 nothing
    kept = policy.select(chain((1, 2, 3, 4, 5), stage=0), 64, None)
    assert kept.tree.n == 6
    policy.observe(kept, (), [7], greedy=True, started=time.perf_counter())
    plan = policy.plan(room=64)
    assert plan.allowed[:2] == (factor * 5 + margin, margin)
    assert plan.budget(0, 0) == min(plan.free_room, factor * 5 + margin)
    # selecting changes nothing: what the next plan allows follows what was observed
    policy.select(chain(()), 64, None)
    assert policy.plan(room=64).allowed == plan.allowed
    # a round that keeps nothing falls back on the decayed mean, never below the margin
    policy.observe(Batch(chain(())), (), [7], greedy=True, started=time.perf_counter())
    plan = policy.plan(room=64)
    mean = (1 - tuning.KEPT_DECAY) * 5 * tuning.KEPT_DECAY
    assert plan.allowed[0] == int(-(-(factor * mean + margin) // 1))
    assert arm in policy.arms


def test_an_arm_with_a_model_stage_leaves_the_free_stages_their_share():
    policy = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE, MODEL], CHEAP,
                         offloaded=True)
    plans = []
    for _ in range(len(policy.arms)):
        plans.append(policy.plan(room=64))
        policy.observe(Batch(chain(())), (), [7], greedy=True, started=time.perf_counter() - 1e-3)
    assert any(2 in p.stages for p in plans) and any(2 not in p.stages for p in plans)
    assert all(p.allowed == (p.room,) * 3 for p in plans if 2 in p.stages)
    margin = tuning.GROW_MARGIN
    assert all(p.allowed[:2] == (margin, margin) for p in plans if 2 not in p.stages)


def test_without_pruning_nothing_bounds_growth():
    policy = AdaptivePolicy((Arm(16, models=False),), [FREE, OTHER_FREE], None, Shapes.FREE)
    plan = policy.plan(room=64)
    assert plan.allowed == () and plan.budget(1, 3) == plan.free_room - 3


def test_a_free_stage_sits_out_rounds_where_its_time_costs_more_than_it_brings():
    policy = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE, MODEL], CHEAP,
                         offloaded=True)
    planned = []
    for _ in range(1200):
        plan = policy.plan(room=64)
        for stage in plan.stages:
            if stage != 2:
                policy.ran(stage, 1e-3 if stage == 0 else 5.0)   # stage 1: five steps a round
        planned.append(plan.stages)
        policy.observe(Batch(chain((10,), stage=0)), (1,), [10, 7], greedy=True, started=time.perf_counter())
    late = planned[200:]
    assert all(0 in p for p in late), "a stage that pays always runs"
    assert 0 < sum(1 in p for p in late) <= 1000 // tuning.WORTH_MAX_GAP + 1, \
        "one that does not is only tried now and then"
    assert any(2 in p for p in late), "a model stage is not gated by worth"
    again = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE, MODEL], CHEAP,
                        offloaded=True)
    again.resume(policy.learnt())
    assert again.learnt()["worth"] == policy.learnt()["worth"]
    fixed = make_policy(TreeBudget(max_nodes=8), [FREE, OTHER_FREE], None, offloaded=True)
    assert all(fixed.plan(room=8).stages == (0, 1) for _ in range(50)), "nothing measured: all run"


@pytest.mark.parametrize("costs, holds", [(GPU, True), (CHEAP, False), (CPU, False)])
def test_choices_are_held_only_with_stable_shapes(costs, holds):
    policy = make_policy(TreeBudget(max_nodes=16, adaptive=True), [FREE, MODEL], costs,
                         offloaded=costs is not CPU)
    policy.begin()
    arms = play(policy, 6 * tuning.HOLD)
    changes = [i for i in range(1, len(arms)) if arms[i] != arms[i - 1]]
    assert changes, "a fresh bandit measures every arm"
    if holds:
        assert all(i % tuning.HOLD == 0 for i in changes), changes
    else:
        assert changes[:len(policy.arms) - 1] == list(range(1, len(policy.arms)))


def test_pruning_keeps_what_pays_and_learns_from_what_it_dropped():
    good, doubtful = chain((10, 11, 12), hint=6), chain((20, 21, 22), hint=1)
    learnt = AcceptanceModel(1)
    for _ in range(30):
        learnt.update(good, (1, 2, 3))
        learnt.update(doubtful, ())
    policy = make_policy(TreeBudget(max_nodes=8), [FREE], CPU, offloaded=False)
    assert isinstance(policy, AdaptivePolicy)
    policy.resume({"acceptance": learnt.state()})
    policy.begin()
    policy.plan(room=8)
    assert policy.select(good, 8, None).tree is good                # all of it pays
    policy.plan(room=8)
    kept = policy.select(doubtful, 8, None)
    assert kept.tree.n == 1 and kept.tree is not doubtful           # a copy: the drafters' tree stays
    proposed = sum(policy.learnt()["acceptance"]["proposed"][0][1])   # [stage][hint][depth]
    policy.observe(kept, (), [20], greedy=True, started=time.perf_counter())   # the target took 20
    after = policy.learnt()["acceptance"]
    assert sum(after["proposed"][0][1]) > proposed                  # the dropped node was judged
    assert after["accepted"][0][1][1] > learnt.state()["accepted"][0][1][1]


def test_what_one_run_learnt_starts_the_next():
    budget = TreeBudget(max_nodes=16, adaptive=True)
    first = make_policy(budget, [FREE, MODEL], CPU, offloaded=False)
    first.begin()
    play(first, 40, chain((10, 11)))
    second = make_policy(budget, [FREE, MODEL], CPU, offloaded=False)
    second.resume(first.learnt())
    assert second.summary() == first.summary() and second.learnt() == first.learnt()
    other = make_policy(budget, [FREE, OTHER_FREE, MODEL], CPU, offloaded=False)
    other.resume(first.learnt())                # other stages: the counts do not fit, start afresh
    assert not any(map(any, other.learnt()["acceptance"]["proposed"][0]))


def test_a_model_whose_step_is_cheap_here_runs_with_the_free_stages():
    """A head on a CPU: its step a twentieth of the target's. It drafts in the free arm, every
    round its worth allows, with no arm of its own for the bandit to weigh; the same head where
    its step is dearer (a GPU) keeps its arms."""
    head = Stage("head", True)
    cheap = replace(CPU, draft={1: 0.05, 4: 0.06})
    policy = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE, head], cheap,
                         offloaded=False)
    assert policy.arms == (Arm(32, models=False),) and policy.bandit is None
    plan = policy.plan(room=64)
    # it drafts after Max-Gram's copies and before the n-grams' guesses (draft_order)
    assert plan.stages == (0, 2, 1) and plan.free == (0, 2, 1) and plan.free_room == plan.room
    assert len(plan.allowed) == 3, "its growth is bounded by what pruning keeps, as theirs is"
    dear = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, OTHER_FREE, head], CPU,
                       offloaded=False)
    assert any(a.models for a in dear.arms) and Arm(32, models=False) in dear.arms
    assert all(2 not in dear.plan(room=64).free for _ in range(4))


def test_stages_draft_copies_first_then_free_models_then_other_free_ones_then_models():
    """A token two stages would both draft is credited to the first: a free head drafts before
    the n-grams, after Max-Gram; a dearer model stage drafts last, as every stage did before."""
    head = Stage("head", True)
    stages = [FREE, OTHER_FREE, head]
    assert draft_order(stages, (True, True, True)) == (0, 2, 1)
    assert draft_order(stages, (True, True, False)) == (0, 1, 2)
    assert draft_order([OTHER_FREE, FREE, MODEL, head], (True, True, False, True)) == (1, 3, 0, 2)
    dear = make_policy(TreeBudget(max_nodes=32, adaptive=True), stages, CPU, offloaded=False)
    for _ in range(8):
        plan = dear.plan(room=64)
        assert plan.stages in ((0, 1), (0, 1, 2)), plan.stages


def test_a_free_model_stage_sits_out_where_its_time_costs_more_than_it_brings():
    head = Stage("head", True)
    cheap = replace(CPU, draft={1: 0.05, 4: 0.06})
    policy = make_policy(TreeBudget(max_nodes=32, adaptive=True), [FREE, head], cheap, offloaded=False)
    ran = 0
    for _ in range(400):
        plan = policy.plan(room=64)
        if 1 in plan.stages:
            ran += 1
            policy.ran(1, 0.5)   # half a target step a round, and never a token accepted
        policy.observe(policy.select(chain(()), 64, None), (), [7], greedy=True, started=time.perf_counter())
    assert 0 < ran < 100, ran
