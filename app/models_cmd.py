"""`localspec pull / import / list / rm`: the installed-models store (models/library.py) from the
shell. `pull` is the only command of localspec that opens a network connection (cli.main keeps
the hub client offline for every other one)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from typing import TYPE_CHECKING

from .paths import looks_like_name
from .terminal import show   # names, paths and a GGUF's own strings may hold controls

if TYPE_CHECKING:
    from localspec.models import library


def add_models_commands(sub: argparse._SubParsersAction) -> None:
    from localspec.models.registry import DEFAULT_MODEL, known_names

    p = sub.add_parser("pull", help="download a verified target + draft pair from the Hugging Face hub")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"a known name ({', '.join(known_names())}; default {DEFAULT_MODEL}) "
                        "or OWNER/REPO[:FILE.gguf]")
    p.add_argument("--name", help="install under this name (default: the known name, or the file's)")
    drafts = p.add_mutually_exclusive_group()
    drafts.add_argument("--draft", help="draft to fetch with it: OWNER/REPO[:FILE.gguf], or a "
                                        "transformers repo OWNER/REPO (a PyTorch draft); a known "
                                        "name brings its own")
    drafts.add_argument("--no-draft", action="store_true", help="fetch the target only")
    drafts.add_argument("--torch-draft", action="store_true",
                        help="a known pair's PyTorch draft (transformers, for a CUDA GPU) instead "
                             "of its GGUF draft")
    p.set_defaults(run=cmd_pull)
    p = sub.add_parser("import", help="register GGUF files already on disk under a name",
                       usage="localspec import [NAME] FILE.gguf [--draft DRAFT] [--copy]")
    p.add_argument("name", nargs="?",
                   help="the name to use with --model (letters, digits, '.', '_', '-'; default: the "
                        "file's name without .gguf)")
    p.add_argument("target", nargs="?", help="the target model: a .gguf file")
    p.add_argument("--draft", help="a draft with the target's vocabulary: a .gguf, or a "
                                   "transformers folder (PyTorch draft)")
    p.add_argument("--copy", action="store_true",
                   help="copy the files into localspec's store (default: use them where they are)")
    p.set_defaults(run=cmd_import)
    p = sub.add_parser("list", help="installed models: size, quantization, draft, head, whether they fit")
    p.set_defaults(run=cmd_list)
    p = sub.add_parser("rm", help="forget an installed model and its draft head (files you imported "
                                  "in place stay)")
    p.add_argument("name")
    p.set_defaults(run=cmd_rm)


def cmd_pull(args: argparse.Namespace) -> int:
    from localspec.models import pull

    plan = pull.plan(args.model, name=args.name, draft=args.draft, with_draft=not args.no_draft,
                     torch_draft=args.torch_draft)
    done = pull.already_installed(plan)
    if done is not None:
        show(f"{done.name} is already installed ({done.target.path.parent}); nothing to do. "
             f"Use it with: {use_with(done)}")
        return 0
    try:
        model = pull.pull(plan)
    except KeyboardInterrupt:
        show("\npull stopped; what arrived is kept: run the same command again to resume",
             file=sys.stderr)
        raise
    draft = f" with draft {model.draft.path.name}" if model.draft else ""
    show(f"Pulled {model.name}: {model.target.path.name}{draft} ({_size(model.size)}, "
         f"{model.quantization}, every file verified against the hub's hashes) into {model.target.path.parent}. "
         f"Use it with: {use_with(model)}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from localspec.engine.errors import LocalspecError
    from localspec.models import library   # when run: building the parser loads no numpy (engine/native.py)

    if args.name is None:
        raise LocalspecError("Nothing to import", "no model file given",
                             "Run: localspec import FILE.gguf, or localspec import NAME FILE.gguf")
    if args.target is None:          # `import FILE.gguf`: the name comes from the file's
        target, name = args.name, library.name_for_file(args.name)
        if library.get_model(name) is not None:
            raise LocalspecError(f"Model '{name}' is already installed",
                                 f"'{name}' (the name taken from '{Path(target).name}') points at "
                                 f"{library.get_model(name).target.path}",
                                 f"Pick a name: localspec import NAME {shlex.quote(target)}")
    else:
        target, name = args.target, args.name
    model = library.import_model(name, target, args.draft, copy=args.copy)
    how = f"copied into {library.store_dir()}" if args.copy else "referenced in place"
    draft = f" with draft {model.draft.path.name}" if model.draft else ""
    show(f"Imported {model.name}: {model.target.path.name}{draft} ({_size(model.size)}, "
         f"{model.quantization}, {how}). Use it with: {use_with(model)}")
    return 0


def use_with(model: library.InstalledModel) -> str:
    """The command that chats with `model`: by its name, or by its files where the name would be
    read as a path (a value ending in .gguf always is)."""
    if looks_like_name(model.name):
        return f"localspec chat --model {model.name}"
    draft = f" --draft {shlex.quote(str(model.draft.path))}" if model.draft else ""
    return (f"localspec chat --model {shlex.quote(str(model.target.path))}{draft} (the name "
            f"'{model.name}' would be read as a file path)")


def cmd_list(args: argparse.Namespace) -> int:
    from localspec.models import fit, library

    rows = library.list_models()
    waiting = library.unfinished_downloads()
    if waiting:
        show(f"{len(waiting)} unfinished download(s), {_size(sum(p.stat().st_size for p in waiting))}"
             f" in {library.downloads_dir()}: the same `localspec pull` resumes them "
             "(or delete them)")
    if not rows:
        show(f"No models installed ({library.store_dir()}). Add one with: "
             "localspec pull NAME, or localspec import NAME FILE.gguf")
        return 0
    free = fit.free_memory()
    vram = _size(free.vram) if free.vram is not None else "none seen (no nvidia-smi)"
    ram = _size(free.ram) if free.ram is not None else "unknown"
    show(f"free: VRAM {vram}, RAM {ram}. NEED = files + {fit.CONTEXT}-token f16 KV cache "
         f"+ {_size(fit.SCRATCH)} runtime; CTX = the context a run gets here by default (tokens)")
    show(f"{'NAME':<24} {'SIZE':>9} {'NEED':>9}  {'QUANT':<8} {'FIT':<13} {'CTX':>6} WHERE")
    for row in rows:
        m = row.model
        fit_text = "missing file" if row.missing else row.fit
        need = _size(row.need) if row.need is not None else "?"
        ctx = str(row.context) if row.context else "?"
        show(f"{m.name:<24} {_size(m.size):>9} {need:>9}  {m.quantization:<8} {fit_text:<13} "
             f"{ctx:>6} {m.location}")
        parts = f" (+{len(m.target.parts)} parts)" if m.target.parts else ""
        show(f"    target {m.target.path}{parts}")
        kind = " (PyTorch)" if m.draft and m.draft.kind == "torch" else ""
        show(f"    draft  {m.draft.path if m.draft else '-'}{kind}")
        show(f"    head   {_head_line(row)}")
    return 0


def _head_line(row: library.ModelListing) -> str:
    """The model's installed draft head (models/heads.py) and how often it guessed the target's
    next token on held-out text, or how to train one."""
    from localspec.models import heads
    from localspec.models.errors import LocalspecError
    from localspec.models.head_file import read_meta

    found = heads.head_for(row.model.target.path) if not row.missing else None
    if found is None:
        return f"- (train one: localspec head train --model {row.name})"
    try:
        meta = read_meta(found)       # the meta alone: no weights read
    except LocalspecError as err:      # unreadable, or from an older localspec: say so, list on
        return f"not usable: {err.cause}"
    if meta.get("target_id", found.stem) != found.stem:   # a file put there by hand
        return f"not usable: '{found}' was trained for another model ({meta['target_id']})"
    top1 = meta.get("held_out_top1")
    score = (f" (held-out top-1 {top1[0]:.2f})"
             if isinstance(top1, list) and top1 and isinstance(top1[0], (int, float)) else "")
    return f"{found}{score}"


def cmd_rm(args: argparse.Namespace) -> int:
    from localspec.models import heads, library

    entry = library.get_model(args.name)
    removed = heads.installed_id(entry.target.path) if entry is not None else None
    model = library.remove_model(args.name)
    kept = [f.path for f in (model.target, model.draft) if f and not f.owned]
    note = f"; your files stay where they are: {', '.join(map(str, kept))}" if kept else ""
    # the head goes with the last installed model of these weights (heads.remove_head says why)
    head = (heads.remove_head(removed, {heads.installed_id(m.target.path)
                                        for m in library.installed().values()})
            if removed is not None else None)
    show(f"Removed {model.name}{' and its draft head' if head else ''}{note}.")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
