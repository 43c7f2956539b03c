"""`localspec head`: train a draft head for a target from text on this machine, and describe one.

A head (engine/drafters/head.py) drafts from the target's own hidden state at a fraction of a
target call. Training reads text already on this machine (app/head_sources.py: the files the user
names, their chat history, the Python standard library and site-packages): nothing leaves the
machine. It wants a GPU: the target reads the text once, then the head trains for a few thousand
steps (how long that takes: docs/decisions/0011). Its progress: app/head_progress.py.
"""
from __future__ import annotations

import argparse
import itertools
import shutil
import sys
from pathlib import Path

from localspec.engine.errors import LocalspecError
from localspec.engine.options import check_values, within

from .head_sources import add_source_flags
from .paths import resolve_models
from .terminal import show   # a head's meta and paths quote file names


# a generated continuation: prompt tokens kept, tokens generated (each prompt token costs about a
# generated one's compute and gives no training pair)
_PROMPT, _GEN = 256, 256
# tokens a decode of the prompts' prefill takes. Each sequence has a KV stream of its own, and
# llama.cpp splits such a decode into ubatches holding as many tokens of each sequence as the
# shortest has: 512-token decodes of 256-token prompts run as several small ubatches. A GPU
# prefills faster in 4096-token decodes; a CPU gains nothing and holds a larger compute buffer
# (docs/decisions/0038)
_PREFILL_BATCH_GPU, _PREFILL_BATCH_CPU = 4096, 512


def add_head(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("head", help="train or describe a draft head (drafts from the target's hidden state)")
    acts = p.add_subparsers(dest="action", required=True)
    train = acts.add_parser("train", help="train a head for a target on text on this machine: files you name, "
                                          "your chat history, the Python standard library and site-packages")
    train.add_argument("--model", required=True,
                       help="target model: a .gguf file or an installed model's name (localspec list)")
    add_source_flags(train)
    train.add_argument("--out", help="the head file to write (.npz; default: installed for the target, "
                                     "which then uses it without --head)")
    train.add_argument("--max-tokens", type=int, default=500_000, help="text to read, in tokens")
    train.add_argument("--generated-tokens", type=int, default=1_000_000,
                       help="the target's own continuations of the functions in the text (signature and "
                            "docstring), in tokens: what the head will draft from (0: text only)")
    train.add_argument("--parallel", type=int, default=64, help="continuations generated side by side (1..256)")
    train.add_argument("--generate-minutes", type=float,
                       help="a time limit for generating continuations: fewer tokens if they would not fit")
    train.add_argument("--steps", type=int, default=3000)
    train.add_argument("--batch", type=int, default=32, help="windows of text a training step takes")
    train.add_argument("--length", type=int, default=256, help="tokens a window holds")
    train.add_argument("--corpus", metavar="FILE.npz",
                       help="keep what the target read and wrote here, and train from it when it is there "
                            "(another shape or length of training on the same text, without reading it again)")
    train.add_argument("--minutes", type=float, help="a time limit for the training steps (after the target "
                                                      "has read the text): fewer steps if they would not fit")
    train.add_argument("--ff", type=int, help="the head's MLP width (default: the target's hidden size)")
    # a small draft vocabulary: its output rows are most of a training step and of a CPU draft
    # step, and the tokens it leaves out are seldom the target's choice (docs/decisions/0030)
    train.add_argument("--draft-vocab", type=int, default=8192,
                       help="tokens the head may draft: the target's most frequent choices")
    train.add_argument("--ctx", type=int, default=512, help="tokens the target reads at a time")
    train.add_argument("--taps",
                       help="target layers the head reads beside the last (EAGLE-3's fused features): "
                            "'auto' (a low and the middle one), layer numbers 'A,B', or 'none'. Default: "
                            "'auto' where the states they add (twice the last layer's) fit in half this "
                            "machine's free memory, else 'none'; with a kept --corpus: the layers it was "
                            "read at, and 'none' trains on its last layer's states alone")
    train.add_argument("--noise", type=float, default=0.0,
                       help="uniform noise, as a fraction of the states' size, on the target's states the "
                            "head reads while training (0..1; 0: none)")
    info = acts.add_parser("info", help="what a head was trained for and on")
    info.add_argument("path")
    p.set_defaults(run=cmd_head)


def cmd_head(args: argparse.Namespace) -> int:
    if args.action == "info":
        return _info(Path(args.path).expanduser())
    check_values({name: v for name in _RULES if (v := getattr(args, name)) is not None}, _RULES)
    return _train(args)


# head train's numeric flags (attribute: rule), checked before anything is read
_RULES = {"max_tokens": within("--max-tokens", 0), "generated_tokens": within("--generated-tokens", 0),
          "parallel": within("--parallel", 1, 256),
          "generate_minutes": within("--generate-minutes", 0.1, integer=False), "steps": within("--steps", 1),
          "batch": within("--batch", 1, 4096), "length": within("--length", 2, 8192),
          "minutes": within("--minutes", 0.1, integer=False), "ff": within("--ff", 64, 65536),
          "draft_vocab": within("--draft-vocab", 2), "ctx": within("--ctx", 64, 32768),
          "noise": within("--noise", 0.0, 1.0, integer=False)}


def tap_layers(spec: str, model: Path) -> tuple[int, ...]:
    """`--taps` for the target `model`: 'none', 'auto' (layer 2 and the middle layer: EAGLE-3's
    low and middle features beside the last) or comma-separated layer numbers, each in
    0..layers-1 (a layer's input state: the output of the layers below it; 0: the embeddings)."""
    from localspec.models.gguf_file import read_gguf

    if spec == "none":
        return ()
    n_layer = read_gguf(model).n_layer
    if n_layer is None or n_layer < 3:
        raise LocalspecError("No layers to read", f"--taps {spec}: '{model.name}' does not say how many "
                             "layers it has, or has fewer than 3", "Use --taps none")
    if spec == "auto":
        return (2, n_layer // 2) if n_layer // 2 > 2 else (n_layer // 2,)
    try:
        taps = tuple(sorted({int(x) for x in spec.split(",")}))
    except ValueError:
        taps = ()
    if not taps or not all(0 <= t < n_layer for t in taps):
        raise LocalspecError("Invalid --taps", f"--taps {spec}: '{model.name}' has layers 0..{n_layer - 1} "
                             "to read", "Pass 'auto', 'none' or layer numbers in that range, e.g. 2,14")
    return taps


def default_taps(model: Path, tokens: int, kept: Path | None) -> tuple[tuple[int, ...], str]:
    """`--taps` left out: 'auto' (they guess better at no measured cost in a step:
    docs/decisions/0033) where the corpus they triple still fits, else none; and a line saying
    which. The corpus is held whole in host memory and on the training device (a GPU when
    PyTorch has one), and written to `kept` if given: the states of `tokens` tokens, f16, the
    target's width, must take at most half of what each has free."""
    import torch

    from localspec.models.fit import free_vram, mem_available
    from localspec.models.gguf_file import read_gguf

    try:
        taps = tap_layers("auto", model)   # its rule for which models have layers to tap
    except LocalspecError as err:
        return (), f"taps: none ({err.cause})"
    info = read_gguf(model)
    width = info.metadata.get(f"{info.architecture}.embedding_length")
    if not isinstance(width, int):
        return (), "taps: none (the model does not say its width)"
    need = tokens * width * 2 * (1 + len(taps))
    room = {"memory": mem_available()}
    if torch.cuda.is_available():
        room["GPU memory"] = free_vram()
    if kept is not None:
        room["disk"] = shutil.disk_usage(kept.parent if kept.parent.exists() else Path.cwd()).free
    short = [f"{name} ({'unknown' if free is None else _gib(free)} free)"
             for name, free in room.items() if free is None or need > free // 2]
    if short:
        return (), (f"taps: none: with layers {', '.join(map(str, taps))} the corpus would take {_gib(need)}, "
                    f"more than half the {' and '.join(short)} (--taps auto asks for them anyway)")
    return taps, f"taps: layers {', '.join(map(str, taps))} beside the last ({_gib(need)} of states; --taps none: a third)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _info(path: Path) -> int:
    from localspec.models.head_file import read_head

    meta, _ = read_head(path)
    for key, value in meta.items():
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            show(f"{key}:" + "".join(f"\n  {v}" for v in value))   # e.g. the text, a source a line
        else:
            show(f"{key}: {value}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from localspec.engine.drafters.registry import Needs, first_imports
    first_imports(Needs(runtime="transformers"))   # torch before llama.cpp
    from localspec.engine.head_train_model import TrainingModel
    from localspec.engine.llama_model import gpu_offload_supported
    from localspec.engine.head_train import (collect, function_prompts, generate_corpus, join, load_corpus,
                                             save_corpus)
    from localspec.models import heads

    from .head_progress import head_report
    from .head_sources import Choice, list_sources, reading_order, summary_lines

    model, out = _model_and_out(args)
    kept = Path(args.corpus).expanduser() if args.corpus else None
    if kept is not None and kept.exists():
        return _train_on(args, model, out, *load_corpus(kept, heads.target_id(model)))
    taps = tap_layers(args.taps, model) if args.taps is not None else None
    choice = Choice.from_args(args)
    sources = list_sources(choice)
    order = reading_order(sources)   # a document's index: its file id (the held-out split is by file)
    if not order:
        raise LocalspecError("Nothing to learn from", "; ".join(f"{s.name} ({s.where}): no {s.unit}" for s in sources)
                             or "every source is left out (--no-history, --no-stdlib, --no-site-packages)",
                             "Name files or folders holding *.py, *.md, *.txt or *.rst files with --text, "
                             "or leave out fewer sources")
    with head_report(sys.stderr) as report:
        if taps is None:
            taps, why = default_taps(model, args.max_tokens + args.generated_tokens, kept)
            report.say(why)
        skipped: set[int] = set()

        def texts():   # (file id, text)
            for i, (_, doc) in enumerate(order):
                try:
                    yield i, doc.read()
                except LocalspecError as err:   # binary, unreadable or too large: skipped, said once
                    if i not in skipped:
                        skipped.add(i)
                        report.say(f"skipped {doc.label}: {err.cause}")

        parts = []
        described = [f"{s.name} ({s.where})" for s in sources]
        if args.max_tokens > 0:
            # a greedy sampler on the device: llama.cpp then leaves every row's logits there, which
            # collect never reads (docs/decisions/0030)
            target = TrainingModel(model, n_ctx=args.ctx, n_batch=args.ctx, n_seq_max=1, hidden=True, taps=taps,
                                   greedy_on_device=True)
            try:
                parts.append(collect(target, texts(), args.max_tokens, chunk=args.ctx, progress=report))
            finally:
                target.close()
                report.clear()
            described = summary_lines(sources, order, _tokens_per_doc(parts[0], len(order)))
            for line in described:
                report.say(f"read {line}")
        prompts = function_prompts(texts())
        first = next(prompts, None) if args.generated_tokens > 0 else None
        if first is None and args.generated_tokens > 0:
            report.say("no function with a docstring in the text: nothing for the target to continue")
        if first is not None:
            width = max(1, min(args.parallel, 256))   # llama.cpp's most sequences
            prefill_batch = _PREFILL_BATCH_GPU if gpu_offload_supported() else _PREFILL_BATCH_CPU
            target = TrainingModel(model, n_ctx=width * (_PROMPT + _GEN), n_batch=max(prefill_batch, width),
                                   n_seq_max=width, hidden=True, unified=False,   # a stream each
                                   greedy_on_device=True, taps=taps)
            try:
                parts.append(generate_corpus(target, itertools.chain([first], prompts), args.generated_tokens,
                                             gen_tokens=_GEN, prompt_tokens=_PROMPT, progress=report,
                                             seconds=None if args.generate_minutes is None
                                             else 60 * args.generate_minutes))
            finally:
                target.close()
                report.clear()
            report.say(f"generated {len(parts[-1].tokens):,} tokens: the target's continuations of "
                       f"{int(parts[-1].chunk.max(initial=-1)) + 1:,} functions")
        corpus = join(*parts) if parts else None
        if corpus is None or len(corpus.tokens) < 64:
            raise LocalspecError("Too little to learn from", f"{0 if corpus is None else len(corpus.tokens)} "
                                 f"tokens from {len(order)} files", "Name more text, or raise --max-tokens")
        if kept is not None:
            save_corpus(kept, corpus, {"target_id": heads.target_id(model), "text": described, "taps": list(taps)})
            report.say(f"kept the corpus in {kept}")
        report.say(f"training on {len(corpus.tokens):,} tokens")
        info = _train_corpus(args, model, out, corpus, report, described, taps)
    _wrote(args, out, info)
    return 0


def _train_on(args: argparse.Namespace, model: Path, out: Path, corpus, kept: dict) -> int:
    """Training alone, on a corpus kept by an earlier run (--corpus)."""
    from .head_progress import head_report

    with head_report(sys.stderr) as report:
        report.say(f"training on {len(corpus.tokens):,} tokens kept in {args.corpus}")
        read_at = tuple(kept.get("taps", []))   # the layers the target was read at then
        asked = read_at if args.taps is None else tap_layers(args.taps, model)
        if asked == () and read_at:        # the last layer's states alone: a head without taps
            corpus = corpus.last_layer(len(read_at))
        elif asked != read_at:
            raise LocalspecError("The kept corpus was read at other layers",
                                 f"--taps {args.taps}: {args.corpus} holds layers {list(read_at)}",
                                 "Leave out --taps (or pass none), or name another --corpus")
        info = _train_corpus(args, model, out, corpus, report, kept.get("text", []), asked)
    _wrote(args, out, info)
    return 0


def _train_corpus(args: argparse.Namespace, model: Path, out: Path, corpus, report, text: list,
                  taps: tuple[int, ...]) -> dict:
    """Train the head on `corpus` as the flags say (`text`: what it was read from, for its meta;
    `taps`: the layers its states hold beside the last);
    what training measured."""
    from localspec.engine.head_train import train

    try:
        info = train(corpus, model, out, vocab_size=args.draft_vocab, steps=args.steps, batch=args.batch,
                     length=args.length, ff=args.ff, noise=args.noise, taps=taps,
                     seconds=None if args.minutes is None else 60 * args.minutes,
                     checkpoint=out.with_name(out.name + ".ckpt"), progress=report,
                     meta={"target": model.name, "text": text})
    except ValueError as err:   # too little text to train on and to check the head on
        raise LocalspecError("Too little to learn from", str(err),
                             "Name more text, or raise --max-tokens") from None
    return info


def _wrote(args: argparse.Namespace, out: Path, info: dict) -> None:
    """Where the head went (after the progress line is gone)."""
    show(f"wrote {out}: {info['tokens']} tokens, draft vocabulary {info['draft_vocab']}, "
         f"held-out top-1 by depth {info['held_out_top1']}")
    show(f"installed: {args.model} drafts with it from now on (--no-head turns it off for a run)"
         if args.out is None else f"use it with: --head {out}")


def _tokens_per_doc(corpus, n_docs: int) -> list[int]:
    """Tokens read of each document, by file id."""
    import numpy as np

    return np.bincount(corpus.source, minlength=n_docs).tolist()


def _model_and_out(args: argparse.Namespace) -> tuple[Path, Path]:
    """The target file (a path, or an installed model's) and where the head goes: --out, or the
    target's installed head (models/heads.py; its folder created), checked before any training."""
    from localspec.models import heads

    model, _ = resolve_models(args.model, None)
    if args.out is None:
        heads.make_heads_dir()
        return model, heads.default_head_path(model)
    out = Path(args.out).expanduser()
    if out.suffix != ".npz":
        raise LocalspecError("Head file name", str(out), "Name the output file with .npz")
    if not out.parent.is_dir():
        raise LocalspecError("Folder for the head not found", str(out.parent), "Create it, or pick another --out")
    return model, out
