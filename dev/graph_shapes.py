"""GPU probe: what alternating batch shapes cost llama.cpp's CUDA graphs (issue 3 notes).

Decodes with the target in four patterns after a 200-token context and prints ms per call:
all batch 1; alternating 1 and 9; all 9; blocks of 16 ones and 16 nines. Rolled-back tokens keep
positions steady, as a speculative round's rejected nodes do. Usage: python3 dev/graph_shapes.py MODEL.gguf
"""
from __future__ import annotations

import sys
import time

from localspec.engine.llama_model import LlamaModel  # llama.cpp before numpy: the GPU host needs it

import numpy as np  # noqa: E402


def run(model: LlamaModel, pattern: list[int], start: int) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {}
    pos = start
    for n in pattern:
        tokens = (np.arange(n, dtype=np.int32) * 13 + 500 + pos) % model.vocab_size
        t = time.perf_counter()
        model.decode(tokens, np.arange(pos, pos + n, dtype=np.int32), logits=True)
        model.logits()[-1].argmax()
        times.setdefault(n, []).append(time.perf_counter() - t)
        model.seq_rm(0, pos + 1, -1)   # keep one token, as a round commits at least one
        pos += 1
    return times


def main() -> None:
    model = LlamaModel(sys.argv[1], n_ctx=4096, n_seq_max=17)
    model.prefill([t % model.vocab_size for t in range(1000, 1200)], 0)
    patterns = {"all 1": [1] * 192, "alternate 1/9": [1, 9] * 96, "all 9": [9] * 192,
                "blocks 16x1/16x9": ([1] * 16 + [9] * 16) * 6, "all 1 again": [1] * 192}
    start = 200
    for name, pattern in patterns.items():
        times = run(model, pattern, start)
        start += len(pattern)
        print(f"{name:>18}: " + "  ".join(f"batch {n}: {1e3 * np.median(v):.2f} ms (min {1e3 * min(v):.2f})"
                                          for n, v in sorted(times.items())), flush=True)
    model.close()


if __name__ == "__main__":
    main()
