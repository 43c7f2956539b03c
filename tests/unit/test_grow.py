"""Best-first growth's floor (drafters/grow.py): a drafter stops where its likeliest candidate is
less likely than the floor, with a scripted evaluator (every node: the same two guesses)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from localspec.engine.config import SamplingParams
from localspec.engine.distribution import Dist
from localspec.engine.drafters.grow import GrowLimits, grow
from localspec.engine.tree import DraftTree


class Scripted:
    """Every node's next-token guesses: token 1 at 0.7, token 2 at 0.2 (and the rest elsewhere)."""

    def __init__(self) -> None:
        self.evaluated: list[int] = []

    def dist(self) -> Dist:
        return Dist(np.array([1, 2, 3]), np.array([0.7, 0.2, 0.1]))

    def evaluate_root(self, tree: DraftTree) -> Dist:
        return self.dist()

    def evaluate(self, tree: DraftTree, nodes) -> list[Dist]:
        self.evaluated += list(nodes)
        return [self.dist() for _ in nodes]

    def rollback(self) -> None:
        pass


def _grow(floor: float, sampling: SamplingParams = SamplingParams()) -> tuple[DraftTree, Scripted]:
    tree = DraftTree(capacity=64)
    tree.reset(0)
    ev = Scripted()
    grow(tree, 0, GrowLimits(budget=20, max_depth=8, branching=2, width=4, chain=0, floor=floor),
         sampling, np.random.default_rng(0), ev)
    return tree, ev


def test_without_a_floor_the_whole_budget_grows():
    tree, _ = _grow(0.0)
    assert tree.n - 1 == 20


@pytest.mark.parametrize("floor", [0.3, 0.15, 0.05])
def test_no_node_below_the_floor_and_every_candidate_above_it_grown(floor):
    tree, ev = _grow(floor)
    path = np.exp(tree.logp[1:tree.n])
    assert (path >= floor - 1e-12).all(), path
    # every node's first guess (0.7) and second (0.2) that clear the floor are in the tree
    for node in range(tree.n):
        p = math.exp(tree.logp[node])
        if tree.depth[node] < 8:
            want = [t for t, q in ((1, 0.7), (2, 0.2)) if p * q >= floor]
            assert sorted(int(tree.tokens[c]) for c in tree.children[node]) == want
    assert tree.n - 1 < 20, "the floor ended growth before the budget"
    assert ev.evaluated, "the nodes above the floor were expanded"


def test_a_floor_of_0_3_grows_the_likely_chain_alone():
    tree, _ = _grow(0.3)
    # 0.7, 0.49, 0.343 along the first guesses; 0.2 and 0.14 branch off below 0.3
    assert [int(t) for t in tree.tokens[1:tree.n]] == [1, 1, 1]
    assert list(tree.depth[1:tree.n]) == [1, 2, 3]


def test_sampled_siblings_stay_a_prefix_of_their_draws():
    tree, _ = _grow(0.15, SamplingParams(temperature=1.0, seed=3))
    for node in range(tree.n):
        kids = tree.children[node]
        if len(kids) > 1:   # a later draw only with the earlier one: both from the node's q
            assert all(tree.proposal[c] is not None for c in kids)
    assert (np.exp(tree.logp[1:tree.n]) >= 0.15 - 1e-12).all()
