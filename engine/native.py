"""llama.cpp's process-wide state, owned in one place: load order, its libraries, its log, and the
numerics switches.

llama.cpp is a shared library with process-wide state; five concerns touch it and each has one rule:

* Load order. llama.cpp's libraries load before numpy or torch in a process that runs a model: on
  the CUDA development host, loading a model segfaulted inside llama_model_load_from_file whenever
  numpy or torch had been imported before llama_cpp (shared-library load order). Importing this
  module loads them; the modules that call llama.cpp import it first (engine/llama_model.py,
  engine/calibrate.py, and so engine/session.py), and so do the processes that run a model
  before anything imports numpy (app/engine_main.py, `generate`; tests/test_layering.py checks).
  Nothing else imports llama_cpp, so the chat UI process and `pull` never load it.
* Aborts. ggml's abort handler runs gdb on the process, when gdb is installed, and the backtrace
  lands on stdout, the protocol's channel in the engine process and the user's text in
  `generate`: GGML_NO_BACKTRACE is set before the libraries load. (What llama.cpp asserts on is
  validated before calling it, engine/llama_model.py: an abort is a bug, not an error message.)
* Library discovery: the folder llama-cpp-python loaded libllama from (LLAMA_CPP_LIB_PATH
  included) and the libggml / libllama files in it, for the patch markers, calibration's
  fingerprint and the GPU name.
* The log: llama.cpp's log callback keeps warnings and errors in a ring buffer; an error quotes
  the error lines llama.cpp logged during the failing call, not the log's tail.
* Numerics switches: packaging/patches' environment variables, read by ggml on every call,
  process-wide. `switches` sets them for a `with` block and puts back what was there; `switched`
  runs each step of a generation inside that block, so a session's numerics (calibration's
  tiled-matmul floor and one-row kernels; on a GPU its kernels per batch width) hold around its
  decodes and are never left set for the rest of the process.
"""
from __future__ import annotations

import ctypes
import functools
import os
from collections import deque
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Generator, Iterator, Mapping, TypeVar

os.environ.setdefault("GGML_NO_BACKTRACE", "1")   # before the libraries load (see above)

import llama_cpp as lc  # noqa: E402  (after the environment above)
import numpy as np  # noqa: E402  (after llama.cpp's libraries: the load order above)
from llama_cpp import llama_cpp as _raw  # noqa: E402

TILED_MIN = "GGML_CPU_TILED_MM_MIN"   # packaging/patches: fewest batch rows on ggml's tiled matmul
FA_SPLIT_KV = "GGML_CPU_FA_SPLIT_KV"  # packaging/patches: 0 keeps one query's KV cells on one thread
FA_ROWS = "GGML_CPU_FA_ROWS"  # packaging/patches: 0 keeps a verify's rows on ggml's per-row attention
MULTICOL_MAX = "GGML_CPU_MULTICOL_MAX"  # packaging/patches: most batch rows on the multi-column kernels
MULTICOL_MIN = "GGML_CPU_MULTICOL_MIN"  # packaging/patches: 1 puts one-row decodes on them too
# packaging/patches (ggml-cuda-width-dispatch, ggml-cuda-width-stream): bitmasks of batch widths
# 1..16 (bit n-1: n rows) that take the CUDA multi-column kernels, of widths 2..8 that take ggml's
# mul_mat_q instead of its mat-vec, and of widths whose Q4_K, Q5_K, Q6_K and Q8_0 matmuls take the
# streaming kernels; read at each graph's start and part of its CUDA graph's key
CUDA_MULTICOL_WIDTHS = "GGML_CUDA_MULTICOL_WIDTHS"
CUDA_MMQ_WIDTHS = "GGML_CUDA_MMQ_WIDTHS"
CUDA_STREAM_WIDTHS = "GGML_CUDA_STREAM_WIDTHS"


# ---- the log ------------------------------------------------------------------------------------
_WARN, _ERROR, _CONT = 3, 4, 5        # ggml_log_level
_LOG: deque[tuple[int, int, str]] = deque(maxlen=50)   # (serial, level, text): warnings and errors
_serial = 0                            # lines seen so far, for `errors_since`
_last_level = 0


@lc.llama_log_callback
def _log_to_buffer(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _serial, _last_level
    line = text.decode("utf-8", errors="replace") if text else ""
    if level == _CONT:                # the rest of the previous line
        if _LOG and _last_level in (_WARN, _ERROR) and _LOG[-1][0] == _serial:
            serial, lvl, head = _LOG.pop()
            _LOG.append((serial, lvl, head + line))
        return
    _last_level = level
    if level in (_WARN, _ERROR) and line.strip():
        _serial += 1
        _LOG.append((_serial, level, line))


lc.llama_log_set(_log_to_buffer, ctypes.c_void_p(0))
lc.llama_backend_init()


def log_mark() -> int:
    """A point in llama.cpp's log, for `errors_since`."""
    return _serial


def errors_since(mark: int) -> str:
    """What llama.cpp logged as errors after `mark`; failing that its last warnings; failing that a
    plain statement that it said nothing."""
    fresh = [(level, text.strip()) for serial, level, text in _LOG if serial > mark]
    errors = [text for level, text in fresh if level == _ERROR]
    return " | ".join(errors or [text for _, text in fresh][-3:]) or "no message from llama.cpp"


def last_log() -> str:
    """llama.cpp's last three warning or error lines."""
    return " | ".join(text.strip() for _, _, text in list(_LOG)[-3:]) or "no message from llama.cpp"


# ---- the libraries ------------------------------------------------------------------------------
def library_folder() -> Path:
    """The folder llama-cpp-python loaded libllama from."""
    return Path(_raw._lib._name).resolve().parent


@functools.cache   # the libraries loaded do not change within a process
def libraries() -> tuple[Path, ...]:
    """llama.cpp's libraries next to the one loaded: ggml's (its CPU backend is its own library in
    llama-cpp-python's builds, or linked into ggml or llama) and llama's."""
    folder = library_folder()
    return tuple(f for pattern in ("libggml*.so*", "libllama*.so*", "libggml*.dylib", "libllama*.dylib")
                 for f in sorted(folder.glob(pattern)))


def library_stamps() -> list[str]:
    """Name, size and mtime of each library: a rebuild (another patch, another backend) shows."""
    return [f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}" for f in libraries()]


@functools.cache
def exported(symbol: str):
    """`symbol` from the first of llama.cpp's libraries that exports it (a ctypes function), or
    None."""
    for lib in libraries():
        try:
            return getattr(ctypes.CDLL(str(lib)), symbol)
        except (OSError, AttributeError):
            continue
    return None


def has_marker(symbol: str) -> bool:
    """Whether one of llama.cpp's libraries exports `symbol` (packaging/patches' markers)."""
    return exported(symbol) is not None


def has_exact_switches() -> bool:
    """Whether the libraries loaded carry both of packaging/patches' switches exact numerics need
    (FA_SPLIT_KV and TILED_MIN)."""
    return has_marker("localspec_fa_split_kv_switch") and has_marker("localspec_tiled_mm_min_switch")


def has_multicol_kernels() -> bool:
    """Whether ggml's CPU matmul here has packaging/patches' multi-column Q4_K/Q5_K/Q6_K kernels
    (built where the CPU has AVX-512 VNNI, or AVX2)."""
    return has_marker("localspec_multicol_switch")


def has_multicol_q8_0_kernels() -> bool:
    """Whether the multi-column kernels here also take Q8_0 rows and repacked Q4_0 (packaging/patches'
    second multicol patch; AVX-512 VNNI builds only)."""
    return has_marker("localspec_multicol_q8_0_switch")


def has_cuda_width_switches() -> bool:
    """Whether ggml's CUDA backend here takes its matmuls' kernels per batch width from
    CUDA_MULTICOL_WIDTHS and CUDA_MMQ_WIDTHS (packaging/patches' ggml-cuda-width-dispatch)."""
    return has_marker("localspec_cuda_widths_switch")


def has_cuda_stream_kernel() -> bool:
    """Whether ggml's CUDA backend here has packaging/patches' streaming kernels (Q4_K, Q5_K, Q6_K
    and Q8_0 weights), which take the widths CUDA_STREAM_WIDTHS names (ggml-cuda-width-stream)."""
    return has_marker("localspec_cuda_stream_switch")


def has_tiled_min_switch() -> bool:
    """Whether TILED_MIN (packaging/patches) steers ggml's tiled matmul here."""
    return has_marker("localspec_tiled_mm_min_switch")


def has_layer_inputs(arch: str) -> bool:
    """Whether this llama.cpp hands back a layer's input for a model of architecture `arch`
    (llama.cpp's llama_set_embeddings_layer_inp, which Qwen2's graph serves with packaging/patches;
    llama.cpp aborts where a graph does not serve it, so nothing else is asked; the same patch
    gives the calls the C names `layer_inputs_api` binds)."""
    return arch == "qwen2" and has_marker("localspec_qwen2_layer_inputs")


@functools.cache
def layer_inputs_api() -> tuple:
    """(set, get): llama_set_embeddings_layer_inp(ctx, layer, on) and
    llama_get_embeddings_layer_inp(ctx, layer) -> float* ([n_batch, n_embd], a decode's every
    token in batch order): llama.cpp's llama-ext.h, outside llama-cpp-python's bindings and
    declared C++, so called through packaging/patches' C names. Only after `has_layer_inputs`."""
    lib = _raw._lib
    set_, get = lib.localspec_set_layer_input, lib.localspec_get_layer_input
    set_.argtypes, set_.restype = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None
    get.argtypes, get.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)
    return set_, get


@functools.cache
def _fp32_to_fp16():
    """ggml's CPU backend's float-to-half conversion of n values (F16C or AVX-512 where built
    with them), or None where no library here exports it."""
    fn = exported("ggml_cpu_fp32_to_fp16")
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return fn


def to_half(src: np.ndarray, out: np.ndarray) -> None:
    """out[...] = src, float32 to float16 rounded to nearest even as numpy's cast rounds, through
    ggml's vectorised conversion where both arrays are C-contiguous and of one shape. Why: numpy
    casts to float16 one value at a time, and a draft head's corpus casts every hidden state the
    target hands back, millions a minute (docs/decisions/0036)."""
    fn = _fp32_to_fp16()
    if (fn is None or src.dtype != np.float32 or out.dtype != np.float16 or src.shape != out.shape
            or not src.flags.c_contiguous or not out.flags.c_contiguous):
        out[...] = src
        return
    fn(src.ctypes.data, out.ctypes.data, src.size)


def gpu_offload_supported() -> bool:
    return bool(lc.llama_supports_gpu_offload())


def gpu_name() -> str | None:
    """The first GPU ggml registered (its description, e.g. "NVIDIA H100 80GB HBM3"), or None."""
    ggml = next((f for f in libraries() if f.name in ("libggml.so", "libggml.dylib")), None)
    if ggml is None:
        return None   # another library layout: report the device as unknown, i.e. CPU
    lib = ctypes.CDLL(str(ggml))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) in (1, 2):   # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
            return lib.ggml_backend_dev_description(dev).decode(errors="replace")
    return None


# ---- numerics switches --------------------------------------------------------------------------
@contextmanager
def switches(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set llama.cpp's environment switches for the block (None: unset, llama.cpp's default);
    afterwards each is as it was (unset ones unset). Nested blocks unwind in order."""
    before = {key: os.environ.get(key) for key in values}
    try:
        _set(values)
        yield
    finally:
        _set(before)


def _set(values: Mapping[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


T = TypeVar("T")


def switched(values: Mapping[str, str], steps: Generator[T, None, None]) -> Iterator[T]:
    """`steps` with the switches set while each step runs (up to the value it yields), and as they
    were in between, while the caller holds that value, and after the last."""
    try:
        while True:
            with switches(values):
                try:
                    value = next(steps)
                except StopIteration:
                    return
            yield value
    finally:
        with switches(values):
            steps.close()        # a generation left early unwinds under its switches too


EXACT_SWITCHES = {TILED_MIN: str(1 << 30), FA_SPLIT_KV: "0", FA_ROWS: "0", MULTICOL_MIN: "1",
                  MULTICOL_MAX: str(1 << 30)}


class ExactNumerics:
    """What exact numerics need from the process, held while any exact model is open (the switches
    are process-wide): ggml's tiled K-quant matmul, taken from 8 rows of a batch up, sums in
    another order than the one-row path, so its row floor goes out of reach; the multi-column
    kernels (packaging/patches), whose columns agree bit for bit at every width they take, take
    every width from one row up, so a verify's rows cost a batch, not a decode each (where they
    are not built, ggml's one-column kernels do every row, as alike); ggml's flash attention
    splits a single query's KV cells over threads once 512 are in view (a context past 256
    tokens), which a batch's rows never do, so that is off. A context manager: the first holder
    sets the switches, the last one out puts back what was there."""

    _holders = 0
    _block: AbstractContextManager[None] | None = None

    def __enter__(self) -> "ExactNumerics":
        cls = type(self)
        if cls._holders == 0:
            cls._block = switches(EXACT_SWITCHES)
            cls._block.__enter__()
        cls._holders += 1
        return self

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        cls._holders -= 1
        if cls._holders == 0:
            block, cls._block = cls._block, None
            block.__exit__(None, None, None)

    @classmethod
    def held(cls) -> bool:
        """Whether an exact model is open in this process."""
        return cls._holders > 0
