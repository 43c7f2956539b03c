"""Greedy speculative output == plain greedy output, token for token, across drafters and tree
shapes, on the tiny real models (llama.cpp target; llama.cpp and PyTorch drafts)."""
from __future__ import annotations

import pytest

from localspec.engine import build as build_module
from localspec.engine.budget import AdaptiveBudget
from localspec.engine.costs import Costs
from localspec.engine.config import TreeBudget
from localspec.engine.config import DraftLimits
from localspec.engine.generation import Finished, Round, finish
from localspec.engine.session import Session
from localspec.engine.shapes import Shapes
from localspec.engine.options import Options

from equality import check_same_or_near_tie

PROMPTS = [
    ("raw", "def add(a, b):\n"),
    ("raw", "for i in range(3):\n    total = total + i\n"),
    ("raw", "class Counter:\n    def __init__(self):\n"),
    ("chat", "Write a function that returns the largest number in a list."),
    # material the model repeats: what Max-Gram copies (the tiny models' own continuations of
    # the prompts above end early and repeat too little for a 3-token match on every build)
    ("raw", "class Person:\n    def __init__(self, name, age):\n        self.name = name\n"
            "        self.age = age\n\n\nclass Person:\n    def __init__(self, name, age):\n"),
]

# name -> (draft kind, maxgram, budget, draft limits)
CONFIGS = {
    "maxgram": (None, True, TreeBudget(max_nodes=8), DraftLimits()),
    "gguf-chain": ("gguf", False, TreeBudget(max_nodes=6), DraftLimits(max_depth=6, branching=1, width=1)),
    "gguf-tree": ("gguf", False, TreeBudget(max_nodes=16), DraftLimits(max_depth=5, branching=2, width=4)),
    "gguf-wide": ("gguf", False, TreeBudget(max_nodes=32), DraftLimits(max_depth=3, branching=4, width=8)),
    "staged": ("gguf", True, TreeBudget(max_nodes=16), DraftLimits(max_depth=6, branching=2, width=4)),
    "torch-tree": ("torch", False, TreeBudget(max_nodes=12), DraftLimits(max_depth=4, branching=3, width=4)),
    "torch-staged": ("torch", True, TreeBudget(max_nodes=16), DraftLimits(max_depth=6, branching=2, width=4)),
    "adaptive": ("gguf", True, TreeBudget(max_nodes=16, adaptive=True), DraftLimits(max_depth=6, branching=2, width=4)),
    # the draft head (drafters/head.py) on the target's hidden states: alone, staged, adaptive
    "head-tree": ("head", False, TreeBudget(max_nodes=12), DraftLimits(max_depth=5, branching=2, width=4)),
    "head-staged": ("head", True, TreeBudget(max_nodes=16), DraftLimits(max_depth=6, branching=3, width=8, chain=4)),
    "head-adaptive": ("head", True, TreeBudget(max_nodes=16, adaptive=True), DraftLimits(max_depth=6, branching=3, width=8)),
    # a head that reads two of the target's layers beside its last (taps)
    "head-taps": ("head-taps", False, TreeBudget(max_nodes=12), DraftLimits(max_depth=5, branching=2, width=4)),
}
MAX_TOKENS = 48


def prompt_tokens(session: Session, kind: str, text: str) -> list[int]:
    if kind == "raw":
        return session.raw_prompt(text)
    return session.chat_prompt([{"role": "user", "content": text}])


@pytest.fixture(scope="module")
def plain(tiny):
    session = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    outputs = {}
    for kind, text in PROMPTS:
        tokens = prompt_tokens(session, kind, text)
        outputs[(kind, text)] = (tokens, session.run(tokens, max_tokens=MAX_TOKENS).tokens)
    yield session, outputs
    session.close()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_speculative_greedy_equals_plain(tiny, plain, name, tmp_path, monkeypatch, request):
    # a fresh data dir: no other test's learnt budget estimates (which may favour plain rounds)
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    draft_kind, maxgram, budget, limits = CONFIGS[name]
    if budget.adaptive:
        # the tiny models' measured cost curve is timer noise (a batch of any size costs ~1 ms),
        # by which pruning may keep nothing: a flat, GPU-like curve, so the rounds speculate
        flat = Costs({1: 1e-3, 2: 1.05e-3, 4: 1.1e-3, 8: 1.2e-3, 16: 1.4e-3, 32: 1.8e-3},
                     {1: 3e-4, 2: 3.1e-4, 4: 3.2e-4, 8: 3.3e-4})   # a draft model's step: in arms
        monkeypatch.setattr(build_module, "calibrate", lambda *a, **k: flat)
    draft = {"gguf": tiny.draft_gguf, "torch": tiny.draft_torch}.get(draft_kind)
    fixture = {"head": "tiny_head", "head-taps": "tiny_head_taps"}.get(draft_kind)
    head = request.getfixturevalue(fixture) if fixture else None
    session = Session(Options(tiny.target_gguf, draft=draft, head=head, maxgram=maxgram, n_ctx=512,
                                   n_threads=1, budget=budget, draft_limits=limits, head_limits=limits))
    plain_session, outputs = plain
    policy = session.engine.policy
    if policy.bandit is not None:
        # On the tiny models a target call costs about as much as a round's Python, so plain
        # decoding may rightly lead and the bandit then only probes: probe every arm often, so
        # that the rounds this test checks speculate (the policy itself: test_budget.py)
        policy.bandit = AdaptiveBudget(policy.bandit.arms, explore_every=1)
    accepted = 0
    try:
        for kind, text in PROMPTS:
            tokens, expect = outputs[(kind, text)]
            assert prompt_tokens(session, kind, text) == tokens
            result = session.run(tokens, max_tokens=MAX_TOKENS)
            note = check_same_or_near_tie(plain_session.model, tokens, expect, result.tokens, 0.05)
            assert not note, note  # the tiny F32 models have clear margins: demand identity
            assert result.stats.tokens == len(result.tokens)
            # each emitted token names its proposer; the drafters' counts agree with the stats
            assert len(result.sources) == len(result.tokens)
            for s in result.stats.stages:
                assert result.sources.count(s.name) <= sum(s.accepted)
            assert result.sources.count("target") >= result.stats.target_calls - 1
            accepted += sum(sum(s.accepted) for s in result.stats.stages)
            assert result.stats.target_calls <= len(result.tokens) + 1
    finally:
        session.close()
    assert accepted > 0, f"{name}: no drafted token was ever accepted"


def test_rounds_carry_every_emitted_token_with_its_source(tiny, plain):
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                   personal=False, budget=TreeBudget(max_nodes=8)))
    plain_session, outputs = plain
    try:
        tokens, expect = outputs[PROMPTS[0]]
        *rounds, finished = session.generate(tokens, max_tokens=MAX_TOKENS)
    finally:
        session.close()
    assert all(isinstance(r, Round) for r in rounds) and isinstance(finished, Finished)
    result = finished.generation
    seen_tokens = [t for r in rounds for t in r.tokens]
    seen_sources = [s for r in rounds for s in r.sources]
    assert seen_tokens == result.tokens == expect
    assert seen_sources == result.sources
    assert set(seen_sources) <= {"maxgram", "target", session.stages[-1].name}
    assert any(s != "target" for s in seen_sources)


@pytest.mark.parametrize("draft_kind", ["gguf", "torch"])
def test_stable_shapes_keep_greedy_output(tiny, plain, draft_kind):
    """The GPU mode (held adaptive choices, padded batches), forced on the CPU: same tokens.
    Without calibration: a CPU's measured switch cost (0) would make shape changes cheap, which
    turns the mode off (test_draft_shapes.py)."""
    draft = tiny.draft_gguf if draft_kind == "gguf" else tiny.draft_torch
    session = Session(Options(tiny.target_gguf, draft=draft, n_ctx=512, n_threads=1, calibrate=False,
                                   budget=TreeBudget(max_nodes=8, adaptive=True), stable_shapes=True,
                                   draft_limits=DraftLimits(max_depth=6, branching=2, width=4)))
    plain_session, outputs = plain
    assert session.engine.policy.shapes is Shapes.STABLE   # no cost curve, so no pruning: every tree padded
    calls = []
    verify = session.engine.target.verify
    session.engine.target.verify = lambda tree, pad=0, top_up=True: (calls.append((tree.n, pad)),
                                                                      verify(tree, pad, top_up))[1]
    try:
        for kind, text in PROMPTS:
            tokens, expect = outputs[(kind, text)]
            assert session.run(tokens, max_tokens=MAX_TOKENS).tokens == expect
    finally:
        session.close()
    padded = [(n, pad) for n, pad in calls if pad]
    assert padded and all(pad >= n for n, pad in padded)
    assert len({pad for _, pad in padded}) <= 3     # one shape per held budget


def test_should_stop_ends_at_a_round_with_statistics(tiny, plain):
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                   budget=TreeBudget(max_nodes=8)))
    plain_session, outputs = plain
    events = []
    try:
        tokens, expect = outputs[PROMPTS[0]]
        # every round of this prompt emits a token, so two events are two rounds
        for event in session.generate(tokens, max_tokens=MAX_TOKENS, should_stop=lambda: len(events) >= 2):
            events.append(event)
        result = finish(iter(events))
        assert result.finish_reason == "stopped"
        assert result.stats.target_calls == 2 and result.stats.tokens == len(result.tokens)
        assert result.tokens == expect[:len(result.tokens)] and 0 < len(result.tokens) < len(expect)
        # the engine is consistent afterwards: the next generation is the full plain output
        assert session.run(tokens, max_tokens=MAX_TOKENS).tokens == expect
    finally:
        session.close()
