"""The PyTorch draft against transformers itself: tree forwards, greedy growth, rollback, sampling.

Every check compares with the HF model's plain full-sequence forward on a tiny randomly initialised
model (real weights, real forward, fp32 on CPU), so a wrong mask, position, slot or cache reuse shows
up as a logits mismatch. The init scale is raised so top tokens are separated by clear margins.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from localspec.engine.config import SamplingParams
from localspec.engine.distribution import process
from localspec.engine.drafters.torch_draft import DraftLimits, TorchDraft, process_rows
from localspec.engine.errors import LocalspecError
from localspec.engine.torch_lm import TorchLM
from localspec.engine.tree import DraftTree

VOCAB = 256
ATOL = 1e-4


def _save(model: torch.nn.Module, path: Path) -> Path:
    model.eval()
    model.save_pretrained(path)
    return path


def _qwen2(path: Path, seed: int = 0) -> tuple[Path, Qwen2ForCausalLM]:
    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                      initializer_range=0.2, rope_theta=10000.0)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # random biases, so a dropped q/k/v bias cannot go unnoticed
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.2)
    return _save(model, path), model


def _llama3(path: Path) -> tuple[Path, LlamaForCausalLM]:
    torch.manual_seed(1)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, num_attention_heads=4,
                      num_key_value_heads=1, intermediate_size=96, max_position_embeddings=512,
                      initializer_range=0.2, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    return _save(LlamaForCausalLM(cfg), path), LlamaForCausalLM.from_pretrained(path).eval()


@pytest.fixture(params=[False, True], ids=["eager", "static"])
def static(request) -> bool:
    """Run a test on the eager forward and on the static-shape (CUDA-graph) path, uncaptured here."""
    return request.param


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> tuple[Path, Qwen2ForCausalLM]:
    return _qwen2(tmp_path_factory.mktemp("qwen2"))


@torch.no_grad()
def hf_logits(model: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    """The HF model's last-position logits for a plain full forward of `tokens`."""
    return model(torch.tensor([tokens])).logits[0, -1].float().numpy()


def _context(n: int, seed: int = 7) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


def _children_chain(tree: DraftTree) -> list[int]:
    node, chain = 0, []
    while tree.children[node]:
        node = tree.children[node][0]
        chain.append(int(tree.tokens[node]))
    return chain


# -- (a) the forward itself -----------------------------------------------------------------------

@pytest.mark.parametrize("build", [_qwen2, _llama3], ids=["qwen2", "llama3-rope-gqa4"])
def test_tree_forward_matches_hf_full_forward(build, tmp_path, static):
    path, hf = build(tmp_path / "m")
    lm = TorchLM.load(path, max_len=64, device="cpu", static_shapes=static)
    ctx = _context(9)
    n = len(ctx)
    # prefill, causal, in two pieces (the second reuses the first's cache)
    for a, b in ((0, 5), (5, n)):
        idx = torch.arange(a, b)
        causal = torch.ones(b - a, b, dtype=torch.bool).tril(a)
        out = lm.forward(torch.tensor(ctx[a:b]), idx, idx, causal)
        for i in range(b - a):
            np.testing.assert_allclose(out[i].numpy(), hf_logits(hf, ctx[:a + i + 1]), atol=ATOL)
    # a hand-built tree below the last context token, all 6 nodes in one forward, slots shuffled
    parent = [-1, -1, 0, 0, 1, 3]          # node i's parent among the new nodes (-1: the root)
    toks = [11, 200, 5, 77, 11, 42]
    slot_of = [n + s for s in (3, 0, 5, 1, 2, 4)]
    depth, attend = [], torch.zeros(6, n + 6, dtype=torch.bool)
    for i, p in enumerate(parent):
        depth.append(1 if p < 0 else depth[p] + 1)
        attend[i, :n] = True
        a = i
        while a >= 0:
            attend[i, slot_of[a]] = True
            a = parent[a]
    out = lm.forward(torch.tensor(toks), torch.tensor([n - 1 + d for d in depth]),
                     torch.tensor(slot_of), attend)
    for i in range(6):
        path_toks, a = [], i
        while a >= 0:
            path_toks.insert(0, toks[a])
            a = parent[a]
        np.testing.assert_allclose(out[i].numpy(), hf_logits(hf, ctx + path_toks), atol=ATOL)


def test_static_padding_rows_touch_no_real_slot(qwen):
    """A forward of fewer rows than the last one in the same bucket pads the leftover rows: they
    must not rewrite the slots the previous forward wrote (those may hold live tree nodes)."""
    path, hf = qwen
    lm = TorchLM.load(path, max_len=64, device="cpu", static_shapes=True)
    ctx = _context(9)
    n = len(ctx)
    idx = torch.arange(n)
    lm.forward(torch.tensor(ctx), idx, idx, torch.ones(n, n, dtype=torch.bool).tril())
    chain = [3, 14, 15, 92, 65, 35]                   # 6 rows: the 8-row bucket
    attend = torch.ones(6, n + 6, dtype=torch.bool).tril(n)
    pos = torch.arange(n, n + 6)
    lm.forward(torch.tensor(chain), pos, pos, attend)
    kept = lm.cache[:, :, :, n + 5].clone()            # the last node's K/V
    other = [8, 9, 79, 32, 38]                         # 5 rows, same bucket, other tokens
    out = lm.forward(torch.tensor(other), pos[:5], pos[:5], attend[:5, :n + 5])
    assert torch.equal(lm.cache[:, :, :, n + 5], kept)
    for i in range(5):
        np.testing.assert_allclose(out[i].numpy(), hf_logits(hf, ctx + other[:i + 1]), atol=ATOL)


# -- (b) greedy growth ----------------------------------------------------------------------------

def _hf_greedy(hf, ctx: list[int], steps: int) -> list[int]:
    out, seq = [], list(ctx)
    for _ in range(steps):
        row = hf_logits(hf, seq)
        top2 = np.sort(row)[-2:]
        assert top2[1] - top2[0] > 1e-3, "near-tie in the test model: pick another seed"
        out.append(int(np.argmax(row)))
        seq.append(out[-1])
    return out


def test_greedy_chain_is_hf_greedy_decoding(qwen, static):
    path, hf = qwen
    ctx = _context(12)
    draft = TorchDraft.load(path, max_len=128, limits=DraftLimits(max_depth=6, branching=1, width=1),
                            device="cpu", static_shapes=static)
    draft.begin(ctx)
    tree = DraftTree(64)
    tree.reset(ctx[-1])
    draft.propose(tree, 0, 6, SamplingParams(), np.random.default_rng(0))
    assert tree.n == 7
    assert _children_chain(tree) == _hf_greedy(hf, ctx, 6)


def test_greedy_tree_children_are_hf_top_tokens(qwen, static):
    path, hf = qwen
    ctx = _context(10, seed=3)
    draft = TorchDraft.load(path, max_len=128, device="cpu", static_shapes=static)  # default limits: depth 8, 2 children, width 4
    draft.begin(ctx)
    tree = DraftTree(64)
    tree.reset(ctx[-1])
    draft.propose(tree, 2, 20, SamplingParams(), np.random.default_rng(0))
    assert tree.n == 21 and set(tree.drafter[1:tree.n]) == {2}
    first = tree.children[0][0]
    assert int(tree.tokens[first]) == _hf_greedy(hf, ctx, 1)[0]
    chain = _children_chain(tree)
    assert len(chain) >= 3 and chain == _hf_greedy(hf, ctx, len(chain))
    for node in range(tree.n):  # every expanded node's children: HF's top tokens, in order
        kids = tree.children[node]
        if not kids:
            continue
        row = hf_logits(hf, ctx + tree.path_tokens(node))
        p = np.exp(row - row.max())
        p /= p.sum()
        assert [int(tree.tokens[c]) for c in kids] == list(np.argsort(-p)[:len(kids)])
        for c in kids:  # path log-probs accumulate full-softmax probabilities
            assert tree.logp[c] - tree.logp[node] == pytest.approx(np.log(p[tree.tokens[c]]), abs=1e-4)


# -- (c) rollback and accept ----------------------------------------------------------------------

def test_after_accept_root_and_children_dists_match_hf(qwen, static):
    path, hf = qwen
    ctx = _context(8, seed=5)
    draft = TorchDraft.load(path, max_len=128, device="cpu", static_shapes=static)
    draft.begin(ctx)
    tree = DraftTree(64)
    rng = np.random.default_rng(1)
    for accepted in ([3, 9, 27], [101], [7, 7]):  # none of these need be what the tree drafted
        tree.reset(ctx[-1])
        draft.propose(tree, 0, 12, SamplingParams(), rng)  # fills tree slots, then rolls back
        ctx = ctx + accepted
        draft.accept(accepted)
    tree.reset(ctx[-1])
    full = SamplingParams(temperature=1.0, seed=0)  # no filters: the whole distribution
    draft.propose(tree, 0, 6, full, rng)
    checked = 0
    for node in range(tree.n):  # a node's children carry the dist of the node itself
        if not tree.children[node]:
            continue
        dist = tree.proposal[tree.children[node][0]]
        row = hf_logits(hf, ctx + tree.path_tokens(node))
        p = np.exp(row - row.max())
        p /= p.sum()
        assert dist.ids.size == VOCAB
        np.testing.assert_allclose(dist.probs, p[dist.ids], atol=1e-5)
        checked += 1
    assert checked >= 2 and draft.n_cached == len(ctx)


def test_long_context_is_a_localspec_error(qwen):
    draft = TorchDraft.load(qwen[0], max_len=16, device="cpu")
    with pytest.raises(LocalspecError) as err:
        draft.begin(_context(17))
    assert "max_len" in err.value.fix
    draft.begin(_context(16))  # a full cache: the stage sits the round out instead of failing
    tree = DraftTree(8)
    tree.reset(_context(16)[-1])
    draft.propose(tree, 0, 4, SamplingParams(), np.random.default_rng(0))
    assert tree.n == 1


# -- (d) sampling ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
    SamplingParams(temperature=1.3, top_p=0.7),
    SamplingParams(temperature=0.6),
], ids=["topk-topp", "topp-only", "temperature-only"])
def test_sampling_children_carry_their_proposal(qwen, sampling, static):
    path, hf = qwen
    ctx = _context(10, seed=11)
    draft = TorchDraft.load(path, max_len=128, limits=DraftLimits(max_depth=4, branching=3, width=4),
                            device="cpu", static_shapes=static)
    draft.begin(ctx)
    tree = DraftTree(64)
    tree.reset(ctx[-1])
    draft.propose(tree, 1, 16, sampling, np.random.default_rng(4))
    assert tree.n > 4
    for node in range(tree.n):
        kids = tree.children[node]
        if not kids:
            continue
        tokens = [int(tree.tokens[c]) for c in kids]
        assert len(set(tokens)) == len(tokens)
        dist = tree.proposal[kids[0]]
        assert all(tree.proposal[c] is dist for c in kids)  # all drawn from the parent's dist
        assert dist.probs.sum() == pytest.approx(1.0, abs=1e-12)
        filtered = sampling.top_k > 0 or sampling.top_p < 1.0   # temperature-only: id order
        assert (not filtered or np.all(np.diff(dist.probs) <= 1e-12)) and set(tokens) <= set(dist.ids.tolist())
        want = process(hf_logits(hf, ctx + tree.path_tokens(node)), sampling)  # the target's processing
        assert set(dist.ids.tolist()) == set(want.ids.tolist())
        np.testing.assert_allclose(dist.probs, [want.prob_of(t) for t in dist.ids], atol=1e-5)


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0.7, top_k=50, top_p=0.8),
    SamplingParams(temperature=1.0, top_p=0.5),     # the flat row's nucleus is wider than the probe
    SamplingParams(temperature=0.9, top_p=0.95),
    SamplingParams(temperature=1.0, top_k=5000),    # top_k beyond the vocabulary: no filter
], ids=["topk-topp", "topp-wide", "topp-probe", "topk-off"])
def test_process_rows_matches_target_processing_on_a_large_vocabulary(sampling):
    gen = torch.Generator().manual_seed(0)
    scales = torch.tensor([[4.0], [0.1], [2.0]])
    logits = torch.randn(3, 3000, generator=gen) * scales  # [3, V]: peaky, flat, in between
    for got, row in zip(process_rows(logits, sampling), logits.numpy()):
        want = process(row, sampling)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.probs, want.probs, rtol=1e-5, atol=1e-9)
        assert got.probs.sum() == pytest.approx(1.0, abs=1e-12)


# -- (e) loading errors ---------------------------------------------------------------------------

def test_missing_path_and_bad_folder_are_localspec_errors(tmp_path):
    with pytest.raises(LocalspecError) as err:
        TorchDraft.load(tmp_path / "nope")
    assert err.value.title == "Draft model not found" and "config.json" in err.value.fix
    (tmp_path / "empty").mkdir()
    with pytest.raises(LocalspecError, match="no config.json"):
        TorchDraft.load(tmp_path / "empty")
    bogus = tmp_path / "draft.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    with pytest.raises(LocalspecError, match="Could not load the draft model"):
        TorchDraft.load(bogus)


def test_vocab_size_is_exposed(qwen):
    assert TorchDraft.load(qwen[0], max_len=32, device="cpu").vocab_size == VOCAB
