"""ms per ggml mul_mat, ggml's own kernels (GGML_CPU_MULTICOL_MAX=0) against the multi-column ones,
per weight type and batch width, through ggml's graph on the installed llama.cpp (or the one
LLAMA_CPP_LIB_PATH names): activations quantized, threads and all, as a model's matmul runs.

Each (type, width) runs both sides interleaved, REPS rounds of a few calls each, and reports the
medians. The kernels' side runs from one column (GGML_CPU_MULTICOL_MIN=1), so width 1 shows what
they cost there (by default one column keeps ggml's kernels). The repacked layouts (Q4_K, Q4_0) are allocated in the CPU backend's repacking buffer type,
the others as plain rows. ggml's tiled matmul is switched out of the way (TILED_MIN) on both sides.

    .venv/bin/python dev/multicol/matmul_timing.py [--threads 2] [--reps 15] > out.txt
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import numpy as np

from localspec.engine import native

sys.path.insert(0, "tests")   # run from the repository root
from ggml_cpu import InitParams, ggml, quantize, repack_buffer_type  # noqa: E402

TYPES = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
F32 = 0
# (name, ggml type, repacked, k, rows): shapes of Qwen2.5-Coder-1.5B (1536 wide, 8960 ffn) and the
# 0.5B draft (896 wide, 4864 ffn, 151936 vocabulary)
CASES = [("Q8_0", "Q8_0", False, 896, 4864), ("Q8_0", "Q8_0", False, 1536, 8960),
         ("Q8_0", "Q8_0", False, 896, 151936),   # the 0.5B draft's output matrix
         ("Q5_K", "Q5_K", False, 1536, 8960),
         ("Q4_0-repacked", "Q4_0", True, 896, 4864), ("Q4_0-repacked", "Q4_0", True, 1536, 8960),
         ("Q4_K-repacked", "Q4_K", True, 1536, 8960), ("Q6_K", "Q6_K", False, 1536, 8960)]
WIDTHS = (1, 2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", help="cases whose name starts so (Q8_0, Q4_0, ...)")
    args = ap.parse_args()
    base, cpu = ggml()
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, median of {args.reps} rounds; ms per mul_mat; libs {native.library_folder()}")
    print("case | k x rows | width | ggml ms | multicol ms | ggml / multicol")
    for name, tname, repack, k, rows in CASES:
        if args.only and not name.startswith(args.only):
            continue
        kind = TYPES[tname]
        src = rng.normal(size=(rows, k)).astype(np.float32)
        quantized = quantize(kind, src)
        wctx = base.ggml_init(InitParams(1 << 20, None, True))
        w = base.ggml_new_tensor_2d(wctx, kind, k, rows)
        if repack:   # the weights alone in a context of their own, allocated in that buffer type
            base.ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buffer_type(base, cpu))
            base.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, base.ggml_nbytes(w))
        for n in WIDTHS:
            ctx = base.ggml_init(InitParams(512 << 20, None, False))
            if not repack:
                w = base.ggml_new_tensor_2d(ctx, kind, k, rows)
                ctypes.memmove(base.ggml_get_data(w), quantized.ctypes.data, base.ggml_nbytes(w))
            x = base.ggml_new_tensor_2d(ctx, F32, k, n)
            acts = rng.normal(size=(n, k)).astype(np.float32)
            ctypes.memmove(base.ggml_get_data(x), acts.ctypes.data, acts.nbytes)
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, base.ggml_mul_mat(ctx, w, x))
            times = {"0": [], "16": []}
            for _ in range(args.reps):
                for side in ("0", "16"):
                    with native.switches({native.MULTICOL_MAX: side, native.MULTICOL_MIN: "1",
                                          native.TILED_MIN: str(1 << 30)}):
                        cpu.ggml_graph_compute_with_ctx(ctx, graph, args.threads)
                        t0 = time.perf_counter()
                        for _ in range(3):
                            cpu.ggml_graph_compute_with_ctx(ctx, graph, args.threads)
                        times[side].append((time.perf_counter() - t0) / 3 * 1e3)
            stock, mc = statistics.median(times["0"]), statistics.median(times["16"])
            print(f"{name} | {k}x{rows} | {n} | {stock:.3f} | {mc:.3f} | {stock / mc:.2f}", flush=True)
            base.ggml_free(ctx)


if __name__ == "__main__":
    main()
