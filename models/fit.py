"""Will a model run here? A memory estimate for `localspec list`, from files and GGUF metadata.

Running a model needs its weights, a KV cache and some scratch: the weights are the file sizes; the
KV cache follows from the GGUF's own hyperparameters (layers x KV heads x head size, keys and
values, f16, for a 4096-token context); scratch is a fixed allowance. That is compared with free
GPU memory (nvidia-smi, when there is one: no CUDA library is loaded for this) and with available
RAM (/proc/meminfo MemAvailable). It is an estimate, worded as one; nothing here decides whether
localspec will try to load a model.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localspec.models.errors import LocalspecError
from localspec.models.gguf_file import GGUFInfo, read_gguf
from localspec.models.own_files import Unreadable, read_json
from localspec.models.safetensors_file import MAX_CONFIG

CONTEXT = 4096          # tokens: the estimate's context (the CLI's default --ctx)
KV_BYTES = 2            # f16 keys and values, llama.cpp's default cache type
KV_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32}   # bytes a cell value: q8_0 is 32 int8 and an f16 scale
SCRATCH = 512 << 20     # compute buffers, runtime


@dataclass(frozen=True)
class FreeMemory:
    vram: int | None    # bytes free on the emptiest GPU; None without nvidia-smi
    ram: int | None     # MemAvailable; None without /proc


def kv_cache_bytes(info: GGUFInfo, n_ctx: int = CONTEXT, kv_type: str = "f16") -> int | None:
    """K and V for `n_ctx` tokens over every layer, in cells of `kv_type` (KV_TYPE_BYTES); None
    if the metadata lacks a field."""
    meta, arch = info.metadata, info.architecture
    try:
        n_layer = int(meta[f"{arch}.block_count"])
        n_head = int(meta[f"{arch}.attention.head_count"])
        n_embd = int(meta[f"{arch}.embedding_length"])
    except (KeyError, TypeError, ValueError):
        return None
    n_head_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
    k_len = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
    v_len = int(meta.get(f"{arch}.attention.value_length", n_embd // n_head))
    return int(n_ctx * n_layer * n_head_kv * (k_len + v_len) * KV_TYPE_BYTES[kv_type])


# The KV cache's cells where none is asked for (--kv-type auto), by where the target runs: q8_0
# holds twice the context in the same memory, and is chosen only where it measured no slower than
# f16 (decode, a verify's rows and a turn's prefill; docs/decisions/0047).
AUTO_KV_TYPE = {"cpu": "f16", "gpu": "f16"}


def auto_kv_type(on_gpu: bool) -> str:
    """The KV cache's cell type `--kv-type auto` takes where the target runs."""
    return AUTO_KV_TYPE["gpu" if on_gpu else "cpu"]

# Of the memory left once the weights are in, what a fitted context's KV cache may take: the rest
# stays for llama.cpp's compute buffers, a draft, and the other programs on the machine.
FIT_SHARE = 0.5
FIT_STEP = 1024     # a fitted context is a multiple of this many tokens


def trained_context(info: GGUFInfo) -> int | None:
    """The context the model was trained for (its GGUF's context_length), None if not given."""
    try:
        return int(info.metadata[f"{info.architecture}.context_length"])
    except (KeyError, TypeError, ValueError):
        return None


def fitted_context(info: GGUFInfo, weights: int, on_gpu: bool, free: FreeMemory | None = None,
                   kv_type: str = "f16") -> int:
    """The default context: the largest multiple of FIT_STEP whose KV cache (cells of `kv_type`) fits in FIT_SHARE
    of the memory the model's `weights` (bytes) leave free where it runs (the GPU's, or RAM), up to
    the model's trained context; never below CONTEXT (or the trained one, if smaller), so that
    what ran before still runs. `free`: measured now unless given."""
    trained = trained_context(info) or CONTEXT
    floor = min(trained, CONTEXT)
    per_token = kv_cache_bytes(info, 1, kv_type)
    if not per_token:
        return floor
    free = free or free_memory()
    room = free.vram if on_gpu and free.vram is not None else free.ram
    if room is None:
        return floor
    fits = int((room - weights - SCRATCH) * FIT_SHARE // per_token) // FIT_STEP * FIT_STEP
    return max(floor, min(trained, fits))


def torch_kv_cache_bytes(config: dict, n_ctx: int = CONTEXT) -> int | None:
    """The same for a transformers config.json (a PyTorch draft)."""
    try:
        n_layer = int(config["num_hidden_layers"])
        n_head = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // n_head)
    except (KeyError, TypeError, ValueError):
        return None
    n_head_kv = int(config.get("num_key_value_heads") or n_head)
    return n_ctx * n_layer * n_head_kv * 2 * head_dim * KV_BYTES


def listed_context(target, free: FreeMemory) -> int | None:
    """The context a run of `target` (library.ModelFile, a GGUF) gets here by default: fitted
    where it fits (the GPU's memory when it fits there), with AUTO_KV_TYPE's cells; None if
    unreadable."""
    try:
        info = read_gguf(target.path, require_vocab=False)
    except (LocalspecError, OSError, ValueError):
        return None
    on_gpu = free.vram is not None and verdict(need_bytes([target]), free) == "fits in VRAM"
    return fitted_context(info, target.size, on_gpu, free, auto_kv_type(on_gpu))


def need_bytes(models: list) -> int | None:
    """Weights + the KV cache of every model (library.ModelFile: target, draft) + scratch."""
    total = SCRATCH
    for model in models:
        try:
            if model.kind == "torch":
                kv = torch_kv_cache_bytes(read_json(model.path / "config.json", MAX_CONFIG))
            else:
                kv = kv_cache_bytes(read_gguf(model.path, require_vocab=False))
        except (LocalspecError, OSError, ValueError, Unreadable):
            return None
        if kv is None:
            return None
        total += model.size + kv
    return total


def free_memory() -> FreeMemory:
    return FreeMemory(free_vram(), mem_available())


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; else free pages from sysconf; None if neither."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def free_vram() -> int | None:
    """Free memory of the GPU with the most of it, from nvidia-smi; None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return max(int(line) for line in out.split()) << 20    # MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None      # a driver that answers oddly: no VRAM figure, not a failed `list`


def verdict(need: int | None, free: FreeMemory) -> str:
    if need is None:
        return "unknown"
    if free.vram is not None and need <= free.vram:
        return "fits in VRAM"
    if free.ram is not None and need <= free.ram:
        return "fits in RAM"
    if free.ram is None and free.vram is None:
        return "unknown"
    return "too big"
