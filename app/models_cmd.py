"""`localspec import / list / rm`: the installed-models store (models/library.py) from the shell."""
from __future__ import annotations

import argparse

from localspec.models import library


def add_models_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="register GGUF files already on disk under a name")
    p.add_argument("name", help="the name to use with --model (letters, digits, '.', '_', '-')")
    p.add_argument("target", help="the target model: a .gguf file")
    p.add_argument("--draft", help="a draft .gguf with the target's vocabulary")
    p.add_argument("--copy", action="store_true",
                   help="copy the files into localspec's store (default: use them where they are)")
    p.set_defaults(run=cmd_import)
    p = sub.add_parser("list", help="installed models: size, quantization, draft, whether they fit")
    p.set_defaults(run=cmd_list)
    p = sub.add_parser("rm", help="forget an installed model (files you imported in place stay)")
    p.add_argument("name")
    p.set_defaults(run=cmd_rm)


def cmd_import(args: argparse.Namespace) -> int:
    model = library.import_model(args.name, args.target, args.draft, copy=args.copy)
    how = f"copied into {library.store_dir()}" if args.copy else "referenced in place"
    draft = f" with draft {model.draft.path.name}" if model.draft else ""
    print(f"Imported {model.name}: {model.target.path.name}{draft} ({_size(model.size)}, "
          f"{model.quantization}, {how}). Use it with: localspec chat --model {model.name}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = library.list_models()
    if not rows:
        print(f"No models installed ({library.store_dir()}). Add one with: "
              "localspec import NAME FILE.gguf")
        return 0
    print(f"{'NAME':<24} {'SIZE':>9} {'QUANT':<8} {'FIT':<8} {'WHERE':<9} {'DRAFT':<36} TARGET")
    for row in rows:
        m = row.model
        draft = m.draft.path.name if m.draft else "-"
        fit = "missing" if row.missing else row.fit
        print(f"{m.name:<24} {_size(m.size):>9} {m.quantization:<8} {fit:<8} {m.location:<9} "
              f"{draft:<36} {m.target.path}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    model = library.remove_model(args.name)
    kept = [f.path for f in (model.target, model.draft) if f and not f.owned]
    note = f"; your files stay where they are: {', '.join(map(str, kept))}" if kept else ""
    print(f"Removed {model.name}{note}.")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
