"""packaging/patches' attention for a verify's few rows (ggml-cpu-fa-verify-rows.patch): ggml's
flash attention op on the CPU, through ggml's C API, against a float64 reference of the same
f16 keys and values, with the path on (GGML_CPU_FA_ROWS unset) and off, on random data with
masked keys (a tree's mask: each row sees its own keys), grouped-query heads and key counts around
the path's 64-key tiles. One-row decodes never take it; off, ggml's own loop runs."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from localspec.engine import native

from ggml_cpu import InitParams, ggml

F32, F16 = 0, 1
pytestmark = pytest.mark.skipif(not native.has_marker("localspec_fa_rows_calls"),
                                reason="a llama.cpp without packaging/patches' attention for few rows")


@pytest.fixture(scope="module")
def lib():
    base, cpu = ggml()
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    base.ggml_new_tensor_3d.restype, base.ggml_new_tensor_3d.argtypes = p, [p, ctypes.c_int, i64, i64, i64]
    base.ggml_flash_attn_ext.restype = p
    base.ggml_flash_attn_ext.argtypes = [p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float]
    cpu.localspec_fa_rows_calls.restype = ctypes.c_int
    return base, cpu


def attention(lib, q, k, v, mask, scale, monkeypatch, on: bool) -> tuple[np.ndarray, int]:
    """ggml_flash_attn_ext of q [heads, rows, d] f32, k and v [kv heads, keys, d] f16, mask [rows,
    keys] f16 (0 or -inf) on 2 threads: ([heads, rows, d] f32, ops the few-rows path took)."""
    base, cpu = lib
    monkeypatch.setenv("GGML_CPU_FA_ROWS", "1" if on else "0")
    heads, rows, d = q.shape
    kvh, keys, _ = k.shape
    ctx = base.ggml_init(InitParams(64 << 20, None, False))
    try:
        tq = base.ggml_new_tensor_3d(ctx, F32, d, rows, heads)
        tk = base.ggml_new_tensor_3d(ctx, F16, d, keys, kvh)
        tv = base.ggml_new_tensor_3d(ctx, F16, d, keys, kvh)
        tm = base.ggml_new_tensor_3d(ctx, F16, keys, rows, 1)
        for t, a in ((tq, q.astype(np.float32)), (tk, k), (tv, v), (tm, mask)):
            ctypes.memmove(base.ggml_get_data(t), np.ascontiguousarray(a).ctypes.data, a.nbytes)
        out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)   # [d, heads, rows]
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        before = cpu.localspec_fa_rows_calls()
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
        taken = cpu.localspec_fa_rows_calls() - before
        got = np.ctypeslib.as_array(ctypes.cast(base.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)),
                                    shape=(rows, heads, d)).copy()
    finally:
        base.ggml_free(ctx)
    return got.transpose(1, 0, 2), taken


def reference(q, k, v, mask, scale) -> np.ndarray:
    heads, kvh = q.shape[0], k.shape[0]
    kk = np.repeat(k.astype(np.float64), heads // kvh, axis=0)
    vv = np.repeat(v.astype(np.float64), heads // kvh, axis=0)
    s = np.einsum("hrd,hkd->hrk", q.astype(np.float64), kk) * scale + mask.astype(np.float64)[None]
    m = s.max(-1, keepdims=True)
    e = np.where(np.isinf(s), 0.0, np.exp(s - np.where(np.isinf(m), 0.0, m)))
    total = e.sum(-1, keepdims=True)
    return np.einsum("hrk,hkd->hrd", e / np.where(total == 0, 1.0, total), vv)


CASES = [  # heads, kv heads, d, rows, keys
    (12, 2, 128, 2, 300), (12, 2, 128, 8, 65), (12, 2, 128, 13, 64), (12, 2, 128, 16, 1),
    (4, 4, 64, 5, 130), (4, 2, 32, 11, 63), (14, 2, 64, 63, 200), (12, 2, 128, 1, 300),
]


@pytest.mark.parametrize("heads,kvh,d,rows,keys", CASES)
def test_few_rows_attention_matches_a_float64_reference_and_ggml(lib, monkeypatch, heads, kvh, d, rows, keys):
    rng = np.random.default_rng(heads * 1000 + rows * 10 + keys)
    q = rng.standard_normal((heads, rows, d)).astype(np.float32)
    k = rng.standard_normal((kvh, keys, d)).astype(np.float16)
    v = rng.standard_normal((kvh, keys, d)).astype(np.float16)
    mask = np.zeros((rows, keys), np.float16)
    mask[rng.random((rows, keys)) < 0.3] = -np.inf          # a tree's mask: some keys hidden per row
    mask[:, 0] = 0                                           # every row sees at least one key
    scale = 1.0 / np.sqrt(d)
    want = reference(q, k, v, mask, scale)
    fast, taken = attention(lib, q, k, v, mask, scale, monkeypatch, on=True)
    slow, not_taken = attention(lib, q, k, v, mask, scale, monkeypatch, on=False)
    assert not_taken == 0 and np.abs(slow - want).max() < 2e-2   # ggml's loop: queries and sums in f16
    if rows >= 2:
        assert taken == 1 and np.abs(fast - want).max() < 1e-4      # f32 throughout
    else:
        assert taken == 0 and np.array_equal(fast, slow)            # one row: ggml's path either way


def test_a_row_that_sees_no_key_gets_zeros_as_in_ggml(lib, monkeypatch):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((12, 4, 128)).astype(np.float32)
    k = rng.standard_normal((2, 70, 128)).astype(np.float16)
    v = rng.standard_normal((2, 70, 128)).astype(np.float16)
    mask = np.zeros((4, 70), np.float16)
    mask[2] = -np.inf
    fast, taken = attention(lib, q, k, v, mask, 0.1, monkeypatch, on=True)
    slow, _ = attention(lib, q, k, v, mask, 0.1, monkeypatch, on=False)
    assert taken == 1
    assert np.all(fast[:, 2] == 0) and np.all(slow[:, 2] == 0)
    assert np.abs(fast - reference(q, k, v, mask, 0.1)).max() < 1e-4
