"""Whether llama.cpp computes a batch's rows bit for bit as single-token decodes, per batch size
and context length, on this machine: max |logit difference| of each batch of 2..8 tokens against
the same tokens decoded one at a time (0.000: exact). Usage:
    python dev/exact_rows_probe.py MODEL.gguf [--exact] [CONTEXTS...]

Why it matters: a speculative run evaluates accepted tokens in batches, so unless batches are
computed exactly as single tokens its cache differs slightly from a plain run's and a near-tie can
go the other way later on. Measured 2026-11-27 on the reference target (Qwen2.5-Coder-1.5B Q4_K_M):
on the 2-core AVX-512 Xeon batches of 2-3 are exact after 64 tokens of context and none is after
320 (flash attention on; with it off not even at 64), and on the H200 no batch size is exact at
any context: an "exact mode" that keeps verifies within the exact sizes would be plain decoding.
With --exact (LlamaModel's exact numerics: no repacked weights, flash attention on, ggml's tiled
matmul off), measured 2026-11-27 on the 2-core EPYC: 0.000 at every size and context.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from localspec.engine.calibrate import _batch   # the tokens calibration measures with
from localspec.engine.llama_model import LlamaModel


def main() -> None:
    args = sys.argv[1:]
    exact = "--exact" in args
    args = [a for a in args if a != "--exact"]
    path = Path(args[0])
    contexts = [int(c) for c in args[1:]] or [64, 320, 700, 1500]
    model = LlamaModel(path, n_ctx=2048, n_seq_max=4, exact=exact)
    tokens = _batch(model, 8)
    for context in contexts:
        model.clear()
        model.prefill((np.arange(100, 100 + context) % model.vocab_size).tolist(), 0)
        positions = np.arange(context, context + 8, dtype=np.int32)
        alone = []
        for i in range(8):
            model.decode(tokens[i:i + 1], positions[i:i + 1])
            alone.append(model.logits()[0].copy())
        model.seq_rm(0, context, -1)
        out = []
        for n in range(2, 9):
            model.decode(tokens[:n], positions[:n])
            out.append(f"{n}:{np.abs(model.logits() - np.stack(alone[:n])).max():.3f}")
            model.seq_rm(0, context, -1)
        print(f"{path.name} context {context}: " + " ".join(out), flush=True)
    model.close()


if __name__ == "__main__":
    main()
