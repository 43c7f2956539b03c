"""ggml's CUDA backend through ctypes, for tests/engine/test_multicol_cuda.py: one mul_mat of
quantized weights by f32 columns on the GPU. The kernels' switches (GGML_CUDA_MULTICOL_MIN/MAX)
are read once per process, so the test runs each setting in a process of its own:
`python tests/ggml_cuda.py IN.npz OUT.npz` reads weights and columns and writes every width's
product and the kernels' call count."""
from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np

F32 = 0


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def _library(stem: str):
    from localspec.engine import native
    for f in native.libraries():
        if f.name.split(".so")[0] == stem:
            return ctypes.CDLL(str(f))
    return None


def available() -> bool:
    """Whether llama.cpp's libraries include a CUDA backend that finds a device."""
    try:
        cuda = _library("libggml-cuda")
    except Exception:   # no llama.cpp at all
        return False
    if cuda is None:
        return False
    cuda.ggml_backend_cuda_get_device_count.restype = ctypes.c_int
    return cuda.ggml_backend_cuda_get_device_count() > 0


@functools.cache
def ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml-base and libggml-cuda with the prototypes used here."""
    base, cuda = _library("libggml-base"), _library("libggml-cuda")
    p, size = ctypes.c_void_p, ctypes.c_size_t
    base.ggml_init.restype, base.ggml_init.argtypes = p, [InitParams]
    base.ggml_free.argtypes = [p]
    base.ggml_new_tensor_2d.restype = p
    base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_quantize_chunk.restype = size
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_int64, p]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = p, [p, p, p]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = p, [p]
    base.ggml_build_forward_expand.argtypes = [p, p]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = size, [p]
    base.ggml_backend_alloc_ctx_tensors.restype = p
    base.ggml_backend_alloc_ctx_tensors.argtypes = [p, p]
    base.ggml_backend_tensor_set.argtypes = [p, p, size, size]
    base.ggml_backend_tensor_get.argtypes = [p, p, size, size]
    base.ggml_backend_graph_compute.restype = ctypes.c_int
    base.ggml_backend_graph_compute.argtypes = [p, p]
    base.ggml_backend_buffer_free.argtypes = [p]
    base.ggml_backend_free.argtypes = [p]
    cuda.ggml_backend_cuda_init.restype, cuda.ggml_backend_cuda_init.argtypes = p, [ctypes.c_int]
    return base, cuda


def kernel_calls() -> int:
    """How many matmuls packaging/patches' CUDA multi-column kernels took in this process (-1:
    a build without them)."""
    cuda = ggml()[1]
    if not hasattr(cuda, "localspec_cuda_multicol_calls"):
        return -1
    cuda.localspec_cuda_multicol_calls.restype = ctypes.c_int
    return cuda.localspec_cuda_multicol_calls()


def mul_mat(backend: int, kind: int, quantized: np.ndarray, rows: int, k: int,
            acts: np.ndarray) -> np.ndarray:
    """`quantized` (rows x k weights of ggml type `kind`) times the columns of `acts` (n x k f32)
    on the GPU: n x rows f32."""
    base, _ = ggml()
    ctx = base.ggml_init(InitParams(1 << 20, None, True))
    buffer = None
    try:
        w = base.ggml_new_tensor_2d(ctx, kind, k, rows)
        x = base.ggml_new_tensor_2d(ctx, F32, k, len(acts))
        y = base.ggml_mul_mat(ctx, w, x)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        buffer = base.ggml_backend_alloc_ctx_tensors(ctx, backend)
        columns = np.ascontiguousarray(acts, np.float32)
        base.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, base.ggml_nbytes(w))
        base.ggml_backend_tensor_set(x, columns.ctypes.data, 0, columns.nbytes)
        assert base.ggml_backend_graph_compute(backend, graph) == 0
        out = np.empty((len(acts), rows), np.float32)
        base.ggml_backend_tensor_get(y, out.ctypes.data, 0, out.nbytes)
        return out
    finally:
        if buffer is not None:
            base.ggml_backend_buffer_free(buffer)
        base.ggml_free(ctx)


def quantize(kind: int, weights: np.ndarray) -> np.ndarray:
    """`weights` (rows x k f32) in ggml type `kind`, as bytes."""
    base, _ = ggml()
    rows, k = weights.shape
    out = np.zeros(2 * rows * k, dtype=np.uint8)     # more than any type up to 8 bits a code needs
    src = np.ascontiguousarray(weights, dtype=np.float32)
    n = base.ggml_quantize_chunk(kind, src.ctypes.data, out.ctypes.data, 0, rows, k, None)
    return out[:n]


def main(src: str, dst: str) -> None:
    data = np.load(src)
    kind, weights, acts = int(data["kind"]), data["weights"], data["acts"]
    rows, k = weights.shape
    quantized = quantize(kind, weights)
    backend = ggml()[1].ggml_backend_cuda_init(0)
    try:
        products = {f"w{n}": mul_mat(backend, kind, quantized, rows, k, acts[:n])
                    for n in range(1, len(acts) + 1)}
    finally:
        ggml()[0].ggml_backend_free(backend)
    np.savez(dst, calls=kernel_calls(), **products)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
