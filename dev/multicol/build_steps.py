"""ms per decode of n tokens (after a 300-token context, rolled back after each) with the llama.cpp
libraries this process loaded, the multi-column switches as `calibrate` leaves them on a CPU
(kernels up to 64 columns, ggml's tiled floor past them): one line of JSON a run, to compare two
builds of the same source (before and after a patch, or an AVX2-only build against a native one),
each run in a process of its own and the runs alternated:

    LLAMA_CPP_LIB_PATH=DIR LD_LIBRARY_PATH=DIR .venv/bin/python dev/multicol/build_steps.py NAME \
        [--model GGUF] [--reps 5]

(LD_LIBRARY_PATH too: a build tree's libraries carry a RUNPATH to the tree, which would otherwise
pick the tree's current libggml*.so whatever LLAMA_CPP_LIB_PATH says.) docs/decisions/0040's model
decodes came from this.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from localspec.engine import native
from localspec.engine.llama_model import LlamaModel

from model_steps import CONTEXT, step_ms

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
REFERENCE = Path.home() / ".cache/localspec-bench/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--model", default=str(REFERENCE))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    t = time.perf_counter()
    model = LlamaModel(args.model, n_ctx=1024, n_gpu_layers=0, n_threads=2)
    load = time.perf_counter() - t
    model.prefill((np.arange(100, 100 + CONTEXT, dtype=np.int32) % model.vocab_size).tolist(), 0)
    times: dict[int, list[float]] = {n: [] for n in WIDTHS}
    with native.switches({native.MULTICOL_MAX: "64", native.TILED_MIN: "35"}):
        for _ in range(args.reps):
            for n in WIDTHS:
                step_ms(model, n)   # warm
                times[n].append(step_ms(model, n))
    med = {n: statistics.median(v) for n, v in times.items()}
    print(json.dumps({"name": args.name, "load_s": round(load, 2),
                      "ms": {n: round(m, 1) for n, m in med.items()},
                      "steps": {n: round(m / med[1], 2) for n, m in med.items()}}), flush=True)
    model.close()


if __name__ == "__main__":
    main()
