"""`localspec chat`: the saved settings with --model/--draft over them, the history, the app."""
from __future__ import annotations

import argparse
from dataclasses import replace

from localspec.app.engine_proc import EngineSpec
from localspec.app.history import History
from localspec.app.settings import load_settings_or_default


def run_chat(args: argparse.Namespace) -> int:
    from .app import ChatApp

    settings, notice = load_settings_or_default()
    settings = settings.with_overrides(model=args.model, draft=args.draft)
    if args.model and not args.draft:
        settings = replace(settings, draft=None)   # another model: not the saved model's draft
    if args.no_speculation:
        settings = replace(settings, speculation=False)
    if args.no_personal:
        settings = replace(settings, stages=tuple(s for s in settings.stages if s != "personal"))
    spec = EngineSpec(model="", n_ctx=args.ctx, n_gpu_layers=args.gpu_layers,
                      tree_nodes=args.tree_nodes, head=args.head, exact=args.exact)
    with History.open() as history:
        ChatApp(settings, history, engine_spec=spec, notice=notice).run()
    return 0
