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
import time

import numpy as np

from localspec.engine import native

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


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    libs = {f.name.split(".so")[0]: f for f in native.libraries()}
    base, cpu = ctypes.CDLL(str(libs["libggml-base"])), ctypes.CDLL(str(libs["libggml-cpu"]))
    p = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = p, [_InitParams]
    base.ggml_free.argtypes = [p]
    base.ggml_new_tensor_2d.restype = p
    base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = p, [p]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = p, [p, p, p]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = p, [p]
    base.ggml_build_forward_expand.argtypes = [p, p]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [p]
    base.ggml_backend_reg_get_proc_address.restype = p
    base.ggml_backend_reg_get_proc_address.argtypes = [p, ctypes.c_char_p]
    base.ggml_backend_reg_dev_get.restype = p
    base.ggml_backend_reg_dev_get.argtypes = [p, ctypes.c_size_t]
    base.ggml_backend_buft_name.restype, base.ggml_backend_buft_name.argtypes = ctypes.c_char_p, [p]
    base.ggml_backend_alloc_ctx_tensors_from_buft.restype = p
    base.ggml_backend_alloc_ctx_tensors_from_buft.argtypes = [p, p]
    base.ggml_backend_tensor_set.argtypes = [p, p, ctypes.c_size_t, ctypes.c_size_t]
    cpu.ggml_backend_cpu_reg.restype = p
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


def _repack_buft(base, cpu) -> int:
    reg = cpu.ggml_backend_cpu_reg()
    get = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get)(base.ggml_backend_reg_dev_get(reg, 0))
    i = 0
    while bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            return bufts[i]
        i += 1
    raise SystemExit("no CPU_REPACK buffer type in this build")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", help="cases whose name starts so (Q8_0, Q4_0, ...)")
    args = ap.parse_args()
    base, cpu = _libs()
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, median of {args.reps} rounds; ms per mul_mat; libs {native.library_folder()}")
    print("case | k x rows | width | ggml ms | multicol ms | ggml / multicol")
    for name, tname, repack, k, rows in CASES:
        if args.only and not name.startswith(args.only):
            continue
        kind = TYPES[tname]
        src = rng.normal(size=(rows, k)).astype(np.float32)
        quantized = np.zeros(2 * rows * k, dtype=np.uint8)
        base.ggml_quantize_chunk(kind, src.ctypes.data, quantized.ctypes.data, 0, rows, k, None)
        wctx = base.ggml_init(_InitParams(1 << 20, None, True))
        w = base.ggml_new_tensor_2d(wctx, kind, k, rows)
        if repack:   # the weights alone in a context of their own, allocated in that buffer type
            base.ggml_backend_alloc_ctx_tensors_from_buft(wctx, _repack_buft(base, cpu))
            base.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, base.ggml_nbytes(w))
        for n in WIDTHS:
            ctx = base.ggml_init(_InitParams(512 << 20, None, False))
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
