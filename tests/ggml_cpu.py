"""ggml's C API through ctypes for the tests and probes that drive ggml without a model
(tests/engine/test_multicol.py, dev/multicol/matmul_timing.py): libggml-base and libggml-cpu of
the llama.cpp localspec loads, with the prototypes they call."""
from __future__ import annotations

import ctypes
import functools

from localspec.engine import native


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


@functools.cache
def ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml-base and libggml-cpu with the prototypes used here, the CPU backend initialised."""
    libs = {f.name.split(".so")[0]: f for f in native.libraries()}
    base = ctypes.CDLL(str(libs["libggml-base"]))
    cpu = ctypes.CDLL(str(libs["libggml-cpu"]))
    p = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = p, [InitParams]
    base.ggml_free.argtypes = [p]
    base.ggml_new_tensor_2d.restype = p
    base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = p, [p]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_int64, p]
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
    base.ggml_backend_buffer_free.argtypes = [p]
    cpu.ggml_backend_cpu_reg.restype = p
    cpu.localspec_multicol_calls.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


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
