"""GPU probe: a draft model's forwards in the pattern of a linear draft round, unpadded and padded.

A round evaluates the root (the 1-2 tokens committed since the last round, in sequence 0) and then
one node per forward along a chain in sequence 1, which is dropped at the end of the round.
Unpadded, the first forward's shape differs from the others; padded (LlamaModel.decode pad_to), all
forwards have one shape. Prints ms per forward, median over the rounds.
Usage: python3 dev/draft_round_probe.py DRAFT.gguf
"""
from __future__ import annotations

import sys
import time

from localspec.engine.llama_model import LlamaModel  # llama.cpp before numpy: the GPU host needs it

import numpy as np  # noqa: E402


def rounds(model: LlamaModel, pad: int, start: int, n_rounds: int = 60, depth: int = 3) -> tuple[list[float], int]:
    kw = {"pad_to": pad} if pad else {}
    per_forward = []
    pos = start
    for r in range(n_rounds):
        root = 1 + r % 2                                  # 1 or 2 tokens since the last round
        toks = (np.arange(root, dtype=np.int32) * 13 + 500 + pos) % model.vocab_size
        t = time.perf_counter()
        model.decode(toks, np.arange(pos, pos + root, dtype=np.int32), None, logits=True, **kw)
        int(model.logits()[root - 1].argmax())
        if pad:
            model.drop_padding()
        pos += root
        model.seq_cp(0, 1, -1, pos)
        for d in range(depth):
            model.decode(np.array([(pos + d * 7) % model.vocab_size], np.int32),
                         np.array([pos + d], np.int32), [(1,)], logits=True, **kw)
            int(model.logits()[0].argmax())
            if pad:
                model.drop_padding()
        per_forward.append((time.perf_counter() - t) / (depth + 1))
        model.seq_rm(1, -1, -1)
    return per_forward, pos


def main() -> None:
    model = LlamaModel(sys.argv[1], n_ctx=4096, n_seq_max=18, n_pad_seqs=16)
    model.prefill([t % model.vocab_size for t in range(1000, 1300)], 0)
    start = 300
    for name, pad in (("unpadded", 0), ("padded to 2", 2), ("padded to 12", 12), ("unpadded again", 0)):
        times, start = rounds(model, pad, start)
        print(f"{name:>15}: {1e3 * np.median(times[5:]):.2f} ms a forward "
              f"(min {1e3 * min(times[5:]):.2f})", flush=True)
    model.close()


if __name__ == "__main__":
    main()
