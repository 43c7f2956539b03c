"""packaging/patches' streaming kernels (ggml-cuda's mmvq-stream.cu: Q4_K, Q5_K, Q6_K and Q8_0 weights in
ggml's own rows times 1..16 columns, streamed once for all of them into int8 tensor cores) against ggml's
own CUDA kernels, on random data. Runs where llama.cpp has a CUDA backend and a GPU (the GPU host:
`dev/gpu-kernels.sh`); skipped elsewhere.

The kernels sum the integers ggml's mat-vec sums (a Q4_K or Q5_K sub-block, a Q8_0 block, or a Q6_K
group of 16, against a q8_1 block) and apply the scales in fp32 per sub-block, in another order: within float rounding of ggml's
mat-vec (1..8 columns), and of mul_mat_q within its own difference (9..16, test_multicol_cuda's
TOLERANCE_MMQ). Each column's sums run in the same order at every width, so a column's result is
the same bits at every width."""
from __future__ import annotations

import numpy as np
import pytest

import ggml_cuda
from test_multicol_cuda import COLS, NAMES, Q4_K, Q5_K, Q6_K, Q8_0, TOLERANCE, TOLERANCE_MMQ, _inputs, _run

EVERY = str((1 << COLS) - 1)

# (type, row length, rows): the reference target's (1536, 8960), rows not a multiple of the kernel's
# 64, one super-block a row (Q6_K: one pair of them), 7B-shaped k/v and q/o matrices (a row split
# over blocks: split-K), and a 7B ffn_down in Q6_K; a 32B k/v (5120 by 1024) and ffn_down row
# (27648); Q5_K and Q8_0 (a step of eight Q8_0 blocks) alike
CASES = [(Q4_K, 1536, 200), (Q4_K, 8960, 40), (Q4_K, 256, 1000), (Q4_K, 3584, 512), (Q4_K, 3584, 3584),
         (Q4_K, 5120, 1024),
         (Q6_K, 1536, 200), (Q6_K, 512, 1000), (Q6_K, 3584, 512), (Q6_K, 18944, 256), (Q6_K, 27648, 128),
         (Q5_K, 1536, 200), (Q5_K, 256, 1000), (Q5_K, 3584, 512), (Q5_K, 18944, 256),
         (Q8_0, 1536, 200), (Q8_0, 256, 1000), (Q8_0, 3584, 512), (Q8_0, 8960, 40)]

pytestmark = pytest.mark.skipif(not ggml_cuda.available(),
                                reason="needs llama.cpp's CUDA backend and a GPU")


def _stream(tmp, kind, weights, acts, name, widths=EVERY, **more):
    return _run(tmp, kind, weights, acts, name, stream_widths=widths, max="0", **more)


@pytest.mark.parametrize("kind,k,rows", CASES, ids=[f"{NAMES[c[0]]}-{c[1]}x{c[2]}" for c in CASES])
def test_stream_kernel_matches_ggml_and_a_column_is_the_same_at_every_width(tmp_path, kind, k, rows):
    weights, acts = _inputs(kind, k, rows)
    stock = _run(tmp_path, kind, weights, acts, "stock", max="0")
    assert stock["stream_calls"] in (0, -1), "the streaming kernel ran although no width was named"
    got = _stream(tmp_path, kind, weights, acts, "stream")
    assert got["stream_calls"] == COLS, "the streaming kernel did not take every width"
    scale = float(np.abs(stock[f"w{COLS}"]).max())
    widest = got[f"w{COLS}"]
    for n in range(1, COLS + 1):
        err = float(np.abs(got[f"w{n}"] - stock[f"w{n}"]).max()) / scale
        assert err <= (TOLERANCE if n <= 8 else TOLERANCE_MMQ), f"{n} columns: {err:.2e} of the output's scale from ggml's"
        assert np.array_equal(got[f"w{n}"], widest[:n]), f"a column's output changed at {n} columns"


def test_stream_widths_mask_sends_exactly_its_widths_and_what_it_cannot_stream_stays(tmp_path):
    """GGML_CUDA_STREAM_WIDTHS names the widths; the others keep ggml's bits. Q6_K rows of an odd
    number of super-blocks (not 4-byte aligned a pair at a time), and Q8_0 rows that are not whole
    steps of 256 weights, stay where the other switches send them at every width."""
    weights, acts = _inputs(Q4_K, 1536, 200)
    widths = {1, 3, 8, 9, 16}
    stock = _run(tmp_path, Q4_K, weights, acts, "stock", max="0")
    every = _stream(tmp_path, Q4_K, weights, acts, "every")
    some = _stream(tmp_path, Q4_K, weights, acts, "some", widths=hex(sum(1 << (n - 1) for n in widths)))
    assert some["stream_calls"] == len(widths)
    for n in range(1, COLS + 1):
        assert np.array_equal(some[f"w{n}"], (every if n in widths else stock)[f"w{n}"]), f"{n} columns"
    for kind, k in ((Q6_K, 768), (Q8_0, 288)):
        weights_k, acts_k = _inputs(kind, k, 200)
        stock_k = _run(tmp_path, kind, weights_k, acts_k, f"stock{kind}", max="0")
        named_k = _stream(tmp_path, kind, weights_k, acts_k, f"named{kind}")
        assert named_k["stream_calls"] == 0, NAMES[kind]
        for n in range(1, COLS + 1):
            assert np.array_equal(named_k[f"w{n}"], stock_k[f"w{n}"]), f"{NAMES[kind]}, {n} columns"


@pytest.mark.parametrize("kind", [Q4_K, Q5_K, Q6_K, Q8_0], ids=["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_stream_kernel_adds_a_bias_row_in_its_store_with_the_bits_of_a_separate_add(tmp_path, kind):
    weights, acts = _inputs(kind, 3584, 512)
    bias = np.random.default_rng(11).normal(size=512).astype(np.float32)
    plain = _stream(tmp_path, kind, weights, acts, "plain")
    fused = _stream(tmp_path, kind, weights, acts, "bias", bias=bias)
    assert fused["stream_calls"] == COLS
    for n in range(1, COLS + 1):
        assert np.array_equal(fused[f"w{n}"], plain[f"w{n}"] + bias), f"{n} columns"
