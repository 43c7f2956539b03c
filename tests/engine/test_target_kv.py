"""The target's tree verification and its one rollback method, on the tiny real model.

Invariants: each tree node's logits are those of its own root-to-node path; after commit the cache
behaves exactly as a fresh evaluation of the accepted tokens (the next token's logits match).
"""
from __future__ import annotations

import numpy as np
import pytest

from localspec.engine.llama_model import LlamaModel
from localspec.engine.target import Target
from localspec.engine.tree import DraftTree

ATOL = 2e-3   # batch composition changes llama.cpp's float summation order, not the result
# a tree's rows take packaging/patches' f32 attention for few rows (docs/decisions/0034), the
# one-token reference ggml's loop, which sums in f16: further apart, still one argmax
ATOL_FEW_ROWS = 5e-3


@pytest.fixture(scope="module")
def models(tiny):
    a = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=8, n_threads=1, n_pad_seqs=11)
    b = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=1, n_threads=1)
    yield a, b
    a.close()
    b.close()


def fresh_logits(model: LlamaModel, tokens: list[int]) -> np.ndarray:
    """Logits after each of `tokens`, evaluated one at a time into an empty cache."""
    model.clear()
    rows = []
    for i, tok in enumerate(tokens):
        model.decode([tok], [i])
        rows.append(model.logits()[0].copy())
    return np.array(rows)


def example_tree(root: int, toks: list[int]) -> DraftTree:
    t = DraftTree(16)
    t.reset(root)
    a = t.add(0, toks[0], 0.0, 0)
    b = t.add(0, toks[1], 0.0, 0)
    c = t.add(a, toks[2], 0.0, 0)
    t.add(a, toks[3], 0.0, 0)
    d = t.add(b, toks[4], 0.0, 0)
    t.add(d, toks[5], 0.0, 0)
    t.add(c, toks[6], 0.0, 0)
    return t


def verified(model: LlamaModel, text: str, tokens: list[int]):
    """A target holding `text` with the example tree of `tokens` verified: (context, target, tree, rows)."""
    context = model.tokenize(text, special=False)
    target = Target(model)
    target.reset()
    target.prefill(context[:-1])
    tree = example_tree(context[-1], tokens)
    rows = target.verify(tree).copy()
    return context, target, tree, rows


@pytest.mark.parametrize("few_rows", ["0", "1"])
def test_tree_logits_equal_each_paths_own_logits(models, tiny, monkeypatch, few_rows):
    """With ggml's attention loop for the tree's rows and with the few-rows path (GGML_CPU_FA_ROWS,
    read on each call): each node's logits are its own path's."""
    monkeypatch.setenv("GGML_CPU_FA_ROWS", few_rows)
    model, ref = models
    context, target, tree, rows = verified(model, "def add(a, b):\n    return", [11, 12, 13, 14, 15, 16, 17])
    for node in range(tree.n):
        path = context + tree.path_tokens(node)
        expect = fresh_logits(ref, path)[-1]
        assert np.argmax(rows[node]) == np.argmax(expect)
        np.testing.assert_allclose(rows[node], expect, atol=ATOL if few_rows == "0" else ATOL_FEW_ROWS)


@pytest.mark.parametrize("accept", ["none", "first-branch", "second-branch-deep", "leaf"])
def test_commit_leaves_cache_as_fresh_evaluation(models, accept):
    model, ref = models
    context, target, tree, _ = verified(model, "for i in range(10):\n", [21, 22, 23, 24, 25, 26, 27])
    path = {"none": (), "first-branch": (1, 3), "second-branch-deep": (2, 5, 6),
            "leaf": (1, 3, 7)}[accept]
    target.commit(tree, path)
    kept = context + [int(tree.tokens[n]) for n in path]
    assert target.n_past == len(kept)
    assert model.seq_pos_max(0) == len(kept) - 1
    for seq in range(1, model.n_seq_max):   # the paths keep the context's tags, nothing past it
        assert model.seq_pos_max(seq) < len(kept), f"sequence {seq} still holds tree nodes"
    # continue decoding two tokens as if nothing else ever ran
    nxt = [31, 32]
    model.decode(nxt, [target.n_past, target.n_past + 1])
    got = model.logits().copy()
    expect = fresh_logits(ref, kept + nxt)[-2:]
    assert (np.argmax(got, axis=1) == np.argmax(expect, axis=1)).all()
    np.testing.assert_allclose(got, expect, atol=ATOL)


@pytest.mark.parametrize("pad_to", [0, 12])
def test_rounds_after_a_commit_see_only_the_accepted_tokens(models, pad_to):
    """The paths' sequences keep their tags of the context between rounds (target.py): a rejected
    node left in any of them, or a committed token missing from one, would change the logits of
    the nodes that read it. Rounds of trees with one to four paths, a plain step among them, each
    node's logits checked against its own path evaluated afresh."""
    model, ref = models
    context = model.tokenize("def mul(a, b):\n    return", special=False)
    target = Target(model)
    target.reset()
    target.prefill(context[:-1])
    kept, root = context[:-1], context[-1]
    for i, path in enumerate([(2, 5), None, (1, 4), (), (1, 3, 7)]):   # None: a plain step
        if path is None:
            tree, path = DraftTree(16), ()
            tree.reset(root)
        else:
            tree = example_tree(root, [10 * i + j for j in range(11, 18)])
        rows = target.verify(tree, pad_to=pad_to).copy()
        for node in range(tree.n):
            expect = fresh_logits(ref, kept + [root] + tree.path_tokens(node))[-1]
            np.testing.assert_allclose(rows[node], expect, atol=ATOL_FEW_ROWS)
        target.commit(tree, path)
        kept = kept + [root] + [int(tree.tokens[n]) for n in path]
        root = 90 + i
        assert target.n_past == len(kept) and model.seq_pos_max(0) == len(kept) - 1


def test_a_root_decoded_alone_commits_without_touching_the_cache(models):
    """A plain step (root alone, unpadded) leaves nothing to roll back: commit only counts it, and
    the cache still continues as a fresh evaluation."""
    model, ref = models
    context = model.tokenize("x = [1, 2, 3]\n", special=False)
    target = Target(model)
    target.reset()
    target.prefill(context[:-1])
    tree = DraftTree(4)
    for token in (context[-1], 61, 62):
        tree.reset(token)
        target.verify(tree)
        target.commit(tree, ())
    kept = context + [61, 62]
    assert target.n_past == len(kept) and model.seq_pos_max(0) == len(kept) - 1
    model.decode([63], [target.n_past])
    np.testing.assert_allclose(model.logits()[0], fresh_logits(ref, kept + [63])[-1], atol=ATOL)


@pytest.mark.parametrize("top_up", [True, False])
@pytest.mark.parametrize("nodes", [0, 7])
def test_padded_verify_is_invisible_and_committed_away(models, nodes, top_up):
    """Padding (stable batch shapes for CUDA graphs) changes no node's logits and leaves no cell."""
    model, ref = models
    context = model.tokenize("while x < 3:\n", special=False)
    target = Target(model)
    target.reset()
    target.prefill(context[:-1])
    tree = example_tree(context[-1], [41, 42, 43, 44, 45, 46, 47]) if nodes else DraftTree(16)
    if not nodes:
        tree.reset(context[-1])
    rows = target.verify(tree, pad_to=12, top_up=top_up).copy()
    assert rows.shape == (tree.n, model.vocab_size)
    for node in range(tree.n):
        expect = fresh_logits(ref, context + tree.path_tokens(node))[-1]
        assert np.argmax(rows[node]) == np.argmax(expect)
        np.testing.assert_allclose(rows[node], expect, atol=ATOL)
    path = (1, 3) if nodes else ()
    target.commit(tree, path)
    kept = context + [int(tree.tokens[n]) for n in path]
    assert model.seq_pos_max(0) == len(kept) - 1
    for seq in range(1, model.n_seq_max):
        assert model.seq_pos_max(seq) < len(kept), f"sequence {seq} still holds tree nodes"
    for seq in range(model.n_seq_max, model.n_seq_max + model.n_pad_seqs):
        assert model.seq_pos_max(seq) == -1, f"padding sequence {seq} still holds cells"
    model.decode([51], [target.n_past])
    np.testing.assert_allclose(model.logits()[0], fresh_logits(ref, kept + [51])[-1], atol=ATOL)


def test_padded_verifies_of_different_trees_reuse_one_llama_graph(models):
    """llama.cpp rebuilds its compute graph when the batch's count of distinct sequence ids
    changes; padding tops it up, so trees of 1, 2 and 4 paths all run one graph (on a GPU: one
    CUDA graph, replayed)."""
    import llama_cpp as lc

    model, _ = models
    context = model.tokenize("while x < 3:\n", special=False)
    target = Target(model)
    target.reset()
    target.prefill(context[:-1])

    def reused() -> int:
        return int(lc.llama_perf_context(model._ctx).n_reused)

    chain = DraftTree(16)
    chain.reset(context[-1])
    chain.add(chain.add(0, 41, 0.0, 0), 42, 0.0, 0)            # one path
    pair = DraftTree(16)
    pair.reset(context[-1])
    pair.add(0, 41, 0.0, 0)
    pair.add(0, 43, 0.0, 0)                                     # two paths
    trees = [example_tree(context[-1], [41, 42, 43, 44, 45, 46, 47]), chain, pair, chain]
    counts = []
    for padded in (12, 0):
        before = reused()
        for tree in trees + trees:
            target.verify(tree, pad_to=padded)
            target.commit(tree, ())
        counts.append(reused() - before)
    assert counts[0] >= len(trees) * 2 - 1, counts     # every padded verify after the first
    assert counts[1] < counts[0], counts               # unpadded, the shapes change
