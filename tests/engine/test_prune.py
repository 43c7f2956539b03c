"""Pruning the draft tree before verification by expected value under the calibrated costs."""
from __future__ import annotations

import numpy as np

from localspec.engine.costs import Costs
from localspec.engine.config import DraftLimits, SamplingParams, TreeBudget
from localspec.engine.decode import Engine
from localspec.engine.policy import make_policy
from localspec.engine.prune import AcceptanceModel, choose
from localspec.engine.session import Session
from localspec.engine.tree import DraftTree
from localspec.engine.options import Options

from test_sampling_distribution import PARAMS, exact_joint, sampled_tv

CPU = lambda n: 1.0 + 0.5 * (n - 1)    # noqa: E731  each extra token: half a plain step
GPU = lambda n: 1.0 + 0.01 * (n - 1)   # noqa: E731  nearly free


def two_stage_tree() -> DraftTree:
    """Stage 0 (a good chain) and stage 1 (a doubtful sibling with a child)."""
    t = DraftTree(16)
    t.reset(5)
    a = t.add(0, 10, 0.0, 0)
    b = t.add(a, 11, 0.0, 0)
    t.add(b, 12, 0.0, 0)
    c = t.add(0, 20, 0.0, 1)
    t.add(c, 21, 0.0, 1)
    return t


def test_choose_keeps_what_pays_on_this_machine():
    t = two_stage_tree()
    probs = np.array([1.0, 0.9, 0.8, 0.7, 0.1, 0.05])
    assert choose(t, probs, CPU).tolist() == [True, True, True, True, False, False]
    assert choose(t, probs, GPU).all()
    assert choose(t, np.array([1.0, 0.2, 0.1, 0.05, 0.1, 0.05]), CPU).tolist() == [True] + [False] * 5


def test_a_later_sibling_never_stays_without_the_earlier_ones():
    t = DraftTree(8)
    t.reset(5)
    t.add(0, 10, 0.0, 0)       # proposed first, unlikely
    t.add(0, 11, 0.0, 0)       # proposed second, likely
    probs = np.array([1.0, 0.05, 0.9])
    assert choose(t, probs, CPU).tolist() == [True, False, False]   # 0.95 expected for 1.0 extra
    assert choose(t, probs, GPU).tolist() == [True, True, True]     # both, in their order
    steep_after_two = lambda n: 1.0 if n <= 2 else 10.0             # noqa: E731  room for one node
    assert choose(t, probs, steep_after_two).tolist() == [True, True, False]


def test_acceptance_model_learns_per_stage_and_depth():
    model = AcceptanceModel(2, decay=1.0)
    t = two_stage_tree()
    for _ in range(50):
        model.update(t, (1, 2, 3))            # stage 0's chain accepted, stage 1's sibling not
    probs = model.node_probs(t)
    assert probs[1] > 0.9 and probs[3] > 0.85
    assert probs[4] < 0.05
    # node 5 (child of a rejected node) was never looked at: its depth borrows what its stage and
    # class showed at the other depths (rejected), not a coin flip
    assert model.rates()[1, 0, 2] < 0.05
    assert AcceptanceModel(2).rates()[1, 0, 2] == 0.5      # nothing seen at all: 1/2


def test_acceptance_model_tells_confidence_classes_apart():
    """Max-Gram chains after a long match are accepted, after a short one not: same stage and
    depths, told apart by the node's hint, so pruning keeps the one and drops the other."""
    model = AcceptanceModel(1, decay=1.0)
    long_match, short_match = DraftTree(8), DraftTree(8)
    for tree, hint in ((long_match, 6), (short_match, 1)):
        tree.reset(5)
        node = 0
        for token in (10, 11, 12, 13):
            node = tree.add(node, token, 0.0, 0, hint=hint)
    for _ in range(40):
        model.update(long_match, (1, 2, 3, 4))
        model.update(short_match, ())
    assert model.node_probs(long_match)[4] > 0.8
    assert model.node_probs(short_match)[1] < 0.05
    assert choose(long_match, model.node_probs(long_match), CPU).all()
    assert choose(short_match, model.node_probs(short_match), CPU).tolist() == [True] + [False] * 4


def test_acceptance_counts_survive_a_round_trip_and_reject_a_bad_shape():
    model = AcceptanceModel(2, decay=1.0)
    model.update(two_stage_tree(), (1, 2))
    again = AcceptanceModel(2)
    again.load(model.state())
    assert np.array_equal(again.rates(), model.rates())
    other = AcceptanceModel(3)
    other.load(model.state())                    # other stages: ignored, starts fresh
    assert (other.proposed == 0).all()


def test_copy_kept_preserves_order_parents_and_proposals():
    t = two_stage_tree()
    out = t.copy_kept(np.array([True, True, True, False, True, False]), DraftTree(16))
    assert out.n == 4
    assert out.tokens[:4].tolist() == [5, 10, 11, 20]
    assert out.parent[:4].tolist() == [-1, 0, 1, 0]
    assert out.children[0] == [1, 3] and out.drafter[3] == 1


def test_copy_kept_keeps_hints():
    t = DraftTree(4)
    t.reset(5)
    t.add(0, 10, 0.0, 0, hint=7)
    out = t.copy_kept(np.array([True, True]), DraftTree(4))
    assert out.hint[1] == 7


def _pruning_session(tiny) -> Session:
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_torch, n_ctx=256, n_threads=1,
                                   budget=TreeBudget(max_nodes=8),
                                   draft_limits=DraftLimits(max_depth=3, branching=2, width=4)))
    steep = Costs({1: 1.0, 2: 1.8, 4: 3.0, 9: 6.0}, {})    # a CPU where the batch costs a lot
    policy = make_policy(TreeBudget(max_nodes=8), session.stages, steep, offloaded=False)
    session.engine = Engine(session.engine.target, session.stages, policy)
    return session


def test_pruned_trees_keep_greedy_output(tiny):
    session = _pruning_session(tiny)
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=256, n_threads=1))
    try:
        tokens = session.raw_prompt("def add(a, b):\n")
        got = session.run(tokens, max_tokens=40)
        assert got.tokens == plain.run(tokens, max_tokens=40).tokens
        assert got.stats.pruned > 0
    finally:
        session.close()
        plain.close()


def test_pruned_trees_keep_the_target_distribution(tiny):
    session = _pruning_session(tiny)
    try:
        prompt = session.raw_prompt("for i in range(")
        joint = exact_joint(session, prompt)
        pruned = session.run(prompt, max_tokens=2, sampling=SamplingParams(seed=1, **PARAMS)).stats
        tv, bound = sampled_tv(session, prompt, joint)
        assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f}"
        assert pruned is not None
        total = sum(session.run(prompt, max_tokens=2, sampling=SamplingParams(seed=s, **PARAMS)).stats.pruned
                    for s in range(50))
        assert total > 0, "the steep cost curve should prune some sampled nodes"
    finally:
        session.close()


def _chain(tokens: tuple[int, ...], hint: int) -> DraftTree:
    tree = DraftTree(16)
    tree.reset(5)
    node = 0
    for token in tokens:
        node = tree.add(node, token, 0.0, 0, hint=hint)
    return tree


def test_a_gpu_round_leaving_the_one_token_shape_pays_the_graph_switch():
    """With stable shapes a speculative round after plain ones rebuilds llama.cpp's CUDA graph
    (Costs.switch): a chain worth its padded batch alone is dropped when it also has to pay
    that, and kept once the speculative shape is already the current one."""
    from localspec.engine.drafters.maxgram import MaxGram

    sure, doubtful = _chain(tuple(range(30, 38)), hint=6), _chain((10, 11, 12), hint=3)
    learnt = AcceptanceModel(1)
    for _ in range(20):
        learnt.update(sure, tuple(range(1, 9)))          # always taken: worth even the switch
        learnt.update(doubtful, (1, 2))                  # ~2/3 taken: worth 1.5x a step
    policy = make_policy(TreeBudget(max_nodes=8), [MaxGram()], Costs({1: 1.0, 9: 1.5}, {}, switch=3.0),
                         offloaded=True)
    policy.resume({"acceptance": learnt.state()})
    root_alone = _chain((), hint=0)

    def round_(drafted: DraftTree, taken: int) -> int:
        """One round where the target's text goes on with the chain's first `taken` tokens;
        the size of the tree verified."""
        policy.plan(room=8)
        batch = policy.select(drafted, 100, None)
        path = tuple(range(1, min(taken, batch.tree.n - 1) + 1))
        text = drafted.tokens[1:taken + 1].tolist() + [99]
        policy.observe(batch, path, text[:len(path) + 1], greedy=True, started=0.0)
        return batch.tree.n

    policy.begin()                                       # a generation starts as if after plain rounds
    assert round_(doubtful, 2) == 1
    assert round_(sure, 8) == 9                          # speculates: its shape is now the current one
    assert round_(doubtful, 2) == 4
    assert round_(root_alone, 0) == 1                    # a plain round
    assert round_(doubtful, 2) == 1


def test_pruned_nodes_are_judged_by_what_the_target_then_chose():
    """A chain pruned on a guess is still learnt from: its tokens against the committed ones."""
    model = AcceptanceModel(1, decay=1.0)
    t = DraftTree(8)
    t.reset(5)
    a = t.add(0, 10, 0.0, 0, hint=6)
    b = t.add(a, 11, 0.0, 0, hint=6)
    t.add(b, 12, 0.0, 0, hint=6)
    t.add(0, 20, 0.0, 0, hint=6)                   # a sibling the target did not take
    nothing_kept = np.array([True, False, False, False, False])
    model.observe_pruned(t, nothing_kept, [10, 11], greedy=True)   # the round committed 10, 11
    # depths 1 and 2 of the chain were taken, the sibling was not, depth 3 is not known yet
    assert model.proposed[0, 6, :4].tolist() == [0, 2, 1, 0]
    assert model.accepted[0, 6, :4].tolist() == [0, 1, 1, 0]
    model.observe_pruned(t, nothing_kept, [20], greedy=True)
    assert model.accepted[0, 6, 1] == 2 and model.proposed[0, 6, 1] == 4
