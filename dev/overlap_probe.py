"""Can the draft decode while the target verifies? Times llama.cpp decodes of the target and the
draft alone, one after the other, and at the same time from two Python threads (llama_decode
releases the GIL; each context has its own CUDA streams), as a pipelined round would run them:
the target verifying a 5-token tree while the draft runs 4 one-token forwards ahead.
Usage: python dev/overlap_probe.py TARGET.gguf DRAFT.gguf [REPS]"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

from localspec.engine.calibrate import _batch   # the tokens calibration measures with
from localspec.engine.llama_model import LlamaModel

CONTEXT = 300


def prepared(path: str) -> LlamaModel:
    model = LlamaModel(Path(path), n_ctx=1024, n_seq_max=4)
    model.prefill((np.arange(100, 100 + CONTEXT) % model.vocab_size).tolist(), 0)
    return model


def steps(model: LlamaModel, n_tokens: int, forwards: int) -> None:
    """`forwards` decodes of n_tokens each at the context's end, each rolled back."""
    tokens = _batch(model, n_tokens)
    positions = np.arange(CONTEXT, CONTEXT + n_tokens, dtype=np.int32)
    for _ in range(forwards):
        model.decode(tokens, positions)
        model.logits()
        model.seq_rm(0, CONTEXT, -1)


def timed(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def together(*jobs) -> None:
    threads = [threading.Thread(target=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    target, draft = prepared(sys.argv[1]), prepared(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    def verify() -> None:
        steps(target, 5, 1)

    def run_ahead() -> None:
        steps(draft, 1, 4)

    def plain_step() -> None:
        steps(target, 1, 1)

    a, b, p = timed(verify, reps), timed(run_ahead, reps), timed(plain_step, reps)
    seq = timed(lambda: (verify(), run_ahead()), reps)
    par = timed(lambda: together(verify, run_ahead), reps)
    print(f"target plain step (1 token)       {1e3 * p:6.2f} ms")
    print(f"target verify (5 tokens)          {1e3 * a:6.2f} ms")
    print(f"draft 4 forwards (1 token each)   {1e3 * b:6.2f} ms")
    print(f"one after the other               {1e3 * seq:6.2f} ms")
    print(f"at the same time (two threads)    {1e3 * par:6.2f} ms   (max of the two: {1e3 * max(a, b):.2f})")
    target.close()
    draft.close()


if __name__ == "__main__":
    main()
