"""Pilot tests of the chat's status bar (scripted engine): a first run's calibration is shown as it
goes, the speed-up against plain decoding waits until it rests on enough rounds, and a new engine
(a restart, another model) never shows the figures of the one before; an engine whose installed
draft head sits out on this machine says why."""
from __future__ import annotations

from dataclasses import replace

import pytest
from tui_support import DEMO_READY, DEMO_STATS, SPEC, ScriptedEngine, demo_history, submit_prompt

from localspec.app.engine_proc import Calibrating, Done
from localspec.app.settings import Settings
from localspec.app.tui.app import ChatApp
from localspec.app.tui.format import MIN_PLAIN_ROUNDS, MIN_ROUNDS
from localspec.app.tui.widgets import MessageView

SIZE = (110, 34)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def app_with(tmp_path, first_events: list) -> ChatApp:
    """The demo chat (stored conversations) over a scripted engine that starts with `first_events`."""
    class Engine(ScriptedEngine):
        def __init__(self, spec) -> None:
            super().__init__(spec)
            self._events = list(first_events)

    return ChatApp(Settings(model="qwen2.5-coder-7b"), demo_history(tmp_path / "history.sqlite"),
                   engine_factory=Engine, engine_spec=SPEC, settings_file=tmp_path / "settings.json")


def status(app: ChatApp) -> str:
    return str(app.chat.query_one("#status").render())


async def ticks(pilot) -> None:
    """A few of the app's timer ticks: it drains the engine's events 30 times a second."""
    await pilot.pause(0.15)


async def until(pilot, done, seconds: float = 10.0) -> None:
    """Let the app run until `done()` holds (its timer drains the engine's events): a fixed pause
    was too short for a reply's events on a loaded machine."""
    for _ in range(int(seconds / 0.05)):
        if done():
            return
        await pilot.pause(0.05)
    raise AssertionError("the chat screen did not get there in time")


async def reply_with(app: ChatApp, pilot, stats: dict) -> None:
    """Send a message; the scripted engine finishes the reply with `stats`."""
    sent = len(app.engine.requests)
    await submit_prompt(pilot, app.chat, "How do I reverse a string?")
    await until(pilot, lambda: len(app.engine.requests) > sent and app.chat.reply is not None)
    op, args, _ = app.engine.requests[-1]
    assert op == "generate"
    app.engine.inject(Done(args[0], "stop", "Use s[::-1].", stats))
    await until(pilot, lambda: app.chat.reply is None)
    await ticks(pilot)


async def test_a_first_runs_calibration_shows_in_the_status_bar_until_ready(tmp_path):
    app = app_with(tmp_path, [Calibrating("target 4 rows", step, 12) for step in (1, 2, 3)])
    async with app.run_test(size=SIZE) as pilot:
        await ticks(pilot)
        assert "Measuring this machine (first run): target 4 rows, 3/12" in status(app)
        app.engine.inject(DEMO_READY)
        await ticks(pilot)
        assert "Measuring" not in status(app)
        assert "qwen2.5-coder-7b-instruct-q4_k_m.gguf" in status(app)


async def test_an_engine_whose_installed_head_sits_out_says_why(tmp_path):
    reason = "its step costs 25% of the model's here (at most 15% pays); --head /h.npz uses it anyway"
    app = app_with(tmp_path, [replace(DEMO_READY, head_left_out=reason)])
    async with app.run_test(size=SIZE) as pilot:
        await ticks(pilot)
        notice = app.chat.query_one("#notice")
        assert notice.display and f"The draft head sits out on this machine: {reason}." in str(notice.render())
        app.engine.inject(DEMO_READY)              # another engine, whose head is in use
        await ticks(pilot)
        assert not notice.display


async def test_the_status_bar_opens_without_figures_of_an_earlier_run(tmp_path):
    """The conversation on screen was answered by an earlier engine: its reply keeps its own
    figures, the status bar shows none until this engine has replied."""
    app = app_with(tmp_path, [DEMO_READY])
    async with app.run_test(size=SIZE) as pilot:
        await ticks(pilot)
        assert "142.3 tok/s" in str(app.chat.query(MessageView).last().query_one(".msg-header").render())
        assert "tok/s" not in status(app) and "drafters: maxgram" in status(app)


async def test_vs_plain_waits_for_enough_rounds(tmp_path):
    app = app_with(tmp_path, [DEMO_READY])
    enough = {**DEMO_STATS, "target_calls": MIN_ROUNDS, "plain_rounds": MIN_PLAIN_ROUNDS}
    async with app.run_test(size=SIZE) as pilot:
        await ticks(pilot)
        await reply_with(app, pilot, {**enough, "target_calls": MIN_ROUNDS - 1})
        assert "142.3 tok/s" in status(app) and "vs plain …" in status(app) and "×" not in status(app)
        await reply_with(app, pilot, {**enough, "plain_rounds": MIN_PLAIN_ROUNDS - 1})
        assert "vs plain …" in status(app) and "×" not in status(app)
        await reply_with(app, pilot, enough)
        assert f"{142.3 / 81.6:.2f}× vs plain" in status(app)


async def test_a_restarted_engine_does_not_show_the_old_ones_figures(tmp_path):
    app = app_with(tmp_path, [DEMO_READY])
    enough = {**DEMO_STATS, "target_calls": MIN_ROUNDS, "plain_rounds": MIN_PLAIN_ROUNDS}
    async with app.run_test(size=SIZE) as pilot:
        await ticks(pilot)
        await reply_with(app, pilot, enough)
        assert "× vs plain" in status(app)
        await pilot.press("f5")
        await ticks(pilot)
        assert "restarting the engine" in status(app) and "tok/s" not in status(app)
        app.engine.inject(DEMO_READY)              # the engine is back (or another model's)
        await ticks(pilot)
        assert "tok/s" not in status(app) and "drafters: maxgram" in status(app)
