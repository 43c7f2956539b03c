"""ms per decode of 16-48 tokens (after a 300-token context, rolled back after each) with the
multi-column kernels bounded at 16 columns, as packaging/patches ships them, against bounded at
64, interleaved call by call in one process: whether a verify of 17-32 rows (a tree of up to 32
nodes, the default) should take the kernels or ggml's paths (docs/decisions/0037). Sides:
  - "max 16, tiled from F": what a CPU's calibration chose with the shipped bound (F, default 24:
    this EPYC's floor); rows 17..F-1 take ggml's one-column vec_dot, F.. its tiled matmul;
  - "max 16, tiled from 17": ggml's tiled matmul right after the kernels;
  - "max 64, tiled from 65": the kernels for every size measured.

    .venv/bin/python dev/multicol/wide_batches.py MODEL.gguf [--reps 5] [--tiled-min 24]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from localspec.engine import native
from localspec.engine.llama_model import LlamaModel

from model_steps import CONTEXT, step_ms  # dev/multicol, the script's own folder

WIDTHS = (16, 17, 20, 24, 28, 32, 40, 48)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiled-min", default="24")
    args = ap.parse_args()
    model = LlamaModel(args.model, n_ctx=1024, n_gpu_layers=0, n_threads=2)
    model.prefill((np.arange(100, 100 + CONTEXT, dtype=np.int32) % model.vocab_size).tolist(), 0)
    sides = {f"max 16, tiled from {args.tiled_min}": {native.MULTICOL_MAX: "16", native.TILED_MIN: args.tiled_min},
             "max 16, tiled from 17": {native.MULTICOL_MAX: "16", native.TILED_MIN: "17"},
             "max 64, tiled from 65": {native.MULTICOL_MAX: "64", native.TILED_MIN: "65"}}
    print(f"{args.model}: median of {args.reps}, ms per decode of n tokens after {CONTEXT}")
    print(f"n | {' | '.join(sides)}")
    times: dict[str, dict[int, list[float]]] = {side: {} for side in sides}
    for _ in range(args.reps):
        for n in WIDTHS:
            for side, switches in sides.items():
                with native.switches(switches):
                    times[side].setdefault(n, []).append(step_ms(model, n))
    for n in WIDTHS:
        print(f"{n} | " + " | ".join(f"{statistics.median(times[side][n]):.1f}" for side in sides), flush=True)
    model.close()


if __name__ == "__main__":
    main()
