"""ggml's CUDA backend through ctypes (tests/ggml_cpu.py's binding of libggml-base), for
tests/engine/test_multicol_cuda.py: one mul_mat of quantized weights by f32 columns on the GPU.
The kernels' switches (GGML_CUDA_MULTICOL_MIN/MAX) are read once per process, so the test runs
each setting in a process of its own: `python tests/ggml_cuda.py IN.npz OUT.npz` reads weights,
columns and an optional bias row, and writes every width's product (plus the bias, added by a
ggml_add that ggml may fuse into the matmul) and the kernels' call counts."""
from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np

from ggml_cpu import InitParams, base, library, quantize

F32 = 0


def available() -> bool:
    """Whether llama.cpp's libraries include a CUDA backend that finds a device."""
    try:
        cuda = library("libggml-cuda")
    except Exception:   # no llama.cpp at all
        return False
    if cuda is None:
        return False
    cuda.ggml_backend_cuda_get_device_count.restype = ctypes.c_int
    return cuda.ggml_backend_cuda_get_device_count() > 0


@functools.cache
def cuda() -> ctypes.CDLL:
    """libggml-cuda with the prototypes used here."""
    lib = library("libggml-cuda")
    lib.ggml_backend_cuda_init.restype, lib.ggml_backend_cuda_init.argtypes = ctypes.c_void_p, [ctypes.c_int]
    return lib


def kernel_calls(counter: str = "localspec_cuda_multicol_calls") -> int:
    """How many matmuls packaging/patches' CUDA multi-column kernels took in this process
    (`localspec_cuda_multicol_bias_calls`: of them, with a bias added in their store); -1: a
    build without them."""
    lib = cuda()
    if not hasattr(lib, counter):
        return -1
    getattr(lib, counter).restype = ctypes.c_int
    return getattr(lib, counter)()


def mul_mat(backend: int, kind: int, quantized: np.ndarray, rows: int, k: int,
            acts: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """`quantized` (rows x k weights of ggml type `kind`) times the columns of `acts` (n x k f32)
    on the GPU, plus `bias` (rows f32) when given: n x rows f32."""
    lib = base()
    ctx = lib.ggml_init(InitParams(1 << 20, None, True))
    buffer = None
    try:
        w = lib.ggml_new_tensor_2d(ctx, kind, k, rows)
        x = lib.ggml_new_tensor_2d(ctx, F32, k, len(acts))
        y = lib.ggml_mul_mat(ctx, w, x)
        b = None if bias is None else lib.ggml_new_tensor_1d(ctx, F32, rows)
        if b is not None:
            y = lib.ggml_add(ctx, y, b)
        graph = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(graph, y)
        buffer = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
        columns = np.ascontiguousarray(acts, np.float32)
        lib.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, lib.ggml_nbytes(w))
        lib.ggml_backend_tensor_set(x, columns.ctypes.data, 0, columns.nbytes)
        if b is not None:
            row = np.ascontiguousarray(bias, np.float32)
            lib.ggml_backend_tensor_set(b, row.ctypes.data, 0, row.nbytes)
        assert lib.ggml_backend_graph_compute(backend, graph) == 0
        out = np.empty((len(acts), rows), np.float32)
        lib.ggml_backend_tensor_get(y, out.ctypes.data, 0, out.nbytes)
        return out
    finally:
        if buffer is not None:
            lib.ggml_backend_buffer_free(buffer)
        lib.ggml_free(ctx)


def shared_q8_1(backend: int, kind: int, quantized: list[np.ndarray], rows: int, k: int,
                acts: np.ndarray, overwrite: np.ndarray | None = None) -> tuple[list[np.ndarray], int]:
    """One graph of a matmul per weight matrix in `quantized` (each rows x k of ggml type `kind`),
    all by the same columns `acts` (n x k f32), in that order; with `overwrite` (n x k f32), a
    copy of it into the columns' bytes between the first matmul and the second. Returns the
    products and how many of the matmuls found the columns' q8_1 copy held (packaging/patches:
    ggml-cuda-shared-q8_1; -1: a build without it)."""
    lib = base()
    ctx = lib.ggml_init(InitParams(1 << 20, None, True))
    buffer = None
    try:
        x = lib.ggml_new_tensor_2d(ctx, F32, k, len(acts))
        weights = [lib.ggml_new_tensor_2d(ctx, kind, k, rows) for _ in quantized]
        graph = lib.ggml_new_graph(ctx)
        products, z = [], None
        for i, w in enumerate(weights):
            if i == 1 and overwrite is not None:
                z = lib.ggml_new_tensor_2d(ctx, F32, k, len(acts))
                lib.ggml_build_forward_expand(graph, lib.ggml_cpy(ctx, z, x))
            products.append(lib.ggml_mul_mat(ctx, w, x))
            lib.ggml_build_forward_expand(graph, products[-1])
        buffer = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
        for w, q in zip(weights, quantized):
            lib.ggml_backend_tensor_set(w, q.ctypes.data, 0, lib.ggml_nbytes(w))
        for tensor, values in ((x, acts), (z, overwrite)):
            if tensor is not None:
                values = np.ascontiguousarray(values, np.float32)
                lib.ggml_backend_tensor_set(tensor, values.ctypes.data, 0, values.nbytes)
        before = kernel_calls("localspec_cuda_q8_1_reused")
        assert lib.ggml_backend_graph_compute(backend, graph) == 0
        reused = kernel_calls("localspec_cuda_q8_1_reused")
        out = []
        for y in products:
            out.append(np.empty((len(acts), rows), np.float32))
            lib.ggml_backend_tensor_get(y, out[-1].ctypes.data, 0, out[-1].nbytes)
        return out, (reused - before if before >= 0 else -1)
    finally:
        if buffer is not None:
            lib.ggml_backend_buffer_free(buffer)
        lib.ggml_free(ctx)


def main_shared(src: str, dst: str) -> None:
    """`python tests/ggml_cuda.py --shared IN.npz OUT.npz`: IN has kind, weights (m x rows x k),
    acts (n x k), overwrite (n x k); OUT, for each width 1..n: the products of the shared graph
    (s{n}_{i}) and with the overwrite (o{n}_{i}), each matmul alone (a{n}_{i}, and of the
    overwrite: z{n}_{i}), and the copies found held (held{n}, held_over{n})."""
    data = np.load(src)
    kind, weights, acts, over = int(data["kind"]), data["weights"], data["acts"], data["overwrite"]
    _, rows, k = weights.shape
    quantized = [quantize(kind, w) for w in weights]
    backend = cuda().ggml_backend_cuda_init(0)
    out = {}
    try:
        for n in range(1, len(acts) + 1):
            shared, out[f"held{n}"] = shared_q8_1(backend, kind, quantized, rows, k, acts[:n])
            over_, out[f"held_over{n}"] = shared_q8_1(backend, kind, quantized, rows, k, acts[:n], over[:n])
            for i, q in enumerate(quantized):
                out[f"s{n}_{i}"], out[f"o{n}_{i}"] = shared[i], over_[i]
                out[f"a{n}_{i}"] = mul_mat(backend, kind, q, rows, k, acts[:n])
                out[f"z{n}_{i}"] = mul_mat(backend, kind, q, rows, k, over[:n])
    finally:
        base().ggml_backend_free(backend)
    np.savez(dst, **out)


def main(src: str, dst: str) -> None:
    data = np.load(src)
    kind, weights, acts = int(data["kind"]), data["weights"], data["acts"]
    bias = data["bias"] if "bias" in data.files else None
    rows, k = weights.shape
    quantized = quantize(kind, weights)
    backend = cuda().ggml_backend_cuda_init(0)
    try:
        products = {f"w{n}": mul_mat(backend, kind, quantized, rows, k, acts[:n], bias)
                    for n in range(1, len(acts) + 1)}
    finally:
        base().ggml_backend_free(backend)
    np.savez(dst, calls=kernel_calls(), bias_calls=kernel_calls("localspec_cuda_multicol_bias_calls"),
             stream_calls=kernel_calls("localspec_cuda_stream_calls"), **products)


if __name__ == "__main__":
    if sys.argv[1] == "--shared":
        main_shared(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1], sys.argv[2])
