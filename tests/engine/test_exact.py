"""Exact numerics (`--exact`): llama.cpp made batch-invariant on the CPU, where greedy speculation
must emit plain decoding's tokens bit for bit, with no near-tie allowance (by default llama.cpp's
batched matmuls sum in another order than one-row decodes, docs/exact-numerics.md)."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp as lc
import numpy as np
import pytest

from localspec.engine import build as build_module
from localspec.engine import llama_model, native
from localspec.engine.budget import AdaptiveBudget
from localspec.engine.costs import Costs
from localspec.engine.config import DraftLimits, TreeBudget
from localspec.engine.decode import Engine
from localspec.engine.errors import LocalspecError
from localspec.engine.llama_model import LlamaModel
from localspec.engine.session import Session
from localspec.engine.target import Target
from localspec.engine.tree import DraftTree
from localspec.engine.options import Options

from test_greedy_equality import PROMPTS, prompt_tokens

MAX_TOKENS = 48
CONFIGS = {
    "maxgram": (False, True, TreeBudget(max_nodes=8), DraftLimits()),
    "gguf-tree": (True, False, TreeBudget(max_nodes=16), DraftLimits(max_depth=5, branching=2, width=4)),
    "gguf-wide": (True, False, TreeBudget(max_nodes=32), DraftLimits(max_depth=3, branching=4, width=8)),
    "staged-adaptive": (True, True, TreeBudget(max_nodes=16, adaptive=True),
                        DraftLimits(max_depth=6, branching=2, width=4)),
}


@pytest.fixture(scope="module")
def quantised(tiny, tmp_path_factory) -> Path:
    """The tiny target in Q5_1. Its matmuls take ggml's row-by-row kernel in batches too; F32
    weights take llamafile's batched sgemm, which sums otherwise (its own test below)."""
    out = tmp_path_factory.mktemp("exact") / "target-q5_1.gguf"
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_Q5_1
    rc = lc.llama_model_quantize(str(tiny.target_gguf).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize returned {rc}"
    return out


@pytest.fixture(scope="module")
def plain_exact(quantised):
    session = Session(Options(quantised, speculation=False, n_ctx=512, n_threads=1, exact=True))
    outputs = {}
    for kind, text in PROMPTS:
        tokens = prompt_tokens(session, kind, text)
        outputs[(kind, text)] = (tokens, session.run(tokens, max_tokens=MAX_TOKENS).tokens)
    yield outputs
    session.close()


def test_exact_tree_batch_rows_equal_each_path_decoded_alone(quantised):
    """A tree batch (two branches, shared root) gives every node the logits its path gets one
    token at a time, bit for bit: the rows' own kernels, not a batched one."""
    model = LlamaModel(quantised, n_ctx=256, n_seq_max=4, n_threads=1, exact=True)
    try:
        prompt = model.tokenize("def add(a, b):\n    return a + b\n\nclass Counter:\n")
        start = len(prompt)
        a, b = [11, 12, 13, 14], [21, 22, 23]
        # root, then branch a (seq 0) and branch b (seq 1) interleaved: their cells alternate
        tokens = [5, a[0], b[0], a[1], b[1], a[2], b[2], a[3]]
        pos = [start, start + 1, start + 1, start + 2, start + 2, start + 3, start + 3, start + 4]
        seqs = [(0, 1), (0,), (1,), (0,), (1,), (0,), (1,), (0,)]
        model.prefill(prompt, 0)
        model.seq_cp(0, 1)
        model.decode(tokens, pos, seqs)
        tree = model.logits().copy()
        for branch, rows in ((a, [0, 1, 3, 5, 7]), (b, [0, 2, 4, 6])):
            model.clear()
            model.prefill(prompt, 0)
            for i, token in enumerate([5] + branch):
                model.decode([token], [start + i])
                assert np.array_equal(model.logits()[0], tree[rows[i]]), f"node {rows[i]}"
    finally:
        model.close()


def test_exact_switches_are_held_while_an_exact_model_is_open(quantised, monkeypatch):
    """The switches are process-wide: set by the first exact model opened, kept while any is
    open, and given back as they were (a user's value, or unset) when the last one closes."""
    switches = native.EXACT_SWITCHES
    if not llama_model.exact_in_process():
        monkeypatch.setenv(native.TILED_MIN, "12")           # a user's own value
        monkeypatch.delenv("GGML_CPU_FA_SPLIT_KV", raising=False)
    before = {key: os.environ.get(key) for key in switches}
    first = LlamaModel(quantised, n_ctx=256, n_threads=1, exact=True)
    try:
        second = LlamaModel(quantised, n_ctx=256, n_threads=1, exact=True)
        try:
            assert {key: os.environ.get(key) for key in switches} == switches
            first.close()
            assert {key: os.environ.get(key) for key in switches} == switches   # still held
        finally:
            second.close()
    finally:
        first.close()
    assert {key: os.environ.get(key) for key in switches} == before


@pytest.mark.parametrize("name", list(CONFIGS))
def test_exact_speculation_emits_plain_tokens(tiny, quantised, plain_exact, name, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    use_draft, maxgram, budget, limits = CONFIGS[name]
    if budget.adaptive:   # a flat, GPU-like curve, so the rounds speculate (test_greedy_equality)
        flat = Costs({1: 1e-3, 2: 1.05e-3, 4: 1.1e-3, 8: 1.2e-3, 16: 1.4e-3, 32: 1.8e-3},
                     {1: 3e-4, 2: 3.1e-4, 4: 3.2e-4, 8: 3.3e-4})   # a draft model's step: in arms
        monkeypatch.setattr(build_module, "calibrate", lambda *a, **k: flat)
    session = Session(Options(quantised, draft=tiny.draft_gguf if use_draft else None, maxgram=maxgram,
                                   n_ctx=512, n_threads=1, budget=budget, draft_limits=limits, exact=True))
    policy = session.engine.policy
    if policy.bandit is not None:
        policy.bandit = AdaptiveBudget(policy.bandit.arms, explore_every=1)
    accepted = rejected = 0
    try:
        for kind, text in PROMPTS:
            tokens, expect = plain_exact[(kind, text)]
            result = session.run(tokens, max_tokens=MAX_TOKENS)
            assert result.tokens == expect, f"{name}: {kind} {text[:30]!r}"
            accepted += sum(sum(s.accepted) for s in result.stats.stages)
            rejected += sum(sum(s.proposed) - sum(s.accepted) for s in result.stats.stages)
    finally:
        session.close()
    assert accepted > 0 and rejected > 0, f"{name}: accepted {accepted}, rejected {rejected}"


def test_exact_rows_past_256_cells_of_context_equal_one_at_a_time(quantised):
    """Past 256 cells ggml's flash attention views 512 and splits a single query's cells over
    threads; exact numerics switch that off (packaging/patches), so long contexts stay exact."""
    assert native.has_exact_switches(), "llama.cpp was built without packaging/patches"
    model = LlamaModel(quantised, n_ctx=1024, n_seq_max=2, n_threads=2, exact=True)
    try:
        context = [(7 * i + 3) % model.vocab_size for i in range(300)]
        model.prefill(context, 0)
        tokens = [11, 12, 13, 14, 15]
        alone = []
        for i, token in enumerate(tokens):
            model.decode([token], [300 + i])
            alone.append(model.logits()[0].copy())
        model.seq_rm(0, 300, -1)
        model.decode(tokens, list(range(300, 305)))
        assert np.array_equal(model.logits(), np.array(alone))
    finally:
        model.close()


def test_exact_refuses_a_llama_cpp_without_the_split_kv_switch(quantised, monkeypatch):
    monkeypatch.setattr(llama_model, "has_exact_switches", lambda: False)
    with pytest.raises(LocalspecError, match="localspec's llama.cpp build") as err:
        LlamaModel(quantised, n_ctx=256, exact=True)
    assert "make install" in err.value.fix


def test_exact_refuses_a_model_whose_batches_sum_otherwise(tiny):
    with pytest.raises(LocalspecError, match="Exact numerics are not available") as err:
        LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=2, n_threads=1, exact=True)
    assert "K-quant" in err.value.fix


def test_exact_refuses_gpu_offload_before_loading(tiny, monkeypatch):
    monkeypatch.setattr(llama_model, "gpu_offload_supported", lambda: True)
    monkeypatch.setattr(llama_model.lc, "llama_model_load_from_file",
                        lambda *a: pytest.fail("loaded a model it should have refused"))
    with pytest.raises(LocalspecError, match="CPU only") as err:
        LlamaModel(tiny.target_gguf, n_gpu_layers=-1, exact=True)
    assert "--gpu-layers 0" in err.value.fix


def test_exact_refuses_trees_past_the_attention_tile(quantised):
    with pytest.raises(LocalspecError, match="Tree too large") as err:
        Session(Options(quantised, exact=True, n_ctx=512, budget=TreeBudget(max_nodes=62)))
    assert "61 nodes or fewer" in err.value.fix
    Session(Options(quantised, exact=True, n_ctx=512, budget=TreeBudget(max_nodes=61))).close()


def _hole_round(model: LlamaModel, prompt: list[int], ordered: bool,
                next_nodes: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Verify a tree whose accepted path sits behind a rejected row, commit it, verify the next
    tree (a chain of `next_nodes` below root 44: 45, 46, ...); the logits of the accepted nodes
    and of the next tree's first two nodes, and the hidden state the head would draft from after
    the first commit (with hidden states). ordered False: the commit of the default mode
    (rejected cells freed in place, holes before accepted cells)."""
    target = Target(model)
    target.exact = ordered
    target.reset()
    target.prefill(prompt[:-1])
    tree = DraftTree(16)
    tree.reset(prompt[-1])
    rejected = tree.add(0, 40, 0.0, 0)         # row 1: rejected
    y = tree.add(0, 41, 0.0, 0)                # row 2: accepted
    tree.add(rejected, 42, 0.0, 0)             # row 3: rejected
    z = tree.add(y, 43, 0.0, 0)                # row 4: accepted
    first = target.verify(tree)[[y, z]].copy()
    target.commit(tree, [y, z])
    # ordered: y and z sit behind the rejected row 1, so only the root stays and they wait
    assert target.n_past == len(prompt) + (0 if ordered else 2)
    hidden = target.new_hidden()[1][-1] if model.hidden else None   # z's row: a copy
    nxt = DraftTree(next_nodes + 1)
    nxt.reset(44)
    for i in range(next_nodes):
        nxt.add(i, 45 + i, 0.0, 0)
    second = target.verify(nxt)[:2].copy()
    assert target.redecoded == (2 if ordered else 0)
    return first, second, hidden


def test_exact_commit_behind_a_rejected_row_keeps_bitwise_logits(quantised):
    """The accepted path's nodes sit behind rejected rows: exact mode decodes them again at the
    head of the next batch, so the next round computes what one-at-a-time decoding computes."""
    model = LlamaModel(quantised, n_ctx=256, n_seq_max=8, n_threads=1, exact=True)
    try:
        prompt = model.tokenize("class Counter:\n    def __init__(self):\n        self.n = 0\n")
        first, second, _ = _hole_round(model, prompt, ordered=True)
        model.clear()
        model.prefill(prompt[:-1], 0)
        alone = []
        for i, token in enumerate([prompt[-1], 41, 43, 44, 45]):
            model.decode([token], [len(prompt) - 1 + i])
            alone.append(model.logits()[0].copy())
        assert np.array_equal(first, np.array(alone[1:3]))
        assert np.array_equal(second, np.array(alone[3:5]))
        # the default mode's commit leaves holes that the next batch fills: other sums
        _, unordered, _ = _hole_round(model, prompt, ordered=False)
        assert not np.array_equal(unordered, np.array(alone[3:5]))
        # pending tokens ahead of a tree that would pass 63 rows go in a batch of their own
        _, long_next, _ = _hole_round(model, prompt, ordered=True, next_nodes=61)
        assert np.array_equal(long_next, np.array(alone[3:5]))
    finally:
        model.close()


def test_exact_commit_behind_a_rejected_row_keeps_the_heads_hidden_state(quantised):
    """With hidden states (a draft head drafts from them) the last accepted node's row is found
    behind the pending rows too, and equals the one-at-a-time state."""
    model = LlamaModel(quantised, n_ctx=256, n_seq_max=8, n_threads=1, exact=True, hidden=True)
    try:
        prompt = model.tokenize("class Counter:\n    def __init__(self):\n        self.n = 0\n")
        _, _, hidden = _hole_round(model, prompt, ordered=True)
        model.clear()
        model.prefill(prompt[:-1], 0)
        for i, token in enumerate([prompt[-1], 41, 43]):
            model.decode([token], [len(prompt) - 1 + i])
        assert np.array_equal(hidden, model.hidden_row(0))
    finally:
        model.close()


def test_exact_speculation_with_decoded_again_tokens_emits_plain_tokens(tiny, quantised, plain_exact,
                                                                         tmp_path, monkeypatch):
    """Trees in proposal order (not likeliest path first): accepted nodes often sit behind
    rejected rows and are decoded again at the head of the next batch; output still plain's."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    session = Session(Options(quantised, draft=tiny.draft_gguf, n_ctx=512, n_threads=1, exact=True,
                                   budget=TreeBudget(max_nodes=16),
                                   draft_limits=DraftLimits(max_depth=5, branching=3, width=4)))
    engine = session.engine
    session.engine = Engine(engine.target, engine.stages, engine.policy, likeliest_first=False)
    redecoded = 0
    try:
        for kind, text in PROMPTS:
            tokens, expect = plain_exact[(kind, text)]
            result = session.run(tokens, max_tokens=MAX_TOKENS)
            assert result.tokens == expect, f"{kind} {text[:30]!r}"
            redecoded += result.stats.redecoded
    finally:
        session.close()
    assert redecoded > 0
