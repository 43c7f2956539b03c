"""The `localspec` command line. Each subcommand is one small function over the engine.

Errors a user can cause arrive as LocalspecError and are printed as title / cause / fix with exit
status 2, never as a traceback; app/exits.py decides how every other ending (Ctrl+C, a closed
pipe, a bug) is reported. What commands read from stdin, files and arguments goes through
app/inputs.py: bounded, one UTF-8 policy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Nothing from localspec is imported here, only in the functions that need it: importing the
# engine loads llama.cpp (engine/__init__.py), and `localspec --version` needs none of it.

# `pull` is the only command that may open a network connection. Whatever imports the command
# line (a chat UI started another way included) is offline until main() decides per command.
ONLINE_COMMANDS = frozenset({"pull"})
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_SET_BY_USER = frozenset(var for var in _OFFLINE_VARS if var in os.environ)
for _var in _OFFLINE_VARS:
    os.environ.setdefault(_var, "1")


def _version() -> str:
    try:
        return version("localspec")
    except PackageNotFoundError:
        return "0+unknown"


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (argument or stdin)")
    p.add_argument("prompt", nargs="?", help="the prompt; read from stdin when omitted")
    _add_run_options(p)
    p.add_argument("--raw", action="store_true", help="plain completion, without the chat template")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--stats", action="store_true", help="print speculation statistics to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    p.set_defaults(run=cmd_generate)


def _add_run_options(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    from .run_options import add_engine_options, add_model_options, add_sampling_options

    add_model_options(p, model_required)
    add_engine_options(p)
    add_sampling_options(p)


def run_options(args: argparse.Namespace):
    """This run's Options: the flags given over the defaults, the model names resolved to paths."""
    from localspec.engine.options import Options

    from .run_options import given, options_from_flags, resolved

    return resolved(options_from_flags(given(args), Options(args.model)))


def _open_session(options):
    """The session, a first calibration's progress shown on stderr when it is a terminal."""
    from localspec.engine.session import Session

    from .progress import terminal_progress

    with terminal_progress(sys.stderr) as progress:
        return Session(options, progress)


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with the model: the Textual chat screen (--line: line mode)")
    _add_run_options(p, model_required=False)
    p.add_argument("--line", action="store_true",
                   help="line-mode chat on stdin/stdout instead of the chat screen (needs --model)")
    p.set_defaults(run=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    from .run_options import given

    given(args)   # a bad value is refused before the history, the screen or the engine opens
    if not args.line:
        _need_terminal()
        from localspec.app.tui.launch import run_chat

        return run_chat(args)
    from localspec.app.inputs import text_stdin
    from localspec.app.repl import chat_loop
    from localspec.engine.errors import LocalspecError

    if not args.model:
        raise LocalspecError("No model for line-mode chat", "--line needs --model",
                             "Run: localspec chat --line --model NAME|FILE.gguf")
    options = run_options(args)
    session = _open_session(options)
    try:
        chat_loop(session, options.sampling, options.max_tokens, stdin=text_stdin(sys.stdin.buffer))
    finally:
        session.close()
    return 0


def _need_terminal() -> None:
    """The chat screen reads keys from stdin and draws on stderr (Textual's driver), so both must
    be a terminal. Given a pipe, a file or /dev/null instead, it would spin on an input that never
    blocks, or draw where nobody sees it, until killed: refused at once, naming line mode, the chat
    for those. stdout is free: nothing of the screen goes there (`localspec chat > log` works)."""
    from localspec.engine.errors import LocalspecError

    missing = [name for fd, name in ((0, "stdin"), (2, "stderr")) if not os.isatty(fd)]
    if missing:
        raise LocalspecError("The chat screen needs a terminal",
                             f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                             "a terminal (a pipe, a file or /dev/null)",
                             "Run it in a terminal, or chat on stdin and stdout in line mode: "
                             "localspec chat --line --model NAME|FILE.gguf")


def cmd_generate(args: argparse.Namespace) -> int:
    from localspec.engine.errors import LocalspecError

    from . import inputs

    options = run_options(args)   # a bad value is refused before stdin is read
    prompt = (inputs.check_prompt(inputs.argument(args.prompt), options.n_ctx, "the prompt")
              if args.prompt is not None else inputs.read_stdin_text(sys.stdin.buffer, options.n_ctx))
    if not prompt.strip():
        raise LocalspecError("Empty prompt", "no prompt argument and nothing on stdin",
                             'Pass a prompt: localspec generate "..." --model M, or pipe one in')
    from localspec.engine import native  # noqa: F401  (first: llama.cpp before numpy, engine/native.py)
    from localspec.engine.generation import finish

    session = _open_session(options)
    try:
        tokens = (session.raw_prompt(prompt) if args.raw
                  else session.chat_prompt([{"role": "user", "content": prompt}]))
        stream = session.generate(tokens, stop=[inputs.argument(s) for s in args.stop])
        result = finish(stream, None if args.json else write_flushed)
        if args.json:
            json.dump({"text": result.text, "tokens": result.tokens,
                       "finish_reason": result.finish_reason, "stats": result.stats.to_dict()},
                      sys.stdout)
        sys.stdout.write("\n")
        sys.stdout.flush()
        if result.finish_reason == "context" and not args.json:   # JSON says so in finish_reason
            print(f"note: the context ({session.model.n_ctx} tokens) is full: the reply stops here. "
                  "Raise --ctx or shorten the prompt for a longer one.", file=sys.stderr)
        if args.stats:
            print(result.stats.summary(), file=sys.stderr)
    finally:
        session.close()
    return 0


def write_flushed(piece: str) -> None:
    """Stream a piece of a model's text to stdout as it arrives, its control characters shown,
    never sent (app/terminal.py)."""
    from .terminal import printable

    sys.stdout.write(printable(piece))
    sys.stdout.flush()


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from .run_options import add_model_options, add_sampling_options, add_threads_option

    p = sub.add_parser("bench", help="run decoding configurations side by side and compare them")
    add_model_options(p, model_help="target model: a .gguf file")
    add_sampling_options(p)
    add_threads_option(p)
    p.add_argument("--workload", default="humaneval", choices=["humaneval", "edit", "chat", "longchat", "newcode",
                                                                 "conversation", "conversation-long"],
                   help="conversation, conversation-long: multi-turn chats, each turn's time to first "
                        "token with and without the cache kept between turns (default configs: plain, "
                        "adaptive-nomodel, adaptive; each runs fresh, +cache and +restart, or name "
                        "one run: plain+cache)")
    p.add_argument("--limit", type=int, default=None, help="first N problems only")
    p.add_argument("--configs", default=None,
                   help="comma-separated (default: all but the head's, and with --head those too): "
                        "plain,maxgram,ngram,draft-linear,draft-tree,staged,adaptive, adaptive-nomodel (Max-Gram and "
                        "n-grams only: the baseline of what a draft model or head adds), "
                        "head, adaptive-head, head-N (with --head; head-N: the head alone, trees of N nodes), "
                        "adaptive-N (the adaptive budget with trees of at most N nodes), "
                        "default (what generate, chat and serve run with a draft)")
    p.add_argument("--learn", action="append", default=[], metavar="PATH",
                   help="build the n-gram stage from these files or folders (their *.py, *.md, *.txt) "
                        "in a scratch store for this run; default: your personal store")
    p.add_argument("--learn-max-tokens", type=int, default=2_000_000,
                   help="stop reading --learn files after this many tokens")
    p.add_argument("--no-exec", action="store_true",
                   help="skip HumanEval pass@1 (it runs the generated code in a guarded child process)")
    p.add_argument("--torch-draft", action="store_true",
                   help="run the draft in PyTorch (CUDA graphs on a GPU); a .gguf draft is dequantised "
                        "(needs the gguf package), a transformers folder always runs in PyTorch")
    p.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png")
    p.add_argument("--serve", action="store_true",
                   help="also send each prompt through /v1/chat/completions of a `localspec serve` started "
                        "for the run, interleaved with the configurations: its tok/s at the client against "
                        "the same engine's here (default, or adaptive-nomodel without --draft) and its first "
                        "byte after the prefill (edit, chat, longchat; needs the serve extra)")
    p.add_argument("--llama-server", metavar="PATH",
                   help="with --serve: llama.cpp's llama-server binary; the same prompts through it too, "
                        "once per --llama-server-modes")
    p.add_argument("--llama-server-modes", default=None,
                   help="with --llama-server, comma-separated (default: plain,ngram-simple,ngram-mod,"
                        "spec-default; also ngram-map-k, and draft: --draft beside it)")
    p.set_defaults(run=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from localspec.app import bench
    from localspec.engine.errors import LocalspecError
    from localspec.engine.session import draft_runs_in_torch

    from .paths import model_path

    talks = args.workload.startswith("conversation")
    configs = args.configs or ("plain,adaptive-nomodel,adaptive" if talks else ",".join(
        n for n in bench.CONFIGS if args.head or "head" not in bench.config(n).stages))
    names = [n.strip() for n in configs.split(",") if n.strip()]
    unknown = []
    for n in names:
        try:
            bench.config(n.split("+")[0] if talks else n)   # conversation runs: NAME+cache, NAME+restart
        except KeyError:
            unknown.append(n)
    if unknown:
        raise LocalspecError("Unknown bench configuration", ", ".join(unknown),
                             f"Choose from: {', '.join(bench.CONFIGS)}, or adaptive-N or head-N (N = 1..64 nodes)")
    if args.head and not any("head" in bench.config(n).stages for n in names):
        raise LocalspecError("--head without a head configuration", f"--configs {configs}",
                             "Add head and/or adaptive-head to --configs, or leave --configs out")
    from localspec.engine.options import Options, check_values, within

    counts = {"limit": args.limit, "learn_max_tokens": args.learn_max_tokens}
    check_values({k: v for k, v in counts.items() if v is not None},
                 {"limit": within("--limit", 1), "learn_max_tokens": within("--learn-max-tokens", 1)})
    if not talks and "plain" not in names:
        names.insert(0, "plain")   # the baseline every speed-up and 'identical' refers to
    via = None
    if args.serve or args.llama_server or args.llama_server_modes:
        from localspec.app import bench_serve

        via = bench_serve.check(args)
        if via.config not in names:   # the served engine's own configuration, beside it here
            names.append(via.config)

    from .run_options import given, options_from_flags

    options = options_from_flags(given(args), Options(args.model))   # plain runs exact too
    bench.check_out(Path(args.out))
    model = model_path(args.model, "Model")
    draft = model_path(args.draft, "Draft model") if args.draft else None
    draft_runs_in_torch(draft, args.torch_draft)
    scratch = tempfile.TemporaryDirectory(prefix="localspec-bench-") if args.learn else None
    prompts, store, learnt = bench.bench_inputs(model, args.workload, args.limit, args.learn, args.learn_max_tokens,
                                                Path(scratch.name) if scratch else None, options.n_ctx)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if talks:   # prompts: conversations, each turn's user message
            from localspec.app import bench_conversation as runner

            report = runner.run_conversation_bench(
                model, draft, prompts, names, options.max_tokens, options.sampling, options.n_ctx, store=store,
                n_threads=options.n_threads, exact=options.exact, progress=progress)
        else:
            runner = bench
            beside = via and via.start(model, draft, options, Path(args.out), progress)
            try:
                report = bench.run_bench(model, draft, prompts, names, options.max_tokens, options.sampling,
                                         options.n_ctx,
                                         store=store, check=not args.no_exec, torch_draft=args.torch_draft,
                                         head=Path(args.head).expanduser() if args.head else None,
                                         exact=options.exact, n_threads=options.n_threads, progress=progress,
                                         beside=beside and beside.ask)
                if beside:
                    bench_serve.add_to(report, beside, prompts)
            finally:
                if beside:
                    beside.close()
    finally:
        store.close()
        if scratch:
            scratch.cleanup()
    report["workload"] = args.workload
    report["ngram_source"] = learnt
    print(runner.format_table(report))
    if "via_http" in report:
        print(bench_serve.format_table(report["via_http"], report))
    for path in bench.write_outputs(report, Path(args.out), plot=not talks):
        print(f"wrote {path}")
    return 0


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure what batches cost on this machine (cached; the "
                                         "adaptive budget uses it)")
    _add_run_options(p)
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    p.set_defaults(run=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from localspec.engine.build import load
    from localspec.engine.drafters.head_stage import with_head
    from localspec.engine.config import TreeBudget

    from .progress import terminal_progress
    from .terminal import show   # model file names

    # what generate and chat load, speculating: the target and a GGUF draft, measured beside it,
    # or a head (the one installed for the target unless told), which takes the draft model's
    # place (a PyTorch draft is not calibrated here)
    options = with_head(replace(run_options(args), speculation=True))
    names = [n for n in options.stages if n in ("draft", "head")]
    model, draft = options.model, options.head if options.head is not None else options.draft
    with terminal_progress(sys.stderr) as progress:
        loaded = load(options, names, measure=True, refresh=args.refresh, progress=progress)
    if "head" in loaded.sat_out:   # the installed head sits out here: the target's costs alone
        names = [n for n in names if n != "head"]
        show(f"head {options.head.name}: sits out on this machine: {loaded.sat_out['head']}")
    kept = loaded.costs is None or loaded.costs.file is not None
    try:
        costs = loaded.stage_costs(loaded.stages(names))   # a head times its own steps
    finally:
        loaded.close()
    if not kept:
        show("Not kept: another localspec process was generating with this model while these were "
             "measured; run `localspec calibrate --refresh` again when it is idle")
    show(f"target {model.name}: " + "  ".join(f"{n}: {ms} ms" for n, ms in costs.to_dict()["target_ms"].items()))
    if costs.draft:
        show(f"draft {draft.name}: " + "  ".join(f"{n}: {ms} ms" for n, ms in costs.to_dict()["draft_ms"].items()))
    if costs.switch:
        print(f"changing the batch shape and back (CUDA graphs rebuilt): {1e3 * costs.switch:.2f} ms")
    if costs.tiled_min is not None:
        below = (f"on the multi-column kernels (up to {costs.multicol_max})" if costs.multicol_max is not None
                 else "row by row")
        print(f"ggml's tiled matmul from {costs.tiled_min} batch rows (measured: fewer rows go {below})")
    if costs.multicol_min is not None:
        print("one-row decodes on " + ("the multi-column kernels (measured faster here)"
                                       if costs.multicol_min == 1 else
                                       "ggml's kernels (the multi-column ones not clearly faster here)"))
    arms = TreeBudget(max_nodes=options.budget.max_nodes, adaptive=True).arms(
        with_models=draft is not None, pruned=True)
    # what generate and chat draft with: the engine judges by the same
    limits = options.head_limits if options.head is not None else options.draft_limits
    kept = costs.viable(arms, limits.width, limits.max_depth)
    plain = 1 / costs.target_cost(1)
    for arm in arms:
        best = costs.best_case_rate(arm, limits.width, limits.max_depth)
        verdict = "tried" if arm in kept else "never tried: cannot beat plain"
        print(f"  budget {str(arm):>8}: best case {best:7.1f} tok/s vs plain {plain:.1f}  {verdict}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .ask import add_ask
    from .head_cmd import add_head
    from .models_cmd import add_models_commands
    from .ngram_cmd import add_ngram
    from .serve import add_serve

    parser = argparse.ArgumentParser(prog="localspec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"localspec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_chat(sub)
    add_ask(sub)
    _add_bench(sub)
    _add_calibrate(sub)
    add_ngram(sub)
    add_head(sub)
    add_models_commands(sub)
    add_serve(sub)
    return parser


def set_network_mode(command: str) -> None:
    """Offline by construction: for every command but `pull`, tell the hub client and
    transformers they are offline (`pull` gets back the environment the user gave). Both read these variables once, when first imported, so this
    runs before anything imports them (nothing at this module's import time does). No telemetry
    either: `pull` talks to the hub about the files it fetches, nothing else (the client would
    otherwise fetch an agent registry and describe this machine in its User-Agent)."""
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    for var in _OFFLINE_VARS:
        if command not in ONLINE_COMMANDS:
            os.environ[var] = "1"
        elif var not in _SET_BY_USER:      # a user's own HF_HUB_OFFLINE=1 stays, and is named
            os.environ.pop(var, None)


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status and message for whatever ends it are app/exits.py's."""
    from .exits import run_command

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:   # what argparse would print, without loading the engine
        print(f"localspec {_version()}")
        return 0
    return run_command(lambda: _run(argv))


def _run(argv: list[str]) -> int:
    from .bus_error import explain_bus_errors

    explain_bus_errors()      # a model file truncated under a running model: said, not "Bus error"
    args = build_parser().parse_args(argv)
    set_network_mode(args.command)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
