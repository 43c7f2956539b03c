"""GPU probe: where a verify's milliseconds go as the batch grows (issue 3's accounting).

The target's cost per call on the H100 rises from 1.7 ms for one token to 2.3 for three and 3.4
for eight, although a 1.5B model's weights are read once per call either way. This times decodes
of n tokens after a 300-token context (rolled back, as rejected nodes are), with logits for every
row against the last row only, then profiles a few sizes with torch.profiler (CUPTI sees every
kernel in the process, llama.cpp's too, inside CUDA graphs as well) and prints, per call: wall
time, GPU busy time, and the kernels grouped by family (matmul, attention, norms and the rest, the
logits copy to the host).
Usage: python3 dev/verify_cost_probe.py TARGET.gguf [SIZES]
PROFILE=1,8,16 names the sizes profiled (default 1,3,8; empty: none).
DUMP=FILE.npz saves the logits of batches of 1, 3 and 8 tokens (and skips the timing); with
COMPARE=OTHER.npz too it prints how far they lie from another run's (GGML_CUDA_DISABLE_FUSION=1
against a fused build, say: a kernel change must not move them).
HIDDEN=1 opens the target with hidden states on, as a draft head needs (every row's final hidden
state handed back each call): what that costs against the same sizes without. TAPS=2,14 (hidden
states implied) also hands back those layers' input states, as a head with taps needs.
"""
from __future__ import annotations

import os
import re
import sys
import time
from collections import defaultdict

from localspec.engine.llama_model import LlamaModel  # llama.cpp before torch: the GPU host needs it

import numpy as np  # noqa: E402

CONTEXT = 300
REPS = 40


def step(model: LlamaModel, n: int, all_rows: bool) -> None:
    tokens = (np.arange(n, dtype=np.int32) * 13 + 700) % model.vocab_size
    model.decode(tokens, np.arange(CONTEXT, CONTEXT + n, dtype=np.int32), logits=all_rows)
    model.logits()
    if model.hidden:
        model.hidden_rows()     # what a head reads back (with taps: their rows copied beside)
    model.seq_rm(0, CONTEXT, -1)


def timed(model: LlamaModel, n: int, all_rows: bool) -> float:
    for _ in range(5):                    # the CUDA graph of this shape is captured by now
        step(model, n, all_rows)
    times = []
    for _ in range(REPS):
        t = time.perf_counter()
        step(model, n, all_rows)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


FAMILIES = [("matmul (mmvq/mmq/gemm)", r"mul_mat|mmvq|mmq|gemm|gemv|cublas|cutlass|sm90_xmma"),
            ("attention", r"flash_attn|fattn|soft_max"),
            ("rope", r"rope"),
            ("norm", r"norm"),
            ("copy/set rows/cpy", r"cpy|set_rows|copy|concat|get_rows"),
            ("elementwise", r"add|mul|silu|glu|scale|unary|swiglu|bin_bcast")]


def family(name: str) -> str:
    for label, pattern in FAMILIES:
        if re.search(pattern, name, re.I):
            return label
    return "other"


def kernel_times(prof) -> tuple[dict[str, float], dict[str, int]]:
    """A torch.profiler run's CUDA kernels: microseconds and calls by name (copies and sets as
    "memcpy/memset: NAME", their time only)."""
    import torch
    kernels: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
        if "memcpy" in ev.name.lower() or "memset" in ev.name.lower():
            kernels["memcpy/memset: " + ev.name[:40]] += us
            continue
        kernels[ev.name] += us
        counts[ev.name] += 1
    return kernels, counts


def by_family(kernels: dict[str, float]) -> dict[str, float]:
    """kernel_times' microseconds summed by family (FAMILIES, copies and sets as one)."""
    out: dict[str, float] = defaultdict(float)
    for name, us in kernels.items():
        out["memcpy/memset" if name.startswith("memcpy/memset") else family(name)] += us
    return out


def profile(model: LlamaModel, n: int, calls: int = 20) -> None:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    for _ in range(5):
        step(model, n, True)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(calls):
            step(model, n, True)
        wall = (time.perf_counter() - t) / calls
    kernels, counts = kernel_times(prof)
    busy = sum(kernels.values()) / calls / 1e3
    print(f"\n== {n} tokens: wall {1e3 * wall:.2f} ms a call, GPU busy {busy:.2f} ms, "
          f"kernels a call {sum(counts.values()) / calls:.0f}", flush=True)
    for label, us in sorted(by_family(kernels).items(), key=lambda kv: -kv[1]):
        print(f"   {label:<28} {us / calls / 1e3:7.3f} ms", flush=True)
    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:14]:
        print(f"      {us / calls / 1e3:7.3f} ms  x{counts.get(name, 0) / calls:4.0f}  {name[:110]}",
              flush=True)


def dump(model: LlamaModel, path: str, compare: str | None) -> None:
    rows = {}
    for n in (1, 3, 8):
        tokens = (np.arange(n, dtype=np.int32) * 13 + 700) % model.vocab_size
        model.decode(tokens, np.arange(CONTEXT, CONTEXT + n, dtype=np.int32), logits=True)
        rows[f"n{n}"] = model.logits().copy()
        model.seq_rm(0, CONTEXT, -1)
    np.savez(path, **rows)
    if compare:
        other = np.load(compare)
        for key, value in rows.items():
            diff = np.abs(value - other[key]).max()
            same = (value.argmax(1) == other[key].argmax(1)).all()
            print(f"{key}: max |logit difference| {diff:.6f}, argmax equal: {same}", flush=True)


def main() -> None:
    sizes = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 2, 3, 4, 6, 8, 16, 32]
    taps = tuple(int(t) for t in os.environ.get("TAPS", "").split(",") if t)
    model = LlamaModel(sys.argv[1], n_ctx=4096, n_seq_max=4, hidden=os.environ.get("HIDDEN") == "1" or bool(taps),
                       taps=taps)
    model.prefill([t % model.vocab_size for t in range(1000, 1000 + CONTEXT)], 0)
    if os.environ.get("DUMP"):
        dump(model, os.environ["DUMP"], os.environ.get("COMPARE"))
        return
    print("tokens  all rows' logits  last row only  (ms a call, median of 40)", flush=True)
    for n in sizes:
        print(f"{n:6d}  {timed(model, n, True):16.3f}  {timed(model, n, False):13.3f}", flush=True)
    logits = np.random.default_rng(0).standard_normal((8, model.vocab_size)).astype(np.float32)
    t = time.perf_counter()
    for _ in range(200):
        logits.argmax(axis=1)
    print(f"numpy argmax of 8 rows: {1e3 * (time.perf_counter() - t) / 200:.3f} ms")
    import torch
    if torch.cuda.is_available():
        for n in [int(s) for s in os.environ.get("PROFILE", "1,3,8").split(",") if s]:
            profile(model, n)
    model.close()


if __name__ == "__main__":
    main()
