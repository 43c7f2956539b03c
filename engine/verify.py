"""Lossless verification of a draft tree against the target's logits.

Greedy: walk from the root, descending into the child whose token is the target's argmax; the first
argmax with no matching child is the target's own token. Every emitted token is the argmax of the
logits the target computed, so the output is the target's greedy output.

Sampling: recursive rejection sampling over the children, in the order they were proposed (Chen et
al.'s min(1, p/q) test generalised to several candidates). Child i was drawn from q_i = its
proposal q with the earlier siblings excluded (a deterministic child: q_i = one-hot). Accept it with
probability min(1, p_i(x)/q_i(x)); otherwise p_{i+1} = norm(max(0, p_i - q_i)) and try the next.
Each step is one speculative-sampling step targeting p_i, so by induction the emitted token is
distributed exactly as p. When no child is accepted the target's own token is drawn from the final
residual. Only p's support is touched (max(0, p - q) is zero outside it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import SamplingParams
from .distribution import Dist, draw_index, process
from .tree import DraftTree


@dataclass(frozen=True)
class Walk:
    path: tuple[int, ...]  # accepted node indices below the root, in order
    token: int             # the target's own token after the path


def greedy_walk(tree: DraftTree, rows: np.ndarray) -> Walk:
    node, path = 0, []
    while True:
        token = int(np.argmax(rows[node]))   # rows[node]: [vocab] view, reduced in numpy
        child = tree.child_with_token(node, token)
        if child < 0:
            return Walk(tuple(path), token)
        path.append(child)
        node = child


def sample_walk(tree: DraftTree, rows: np.ndarray, params: SamplingParams,
                rng: np.random.Generator) -> Walk:
    node, path = 0, []
    while True:
        child, token = choose_child(tree, node, process(rows[node], params), rng)
        if child < 0:
            return Walk(tuple(path), token)
        path.append(child)
        node = child


def _lookup(q: Dist, ids: np.ndarray) -> np.ndarray:
    """q's probabilities at `ids` (0 where q has no mass)."""
    order = np.argsort(q.ids)
    sorted_ids = q.ids[order]
    at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
    return np.where(sorted_ids[at] == ids, q.probs[order][at], 0.0)


def choose_child(tree: DraftTree, node: int, p: Dist, rng: np.random.Generator) -> tuple[int, int]:
    """(accepted child, its token) or (-1, token drawn from the residual)."""
    support = p.ids                    # [k] target's support
    pv = p.probs.copy()                # [k] current residual p_i over the support
    excluded: list[int] = []           # tokens of earlier siblings
    for child in tree.children[node]:
        x = int(tree.tokens[child])
        q = tree.proposal[child]
        at_x = support == x            # [k] one-hot of x within the support (maybe empty)
        if q is None:                  # deterministic child: q_i = one-hot(x)
            qv, q_x = at_x.astype(np.float64), 1.0
        else:
            mass_left = 1.0 - (_lookup(q, np.asarray(excluded, np.int64)).sum() if excluded else 0.0)
            qv = _lookup(q, support)
            if excluded:
                qv[np.isin(support, excluded)] = 0.0
            qv /= mass_left
            q_x = q.prob_of(x) / mass_left
        p_x = float(pv[at_x].sum())
        if q_x > 0 and rng.random() * q_x < p_x:
            return child, x
        residual = np.maximum(pv - qv, 0.0)
        total = residual.sum()
        if total > 1e-12:
            pv = residual / total
        excluded.append(x)
    return -1, int(support[draw_index(pv, rng)])

