"""Where a step of `head train`'s generation goes (engine/head_train.py `generate_corpus`): W
sequences side by side, one row each a step, every row's hidden state handed back. On the H200 a
step of 256 rows took 33 ms and the packed prompts ran at ~17k tok/s (docs/decisions/0030), far
from what a 1.5B model's arithmetic needs; this times one step and the prefill under variations,
each in a model opened afresh:

  - W sequences side by side (--widths);
  - the greedy choice made where the model runs (llama.cpp's backend samplers, what training
    uses) or every row's logits copied out and argmax'd here (`host`);
  - hidden states on or off (`nohidden`: what the states cost);
  - one KV stream a sequence (what training uses) or one cache for all (`unified`).

    python dev/generation_probe.py TARGET.gguf [--widths 64,128,256] [--context 256] [--steps 20]
        [--batches 512,4096]

PROFILE=1 (CUDA, torch installed) adds the kernels of a step by family (verify_cost_probe's
grouping). Prints one line a variation: prefill tok/s, a step's median ms, generated tok/s.

--collect N also times `head train`'s reading of text (engine/head_train.py `collect`: one
sequence, 512 tokens a call, every row's state handed back) on N tokens of the standard library,
with every row's logits copied to the host (llama.cpp outputs them beside the states) and with a
backend greedy sampler on the sequence instead (llama.cpp then leaves the logits on the device).
"""
from __future__ import annotations

import argparse
import os
import time

from localspec.engine.head_train_model import TrainingModel  # llama.cpp before torch: the GPU host needs it

import llama_cpp as lc  # noqa: E402

import numpy as np  # noqa: E402

from verify_cost_probe import by_family, kernel_times  # noqa: E402  (dev/, the script's own folder)

# (name, greedy on device, hidden states, one stream a sequence)
VARIANTS = {"train": (True, True, False), "host": (False, True, False),
            "nohidden": (True, False, False), "unified": (True, True, True)}


def prompts(width: int, context: int, vocab: int) -> list[list[int]]:
    return [[(1000 + 7 * i + 13 * s) % vocab for i in range(context)] for s in range(width)]


def run(path: str, width: int, context: int, steps: int, variant: str, profile: bool,
        batch: int = 512) -> str:
    on_device, hidden, unified = VARIANTS[variant]
    model = TrainingModel(path, n_ctx=width * (context + steps + 8), n_batch=max(batch, width), n_seq_max=width,
                          hidden=hidden, unified=unified, greedy_on_device=on_device)
    try:
        t = time.perf_counter()
        model.prefill_many(prompts(width, context, model.vocab_size))
        lc.llama_synchronize(model._ctx)   # the prefill is done
        prefill = width * context / (time.perf_counter() - t)
        cur = np.full(width, 11, np.int32)
        pos = np.full(width, context, np.int32)
        seqs = [(s,) for s in range(width)]
        times = []

        def one_step() -> None:
            nonlocal cur
            model.decode(cur, pos, seqs, logits=True)
            if hidden:
                model.hidden_rows()
            cur = model.sampled(range(width)) if on_device else model.logits().argmax(axis=1).astype(np.int32)
            pos[:] += 1

        for _ in range(steps):
            t = time.perf_counter()
            one_step()
            times.append(time.perf_counter() - t)
        step = float(np.median(times[2:] or times))
        line = (f"{variant:>9} W={width:<4} B={model.n_batch:<5} prefill {prefill:9,.0f} tok/s   step {1e3 * step:7.2f} ms   "
                f"{width / step:9,.0f} tok/s generated")
        if profile:
            line += "\n" + kernels(one_step, 5)
        return line
    finally:
        model.close()


def kernels(one_step, calls: int) -> str:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            one_step()
    kernels, counts = kernel_times(prof)
    parts = [f"{label} {us / calls / 1e3:.2f}"
             for label, us in sorted(by_family(kernels).items(), key=lambda kv: -kv[1])]
    return f"      GPU ms a step by family ({sum(counts.values()) / calls:.0f} kernels): " + ", ".join(parts)


def collect_rate(path: str, tokens: int, on_device: bool) -> str:
    import inspect
    import json

    from localspec.engine.head_train import collect
    texts = [(i, inspect.getsource(m)) for i, m in enumerate((argparse, inspect, json.decoder, json.encoder))]
    model = TrainingModel(path, n_ctx=512, n_batch=512, n_seq_max=1, hidden=True, greedy_on_device=on_device)
    try:
        collect(model, texts[:1], 512)     # warm-up
        t = time.perf_counter()
        corpus = collect(model, (texts * 64), tokens)
        rate = len(corpus.tokens) / (time.perf_counter() - t)
    finally:
        model.close()
    return f"  collect {'backend sampler' if on_device else 'logits copied':>16}: {rate:9,.0f} tok/s read"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--widths", default="64,128,256")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", default="train,host,nohidden",
                    help=f"of {','.join(VARIANTS)} (unified runs at the smallest width only)")
    ap.add_argument("--collect", type=int, default=0, help="also time reading N tokens of text (0: not)")
    ap.add_argument("--batches", default="512",
                    help="tokens a prefill decode takes (n_batch, at least the width), each a run: "
                         "512 is what head train opens with; larger ones split into fewer ubatches")
    args = ap.parse_args()
    if args.collect:
        for on_device in (False, True):
            print(collect_rate(args.model, args.collect, on_device), flush=True)
    widths = [int(w) for w in args.widths.split(",")]
    profile = os.environ.get("PROFILE") == "1"
    for variant in args.variants.split(","):
        for width in widths[:1] if variant == "unified" else widths:
            for batch in (int(b) for b in args.batches.split(",")):
                print(run(args.model, width, args.context, args.steps, variant, profile, batch), flush=True)


if __name__ == "__main__":
    main()
