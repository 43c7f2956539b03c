"""What compiling a draft head's step buys on this GPU: the step as a run measures it
(`DraftHead.measure`: graph replay, the inputs' fill and the read-back), eager kernels in the
graphs against inductor's, for each compile mode named, with the seconds each mode took to
compile all of a run's row buckets (`DraftHead.prepare`) and the top guesses compared.

Each mode runs in its own head, loaded afresh; inductor's cache is this run's own empty folder
unless TORCHINDUCTOR_CACHE_DIR names one (--warm-cache: run every mode twice. In one process the
second head reuses the code dynamo compiled for the first, so its prepare time is not what a
new process pays to load from inductor's disk cache: run the probe twice on one cache for that).

    python dev/head_compile_probe.py --model target.gguf --head head.npz
        [--modes default,max-autotune-no-cudagraphs] [--reps 5] [--warm-cache]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from localspec.engine.llama_model import LlamaModel  # llama.cpp before torch: the GPU host needs it

import numpy as np  # noqa: E402
import torch  # noqa: E402

from localspec.engine.drafters import head as head_mod  # noqa: E402
from localspec.engine.drafters.head import DraftHead, window_rows  # noqa: E402

SIZES = (1, 2, 4, 8, 16)


def guesses(head: DraftHead, n: int) -> np.ndarray:
    """The top guesses of one step of n distinct rows against a full window."""
    g = torch.Generator().manual_seed(n)
    f = torch.randn(n, head.out.shape[1], generator=g).to(head.device, head.dtype)
    _, _, _, top = head.step(f, [(1000 + 7 * i) % head.vocab_size for i in range(n)], *window_rows(n))
    return top.cpu().numpy()


def run(args, mode: str | None, n_embd: int, vocab: int) -> tuple[dict, float, dict]:
    head = DraftHead(args.head, args.model, n_embd=n_embd, vocab_size=vocab)
    if mode is None:
        head.compiled = False
    else:
        head_mod.COMPILE_MODE = mode
    t = time.perf_counter()
    head.prepare(lambda step: print(f"  {step.what} ({step.step}/{step.total})", flush=True))
    took = time.perf_counter() - t
    if head.compile_error:
        print(f"  compiling failed, eager instead: {head.compile_error}")
    steps = head.measure(SIZES, reps=args.reps)
    return steps, took, {n: guesses(head, n) for n in SIZES}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--modes", default="default,max-autotune-no-cudagraphs")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warm-cache", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))
    meta = LlamaModel(args.model, n_ctx=256, n_seq_max=1, n_gpu_layers=0, hidden=True)
    n_embd, vocab = meta.n_embd, meta.vocab_size
    meta.close()
    print(f"torch {torch.__version__}; inductor cache {os.environ['TORCHINDUCTOR_CACHE_DIR']}")
    rows = [("eager", None)] + [(m, m) for m in args.modes.split(",")]
    if args.warm_cache:
        rows += [(f"{m} (cached)", m) for m in args.modes.split(",")]
    base = None
    print(f"{'kernels':<36} {'prepare s':>9}  " + " ".join(f"{n:>2} rows" for n in SIZES) + "  (ms)")
    for name, mode in rows:
        steps, took, top = run(args, mode, n_embd, vocab)
        base = base or top
        same = all((top[n][:, 0] == base[n][:, 0]).all() for n in SIZES)
        print(f"{name:<36} {took:9.1f}  " + " ".join(f"{1e3 * steps[n]:7.3f}" for n in SIZES)
              + f"  top guesses as eager's: {same}", flush=True)


if __name__ == "__main__":
    main()
