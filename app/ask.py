"""`localspec ask`: one question from the terminal or a pipe, the answer streamed to stdout.

    localspec ask "explain this" < file.py

The question is the argument; piped stdin follows it as a fenced block. Model and sampling come
from the chat's settings (app/settings.py), and flags override them, so a one-shot answers like
the chat does.

It runs the engine in this process, not behind EngineProcess: a one-shot has no conversation to
protect from a crash (the shell reports the signal; the chat keeps its engine in a child so that a
crash costs the engine, not the UI), and in-process it starts faster, streams straight to stdout
and stops on Ctrl-C like `generate`.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, replace
from typing import TextIO

from localspec.engine.config import SamplingParams
from localspec.engine.errors import LocalspecError
from localspec.engine.options import Options

from . import inputs
from .run_options import given, options_from_flags, over, resolved, settings_flags, settings_options
from .settings import Settings, load_settings, settings_path


def add_ask(sub: argparse._SubParsersAction) -> None:
    from .run_options import add_engine_options, add_model_options, add_sampling_options

    p = sub.add_parser("ask", help="answer one question (piped stdin is appended), streamed to stdout")
    p.add_argument("question", nargs="?", help="the question; piped stdin follows it as a fenced block")
    add_model_options(p, model_required=False,
                      model_help="target model: a .gguf file or an installed model's name "
                                 "(default: the chat's settings)")
    add_engine_options(p)
    add_sampling_options(p)
    p.add_argument("--system", help="system prompt (default: the chat's settings)")
    p.add_argument("--stats", action="store_true", help="print speculation statistics to stderr")
    p.set_defaults(run=cmd_ask)


@dataclass(frozen=True)
class AskPlan:
    """What one ask runs: the settings with the flags over them, as engine options."""

    settings: Settings
    messages: list[dict]
    options: Options


def compose_question(question: str | None, piped: str | None) -> str:
    """The question, then piped text as a fenced block (a fence longer than any run of backticks
    in it); either alone is the whole prompt."""
    question = (question or "").strip()
    if piped is None or not piped.strip():
        if not question:
            raise LocalspecError("Empty question", "no question argument and nothing on stdin",
                                 'Ask something: localspec ask "explain this" < file.py')
        return question
    longest = max((len(run) for run in re.findall(r"`+", piped)), default=0)
    fence = "`" * max(3, longest + 1)
    block = f"{fence}\n{piped.rstrip(chr(10))}\n{fence}"
    return f"{question}\n\n{block}" if question else block


def plan(args: argparse.Namespace, piped: str | None) -> AskPlan:
    run, options = settings_run(given(args))
    if args.system is not None:
        run = replace(run, system_prompt=args.system)
    messages = [{"role": "user", "content": compose_question(args.question, piped)}]
    if run.system_prompt:
        messages.insert(0, {"role": "system", "content": run.system_prompt})
    return AskPlan(run, messages, options)


def settings_run(flags: dict[str, object]) -> tuple[Settings, Options]:
    """The chat's settings with this run's flags over them (the chat's rule: flags for this run
    only), and the engine options they ask for; ask's and serve's."""
    run = over(load_settings(), settings_flags(flags))
    if not run.model:
        raise LocalspecError("No model configured",
                             f"no --model given and the settings ({settings_path()}) name none",
                             "Pass --model PATH.gguf, or install a model and name it: "
                             "localspec pull NAME, or localspec import NAME FILE.gguf")
    sampled = SamplingParams(temperature=run.temperature, top_k=run.top_k, top_p=run.top_p,
                             seed=flags.get("seed", 0))   # reproducible by default
    base = options_from_flags(flags, Options(run.model, sampling=sampled, max_tokens=run.max_tokens))
    options = settings_options(run, base)
    if "draft" in flags:      # a draft given is used, whatever stages the settings keep
        options = replace(options, use_draft=True)
    return run, options


def read_piped(stdin: TextIO, n_ctx: int) -> str | None:
    """Stdin's text when something is piped or redirected in, bounded by what a context of n_ctx
    tokens holds (app/inputs.py); None for a terminal."""
    if stdin is None or stdin.closed or stdin.isatty():
        return None
    return inputs.read_stdin_text(stdin.buffer, n_ctx)


def cmd_ask(args: argparse.Namespace) -> int:
    from localspec.app.cli import write_flushed
    from localspec.engine.generation import finish
    from localspec.engine.session import Session

    from .progress import terminal_progress

    flags = given(args)   # a bad value is refused before stdin is read
    n_ctx = flags.get("ctx", Options.n_ctx)
    if args.question is not None:   # argv's surrogate escapes as U+FFFD, the size bounded
        args.question = inputs.check_prompt(inputs.argument(args.question), n_ctx, "the question")
    if args.system is not None:
        args.system = inputs.check_prompt(inputs.argument(args.system), n_ctx, "the system prompt")
    p = plan(args, read_piped(sys.stdin, n_ctx))
    with terminal_progress(sys.stderr) as progress:   # a first run measures this machine
        session = Session(resolved(p.options), progress)
    try:
        stream = session.generate(session.chat_prompt(p.messages))
        result = finish(stream, write_flushed)   # a reader that leaves (`| head`): app/exits.py
        if not result.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if args.stats:
            print(result.stats.summary(), file=sys.stderr)
    finally:
        session.close()
    return 0
