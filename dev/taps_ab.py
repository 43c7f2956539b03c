"""Does a draft head guess better reading the target's low and middle layers beside its last
(taps, EAGLE-3's fused features)? One corpus, read once with the taps, trains two heads with the
same seed, held-out files and number of steps (the first head's in `--minutes`): one on the last
layer's states alone, one with the taps.
Prints each head's held-out top-1 by tree depth and writes both heads.

    python dev/taps_ab.py TARGET.gguf --out DIR [--taps auto] [--text-tokens 1000000]
        [--generated-tokens 1000000] [--parallel 256] [--generate-minutes 3] [--minutes 5]
        [--steps 100000] [--batch 32] [--length 256]

The text is `head train`'s default minus the chat history (the standard library, then
site-packages), in its reading order. In memory only: a kept corpus with taps is three times a
plain one's size (~9 KB a token for a 1536-wide target), more than a GPU host's disk should take.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from localspec.engine import torch_lm  # noqa: F401  (torch before llama.cpp: the measured load order)
from localspec.engine.head_train_model import TrainingModel

from localspec.app.head_cmd import tap_layers  # noqa: E402
from localspec.app.head_sources import Choice, list_sources, reading_order  # noqa: E402
from localspec.engine.errors import LocalspecError  # noqa: E402
from localspec.engine.head_train import collect, function_prompts, generate_corpus, join, train  # noqa: E402


def texts(order):
    for i, (_, doc) in enumerate(order):
        try:
            yield i, doc.read()
        except LocalspecError:
            continue


def add_corpus_args(ap: argparse.ArgumentParser) -> None:
    """The flags of the corpus both heads train on (noise_ab.py takes them too)."""
    ap.add_argument("model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--taps", default="auto")
    ap.add_argument("--text-tokens", type=int, default=1_000_000)
    ap.add_argument("--generated-tokens", type=int, default=1_000_000)
    ap.add_argument("--parallel", type=int, default=256)
    ap.add_argument("--generate-minutes", type=float, default=3.0)
    ap.add_argument("--minutes", type=float, default=5.0, help="training time a head")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=512)


def read_corpus(args: argparse.Namespace, model: Path, taps: tuple[int, ...]):
    """The text read and the continuations generated, with the taps' states: one Corpus."""
    order = reading_order(list_sources(Choice(history=False)))
    t = time.time()
    parts = []
    if args.text_tokens:
        target = TrainingModel(model, n_ctx=args.ctx, n_batch=args.ctx, n_seq_max=1, hidden=True, taps=taps,
                               greedy_on_device=True)
        try:
            parts.append(collect(target, texts(order), args.text_tokens, chunk=args.ctx))
        finally:
            target.close()
        print(f"read {len(parts[-1].tokens):,} tokens in {time.time() - t:.0f} s", flush=True)
    if args.generated_tokens:
        t = time.time()
        width = args.parallel
        target = TrainingModel(model, n_ctx=width * 512, n_batch=max(512, width), n_seq_max=width, hidden=True,
                               unified=False, greedy_on_device=True, taps=taps)
        try:
            parts.append(generate_corpus(target, function_prompts(texts(order)), args.generated_tokens, gen_tokens=256, prompt_tokens=256,
                                         seconds=60 * args.generate_minutes))
        finally:
            target.close()
        print(f"generated {len(parts[-1].tokens):,} tokens in {time.time() - t:.0f} s", flush=True)
    return join(*parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_corpus_args(ap)
    args = ap.parse_args()
    model, out = Path(args.model), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    taps = tap_layers(args.taps, model)
    corpus = read_corpus(args, model, taps)
    last_only = corpus.last_layer(len(taps))
    train_pair(args, model, out, [("last", "last []", last_only, {"taps": ()}),
                                  ("taps", f"taps {list(taps)}", corpus, {"taps": taps})])


def train_pair(args: argparse.Namespace, model: Path, out: Path, heads: list) -> None:
    """Train two heads, each (name, label, corpus, train's keyword arguments), to out/head-NAME.npz
    with the same seed and held-out files; print their held-out top-1 by depth and which is higher
    at depth 1. The second trains as many steps as the first did in its minutes (with twice the
    time to do them): at equal time the two need not get equal steps (0033's addendum)."""
    steps, minutes = args.steps, args.minutes
    first = {}
    for i, (name, label, data, kwargs) in enumerate(heads):
        t = time.time()
        info = train(data, model, out / f"head-{name}.npz", steps=steps, batch=args.batch,
                     length=args.length, seconds=60 * minutes, **kwargs)
        print(f"{label}: held-out top-1 by depth {info['held_out_top1']}, "
              f"{info['steps']} steps in {time.time() - t:.0f} s", flush=True)
        if i and info["steps"] < steps:
            print(f"  (not an equal-steps A/B: {label} ran out of time at {info['steps']} of {steps})")
        steps, minutes = info["steps"], 2 * args.minutes
        first[name] = float(info["held_out_top1"][0])
    print(f"higher at depth 1: {max(first, key=first.get)}", flush=True)


if __name__ == "__main__":
    main()
