"""`localspec ngram`: show, forget, wipe and grow the personal n-gram data (models/ngram_store.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localspec.engine.errors import LocalspecError
from localspec.models.paths import resolved

from .inputs import decode, read_text_file
from .paths import resolve_models
from .terminal import show   # file paths and conversation names may hold control characters

# A file this size already yields more n-gram rows (about four per token, a token being about four
# bytes) than the store keeps (ngram_store.DEFAULT_MAX_ROWS): a bigger one only costs memory and
# time before the pruning drops what it added.
ADD_FILE_MAX_BYTES = 4 << 20


def add_ngram(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ngram", help="show, forget or grow the personal n-gram data")
    acts = p.add_subparsers(dest="action", required=True)
    show = acts.add_parser("show", help="size, sources and what the data was built from")
    forget = acts.add_parser("forget", help="forget one source: exactly its n-grams go")
    forget.add_argument("kind", choices=["conversation", "file"])
    forget.add_argument("name", help="conversation id, or the file's path")
    wipe = acts.add_parser("wipe", help="forget everything")
    wipe.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    for q in (show, forget, wipe):
        q.add_argument("--model", help="only the data for this model's vocabulary: a .gguf or an "
                                       "installed model's name (default: all)")
    add = acts.add_parser("add-file", help="opt in: learn from a text file you point at")
    add.add_argument("path")
    add.add_argument("--model", required=True,
                     help="target model whose tokenizer to use: a .gguf or an installed model's name")
    p.set_defaults(run=cmd_ngram)


def cmd_ngram(args: argparse.Namespace) -> int:
    from localspec.models import ngram_store as ns

    if args.action == "add-file":
        return _ngram_add_file(args)
    if args.model:
        paths = [p for p in [ns.store_path(ns.vocab_key(resolve_models(args.model, None)[0]))]
                 if p.exists()]
    else:
        paths = ns.store_paths()
    where = f"{ns.store_dir()}" + (f" for {Path(args.model).name}" if args.model else "")
    stores = [ns.NgramStore.open_existing(p) for p in paths]
    try:
        if args.action == "show":
            if not stores:
                print(f"No personal n-gram data yet ({where}). It grows as you chat; "
                      "add a file with: localspec ngram add-file PATH --model GGUF")
            for store in stores:
                _print_ngram_info(store.info())
            return 0
        if args.action == "forget":
            names = {args.name, *_resolved_or_none(args.name)} if args.kind == "file" else {args.name}
            hits = [s for s in stores if any([s.forget(args.kind, n) for n in sorted(names)])]
            if not hits:
                raise LocalspecError("Unknown n-gram source", f"no {args.kind} named "
                                     f"'{args.name}' in {where}",
                                     "See the stored sources with: localspec ngram show")
            show(f"Forgot {args.kind} '{args.name}' ({len(hits)} store(s)).")
            return 0
        infos = [s.info() for s in stores]
        summary = (f"{sum(i.n_sources for i in infos)} sources, "
                   f"{sum(i.n_ngrams for i in infos):,} n-grams in {len(infos)} store(s)")
        if not args.yes and not _confirm(f"Wipe all personal n-gram data ({summary})? [y/N] "):
            print("Nothing wiped.")
            return 1
        for store in stores:
            store.wipe()
        print(f"Wiped {summary}.")
        return 0
    finally:
        for store in stores:
            store.close()


def _resolved_or_none(name: str) -> list[str]:
    """A file source's name as `add-file` stored it (resolved); none where the path cannot be
    resolved (a symlink loop): the name as given is still tried."""
    try:
        return [str(resolved(name, "Cannot follow the path"))]
    except LocalspecError:
        return []


def _confirm(question: str) -> bool:
    """A yes from stdin: one short line read (bounded, decoded by app/inputs.py's policy)."""
    print(question, end="", flush=True)
    return decode(sys.stdin.buffer.readline(64)).strip().lower() in ("y", "yes")


def _print_ngram_info(info) -> None:
    import time

    show(f"{info.path}")
    show(f"  vocabulary: {info.label or 'unknown model'} (key {info.key})")
    print(f"  size:       {info.n_sources} sources, {info.n_ngrams:,} n-grams of order 1-"
          f"{info.max_n} (cap {info.max_rows:,}), {info.bytes / 1024:,.0f} KiB on disk")
    print("  built from:" + ("" if info.sources else " nothing yet"))
    for s in info.sources:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.added_at))
        show(f"    {s.kind:<12} {s.name:<40} {s.n_tokens:>9,} tokens  {when}")


def _ngram_add_file(args: argparse.Namespace) -> int:
    from localspec.engine.llama_model import LlamaModel
    from localspec.models.ngram_store import NgramStore, vocab_key

    path = resolved(args.path, "Cannot learn from the file")
    text = read_text_file(path, ADD_FILE_MAX_BYTES, "Cannot learn from the file",
                          "Split it, or add the part that matters")
    gguf, _ = resolve_models(args.model, None)
    model = LlamaModel(gguf, n_ctx=64)
    try:
        tokens = model.tokenize(text, special=False, add_bos=False)
    finally:
        model.close()
    with NgramStore.open(vocab_key(gguf), label=gguf.name) as store:
        store.add("file", str(path), tokens)
        info = store.info()
    show(f"Added file {path}: {len(tokens):,} tokens. The store now holds {info.n_sources} "
         f"sources, {info.n_ngrams:,} n-grams.")
    return 0
