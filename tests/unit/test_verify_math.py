"""Verification math on scripted distributions (no model): greedy walk, and the claim that tree
rejection sampling emits tokens distributed exactly as the target's p."""
from __future__ import annotations

import numpy as np
import pytest

from localspec.engine.distribution import Dist, draw_index
from localspec.engine.tree import DraftTree
from localspec.engine.verify import choose_child, greedy_walk

from stat_bounds import tv_bound, tv_distance

V = 6
P = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])   # target
Q = np.array([0.05, 0.50, 0.30, 0.05, 0.05, 0.05])   # a draft that disagrees with it


def dense(probs: np.ndarray) -> Dist:
    ids = np.flatnonzero(probs > 0)
    return Dist(ids.astype(np.int64), probs[ids].astype(np.float64))


def draw_children(tree: DraftTree, q: Dist, deterministic: list[int], n_sampled: int,
                  rng: np.random.Generator) -> None:
    """Children as the drafters make them: deterministic ones first, then draws from q without
    replacement excluding the siblings already present."""
    for tok in deterministic:
        tree.add(0, tok, 0.0, 0)
    probs = q.probs.copy()
    probs[np.isin(q.ids, deterministic)] = 0.0
    for _ in range(n_sampled):
        if probs.sum() <= 0:
            break
        i = draw_index(probs, rng)
        tree.add(0, int(q.ids[i]), 0.0, 1, proposal=q)
        probs[i] = 0.0


def biased_choose_child(tree, node, p, rng):
    """A deliberately wrong verifier: on rejection it resamples from p, not from the residual."""
    for child in tree.children[node]:
        x = int(tree.tokens[child])
        q = tree.proposal[child]
        q_x = 1.0 if q is None else q.prob_of(x)
        if rng.random() * q_x < p.prob_of(x):
            return child, x
    return -1, p.sample(rng)


def emitted_counts(verifier, deterministic, n_sampled, n, seed=1):
    rng = np.random.default_rng(seed)
    tree, p, q = DraftTree(16), dense(P), dense(Q)
    counts = np.zeros(V)
    for _ in range(n):
        tree.reset(0)
        draw_children(tree, q, deterministic, n_sampled, rng)
        _, token = verifier(tree, 0, p, rng)
        counts[token] += 1
    return counts


CASES = [([], 0), ([], 1), ([], 3), ([1], 0), ([2, 4], 2), ([], V)]


@pytest.mark.parametrize("deterministic,n_sampled", CASES)
def test_tree_rejection_sampling_reproduces_target(deterministic, n_sampled):
    n = 20000
    tv = tv_distance(emitted_counts(choose_child, deterministic, n_sampled, n), P)
    assert tv < tv_bound(V, n), (tv, tv_bound(V, n))


def test_biased_verifier_fails_the_same_test():
    n = 20000
    tv = tv_distance(emitted_counts(biased_choose_child, [], 2, n), P)
    assert tv > tv_bound(V, n), (tv, tv_bound(V, n))


def test_greedy_walk_follows_argmax_and_returns_targets_token():
    tree = DraftTree(8)
    tree.reset(0)
    a = tree.add(0, 3, 0.0, 0)
    tree.add(0, 4, 0.0, 0)
    b = tree.add(a, 5, 0.0, 0)
    rows = np.full((tree.n, V), -1.0, np.float32)
    rows[0, 3] = 2.0      # root -> 3 (child a)
    rows[a, 5] = 2.0      # a -> 5 (child b)
    rows[b, 1] = 2.0      # b -> 1: no child, the target's own token
    walk = greedy_walk(tree, rows)
    assert walk.path == (a, b) and walk.token == 1
    rows[0, 3], rows[0, 2] = -1.0, 2.0   # root's argmax has no child: nothing accepted
    walk = greedy_walk(tree, rows)
    assert walk.path == () and walk.token == 2


@pytest.mark.parametrize("n", [151936, 4096, 300, 7])
def test_top_ids_are_the_exact_top_k(n):
    """The column-maxima search finds exactly a full sort's top k: peaked and flat rows, the
    tail past the grid, and many equal logits (order among equals: by id)."""
    from localspec.engine.distribution import top_ids

    rng = np.random.default_rng(n)
    rows = [rng.standard_normal(n).astype(np.float32),
            np.round(rng.standard_normal(n), 1).astype(np.float32)]      # many ties
    peaked = rng.standard_normal(n).astype(np.float32)
    peaked[-min(n, 5):] += 20.0                                          # best in the tail
    rows.append(peaked)
    for row in rows:
        for k in (1, 2, 40, 100):
            want = np.argsort(-row, kind="stable")[:min(k, n)]
            got = top_ids(row, k)
            np.testing.assert_array_equal(row[got], row[want])            # the same values
            assert len(set(got.tolist())) == len(got) == min(k, n)


def test_top_dist_is_the_softmax_head():
    """Exact top k; probabilities at most the documented left-out mass above the softmax's, on a
    small flat row (the whole-row sum) and on 152k-entry peaked rows (the hot columns' sum)."""
    from localspec.engine.distribution import top_dist

    rng = np.random.default_rng(3)
    flat = (rng.standard_normal(5000) * 4).astype(np.float32)
    rows = [flat]
    for seed in range(6):
        row = (np.random.default_rng(seed).standard_normal(151_936) * 2.0).astype(np.float32)
        row[np.random.default_rng(seed).integers(0, row.size, 3)] += (18.0, 16.5, 15.0)
        rows.append(row)
    for row in rows:
        p = np.exp(row.astype(np.float64) - row.max())
        p /= p.sum()
        for k in (1, 2, 4):
            d = top_dist(row, k)
            assert d.ids.tolist() == np.argsort(-p, kind="stable")[:k].tolist()
            ratio = d.probs / np.sort(p)[::-1][:k]
            assert np.all(ratio >= 1 - 1e-6) and np.all(ratio <= 1 + 1.3e-2), ratio