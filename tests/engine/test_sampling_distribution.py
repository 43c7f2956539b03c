"""Speculative sampling keeps the target's distribution, end to end on the tiny real models.

Many seeded generations of two tokens through the staged tree (Max-Gram's deterministic children
and the PyTorch draft's sampled ones); the empirical joint distribution of the two tokens is compared
with the target's exact one, computed from its own logits, by total-variation distance with a bound
derived from the sample size (tests/stat_bounds.py). The same test with a deliberately biased
verifier must fail, so the test can tell.
"""
from __future__ import annotations

import numpy as np
import pytest

import localspec.engine.verify as verify
from localspec.engine.config import SamplingParams, TreeBudget
from localspec.engine.distribution import process
from localspec.engine.config import DraftLimits
from localspec.engine.session import Session
from localspec.engine.options import Options

from stat_bounds import tv_bound, tv_distance

N = 1500
PARAMS = dict(temperature=1.5, top_k=0, top_p=1.0)
TOP_FIRST, TOP_SECOND = 3, 3


def exact_joint(session: Session, prompt: list[int]) -> dict:
    """P(t1, t2) for the likeliest first and second tokens, from plain target logits."""
    params = SamplingParams(**PARAMS)
    m = session.model

    def dist_after(tokens):
        m.clear()
        m.prefill(tokens, 0)
        return process(m.logits()[-1].copy(), params)

    def top(dist, k):
        order = np.argsort(-dist.probs)[:k]
        return zip(dist.ids[order], dist.probs[order])

    joint = {}
    for t1, p1 in top(dist_after(prompt), TOP_FIRST):
        for t2, p2 in top(dist_after(prompt + [int(t1)]), TOP_SECOND):
            joint[(int(t1), int(t2))] = float(p1 * p2)
    assert sum(joint.values()) > 0.3, joint   # the buckets must hold real mass
    return joint


def sampled_tv(session: Session, prompt: list[int], joint: dict) -> tuple[float, float]:
    keys = list(joint)
    counts = np.zeros(len(keys) + 1)
    index = {k: i for i, k in enumerate(keys)}
    for seed in range(N):
        out = session.run(prompt, max_tokens=2, sampling=SamplingParams(seed=seed, **PARAMS)).tokens
        counts[index.get(tuple(out[:2]), len(keys))] += 1
    exact = np.append(np.array([joint[k] for k in keys]), 1.0 - sum(joint.values()))
    return tv_distance(counts, exact), tv_bound(len(keys) + 1, N)


@pytest.fixture(scope="module")
def staged(tiny):
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_torch, n_ctx=256, n_threads=1,
                                   budget=TreeBudget(max_nodes=8),
                                   draft_limits=DraftLimits(max_depth=3, branching=2, width=4)))
    prompt = session.raw_prompt("for i in range(")  # an uncertain next token at T=1.5
    yield session, prompt, exact_joint(session, prompt)
    session.close()


def test_staged_tree_sampling_matches_target_distribution(staged):
    session, prompt, joint = staged
    tv, bound = sampled_tv(session, prompt, joint)
    assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("floor", [None, 0.15], ids=["whole-budget", "growth-floor"])
def test_draft_head_sampling_matches_target_distribution(tiny, tiny_head, floor):
    """The head's proposals cover only its draft vocabulary (zero mass elsewhere): still exact;
    also where its growth stops at a floor (sampled siblings end where a draw falls below it)."""
    session = Session(Options(tiny.target_gguf, head=tiny_head, n_ctx=256, n_threads=1,
                                   budget=TreeBudget(max_nodes=8),
                                   head_limits=DraftLimits(max_depth=3, branching=2, width=4, floor=floor)))
    try:
        prompt = session.raw_prompt("for i in range(")
        tv, bound = sampled_tv(session, prompt, exact_joint(session, prompt))
        drafted = session.run(prompt, max_tokens=24, sampling=SamplingParams(seed=1, **PARAMS)).stats
    finally:
        session.close()
    assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f}"
    assert sum(sum(s.proposed) for s in drafted.stages if s.name == "head") > 0


def accept_whenever_possible(tree, node, p, rng):
    """Biased: takes the first drafted child the target gives any probability, skipping the test."""
    for child in tree.children[node]:
        if p.prob_of(int(tree.tokens[child])) > 0:
            return child, int(tree.tokens[child])
    return -1, p.sample(rng)


@pytest.mark.slow
def test_biased_verifier_fails(staged, monkeypatch):
    session, prompt, joint = staged
    monkeypatch.setattr(verify, "choose_child", accept_whenever_possible)
    tv, bound = sampled_tv(session, prompt, joint)
    assert tv > bound, f"a biased verifier passed: TV {tv:.4f} < bound {bound:.4f}"
