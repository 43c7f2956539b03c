"""ggml's C API through ctypes for the tests and probes that drive ggml without a model
(tests/engine/test_multicol.py and test_multicol_cuda.py through tests/ggml_cuda.py,
dev/multicol/matmul_timing.py): libggml-base and libggml-cpu of the llama.cpp localspec loads, with
the prototypes they call."""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from localspec.engine import native


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def library(stem: str) -> ctypes.CDLL | None:
    """One of the libraries of the llama.cpp localspec loads, by name ("libggml-base"); None where
    this build has none (libggml-cuda in a CPU build)."""
    for f in native.libraries():
        if f.name.split(".so")[0] == stem:
            return ctypes.CDLL(str(f))
    return None


@functools.cache
def base() -> ctypes.CDLL:
    """libggml-base with the prototypes used here: contexts, tensors, graphs, quantizing, and the
    backend calls that allocate, fill, compute and read on any backend."""
    lib = library("libggml-base")
    p, size = ctypes.c_void_p, ctypes.c_size_t
    lib.ggml_init.restype, lib.ggml_init.argtypes = p, [InitParams]
    lib.ggml_free.argtypes = [p]
    lib.ggml_new_tensor_2d.restype = p
    lib.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.ggml_get_data.restype, lib.ggml_get_data.argtypes = p, [p]
    lib.ggml_quantize_chunk.restype = size
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64, p]
    lib.ggml_new_tensor_1d.restype = p
    lib.ggml_new_tensor_1d.argtypes = [p, ctypes.c_int, ctypes.c_int64]
    lib.ggml_mul_mat.restype, lib.ggml_mul_mat.argtypes = p, [p, p, p]
    lib.ggml_add.restype, lib.ggml_add.argtypes = p, [p, p, p]
    lib.ggml_cpy.restype, lib.ggml_cpy.argtypes = p, [p, p, p]
    lib.ggml_new_graph.restype, lib.ggml_new_graph.argtypes = p, [p]
    lib.ggml_build_forward_expand.argtypes = [p, p]
    lib.ggml_nbytes.restype, lib.ggml_nbytes.argtypes = size, [p]
    lib.ggml_backend_reg_get_proc_address.restype = p
    lib.ggml_backend_reg_get_proc_address.argtypes = [p, ctypes.c_char_p]
    lib.ggml_backend_reg_dev_get.restype = p
    lib.ggml_backend_reg_dev_get.argtypes = [p, size]
    lib.ggml_backend_buft_name.restype, lib.ggml_backend_buft_name.argtypes = ctypes.c_char_p, [p]
    lib.ggml_backend_alloc_ctx_tensors_from_buft.restype = p
    lib.ggml_backend_alloc_ctx_tensors_from_buft.argtypes = [p, p]
    lib.ggml_backend_alloc_ctx_tensors.restype = p
    lib.ggml_backend_alloc_ctx_tensors.argtypes = [p, p]
    lib.ggml_backend_tensor_set.argtypes = [p, p, size, size]
    lib.ggml_backend_tensor_get.argtypes = [p, p, size, size]
    lib.ggml_backend_graph_compute.restype = ctypes.c_int
    lib.ggml_backend_graph_compute.argtypes = [p, p]
    lib.ggml_backend_buffer_free.argtypes = [p]
    lib.ggml_backend_free.argtypes = [p]
    return lib


@functools.cache
def ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml-base and libggml-cpu with the prototypes used here, the CPU backend initialised."""
    cpu = library("libggml-cpu")
    p = ctypes.c_void_p
    cpu.ggml_backend_cpu_reg.restype = p
    cpu.localspec_multicol_calls.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_cpu_init()
    return base(), cpu


def quantize(kind: int, weights: np.ndarray) -> np.ndarray:
    """`weights` (rows x k f32) in ggml type `kind`, as bytes."""
    rows, k = weights.shape
    out = np.zeros(2 * rows * k, dtype=np.uint8)     # more than any type up to 8 bits a code needs
    src = np.ascontiguousarray(weights, dtype=np.float32)
    n = base().ggml_quantize_chunk(kind, src.ctypes.data, out.ctypes.data, 0, rows, k, None)
    return out[:n]


def repack_buffer_type(base: ctypes.CDLL, cpu: ctypes.CDLL) -> int:
    """The CPU backend's extra buffer type that repacks weights (llama.cpp's default for Q4_K)."""
    reg = cpu.ggml_backend_cpu_reg()
    get = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get)(
        base.ggml_backend_reg_dev_get(reg, 0))
    i = 0
    while bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            return bufts[i]
        i += 1
    raise RuntimeError("this llama.cpp build has no CPU_REPACK buffer type")
