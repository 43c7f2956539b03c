"""Stable batch shapes for the GGUF draft (what a GPU needs to replay llama.cpp's CUDA graph).

With `stable_shapes` every forward of the draft, root prefill and node batches alike, has the same
number of rows: the draft pads them in a sequence of its own and removes the padding at once. The
target's output must not change, and no padding may stay in the draft's cache.
"""
from __future__ import annotations

import pytest
from localspec.engine.config import DraftLimits, SamplingParams, TreeBudget
from localspec.engine.session import Session
from localspec.engine.options import Options
from test_cascade import PROMPT   # tests/ is on sys.path under pytest (like tiny_models), the repo root not always


def _session(tiny, stable: bool, limits: DraftLimits) -> Session:
    return Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                budget=TreeBudget(max_nodes=12), draft_limits=limits,
                                stable_shapes=stable))


def _reused(model) -> int:
    import llama_cpp as lc
    return int(lc.llama_perf_context(model._ctx).n_reused)


def _record_rows(drafter) -> list[int]:
    rows: list[int] = []
    decode = drafter.model.decode

    def recording(tokens, positions, seq_ids=None, *, logits=True, pad_to=0):
        rows.append(max(len(tokens) + 1, pad_to) if pad_to else len(tokens))
        return decode(tokens, positions, seq_ids, logits=logits, pad_to=pad_to)

    drafter.model.decode = recording
    return rows


@pytest.mark.parametrize("limits", [DraftLimits(max_depth=4, branching=1, width=1, chain=0),
                                    DraftLimits(max_depth=6, branching=2, width=2, chain=4)],
                         ids=["linear", "tree-with-cascade"])
def test_padded_draft_keeps_one_shape_and_the_targets_output(tiny, limits):
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    try:
        expect = plain.run(plain.raw_prompt(PROMPT), max_tokens=40).tokens
    finally:
        plain.close()

    session = _session(tiny, True, limits)
    drafter = session.stages[-1]
    assert drafter.pad == limits.pad_rows
    rows = _record_rows(drafter)
    try:
        before = _reused(drafter.model)
        got = session.run(session.raw_prompt(PROMPT), max_tokens=40)
        reused = _reused(drafter.model) - before
        model = drafter.model
        for seq in range(model.n_seq_max, model.n_seq_max + model.n_pad_seqs):
            assert model.seq_pos_max(seq) == -1, "padding left in the draft's cache"
    finally:
        session.close()
    assert got.tokens == expect
    # the first root evaluation brings the whole prompt in (unpadded, then a padded last chunk);
    # every later forward of the draft has exactly `pad` rows
    assert len(rows) > 10
    assert set(rows[2:]) == {drafter.pad}, rows
    # and llama.cpp reuses one compute graph for them: same rows, outputs and distinct sequences
    assert reused >= len(rows) - 3, (reused, len(rows))


def test_unpadded_draft_on_cpu_by_default(tiny):
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                   budget=TreeBudget(max_nodes=8)))
    try:
        drafter = session.stages[-1]
        assert (drafter.pad > 0) == (drafter.model.n_gpu_layers != 0)
    finally:
        session.close()


def test_padded_draft_in_sampling_mode_leaves_no_padding(tiny):
    session = _session(tiny, True, DraftLimits(max_depth=4, branching=2, width=2, chain=2))
    drafter = session.stages[-1]
    rows = _record_rows(drafter)
    try:
        got = session.run(session.raw_prompt(PROMPT), max_tokens=30,
                          sampling=SamplingParams(temperature=0.8, seed=3))
        model = drafter.model
        assert all(model.seq_pos_max(s) == -1
                   for s in range(model.n_seq_max, model.n_seq_max + model.n_pad_seqs))
    finally:
        session.close()
    assert len(got.tokens) > 0
    assert set(rows[2:]) == {drafter.pad}, rows


def test_bucket_is_the_smallest_bucket_that_holds_the_tree():
    from localspec.engine.shapes import bucket
    from localspec.engine.tuning import BUCKET_SIZES

    assert [bucket(n, 33) for n in (2, 3, 5, 9, 16, 17, 32, 33)] == [2, 4, 8, 16, 16, 32, 32, 33]
    assert bucket(5, 5) == 5 and bucket(3, 5) == 4       # never past the arm's full tree
    assert all(bucket(n, 33) >= n for n in range(2, 34)) and BUCKET_SIZES == tuple(sorted(BUCKET_SIZES))


def test_cheap_shape_changes_verify_in_buckets_and_keep_the_output(tiny):
    """Where a change of batch shape is cheap (Costs.cheap_switch; a CPU's switch cost is 0, a GPU's
    with llama.cpp keeping a CUDA graph per shape), a GPU-style engine does not hold its choices,
    keeps no plain arm (pruning to the root is the plain step),
    pads a tree only up to its bucket (rows only, no sequence top-up), its GGUF draft does not pad,
    and the output stays the target's own."""
    from localspec.engine.shapes import Shapes
    from localspec.engine.tuning import BUCKET_SIZES

    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    try:
        expect = plain.run(plain.raw_prompt(PROMPT), max_tokens=40).tokens
    finally:
        plain.close()
    session = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                   budget=TreeBudget(max_nodes=16, adaptive=True),
                                   stable_shapes=True))
    target = session.engine.target
    seen: list[tuple[int, int, bool]] = []
    verify = target.verify

    def recording(tree, pad_to=0, top_up=True):
        seen.append((tree.n, pad_to, top_up))
        return verify(tree, pad_to, top_up)

    target.verify = recording
    try:
        assert session.costs.cheap_switch
        assert session.engine.policy.shapes is Shapes.BUCKETS and session.stages[-1].pad == 0
        got = session.run(session.raw_prompt(PROMPT), max_tokens=40)
    finally:
        session.close()
    assert got.tokens == expect
    trees = [(n, pad, top_up) for n, pad, top_up in seen if n > 1]
    assert trees, "the repetitive prompt should draft"
    arms = session.engine.policy.arms
    assert all(a.nodes for a in arms), "the free drafters' arm stands in for plain decoding"
    fulls = {a.nodes + 1 for a in arms}
    assert all(pad >= n and not top_up and (pad in BUCKET_SIZES or pad in fulls)
               for n, pad, top_up in trees), trees
    assert all(pad == 0 for n, pad, _ in seen if n == 1)
