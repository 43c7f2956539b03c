"""GPU probe: the PyTorch draft's forward, eager against CUDA-graph replay (issue 3 notes).

Builds a randomly initialised model of the 0.5B draft's shape (or loads one: a transformers folder
or a .gguf), checks that graph replay gives the eager forward's logits for a prefill and tree
forwards of 1..16 rows, then prints ms per forward for each row count, both ways.
Usage: python3 dev/torch_draft_probe.py [MODEL]
"""
from __future__ import annotations

import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from localspec.engine.drafters.torch_draft import measure_forward
from localspec.engine.torch_lm import TorchLM, default_device, default_dtype

# Qwen2.5-Coder-0.5B's shape
SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True,
             max_position_embeddings=32768)


def build(static: bool, path: str | None, compile: bool | None = None) -> TorchLM:
    dev = default_device()
    dt = default_dtype(dev)
    if path:
        return TorchLM.load(path, max_len=4096, device=str(dev), dtype=dt, static_shapes=static,
                            compile=compile)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).to(dt)
    return TorchLM(model, max_len=4096, device=dev, dtype=dt, static_shapes=static, compile=compile)


def tree_rows(lm: TorchLM, base: int, n: int):
    pos = torch.arange(base, base + n)
    attend = torch.ones(n, base + n, dtype=torch.bool).tril(base)
    return (pos * 31 + 7) % lm.vocab_size, pos, pos, attend


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else None
    eager, graphed, plain_graph = build(False, path), build(True, path), build(True, path, False)
    ctx = 300
    idx = torch.arange(ctx)
    causal = torch.ones(ctx, ctx, dtype=torch.bool).tril()
    toks = (idx * 17 + 3) % eager.vocab_size
    for lm in (eager, graphed, plain_graph):
        lm.forward(toks, idx, idx, causal)          # 300 rows: eager on all
    worst = 0.0
    t = time.perf_counter()
    for n in (1, 3, 8, 16, 5, 1):
        a = eager.forward(*tree_rows(eager, ctx, n)).clone()
        b = graphed.forward(*tree_rows(graphed, ctx, n)).clone()
        diff = (a - b).abs().max().item()
        same = bool((a.argmax(-1) == b.argmax(-1)).all())
        worst = max(worst, diff)
        print(f"rows {n:2d}: max |eager - graph| = {diff:.4f}, argmax equal: {same}")
    print(f"worst logit difference {worst:.4f} ({eager.dtype}); "
          f"{time.perf_counter() - t:.1f} s including compiling and capturing")
    sizes = (1, 2, 4, 8, 16)
    for name, lm in (("eager", eager), ("graph", plain_graph), ("compiled graph", graphed)):
        ms = measure_forward(lm, sizes, reps=20, context=300)
        print(f"{name}: " + "  ".join(f"{n}: {1e3 * s:.2f} ms" for n, s in ms.items()))


if __name__ == "__main__":
    main()
