"""GPU probe: which decode patterns keep llama.cpp's graph and ggml-cuda's CUDA graph, and what a
forward costs in each. Counts llama.cpp's debug messages ("CUDA Graph id .. reused": llama.cpp
reused its graph; "warmup complete"/"warmup reset": ggml-cuda (re)captured or dropped its CUDA
graph) per pattern and prints ms per forward.
Usage: python3 dev/cuda_graph_probe.py MODEL.gguf
"""
from __future__ import annotations

import ctypes
import sys
import time
from collections import Counter

import llama_cpp as lc

from localspec.engine.llama_model import LlamaModel  # llama.cpp before numpy: the GPU host needs it

import numpy as np  # noqa: E402

SEEN: Counter = Counter()


@lc.llama_log_callback
def _count(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    msg = text.decode("utf-8", "replace")
    for key in ("reused", "warmup complete", "warmup reset", "disabling"):
        if key in msg:
            SEEN[key] += 1


def linear_rounds(model: LlamaModel, pos: int, pad: int, rounds: int = 50, depth: int = 3,
                  root_sizes=(1, 2)) -> tuple[list[float], int]:
    kw = {"pad_to": pad} if pad else {}
    times = []
    for r in range(rounds):
        root = root_sizes[r % len(root_sizes)]
        toks = (np.arange(root, dtype=np.int32) * 13 + 500 + pos) % model.vocab_size
        t = time.perf_counter()
        model.decode(toks, np.arange(pos, pos + root, dtype=np.int32), None, logits=True, **kw)
        int(model.logits()[root - 1].argmax())
        times.append(time.perf_counter() - t)
        if pad:
            model.drop_padding()
        pos += root
        model.seq_cp(0, 1, -1, pos)
        for d in range(depth):
            t = time.perf_counter()
            model.decode(np.array([(pos + d * 7) % model.vocab_size], np.int32),
                         np.array([pos + d], np.int32), [(1,)], logits=True, **kw)
            int(model.logits()[0].argmax())
            times.append(time.perf_counter() - t)
            if pad:
                model.drop_padding()
        model.seq_rm(1, -1, -1)
    return times, pos


def plain(model: LlamaModel, pos: int, steps: int = 200) -> tuple[list[float], int]:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        model.decode(np.array([pos % model.vocab_size], np.int32), np.array([pos], np.int32), None, logits=True)
        int(model.logits()[0].argmax())
        times.append(time.perf_counter() - t)
        pos += 1
    return times, pos


def main() -> None:
    model = LlamaModel(sys.argv[1], n_ctx=4096, n_seq_max=18, n_pad_seqs=16)
    lc.llama_log_set(_count, ctypes.c_void_p(0))
    model.prefill([t % model.vocab_size for t in range(1000, 1300)], 0)
    pos = 300
    patterns = [
        ("plain 1-token steps", lambda p: plain(model, p)),
        ("linear rounds unpadded", lambda p: linear_rounds(model, p, 0)),
        ("linear rounds pad 2", lambda p: linear_rounds(model, p, 2)),
        ("linear rounds pad 3", lambda p: linear_rounds(model, p, 3)),
        ("linear rounds pad 4", lambda p: linear_rounds(model, p, 4)),
        ("linear rounds pad 8", lambda p: linear_rounds(model, p, 8)),
        ("linear rounds pad 12", lambda p: linear_rounds(model, p, 12)),
        ("pad 3, root always 1", lambda p: linear_rounds(model, p, 3, root_sizes=(1,))),
        ("plain 1-token steps again", lambda p: plain(model, p)),
    ]
    def reused() -> int:
        return int(getattr(lc.llama_perf_context(model._ctx), "n_reused", -1))

    for name, fn in patterns:
        SEEN.clear()
        before = reused()
        times, pos = fn(pos)
        SEEN["llama graph reused"] = reused() - before
        t = np.array(times[8:]) * 1e3
        print(f"{name:>26}: median {np.median(t):.2f} ms, min {t.min():.2f}, p90 {np.percentile(t, 90):.2f}"
              f"  over {len(t)} forwards; {dict(SEEN)}", flush=True)
    model.close()


if __name__ == "__main__":
    main()
