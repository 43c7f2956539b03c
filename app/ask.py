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

from localspec.engine.config import DEFAULT_TREE_NODES
from localspec.engine.errors import LocalspecError

from . import inputs
from .paths import head_path, resolve_models
from .settings import Settings, load_settings, settings_path


def add_ask(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer one question (piped stdin is appended), streamed to stdout")
    p.add_argument("question", nargs="?", help="the question; piped stdin follows it as a fenced block")
    p.add_argument("--model", help="target model: a .gguf file or an installed model's name "
                                   "(default: the chat's settings)")
    p.add_argument("--draft", help="draft model: a .gguf file or a transformers folder")
    p.add_argument("--head", help="a draft head trained for the model (localspec head train), in the "
                                  "draft model's place")
    p.add_argument("--no-speculation", action="store_true", help="plain decoding, one token per target call")
    p.add_argument("--no-personal", action="store_true", help="do not use the personal n-gram drafter")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", help="system prompt (default: the chat's settings)")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    p.add_argument("--tree-nodes", type=int, default=DEFAULT_TREE_NODES, help="largest draft tree per round")
    p.add_argument("--gpu-layers", type=int, default=-1, help="layers to offload to the GPU (-1 all)")
    p.add_argument("--stats", action="store_true", help="print speculation statistics to stderr")
    p.add_argument("--exact", action="store_true",
                   help="batch-invariant numerics (CPU only, slower): greedy speculation emits exactly "
                        "plain decoding's tokens, bit for bit")
    p.set_defaults(run=cmd_ask)


@dataclass(frozen=True)
class AskPlan:
    """What one ask runs: the settings with the flags applied."""

    settings: Settings
    messages: list[dict]
    personal: bool
    use_draft: bool


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
    try:
        settings = load_settings().with_overrides(
            model=args.model, draft=args.draft, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, max_tokens=args.max_tokens, system_prompt=args.system,
            speculation=False if args.no_speculation else None)
    except ValueError as err:
        raise LocalspecError("Bad option", str(err),
                             "Use --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0, "
                             "--max-tokens >= 1") from None
    if args.model and not args.draft:
        settings = replace(settings, draft=None)   # the settings' draft belongs to their model
    if not settings.model:
        raise LocalspecError("No model configured",
                             f"no --model given and the settings ({settings_path()}) name none",
                             "Pass --model PATH.gguf, or install a model and name it: "
                             "localspec pull NAME, or localspec import NAME FILE.gguf")
    messages = [{"role": "user", "content": compose_question(args.question, piped)}]
    if settings.system_prompt:
        messages.insert(0, {"role": "system", "content": settings.system_prompt})
    return AskPlan(settings, messages,
                   personal="personal" in settings.stages and not args.no_personal,
                   use_draft=args.draft is not None or "draft" in settings.stages)


def open_session(p: AskPlan, args: argparse.Namespace):
    from localspec.engine.config import TreeBudget
    from localspec.engine.session import EngineConfig, Session

    model, draft = resolve_models(p.settings.model, p.settings.draft)
    return Session(EngineConfig(model=model, draft=draft if p.use_draft else None,
                                head=head_path(args.head),
                                speculation=p.settings.speculation, personal=p.personal,
                                n_ctx=args.ctx, n_gpu_layers=args.gpu_layers,
                                exact=args.exact or p.settings.exact,
                                budget=TreeBudget(max_nodes=args.tree_nodes, adaptive=True)))


def read_piped(stdin: TextIO, n_ctx: int) -> str | None:
    """Stdin's text when something is piped or redirected in, bounded by what a context of n_ctx
    tokens holds (app/inputs.py); None for a terminal."""
    if stdin is None or stdin.closed or stdin.isatty():
        return None
    return inputs.read_stdin_text(stdin.buffer, n_ctx)


def cmd_ask(args: argparse.Namespace) -> int:
    from localspec.app.cli import write_flushed
    from localspec.engine.config import SamplingParams
    from localspec.engine.decode import drain

    if args.question is not None:   # argv's surrogate escapes as U+FFFD, the size bounded
        args.question = inputs.check_prompt(inputs.argument(args.question), args.ctx, "the question")
    if args.system is not None:
        args.system = inputs.check_prompt(inputs.argument(args.system), args.ctx, "the system prompt")
    p = plan(args, read_piped(sys.stdin, args.ctx))
    s = p.settings
    sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=args.seed)
    session = open_session(p, args)
    try:
        stream = session.generate(session.chat_prompt(p.messages), max_tokens=s.max_tokens,
                                  sampling=sampling)
        result = drain(stream, write_flushed)   # a reader that leaves (`| head`): app/exits.py
        if not result.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if args.stats:
            print(result.stats.summary(), file=sys.stderr)
    finally:
        session.close()
    return 0
