"""`localspec head`: train a draft head for a target from text on this machine, and describe one.

A head (engine/drafters/head.py) drafts from the target's own hidden state at a fraction of a
target call. Training reads files the user names (their code, their notes): nothing leaves the
machine. It wants a GPU: the target reads the text once, then the head trains for a few thousand
steps (how long that takes: docs/decisions/0011).
"""
from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

from localspec.engine.errors import LocalspecError

from .inputs import read_text_file
from .paths import resolve_models


_PROMPT, _GEN = 384, 128   # a generated continuation: prompt tokens kept, tokens generated
# The default --max-tokens reads about 2 MB of text in all; one file many times that is a log or a
# data dump rather than the code and notes a head learns from, and is skipped (with a note)
# instead of being read into memory whole.
HEAD_FILE_MAX_BYTES = 16 << 20


def add_head(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("head", help="train or describe a draft head (drafts from the target's hidden state)")
    acts = p.add_subparsers(dest="action", required=True)
    train = acts.add_parser("train", help="train a head for a target on files you name")
    train.add_argument("--model", required=True,
                       help="target model: a .gguf file or an installed model's name (localspec list)")
    train.add_argument("--text", action="append", required=True, metavar="PATH",
                       help="files or folders to learn from (their *.py, *.md, *.txt, *.rst); repeatable")
    train.add_argument("--out", help="the head file to write (.npz; default: installed for the target, "
                                     "which then uses it without --head)")
    train.add_argument("--max-tokens", type=int, default=500_000, help="text to read, in tokens")
    train.add_argument("--generated-tokens", type=int, default=1_000_000,
                       help="the target's own continuations of the functions in --text (signature and "
                            "docstring), in tokens: what the head will draft from (0: text only)")
    train.add_argument("--parallel", type=int, default=64, help="continuations generated side by side")
    train.add_argument("--steps", type=int, default=3000)
    train.add_argument("--batch", type=int, default=32, help="windows of text a training step takes")
    train.add_argument("--length", type=int, default=256, help="tokens a window holds")
    train.add_argument("--minutes", type=float, help="a time limit for the training steps (after the target "
                                                      "has read the text): fewer steps if they would not fit")
    train.add_argument("--ff", type=int, help="the head's MLP width (default: 4 x the target's hidden size)")
    train.add_argument("--draft-vocab", type=int, default=32768,
                       help="tokens the head may draft: the target's most frequent choices")
    train.add_argument("--ctx", type=int, default=512, help="tokens the target reads at a time")
    info = acts.add_parser("info", help="what a head was trained for and on")
    info.add_argument("path")
    p.set_defaults(run=cmd_head)


def cmd_head(args: argparse.Namespace) -> int:
    if args.action == "info":
        return _info(Path(args.path).expanduser())
    return _train(args)


def _info(path: Path) -> int:
    from localspec.models.head_file import read_head

    meta, _ = read_head(path)
    for key, value in meta.items():
        print(f"{key}: {value}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from localspec.engine import torch_lm  # noqa: F401  (torch before llama.cpp)
    from localspec.engine.drafters.head import target_tables
    from localspec.engine.llama_model import LlamaModel
    from localspec.engine.head_train import collect, function_prompts, generate_corpus, join, text_files, train

    model, out = _model_and_out(args)
    files = text_files(args.text)
    random.Random(0).shuffle(files)   # a spread of the text when --max-tokens stops early
    if not files:
        raise LocalspecError("Nothing to learn from", ", ".join(args.text),
                             "Name files or folders holding *.py, *.md, *.txt or *.rst files")
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731

    skipped: set[Path] = set()

    def texts():   # (file id, text): the held-out split is by file
        for i, f in enumerate(files):
            try:
                yield i, read_text_file(f, HEAD_FILE_MAX_BYTES, "Cannot learn from the file", "Split it")
            except LocalspecError as err:   # binary, unreadable or too large: skipped, said once
                if f not in skipped:
                    skipped.add(f)
                    say(f"skipped {f}: {err.cause}")

    parts = []
    if args.max_tokens > 0:
        target = LlamaModel(model, n_ctx=args.ctx, n_batch=args.ctx, n_seq_max=1, hidden=True)
        try:
            parts.append(collect(target, texts(), args.max_tokens, chunk=args.ctx, progress=say))
        finally:
            target.close()
    prompts = function_prompts(texts())
    first = next(prompts, None) if args.generated_tokens > 0 else None
    if first is None and args.generated_tokens > 0:
        say("no function with a docstring in the text: nothing for the target to continue")
    tables = None   # the target's embedding, output matrix and norm: dequantised once, for both steps
    if first is not None:
        tables = target_tables(model, None)
        width = max(1, min(args.parallel, 128))
        target = LlamaModel(model, n_ctx=width * (_PROMPT + _GEN), n_batch=max(512, width),
                            n_seq_max=width, hidden=True)
        try:
            parts.append(generate_corpus(target, itertools.chain([first], prompts), args.generated_tokens,
                                         gen_tokens=_GEN, prompt_tokens=_PROMPT, progress=say,
                                         out_all=tables[1]))
        finally:
            target.close()
    corpus = join(*parts) if parts else None
    if corpus is None or len(corpus.tokens) < 64:
        raise LocalspecError("Too little to learn from", f"{0 if corpus is None else len(corpus.tokens)} tokens "
                             f"from {len(files)} files", "Name more text, or raise --max-tokens")
    say(f"{len(corpus.tokens)} tokens from {len(files)} files; training")
    try:
        info = train(corpus, model, out, vocab_size=args.draft_vocab, steps=args.steps, batch=args.batch,
                     length=args.length, ff=args.ff,
                     seconds=None if args.minutes is None else 60 * args.minutes, checkpoint=out.with_name(out.name + ".ckpt"), progress=say, meta={"target": model.name, "text": [str(Path(t)) for t in args.text]},
                     tables=tables)
    except ValueError as err:   # too little text to train on and to check the head on
        raise LocalspecError("Too little to learn from", str(err),
                             "Name more text, or raise --max-tokens") from None
    print(f"wrote {out}: {info['tokens']} tokens, draft vocabulary {info['draft_vocab']}, "
          f"held-out top-1 by depth {info['held_out_top1']}")
    print(f"installed: {args.model} drafts with it from now on (--no-head turns it off for a run)"
          if args.out is None else f"use it with: --head {out}")
    return 0


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
