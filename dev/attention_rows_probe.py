"""ms of a decode of n rows after a context of c tokens, ggml's per-row attention against
packaging/patches' attention for a verify's few rows (GGML_CPU_FA_ROWS=0 / 1, read on every
call), alternated call by call in one process: what an 8-row verify's attention costs as the
context grows (docs/decisions/0034). Random tokens; the rows are rolled back after each call.

    GGML_CPU_TILED_MM_MIN=24 .venv/bin/python dev/attention_rows_probe.py MODEL.gguf [--reps 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from localspec.engine.llama_model import LlamaModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--contexts", default="300,1000,2000")
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    model = LlamaModel(args.model, n_ctx=max(contexts) + 64, n_batch=512, n_seq_max=1)
    try:
        for ctx in contexts:
            model.clear()
            for a in range(0, ctx, 500):
                b = min(ctx, a + 500)
                model.decode(list(range(1000 + a, 1000 + b)), np.arange(a, b, dtype=np.int32), logits=False)
            for n in (int(r) for r in args.rows.split(",")):
                tokens = (np.arange(n, dtype=np.int32) * 13 + 700) % model.vocab_size
                times: dict[str, list[float]] = {"0": [], "1": []}
                for _ in range(args.reps):
                    for on in times:
                        os.environ["GGML_CPU_FA_ROWS"] = on
                        t = time.perf_counter()
                        model.decode(tokens, np.arange(ctx, ctx + n, dtype=np.int32), logits=True)
                        model.logits()
                        times[on].append(time.perf_counter() - t)
                        model.seq_rm(0, ctx, -1)
                print(f"context {ctx:5d}  rows {n:2d}: ggml {1e3 * statistics.median(times['0']):6.1f} ms, "
                      f"few-rows {1e3 * statistics.median(times['1']):6.1f} ms", flush=True)
    finally:
        model.close()


if __name__ == "__main__":
    main()
