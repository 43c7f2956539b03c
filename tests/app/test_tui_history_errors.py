"""A history that fails mid-chat (issue 20): the chat screen shows the error's title, cause and fix,
keeps what it shows and the unsent text, stops a reply in flight where its text was last saved,
and the command exits with status 2 when the user quits (app/tui/history_failure.py: history_failed).

The failure is real: another connection damages the history's schema while the chat runs (what
a damaged page that the check at open missed looks like to the next statement)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tui_support import demo_app, submit_prompt, wait_until

from localspec.app.engine_proc import Token
from localspec.app.tui.launch import exit_status
from localspec.app.tui.widgets import MessageView
from localspec.engine.errors import LocalspecError

SIZE = (110, 34)
BAD_ROOT = 99999          # a page past the end of the file
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _set_messages_root(path: Path, root: int) -> int:
    """Point the messages table at page `root` from another connection, as a damaged page would
    (or back at its own root); returns the root it had."""
    with sqlite3.connect(path, isolation_level=None) as other:
        other.execute("PRAGMA writable_schema = ON")     # read a damaged schema too
        (before,) = other.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'"
                                  ).fetchone()
        (version,) = other.execute("PRAGMA schema_version").fetchone()
        other.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = 'messages'", (root,))
        other.execute(f"PRAGMA schema_version = {version + 1}")
    other.close()
    return before


def _screen(app) -> list[tuple[str, str, str]]:
    return [(v.role, v.state, v.content) for v in app.chat.query(MessageView)]


def _notice(app) -> str:
    notice = app.chat.query_one("#notice")
    return str(notice.render()) if notice.display else ""


async def test_a_damaged_history_keeps_the_unsent_text_and_exits_2(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = _screen(app)
        assert shown and not _notice(app)
        _set_messages_root(app.history.path, BAD_ROOT)
        prompt = app.chat.query_one("#prompt")
        await submit_prompt(pilot, app.chat, "Please keep this text.")
        await pilot.pause()
        assert "Chat history is unusable" in _notice(app) and "Move" in _notice(app)   # the fix
        assert prompt.text == "Please keep this text."                # unsent, not lost
        assert _screen(app) == shown and not app.engine.requests     # nothing sent, screen kept
        assert app.is_running
        await pilot.press("ctrl+f")
        prompt.focus()
        await pilot.press("ctrl+r")                                   # another handler: same end
        await pilot.pause()
        assert app.is_running and _screen(app) == shown
        await pilot.press("ctrl+q")
    with pytest.raises(LocalspecError, match="damaged"):               # printed by the CLI: exit 2
        exit_status(app)


async def _send_prompt(app, pilot) -> None:
    """Type a prompt, send it, and wait until the engine has the generate request."""
    await pilot.pause()
    await submit_prompt(pilot, app.chat, "Say hello.")
    await wait_until(pilot, lambda: app.engine.requests, what="the generate request")


async def test_a_reply_in_flight_stops_where_it_was_last_saved(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _send_prompt(app, pilot)
        (op, (request_id, *_), _kw) = app.engine.requests[-1]
        assert op == "generate"
        reply_id = app.chat.reply.message_id
        app.engine.inject(Token(request_id, "Hel", [1], ["target"], ["Hel"]))
        await wait_until(pilot, lambda: app.chat.reply.text == "Hel", what="the first piece")
        root = _set_messages_root(app.history.path, BAD_ROOT)
        app.engine.inject(Token(request_id, "lo", [2], ["target"], ["lo"]))
        await wait_until(pilot, lambda: app.chat.reply is None, what="the reply stopped")
        await pilot.pause()
        last = app.chat.query(MessageView).last()
        assert (last.state, last.content) == ("error", "Hel")         # the unsaved piece not shown
        assert "not saved" in str(last.query_one(".msg-header").render())
        assert ("stop", (request_id,), {}) in app.engine.requests
        assert "Chat history is unusable" in _notice(app)
        await pilot.press("ctrl+q")
    with pytest.raises(LocalspecError):
        exit_status(app)
    _set_messages_root(app.history.path, root)                         # undo the damage: what was saved
    with sqlite3.connect(app.history.path) as db:
        saved = db.execute("SELECT content FROM messages WHERE id = ?", (reply_id,)).fetchone()
    assert saved == ("Hel",)


async def test_quitting_mid_reply_when_the_reply_cannot_be_saved_exits_2(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _send_prompt(app, pilot)
        _set_messages_root(app.history.path, BAD_ROOT)
        await pilot.press("ctrl+q")                    # saving the reply in flight fails
    assert app.history_failure is not None
    with pytest.raises(LocalspecError, match="damaged"):
        exit_status(app)
