"""packaging/patches' multi-column kernels, against ggml's own kernels.

A batch of 2..16 activation columns of a Q4_K, Q5_K, Q6_K or Q8_0 mul_mat (plain rows) or of a
Q4_K or Q4_0 one repacked 8 rows at a time (the CPU backend's extra buffer: the layouts llama.cpp
loads Q4_K and Q4_0 weights in on AVX2 CPUs) takes the kernels when GGML_CPU_MULTICOL_MAX allows
it (unset: 16) and ggml's own when it is 0: one build, both paths, switched per call. ggml's own are
vec_dot per column for the K-quants' plain rows, llamafile's tinyBLAS for Q8_0 rows from 2 columns,
gemm/gemv for the repacked layouts. On random weights and activations, for every width 1..16,
the kernels' output lies within a stated tolerance of ggml's, and each column's output is the
same bit for bit at every width from 2 up; the patch's call counter shows they ran (on AVX2 the
plain-row Q6_K kernel sums exactly as ggml's own, so its output alone could not). The Q8_0 rows'
kernel exists in AVX-512 VNNI builds only (native.has_multicol_q8_0_kernels). The repacked
Q6_K layout is the kernels' own (AVX-512 VNNI and AVX2 builds): with them switched off a plain
scalar loop over it stands for ggml's kernels. ggml is driven through its C API (ctypes), no model.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import pytest

from ggml_cpu import InitParams, ggml, quantize, repack_buffer_type
from localspec.engine import native

Q4_0, Q8_0, Q4_K, Q5_K, Q6_K = 2, 8, 12, 13, 14   # enum ggml_type
F32 = 0
COLS = 16
# the kernels sum in another order than ggml's: float rounding, relative to the output's scale
TOLERANCE = 2e-5
# ggml's own result against the float product of the unquantized inputs (4- to 8-bit weights,
# 8-bit activations): a sanity bound on the reference, relative to the output's scale
QUANTIZATION_ERROR = 0.1


@dataclass(frozen=True)
class Case:
    """One layout the kernels take: a weight type, repacked or not, and the row length."""
    name: str
    kind: int
    repack: bool = False
    k: int = 768          # three 256-code blocks a row
    rows: int = 96
    q8_0: bool = False    # the Q8_0 rows' kernel of multicol-q8_0.h (AVX-512 VNNI builds only)


CASES = [Case("Q4_K", Q4_K), Case("Q5_K", Q5_K), Case("Q6_K", Q6_K),
         # 25 blocks a row; 13 groups of 8 rows, one cut by the 2 threads' chunks (52 rows each)
         Case("Q8_0", Q8_0, k=800, rows=104, q8_0=True),
         Case("Q4_K-repacked", Q4_K, repack=True),
         # the kernels' own layout; switched off, a scalar path stands for ggml's
         Case("Q6_K-repacked", Q6_K, repack=True),
         Case("Q4_0-repacked", Q4_0, repack=True)]

pytestmark = pytest.mark.skipif(not native.has_multicol_kernels(),
                                reason="llama.cpp built without the multi-column kernels "
                                       "(they need AVX-512 VNNI or AVX2, and packaging/patches)")


def _built(case: Case) -> None:
    if case.q8_0 and not native.has_multicol_q8_0_kernels():   # AVX-512 VNNI builds
        pytest.skip("the Q8_0 rows' kernel is built for AVX-512 VNNI CPUs only")


def _kernel_calls() -> int:
    """How many matmuls the multi-column kernels have taken in this process."""
    return ggml()[1].localspec_multicol_calls()


def _mul_mat(kind: int, weights: np.ndarray, acts: np.ndarray, multicol: str,
             repack: bool = False, min_cols: str = "2") -> np.ndarray:
    """ggml_mul_mat of `weights` (rows x k f32, quantized to `kind`; in the repacking buffer
    type when `repack`) by the columns of `acts` (n x k f32) on 2 threads, with
    GGML_CPU_MULTICOL_MAX=multicol and GGML_CPU_MULTICOL_MIN=min_cols: n x rows f32."""
    base, cpu = ggml()
    rows, k = weights.shape
    quantized = quantize(kind, weights)
    ctx = base.ggml_init(InitParams(64 << 20, None, False))
    wctx = buffer = None
    try:
        if repack:   # the weights alone in a context of their own, allocated in that buffer type
            wctx = base.ggml_init(InitParams(1 << 20, None, True))
            w = base.ggml_new_tensor_2d(wctx, kind, k, rows)
            buffer = base.ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buffer_type(base, cpu))
            base.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, base.ggml_nbytes(w))
        else:
            w = base.ggml_new_tensor_2d(ctx, kind, k, rows)
            ctypes.memmove(base.ggml_get_data(w), quantized.ctypes.data, base.ggml_nbytes(w))
        x = base.ggml_new_tensor_2d(ctx, F32, k, len(acts))
        columns = np.ascontiguousarray(acts, np.float32)   # held: memmove reads it
        ctypes.memmove(base.ggml_get_data(x), columns.ctypes.data, columns.nbytes)
        y = base.ggml_mul_mat(ctx, w, x)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        with native.switches({native.MULTICOL_MAX: multicol, native.MULTICOL_MIN: min_cols,
                              native.TILED_MIN: str(1 << 30)}):
            assert cpu.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
        out = np.ctypeslib.as_array(ctypes.cast(base.ggml_get_data(y), ctypes.POINTER(ctypes.c_float)),
                                    shape=(len(acts), rows))
        return out.copy()
    finally:
        base.ggml_free(ctx)
        if wctx is not None:
            base.ggml_free(wctx)
        if buffer is not None:
            base.ggml_backend_buffer_free(buffer)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_multicol_matches_ggml_at_every_width_and_columns_agree_across_widths(case):
    _built(case)
    kind, repack = case.kind, case.repack
    rng = np.random.default_rng(kind + repack)
    weights = rng.normal(size=(case.rows, case.k)).astype(np.float32)
    acts = rng.normal(size=(COLS, case.k)).astype(np.float32) * rng.uniform(0.1, 3, size=(COLS, 1))
    calls = _kernel_calls()
    reference = _mul_mat(kind, weights, acts, "0", repack)    # ggml's own kernels
    assert _kernel_calls() == calls, "the kernels ran although switched off"
    unquantized = acts @ weights.T                             # what both approximate
    scale = float(np.abs(unquantized).max())
    assert np.abs(reference - unquantized).max() <= QUANTIZATION_ERROR * scale
    if repack:   # ggml's repacked gemm sums in another order than vec_dot: the repacking ran
        assert not np.array_equal(reference, _mul_mat(kind, weights, acts, "0"))
    widest = _mul_mat(kind, weights, acts, "16", repack)
    assert _kernel_calls() == calls + 1, "the kernels did not run"
    for n in range(1, COLS + 1):
        got = _mul_mat(kind, weights, acts[:n], "16", repack)
        err = float(np.abs(got - reference[:n]).max()) / scale
        assert err <= TOLERANCE, f"{n} columns: {err:.2e} of the output's scale from ggml's"
        if n >= 2:   # one column keeps ggml's kernel (the multi-column ones start at 2)
            assert np.array_equal(got, widest[:n]), f"a column's output changed at {n} columns"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_exact_switches_make_every_width_compute_a_column_alike(case):
    """What exact numerics switch on (native.EXACT_SWITCHES): the kernels from one column up and past
    any batch, so a one-token decode's column is the same bit for bit as inside any verify."""
    _built(case)
    kind, repack = case.kind, case.repack
    exact = native.EXACT_SWITCHES
    rng = np.random.default_rng(100 + kind + repack)
    weights = rng.normal(size=(case.rows, case.k)).astype(np.float32)
    acts = rng.normal(size=(COLS, case.k)).astype(np.float32)
    widest = _mul_mat(kind, weights, acts, exact[native.MULTICOL_MAX], repack, exact[native.MULTICOL_MIN])
    for n in range(1, COLS + 1):
        got = _mul_mat(kind, weights, acts[:n], exact[native.MULTICOL_MAX], repack, exact[native.MULTICOL_MIN])
        assert np.array_equal(got, widest[:n]), f"a column's output changed at {n} columns"
    calls = _kernel_calls()
    _mul_mat(kind, weights, acts[:1], exact[native.MULTICOL_MAX], repack, exact[native.MULTICOL_MIN])
    assert _kernel_calls() == calls + 1, "one column ran ggml's own kernel, not the multi-column one"
