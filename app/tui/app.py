"""The chat application: owns the settings, the history and the engine process; shows the chat
screen, or the first-run screen when there is no usable model.

Why it is shaped so:

* One builder (`ChatApp(...)`) serves `localspec chat` and the tests; the engine comes from a
  factory, so tests pass the real `EngineProcess` with test-sized options (or a scripted one for
  snapshots) and nothing checks whether it runs under test.
* The engine runs in its own process (app/engine_proc.py). A timer drains its events 30 times a
  second without blocking and hands them to the chat screen; `engine_call` is the one place that
  sends it requests.
* A load failure (missing, broken or mismatched model) arrives as an `Error` with no request and
  switches to the first-run screen, which explains it. An engine process the machine would not
  start (a low `ulimit -n`) is no model's fault: the chat screen says why, and F5 tries again.
  Nothing here lets a traceback through.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol

from textual.app import App

from localspec.app.engine_proc import EngineProcess, Error
from localspec.app.history import History
from localspec.app.run_options import edited, over, settings_options, spec_flags
from localspec.app.settings import Settings, save_settings
from localspec.engine.errors import LocalspecError

from .chat import ChatScreen
from .dialogs import SettingsScreen
from .first_run import FirstRunScreen
from .notify import notify
from .styles import CSS
from .terminal import TolerantDriver, exit_on_signals
from localspec.engine.options import Options

POLL_HZ = 30
MAX_EVENTS_PER_TICK = 200


class Engine(Protocol):
    """What the app needs of an engine: app/engine_proc.EngineProcess."""

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...
    def poll(self, timeout: float | None = 0.0): ...
    def generate(self, request_id: str, messages: list[dict], **sampling) -> None: ...
    def stop(self, request_id: str) -> None: ...
    def learn(self, conversation_id: str, messages: list[dict]) -> None: ...
    def forget(self, conversation_id: str) -> None: ...


EngineFactory = Callable[[Options], Engine]


class ChatApp(App):
    CSS = CSS
    TITLE = "localspec"
    BINDINGS = [("ctrl+o", "settings", "Settings")]

    def __init__(self, settings: Settings, history: History, *,
                 engine_factory: EngineFactory = EngineProcess,
                 engine_spec: Options | None = None,
                 settings_file: Path | None = None,
                 notice: LocalspecError | None = None,
                 run_flags: dict[str, object] | None = None) -> None:
        """engine_spec: the options the settings do not hold (context size, GPU layers, threads);
        its model, draft, speculation/personal off and exact on are this run's flags (chat --model,
        --draft, --no-speculation, --no-personal, --exact), over the settings. A model given
        (not "") brings its draft: the one given, or None (the model's own), not the saved one.
        run_flags: the flags that stand over the settings for this run (app/run_options
        settings_flags); None: those the spec implies (its models, exact, speculation, personal)."""
        super().__init__(driver_class=TolerantDriver)
        self.settings, self.history = settings, history
        self.engine_factory, self.settings_file = engine_factory, settings_file
        self.base_spec = engine_spec or Options(model="")
        # this run's flags over the saved settings (app/run_options.py holds the rule)
        self.run_flags = dict(run_flags) if run_flags is not None else spec_flags(self.base_spec)
        # a --head was trained for the model chat started with
        self.head_model = self.run_settings(settings).model
        self.startup_notice = notice
        self.engine: Engine | None = None
        self.chat: ChatScreen | None = None
        # the history failed during the chat (ChatScreen.history_failed): the command exits 2
        self.history_failure: LocalspecError | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    async def on_mount(self) -> None:
        if not self.is_headless:
            exit_on_signals(self)
        if self.startup_notice is not None:
            n = self.startup_notice
            notify(self, f"{n.cause}. {n.fix}", title=n.title, severity="warning", timeout=15)
        self.set_interval(1 / POLL_HZ, self.drain_engine)
        await self.open_chat_or_first_run()

    async def open_chat_or_first_run(self) -> None:
        if not self.run_settings(self.settings).model:
            await self.show_first_run(None)
            return
        while isinstance(self.screen, FirstRunScreen):
            await self.pop_screen()
        self.chat = ChatScreen(self.history)
        await self.push_screen(self.chat)
        self.start_engine()

    async def show_first_run(self, problem: LocalspecError | None) -> None:
        if self.chat is not None:
            while self.screen is not self.chat:   # a dialog above the chat goes too
                await self.pop_screen()
            self.chat.save_reply_in_flight()
            await self.pop_screen()
            self.chat = None
        await self.push_screen(FirstRunScreen(problem))

    async def on_first_run_screen_chosen(self, message: FirstRunScreen.Chosen) -> None:
        self.settings = replace(self.settings, model=message.name, draft=None)
        for name in ("model", "draft"):   # the user's choice: saved, and this run follows it
            self.run_flags.pop(name, None)
        self.save()
        await self.open_chat_or_first_run()

    def run_settings(self, s: Settings) -> Settings:
        """S with this run's flags over them."""
        return over(s, self.run_flags)

    def spec_for(self, s: Settings) -> Options:
        run = self.run_settings(s)
        return replace(settings_options(run, self.base_spec),
                       head=self.base_spec.head if run.model == self.head_model else None)

    def start_engine(self) -> None:
        self.stop_engine()
        self.engine = self.engine_factory(self.spec_for(self.settings))
        self._starting(self.engine.start)

    def restart_engine(self) -> None:
        if self.engine is None:
            self.start_engine()
            return
        if self.chat is not None:
            self.chat.engine_loading("restarting the engine…")
        self._starting(self.engine.restart)

    def _starting(self, start: Callable[[], None]) -> None:
        """Start the engine process; one the machine would not start (no file descriptors or
        processes left: a LocalspecError) is said on the chat screen, and F5 tries again."""
        try:
            start()
        except LocalspecError as err:
            if self.chat is None:   # the engine starts under the chat screen only
                raise
            self.chat.engine_failed(err)

    def stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    async def on_unmount(self) -> None:
        if self.chat is not None:
            self.chat.save_reply_in_flight()
        self.stop_engine()

    # ---- engine traffic -----------------------------------------------------------------------
    def engine_call(self, op: str, *args, **kwargs) -> None:
        """Send one request (generate / stop / learn / forget) to the engine."""
        if self.engine is not None:
            getattr(self.engine, op)(*args, **kwargs)

    async def drain_engine(self) -> None:
        if self.engine is None:
            return
        for _ in range(MAX_EVENTS_PER_TICK):
            event = self.engine.poll()
            if event is None:
                return
            if isinstance(event, Error) and event.request_id is None:
                self.stop_engine()    # loading failed: explain it, the process has exited
                await self.show_first_run(LocalspecError(event.title, event.cause, event.fix))
                return
            if self.chat is not None:
                await self.chat.on_engine_event(event)

    # ---- settings -----------------------------------------------------------------------------
    def action_settings(self) -> None:
        # The form shows this run's engine: `chat --model/--draft` pick the models, `--exact` turns
        # exact numerics on, --no-speculation and --no-personal turn those off, whatever is saved.
        # A field left as shown keeps the saved value (a flag is never saved); one changed is the
        # user's choice: saved, and this run follows it over the flag.
        shown = self.run_settings(self.settings)

        async def done(new: Settings | None) -> None:
            if new is None:
                return
            before = self.spec_for(self.settings)
            new, self.run_flags = edited(self.settings, self.run_flags, new)
            self.settings = new
            self.save()
            if self.chat is None:
                await self.open_chat_or_first_run()
                return
            if self.chat.has_class("-sources") != new.show_sources:
                self.chat.action_toggle_sources()
            if before != self.spec_for(new):
                self.start_engine()
                self.chat.engine_loading("loading the new model…")

        self.push_screen(SettingsScreen(shown), done)

    def save(self) -> None:
        try:
            save_settings(self.settings, self.settings_file)
        except OSError as err:
            notify(self, f"Settings not saved: {err}", severity="error")
