"""Distribution-distance checks with a bound derived from the sample size.

Weissman et al. (2003): for the empirical distribution of n samples over k outcomes,
P(||p_hat - p||_1 >= eps) <= (2^k - 2) exp(-n eps^2 / 2). Solving for eps at failure
probability delta gives the total-variation bound eps / 2 used by the tests.
"""
from __future__ import annotations

import math

import numpy as np


def tv_bound(k: int, n: int, delta: float = 1e-6) -> float:
    eps_l1 = math.sqrt(2.0 * (k * math.log(2.0) + math.log(1.0 / delta)) / n)
    return eps_l1 / 2.0


def tv_distance(counts: np.ndarray, p: np.ndarray) -> float:
    p_hat = counts / counts.sum()
    return 0.5 * float(np.abs(p_hat - p).sum())


def bucketed(samples: list[int], p_ids: np.ndarray, p_probs: np.ndarray, top: int):
    """Counts and exact probabilities over the `top` likeliest tokens plus one 'other' bucket."""
    order = np.argsort(-p_probs)[:top]
    ids, probs = p_ids[order], p_probs[order]
    exact = np.append(probs, max(0.0, 1.0 - probs.sum()))
    index = {int(t): i for i, t in enumerate(ids)}
    counts = np.zeros(len(ids) + 1)
    for s in samples:
        counts[index.get(int(s), len(ids))] += 1
    return counts, exact
