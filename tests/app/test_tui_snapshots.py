"""Snapshots of the main screens with fixed content (stored conversations, a scripted engine that
only reports Ready): the chat, the chat with token colouring, after an engine crash, settings,
and first run.
Update them after an intended change with: pytest tests/app/test_tui_snapshots.py --snapshot-update"""
from __future__ import annotations

import pytest
from tui_support import demo_app

from localspec.app.engine_proc import Crashed
from localspec.app.history import History
from localspec.app.settings import Settings
from localspec.app.tui.app import ChatApp

SIZE = (110, 34)


@pytest.fixture(autouse=True)
def no_installed_models(tmp_path, monkeypatch):
    """Snapshots never depend on models other tests installed."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))


async def _settle(pilot) -> None:
    # a blinking cursor is drawn or not by when the snapshot lands, which a loaded machine moves
    # (a fresh clone's make test failed on the cursor alone): steady for the snapshots
    for widget in pilot.app.screen.query("Input, TextArea"):
        widget.cursor_blink = False
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def test_chat_screen(snap_compare, tmp_path):
    assert snap_compare(demo_app(tmp_path), terminal_size=SIZE, run_before=_settle)


def test_chat_screen_token_colours(snap_compare, tmp_path):
    assert snap_compare(demo_app(tmp_path), terminal_size=SIZE, press=["ctrl+t"],
                        run_before=_settle)


def test_settings_screen(snap_compare, tmp_path):
    app = demo_app(tmp_path, temperature=0.7, system_prompt="You are a concise coding assistant.")
    assert snap_compare(app, terminal_size=SIZE, press=["ctrl+o"], run_before=_settle)


def test_first_run_screen(snap_compare, tmp_path):
    app = ChatApp(Settings(), History.open(tmp_path / "history.sqlite"),
                  settings_file=tmp_path / "settings.json")
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_chat_screen_after_an_engine_crash(snap_compare, tmp_path):
    app = demo_app(tmp_path)

    async def crash(pilot) -> None:
        await _settle(pilot)
        app.engine.inject(Crashed(-9, "llama_decode: ...\nggml: aborting", "GGML_ASSERT(...) failed"))
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=crash)
