"""`localspec chat`: the saved settings, the history, the app; the flags (--model, --draft,
--no-speculation, --no-personal, --exact, ...) go to the engine spec, for this run (the rule:
app/run_options.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from localspec.app.engine_proc import EngineProcess
from localspec.app.history import History
from localspec.app.run_options import given, options_from_flags, settings_flags
from localspec.app.settings import load_settings_or_default
from localspec.engine.options import Options


def run_chat(args: argparse.Namespace) -> int:
    with History.open() as history:
        app = chat_app(args, history)
        app.run()
    return exit_status(app)


def exit_status(app) -> int:
    """How a chat that has ended ends the command: 128 + the signal when one ended it
    (tui/terminal.py); else, if the history failed during the chat, that error (printed after the
    screen is gone, exit 2: something the user saw may not be saved); else 0."""
    if app.return_code:
        return app.return_code
    if app.history_failure is not None:
        raise app.history_failure
    return 0


def chat_app(args: argparse.Namespace, history: History, *, settings_file: Path | None = None,
             engine_factory=EngineProcess):
    """The chat app for `localspec chat` ARGS: the saved settings (settings_file, default: the
    user's), the engine options from the flags."""
    from .app import ChatApp

    flags = given(args)      # a bad value: LocalspecError before the screen opens
    settings, notice = load_settings_or_default(settings_file)
    # the flags shape this run's engine; over the saved settings they stand for this run only
    # (app/run_options.py), so saving the settings screen does not store them
    spec = options_from_flags(flags, Options(model=""))
    return ChatApp(settings, history, engine_factory=engine_factory, engine_spec=spec,
                   settings_file=settings_file, notice=notice, run_flags=settings_flags(flags))
