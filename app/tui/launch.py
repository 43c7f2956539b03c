"""`localspec chat`: the saved settings, the history, the app; the flags (--model, --draft,
--no-speculation, --no-personal, --exact, ...) go to the engine spec, for this run."""
from __future__ import annotations

import argparse
from pathlib import Path

from localspec.app.engine_proc import EngineProcess, EngineSpec
from localspec.app.history import History
from localspec.app.settings import load_settings_or_default


def run_chat(args: argparse.Namespace) -> int:
    with History.open() as history:
        app = chat_app(args, history)
        app.run()
    return app.return_code or 0     # 128 + the signal when one ended it (tui/terminal.py)


def chat_app(args: argparse.Namespace, history: History, *, settings_file: Path | None = None,
             engine_factory=EngineProcess):
    """The chat app for `localspec chat` ARGS: the saved settings (settings_file, default: the
    user's), the engine options from the flags."""
    from .app import ChatApp

    settings, notice = load_settings_or_default(settings_file)
    # --model/--draft, --no-speculation, --no-personal and --exact shape this run's engine (a
    # --model without --draft: that model's own draft, not the saved model's); the settings keep
    # the saved values, so saving the settings screen does not store them (app.action_settings)
    spec = EngineSpec(model=args.model or "", draft=args.draft, n_ctx=args.ctx,
                      n_gpu_layers=args.gpu_layers,
                      tree_nodes=args.tree_nodes, head=args.head, exact=args.exact,
                      speculation=not args.no_speculation, personal=not args.no_personal)
    return ChatApp(settings, history, engine_factory=engine_factory, engine_spec=spec,
                   settings_file=settings_file, notice=notice)
