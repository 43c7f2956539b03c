"""ms per decode of n tokens (after a 300-token context, rolled back after each), ggml's kernels
(GGML_CPU_MULTICOL_MAX=0) against the multi-column ones, interleaved call by call in one process,
for each GGUF given: the model-level counterpart of matmul_timing.py (dev/multicol/requantize.py
makes a Q8_0, Q4_0 or Q5_K_S file from the reference target). Three sides: ggml's kernels and the
multi-column ones with ggml's tiled matmul floor at --tiled-min (default 24: what calibration chose
on the Xeon of decision 0022), and ggml's kernels with its shipped floor of 8 (the tiled path takes
the K-quants from 8 rows; Q8_0 and Q4_0 are not tiled). The kernels' side runs from one row
(GGML_CPU_MULTICOL_MIN=1): its 1-row figure is theirs, where by default ggml's kernels take it.

    .venv/bin/python dev/multicol/model_steps.py MODEL.gguf [MODEL.gguf ...] [--reps 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from localspec.engine import native
from localspec.engine.llama_model import LlamaModel

CONTEXT = 300
WIDTHS = (1, 2, 4, 8, 16)


def step_ms(model: LlamaModel, n: int) -> float:
    tokens = (np.arange(n, dtype=np.int32) * 13 + 700) % model.vocab_size
    t = time.perf_counter()
    model.decode(tokens, np.arange(CONTEXT, CONTEXT + n, dtype=np.int32), logits=True)
    ms = (time.perf_counter() - t) * 1e3
    model.seq_rm(0, CONTEXT, -1)
    return ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tiled-min", default="24")
    args = ap.parse_args()
    for path in args.models:
        model = LlamaModel(path, n_ctx=1024, n_gpu_layers=0, n_threads=2)
        model.prefill((np.arange(100, 100 + CONTEXT, dtype=np.int32) % model.vocab_size).tolist(), 0)
        print(f"{path}: median of {args.reps}, ms per decode of n tokens")
        sides = {"ggml": {native.MULTICOL_MAX: "0", native.TILED_MIN: args.tiled_min},
                 "ggml, tiled from 8": {native.MULTICOL_MAX: "0", native.TILED_MIN: "8"},
                 "multicol": {native.MULTICOL_MAX: "16", native.MULTICOL_MIN: "1", native.TILED_MIN: args.tiled_min}}
        print(f"n | {' | '.join(sides)} | multicol / ggml | ggml in steps | multicol in steps"
              f"   (tiled floor {args.tiled_min} unless named)")
        times: dict[str, dict[int, list[float]]] = {side: {} for side in sides}
        for _ in range(args.reps):
            for n in WIDTHS:
                for side, switches in sides.items():
                    with native.switches(switches):
                        step_ms(model, n)   # warm
                        times[side].setdefault(n, []).append(step_ms(model, n))
        med = {side: {n: statistics.median(v) for n, v in d.items()} for side, d in times.items()}
        for n in WIDTHS:
            s, m = med["ggml"][n], med["multicol"][n]
            row = " | ".join(f"{med[side][n]:.1f}" for side in sides)
            print(f"{n} | {row} | {m / s:.2f} | {s / med['ggml'][1]:.2f} | {m / med['multicol'][1]:.2f}", flush=True)
        model.close()


if __name__ == "__main__":
    main()
