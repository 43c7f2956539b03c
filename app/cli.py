"""The `localspec` command line. Each subcommand is one small function over the engine.

Errors a user can cause arrive as LocalspecError and are printed as title / cause / fix with exit
status 2, never as a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from localspec.engine.errors import LocalspecError

# Generation never touches the network: keep the hub client offline in this process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _version() -> str:
    try:
        return version("localspec")
    except PackageNotFoundError:
        return "0+unknown"


def _model_path(value: str, what: str) -> Path:
    path = Path(value).expanduser()
    if path.exists():
        return path
    raise LocalspecError(f"{what} not found", f"'{value}' is not an existing file or folder",
                         "Pass the path of a .gguf file (a transformers folder for a PyTorch "
                         "draft); named models arrive with `localspec pull`")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (argument or stdin)")
    p.add_argument("prompt", nargs="?", help="the prompt; read from stdin when omitted")
    _add_model_options(p)
    p.add_argument("--raw", action="store_true", help="plain completion, without the chat template")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--stats", action="store_true", help="print speculation statistics to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    p.set_defaults(run=cmd_generate)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="target model: a .gguf file")
    p.add_argument("--draft", help="draft model: a .gguf file (llama.cpp) or a transformers folder (PyTorch)")
    p.add_argument("--no-speculation", action="store_true", help="plain decoding, one token per target call")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus filter when sampling (llama.cpp default 0.95)")
    p.add_argument("--top-k", type=int, default=40, help="top-k filter when sampling (llama.cpp default 40; 0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    p.add_argument("--tree-nodes", type=int, default=16, help="largest draft tree per round")
    p.add_argument("--fixed-budget", action="store_true",
                   help="always draft --tree-nodes nodes (default: pick 0..N per round by measured speed)")
    p.add_argument("--gpu-layers", type=int, default=-1, help="layers to offload to the GPU (-1 all)")
    p.add_argument("--no-personal", action="store_true",
                   help="do not use the personal n-gram drafter built from your chats")


def _sampling(args: argparse.Namespace):
    from localspec.engine.config import SamplingParams

    if args.max_tokens < 1:
        raise LocalspecError("Bad --max-tokens", f"{args.max_tokens}", "Use a positive number")
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed)
    except ValueError as err:
        raise LocalspecError("Bad sampling option", str(err),
                             "Use --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0") from None


def _open_session(args: argparse.Namespace):
    from localspec.engine.config import TreeBudget
    from localspec.engine.session import EngineConfig, Session

    return Session(EngineConfig(model=_model_path(args.model, "Model"),
                                draft=_model_path(args.draft, "Draft model") if args.draft else None,
                                speculation=not args.no_speculation, n_ctx=args.ctx,
                                personal=not args.no_personal,
                                n_gpu_layers=args.gpu_layers,
                                budget=TreeBudget(max_nodes=args.tree_nodes,
                                                  adaptive=not args.fixed_budget)))


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with the model in the terminal (line mode)")
    _add_model_options(p)
    p.set_defaults(run=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    from localspec.app.repl import chat_loop

    sampling = _sampling(args)
    session = _open_session(args)
    try:
        chat_loop(session, sampling, args.max_tokens)
    finally:
        session.close()
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        raise LocalspecError("Empty prompt", "no prompt argument and nothing on stdin",
                             'Pass a prompt: localspec generate "..." --model M, or pipe one in')
    sampling = _sampling(args)
    session = _open_session(args)
    try:
        tokens = (session.raw_prompt(prompt) if args.raw
                  else session.chat_prompt([{"role": "user", "content": prompt}]))
        stream = session.generate(tokens, max_tokens=args.max_tokens, sampling=sampling,
                                  stop=args.stop)
        while True:
            try:
                piece = next(stream)
            except StopIteration as done:
                result = done.value
                break
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()
        if args.json:
            json.dump({"text": result.text, "tokens": result.tokens,
                       "finish_reason": result.finish_reason, "stats": result.stats.to_dict()},
                      sys.stdout)
        sys.stdout.write("\n")
        if args.stats:
            print(result.stats.summary(), file=sys.stderr)
    finally:
        session.close()
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run decoding configurations side by side and compare them")
    p.add_argument("--model", required=True, help="target model: a .gguf file")
    p.add_argument("--draft", help="draft model: a .gguf file")
    p.add_argument("--workload", default="humaneval", choices=["humaneval", "edit", "chat"])
    p.add_argument("--limit", type=int, default=None, help="first N problems only")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus filter when sampling (llama.cpp default 0.95)")
    p.add_argument("--top-k", type=int, default=40, help="top-k filter when sampling (llama.cpp default 40; 0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default="plain,maxgram,draft-linear,draft-tree,staged,adaptive",
                   help="comma-separated: plain,maxgram,draft-linear,draft-tree,staged,adaptive")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png")
    p.set_defaults(run=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from localspec.app import bench, workloads
    from localspec.engine.session import EngineConfig, Session

    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in bench.CONFIGS]
    if unknown:
        raise LocalspecError("Unknown bench configuration", ", ".join(unknown),
                             f"Choose from: {', '.join(bench.CONFIGS)}")
    if "plain" not in names:
        names.insert(0, "plain")   # the baseline every speed-up and 'identical' refers to
    sampling = _sampling(args)
    model = _model_path(args.model, "Model")
    draft = _model_path(args.draft, "Draft model") if args.draft else None
    probe = Session(EngineConfig(model, speculation=False, n_ctx=args.ctx))
    try:
        prompts = workloads.build(args.workload, args.limit, probe.raw_prompt, probe.chat_prompt)
    finally:
        probe.close()
    report = bench.run_bench(model, draft, prompts, names, args.max_tokens, sampling, args.ctx,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    report["workload"] = args.workload
    print(bench.format_table(report))
    for path in bench.write_outputs(report, Path(args.out)):
        print(f"wrote {path}")
    return 0


# ---- ngram: the personal n-gram store (show / forget / wipe / add-file) -----------------------
def _add_ngram(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ngram", help="show, forget or grow the personal n-gram data")
    acts = p.add_subparsers(dest="action", required=True)
    show = acts.add_parser("show", help="size, sources and what the data was built from")
    forget = acts.add_parser("forget", help="forget one source: exactly its n-grams go")
    forget.add_argument("kind", choices=["conversation", "file"])
    forget.add_argument("name", help="conversation id, or the file's path")
    wipe = acts.add_parser("wipe", help="forget everything")
    wipe.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    for q in (show, forget, wipe):
        q.add_argument("--model", help="only the data for this model's vocabulary (default: all)")
    add = acts.add_parser("add-file", help="opt in: learn from a text file you point at")
    add.add_argument("path")
    add.add_argument("--model", required=True, help="target model (.gguf) whose tokenizer to use")
    p.set_defaults(run=cmd_ngram)


def cmd_ngram(args: argparse.Namespace) -> int:
    from localspec.models import ngram_store as ns

    if args.action == "add-file":
        return _ngram_add_file(args)
    if args.model:
        paths = [p for p in [ns.store_path(ns.vocab_key(_model_path(args.model, "Model")))]
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
            names = {args.name, str(Path(args.name).expanduser().resolve())} \
                if args.kind == "file" else {args.name}
            hits = [s for s in stores if any([s.forget(args.kind, n) for n in sorted(names)])]
            if not hits:
                raise LocalspecError("Unknown n-gram source", f"no {args.kind} named "
                                     f"'{args.name}' in {where}",
                                     "See the stored sources with: localspec ngram show")
            print(f"Forgot {args.kind} '{args.name}' ({len(hits)} store(s)).")
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


def _confirm(question: str) -> bool:
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _print_ngram_info(info) -> None:
    import time

    print(f"{info.path}")
    print(f"  vocabulary: {info.label or 'unknown model'} (key {info.key})")
    print(f"  size:       {info.n_sources} sources, {info.n_ngrams:,} n-grams of order 1-"
          f"{info.max_n} (cap {info.max_rows:,}), {info.bytes / 1024:,.0f} KiB on disk")
    print("  built from:" + ("" if info.sources else " nothing yet"))
    for s in info.sources:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.added_at))
        print(f"    {s.kind:<12} {s.name:<40} {s.n_tokens:>9,} tokens  {when}")


def _ngram_add_file(args: argparse.Namespace) -> int:
    from localspec.engine.llama_model import LlamaModel
    from localspec.models.ngram_store import NgramStore, vocab_key

    path = Path(args.path).expanduser().resolve()
    if not path.is_file():
        raise LocalspecError("File not found", f"'{args.path}' is not an existing file",
                             "Pass the path of a text file to learn from")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LocalspecError("Not a text file", f"'{path}' is not UTF-8 text",
                             "Point add-file at a UTF-8 text file (code, notes, ...)") from None
    model_path = _model_path(args.model, "Model")
    model = LlamaModel(model_path, n_ctx=64)
    try:
        tokens = model.tokenize(text, special=False, add_bos=False)
    finally:
        model.close()
    with NgramStore.open(vocab_key(model_path), label=model_path.name) as store:
        store.add("file", str(path), tokens)
        info = store.info()
    print(f"Added file {path}: {len(tokens):,} tokens. The store now holds {info.n_sources} "
          f"sources, {info.n_ngrams:,} n-grams.")
    return 0
# ---- end ngram ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="localspec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"localspec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_chat(sub)
    _add_bench(sub)
    _add_ngram(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except LocalspecError as err:
        print(err.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
