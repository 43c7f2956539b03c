"""Helpers for the chat UI tests: building the app on the tiny real model, waiting on it without
fixed sleeps, and a gate that holds engine events so a test can act mid-reply deterministically."""
from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from localspec.app.engine_proc import Crashed, Done, EngineProcess, Ready, Token
from localspec.app.history import History
from localspec.app.settings import Settings
from localspec.app.tui.app import ChatApp
from localspec.engine.config import TreeBudget
from localspec.engine.options import Options

# Test-sized engine: one thread, a small context, small trees.
SPEC = Options(model="", n_ctx=1024, n_threads=1, budget=TreeBudget(max_nodes=8, adaptive=True))


async def wait_until(pilot, condition, timeout: float = 60.0, what: str = "") -> None:
    """Let the app run until `condition()` holds (the engine is a real process: its replies take
    real time, so this polls instead of sleeping a fixed amount)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.02)


class GatedEngine(EngineProcess):
    """The real engine process, whose events the test can hold back: with `hold_after_first_token`
    set, everything after a reply's first non-empty Token waits until `release()`, so the test
    presses Esc (or kills the engine) while the UI shows a partial reply."""

    def __init__(self, spec: Options) -> None:
        super().__init__(spec)
        self.hold_after_first_token = False
        self.held: list = []
        self.seen_token = False
        self.holding = False

    def poll(self, timeout: float | None = 0.0):
        if self.holding:
            event = super().poll(0.0)
            if event is not None:
                self.held.append(event)
            return None
        if self.held:
            return self.held.pop(0)
        event = super().poll(timeout)
        if (self.hold_after_first_token and isinstance(event, Token) and event.text
                and not self.seen_token):
            self.seen_token = self.holding = True
        return event

    def release(self, drop_all_but_crash: bool = False) -> None:
        """Let held events through; with drop_all_but_crash, only the Crashed event: what the UI
        sees when the engine dies right after the first token."""
        if drop_all_but_crash:
            self.held = [e for e in self.held if isinstance(e, Crashed)]
        self.hold_after_first_token = self.holding = self.seen_token = False

    @property
    def crash_held(self) -> bool:
        return any(isinstance(e, Crashed) for e in self.held)


@dataclass
class Harness:
    app: ChatApp
    history: History
    engines: list = field(default_factory=list)

    @property
    def engine(self):
        return self.engines[-1]

    @property
    def chat(self):
        return self.app.chat

    def factory(self, spec: Options):
        engine = GatedEngine(spec)
        self.engines.append(engine)
        return engine


def make_app(tiny, tmp_path: Path, **settings) -> Harness:
    values = {"model": str(tiny.target_gguf), "max_tokens": 48, "stages": ("personal",)}
    values.update(settings)
    history = History.open(tmp_path / "history.sqlite")
    harness = Harness(None, history)
    harness.app = ChatApp(Settings(**values), history, engine_factory=harness.factory,
                          engine_spec=SPEC, settings_file=tmp_path / "settings.json")
    return harness


@asynccontextmanager
async def running_chat(tiny, tmp_path: Path, size: tuple[int, int], **settings):
    """The chat on the tiny real model, run under Pilot until its engine is ready: (harness, pilot)."""
    harness = make_app(tiny, tmp_path, **settings)
    async with harness.app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: ready(harness), what="engine ready")
        yield harness, pilot


async def submit_prompt(pilot, chat, text: str) -> None:
    """Type `text` into the chat screen's prompt and press Enter."""
    chat.query_one("#prompt").text = text
    await pilot.press("enter")


async def type_and_send(pilot, harness: Harness, text: str) -> None:
    await submit_prompt(pilot, harness.chat, text)


async def send_and_hold(pilot, harness: Harness, text: str) -> None:
    """Send `text` and let the reply run until its first token, then hold the engine's events
    (GatedEngine) so the test acts while the screen shows a partial reply."""
    harness.engine.hold_after_first_token = True
    await type_and_send(pilot, harness, text)
    await wait_until(pilot, lambda: harness.engine.holding, what="first token")


def ready(harness: Harness) -> bool:
    return harness.chat is not None and harness.chat.ready is not None


def replied(harness: Harness) -> bool:
    """No reply in flight, and the screen has finished marking the last one."""
    from localspec.app.tui.widgets import MessageView

    return harness.chat.reply is None and all(v.state != "streaming"
                                              for v in harness.chat.query(MessageView))


__all__ = ["Done", "Ready", "Harness", "make_app", "running_chat", "wait_until", "submit_prompt",
           "type_and_send", "send_and_hold", "ready", "replied"]


# ---- deterministic content for snapshots (no live engine output) ---------------------------------
DEMO_READY = Ready(model="/models/qwen2.5-coder-7b-instruct-q4_k_m.gguf",
                   draft="/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                   device="GPU (NVIDIA GeForce RTX 4090)", gpu_layers=28,
                   stages=["maxgram", "personal-ngram", "gguf-draft"])
DEMO_STATS = {"prompt_tokens": 31, "tokens": 88, "target_calls": 30, "tokens_per_call": 2.93,
              "tokens_per_second": 142.3, "plain_tok_s": 81.6,
              "stages": [{"name": "maxgram", "proposed": 41, "accepted": 30, "acceptance": 0.7317},
                         {"name": "personal-ngram", "proposed": 12, "accepted": 5,
                          "acceptance": 0.4167},
                         {"name": "gguf-draft", "proposed": 52, "accepted": 23,
                          "acceptance": 0.4423}]}
DEMO_REPLY = """Slicing with a step of -1 walks the string backwards:

```python
def reverse(s: str) -> str:
    return s[::-1]


assert reverse("localspec") == "cepslacol"
```

It runs in O(n) time and works for any Unicode string."""


class ScriptedEngine:
    """An engine that only reports it is ready (snapshots show stored conversations, never live
    output). It records the requests it is sent."""

    def __init__(self, spec: Options) -> None:
        self.spec, self.requests, self._events = spec, [], [DEMO_READY]

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...

    def poll(self, timeout: float | None = 0.0):
        return self._events.pop(0) if self._events else None

    def inject(self, event) -> None:
        self._events.append(event)

    def __getattr__(self, op: str):   # generate / stop / learn / forget
        return lambda *args, **kwargs: self.requests.append((op, args, kwargs))


def demo_segments(text: str) -> list[tuple[str, str]]:
    """The reply cut into pieces with a repeating pattern of proposers, like a real stream's."""
    cycle = ["target", "maxgram", "maxgram", "gguf-draft", "target", "personal-ngram", "gguf-draft"]
    pieces, i = [], 0
    for n, size in enumerate([3, 7, 2, 9, 4, 5, 11] * 20):
        if i >= len(text):
            break
        pieces.append((text[i:i + size], cycle[n % len(cycle)]))
        i += size
    return pieces


def demo_history(path: Path) -> History:
    history = History.open(path)
    older = history.new_conversation("Explain SQLite WAL mode")
    history.add_message(older.id, "user", "What does WAL mode change in SQLite?")
    r = history.begin_reply(older.id)
    history.finish_reply(r.id, "Readers no longer block the writer: changes go to a log first.",
                         "stopped")
    conv = history.new_conversation("Reverse a string in Python")
    history.add_message(conv.id, "user", "How do I reverse a string in Python?")
    r = history.begin_reply(conv.id)
    history.finish_reply(r.id, DEMO_REPLY, "complete", DEMO_STATS, demo_segments(DEMO_REPLY))
    return history


def demo_app(tmp_path: Path, **settings) -> ChatApp:
    values = {"model": "qwen2.5-coder-7b"}
    values.update(settings)
    return ChatApp(Settings(**values), demo_history(tmp_path / "history.sqlite"),
                   engine_factory=ScriptedEngine, engine_spec=SPEC,
                   settings_file=tmp_path / "settings.json")


async def save_demo_screenshots(folder: Path) -> None:
    """docs/chat.svg and docs/chat-colours.svg (the README's): `python tests/tui_support.py docs`."""
    import re
    import tempfile

    for name, keys in (("chat", []), ("chat-colours", ["ctrl+t"])):
        app = demo_app(Path(tempfile.mkdtemp()))
        async with app.run_test(size=(120, 34)) as pilot:
            await pilot.press(*keys)
            await pilot.pause()
            svg = app.export_screenshot()
        # local fonts only: the image fetches nothing when viewed
        svg = re.sub(r',\s*url\("https://[^"]+"\) format\("[^"]+"\)', "", svg)
        (folder / f"{name}.svg").write_text(svg)


if __name__ == "__main__":
    import asyncio
    import sys

    asyncio.run(save_demo_screenshots(Path(sys.argv[1])))
