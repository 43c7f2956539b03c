"""packaging/patches' wide CUDA mat-vec kernels (2..16 columns), against ggml's own one-kernel-per-
width path, on the GPU.

GGML_CUDA_MMVQ_WIDE_MAX is read once per process, so each side runs in a process of its own: "0"
is ggml as shipped (its MMVQ kernels up to 8 columns, MMQ above), unset is the wide kernels up to
16. For each quantization type the wide kernels take and every width 1..16, on random weights and
activations, each column lies within a stated tolerance of ggml's MMVQ result for that column, and
is the same bit for bit at every width from 2 up. ggml is driven through its C API (ctypes), no
model. Skips where there is no CUDA build with the patch or no GPU.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from localspec.engine import native

KINDS = {"Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}   # enum ggml_type
F32 = 0
ROWS, K, COLS = 96, 768, 16
STOCK_MMVQ_MAX = 8      # ggml's MMVQ takes up to 8 columns; its result per column is the reference
# the wide kernels sum each row in another order than ggml's (4 warps, one row a block): float
# rounding, relative to the output's scale
TOLERANCE = 2e-5
# ggml's result against the float product of the unquantized inputs: a sanity bound on the reference
QUANTIZATION_ERROR = 0.1


def _cuda_lib():
    return next((f for f in native.libraries() if f.name.startswith("libggml-cuda")), None)


pytestmark = pytest.mark.skipif(
    _cuda_lib() is None or not native.has_marker("localspec_mmvq_wide_switch"),
    reason="llama.cpp built without CUDA or without the wide mat-vec patch (packaging/patches)")


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def _products(out: str) -> None:
    """Worker (its own process): for each type, the CUDA products of ROWS x K weights by the first
    n of COLS activation columns for n = 1..COLS, and by the last STOCK_MMVQ_MAX columns alone."""
    libs = {f.name.split(".so")[0]: f for f in native.libraries()}
    base = ctypes.CDLL(str(libs["libggml-base"]))
    cuda = ctypes.CDLL(str(_cuda_lib()))
    p = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = p, [_InitParams]
    base.ggml_free.argtypes = [p]
    base.ggml_new_tensor_2d.restype = p
    base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_int64, p]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = p, [p, p, p]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = p, [p]
    base.ggml_build_forward_expand.argtypes = [p, p]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [p]
    base.ggml_backend_alloc_ctx_tensors.restype = p
    base.ggml_backend_alloc_ctx_tensors.argtypes = [p, p]
    base.ggml_backend_tensor_set.argtypes = [p, p, ctypes.c_size_t, ctypes.c_size_t]
    base.ggml_backend_tensor_get.argtypes = [p, p, ctypes.c_size_t, ctypes.c_size_t]
    base.ggml_backend_graph_compute.restype = ctypes.c_int
    base.ggml_backend_graph_compute.argtypes = [p, p]
    base.ggml_backend_buffer_free.argtypes = [p]
    base.ggml_backend_free.argtypes = [p]
    cuda.ggml_backend_cuda_init.restype, cuda.ggml_backend_cuda_init.argtypes = p, [ctypes.c_int]
    backend = cuda.ggml_backend_cuda_init(0)
    assert backend, "no CUDA device"

    def mul_mat(kind: int, quantized: np.ndarray, acts: np.ndarray) -> np.ndarray:
        ctx = base.ggml_init(_InitParams(1 << 20, None, True))
        w = base.ggml_new_tensor_2d(ctx, kind, K, ROWS)
        x = base.ggml_new_tensor_2d(ctx, F32, K, len(acts))
        y = base.ggml_mul_mat(ctx, w, x)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        buffer = base.ggml_backend_alloc_ctx_tensors(ctx, backend)
        try:
            base.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, base.ggml_nbytes(w))
            columns = np.ascontiguousarray(acts, np.float32)
            base.ggml_backend_tensor_set(x, columns.ctypes.data, 0, columns.nbytes)
            assert base.ggml_backend_graph_compute(backend, graph) == 0
            result = np.empty((len(acts), ROWS), np.float32)
            base.ggml_backend_tensor_get(y, result.ctypes.data, 0, result.nbytes)
            return result
        finally:
            base.ggml_backend_buffer_free(buffer)
            base.ggml_free(ctx)

    results = {}
    for name, kind in KINDS.items():
        weights, acts = _inputs(kind)
        quantized = np.zeros(ROWS * K * 2, dtype=np.uint8)   # more than any row of these types needs
        base.ggml_quantize_chunk(kind, weights.ctypes.data, quantized.ctypes.data, 0, ROWS, K, None)
        for n in range(1, COLS + 1):
            results[f"{name}/{n}"] = mul_mat(kind, quantized, acts[:n])
        results[f"{name}/tail"] = mul_mat(kind, quantized, acts[COLS - STOCK_MMVQ_MAX:])
    base.ggml_backend_free(backend)
    np.savez(out, **results)


def _inputs(kind: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(kind)
    weights = rng.normal(size=(ROWS, K)).astype(np.float32)
    acts = (rng.normal(size=(COLS, K)) * rng.uniform(0.1, 3, size=(COLS, 1))).astype(np.float32)
    return weights, acts


def _run(tmp_path, wide_max: str | None) -> dict[str, np.ndarray]:
    out = tmp_path / f"products-{wide_max}.npz"
    env = {k: v for k, v in os.environ.items() if k != "GGML_CUDA_MMVQ_WIDE_MAX"}
    if wide_max is not None:
        env["GGML_CUDA_MMVQ_WIDE_MAX"] = wide_max
    done = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(np.load(out))


def test_wide_kernels_match_ggml_per_column_at_every_width(tmp_path):
    stock, wide = _run(tmp_path, "0"), _run(tmp_path, None)
    for name, kind in KINDS.items():
        weights, acts = _inputs(kind)
        unquantized = acts @ weights.T
        scale = float(np.abs(unquantized).max())
        # ggml's MMVQ result for every column: the first 8 in one call, the last 8 in another
        reference = np.concatenate([stock[f"{name}/{STOCK_MMVQ_MAX}"], stock[f"{name}/tail"]])
        assert np.abs(reference - unquantized).max() <= QUANTIZATION_ERROR * scale, name
        widest = wide[f"{name}/{COLS}"]
        assert not np.array_equal(widest, stock[f"{name}/{COLS}"]), \
            f"{name}: 16 columns ran the same kernel as ggml's (MMQ) - the wide kernels did not run"
        for n in range(1, COLS + 1):
            got = wide[f"{name}/{n}"]
            err = float(np.abs(got - reference[:n]).max()) / scale
            assert err <= TOLERANCE, f"{name}, {n} columns: {err:.2e} of the output's scale from ggml's"
            if n >= 2:   # one column keeps ggml's kernel
                assert np.array_equal(got, widest[:n]), f"{name}: a column's output changed at {n} columns"


if __name__ == "__main__":
    _products(sys.argv[1])
