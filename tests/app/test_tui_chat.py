"""Pilot tests of the chat screen on the tiny real model and the real engine process:
send -> stream -> finish, Esc mid-reply, switching and deleting conversations (deleting forgets
them in the personal n-gram store), and the engine killed mid-reply."""
from __future__ import annotations

import os
import signal

import pytest
from tui_support import ready, replied, running_chat, send_and_hold, type_and_send, wait_until

from localspec.app.tui.widgets import MessageView
from localspec.models.ngram_store import NgramStore, store_paths

SIZE = (110, 32)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    """The engine's personal n-gram store lives in the test's folder."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))


def _store_conversations(root) -> set[str]:
    names = set()
    for path in store_paths(root):
        with NgramStore.open_existing(path) as store:
            names |= {s.name for s in store.info().sources if s.kind == "conversation"}
    return names


async def test_send_streams_and_finishes(tiny, tmp_path):
    async with running_chat(tiny, tmp_path, SIZE) as (h, pilot):
        assert "target.gguf" in str(h.chat.query_one("#status").render())
        await send_and_hold(pilot, h, "Say hello to Bob.")    # look at it mid-stream
        (conv,) = h.history.conversations()
        assert conv.title == "Say hello to Bob."
        user, reply = h.history.messages(conv.id)
        assert (user.state, reply.state) == ("complete", "streaming")   # committed before sending
        view = h.chat.query(MessageView).last()
        assert view.state == "streaming" and view.content == h.chat.reply.text != ""
        h.engine.release()
        await wait_until(pilot, lambda: replied(h), what="reply")
        user, reply = h.history.messages(conv.id)
        assert reply.state == "complete" and "Bob" in reply.content
        assert reply.stats["tokens"] > 0 and reply.stats["stages"]
        assert "".join(t for t, _ in reply.segments) == reply.content  # pieces as they streamed
        assert len(reply.segments) > 1
        view = h.chat.query(MessageView).last()
        assert (view.state, view.content) == ("complete", reply.content)
        assert "tok/s" in str(h.chat.query_one("#status").render())
        assert not h.chat.query_one("#prompt").text                  # the prompt was cleared
        await wait_until(pilot, lambda: conv.id in _store_conversations(tmp_path),
                         what="the personal store learns the exchange")


async def test_esc_stops_mid_reply_keeps_it_marked_and_next_message_works(tiny, tmp_path):
    async with running_chat(tiny, tmp_path, SIZE) as (h, pilot):
        await send_and_hold(pilot, h, "Write a function that adds 2 to a number.")
        shown = h.chat.reply.text
        assert shown and h.chat.reply.view.state == "streaming"
        await pilot.press("escape")
        assert h.chat.reply is None                           # stopped at once
        (conv,) = h.history.conversations()
        reply = h.history.messages(conv.id)[-1]
        assert (reply.state, reply.content) == ("stopped", shown)
        view = h.chat.query(MessageView).last()
        assert view.state == "stopped" and "stopped" in str(view.query_one(".msg-header").render())
        h.engine.release()                                    # the engine's late events are dropped
        await type_and_send(pilot, h, "Say hello to Bob.")
        await wait_until(pilot, lambda: replied(h), what="second reply")
        states = [(m.role, m.state) for m in h.history.messages(conv.id)]
        assert states == [("user", "complete"), ("assistant", "stopped"),
                          ("user", "complete"), ("assistant", "complete")]
        assert h.history.messages(conv.id)[1].content == shown
        assert "Bob" in h.history.messages(conv.id)[-1].content


async def test_switch_and_delete_conversations(tiny, tmp_path):
    async with running_chat(tiny, tmp_path, SIZE) as (h, pilot):
        await type_and_send(pilot, h, "Say hello to Bob.")
        await wait_until(pilot, lambda: replied(h), what="first reply")
        await pilot.press("ctrl+n")
        assert not h.chat.query(MessageView)                  # a fresh conversation
        await type_and_send(pilot, h, "Write a function that adds 2 to a number.")
        await wait_until(pilot, lambda: replied(h), what="second reply")
        second, first = h.history.conversations()             # most recent first
        await wait_until(pilot, lambda: _store_conversations(tmp_path) == {first.id, second.id},
                         what="both conversations learnt")

        sidebar = h.chat.query_one("#conversations")
        assert [item.name for item in sidebar.children] == [second.id, first.id]
        sidebar.focus()
        sidebar.index = 1
        await pilot.press("enter")                            # switch to the first one
        assert h.chat.conversation.id == first.id
        assert [v.content for v in h.chat.query(MessageView)] == \
            [m.content for m in h.history.messages(first.id)]

        await pilot.press("ctrl+d")
        await pilot.press("y")
        await pilot.pause()
        assert [c.id for c in h.history.conversations()] == [second.id]
        assert h.history.messages(first.id) == []
        assert [item.name for item in sidebar.children] == [second.id]
        assert h.chat.conversation.id == second.id           # the remaining one is shown
        await wait_until(pilot, lambda: _store_conversations(tmp_path) == {second.id},
                         what="the personal store forgets the deleted conversation")

        await pilot.press("ctrl+f")
        await pilot.press(*"adds 2")
        assert [item.name for item in sidebar.children] == [second.id]
        await pilot.press(*"zzz")
        assert list(sidebar.children) == []


async def test_engine_killed_mid_reply_ui_survives_and_restart_works(tiny, tmp_path):
    # temperature 2 with this seed: a long reply (~300 tokens), so the kill usually lands while
    # the engine is still generating; events it sent before dying are dropped either way, so the
    # UI sees exactly a reply cut off by a crash
    async with running_chat(tiny, tmp_path, SIZE, temperature=2.0, top_p=1.0, top_k=0, seed=1,
                            max_tokens=900) as (h, pilot):
        await send_and_hold(pilot, h, "Write a function that adds 2 to a number.")
        shown = h.chat.reply.text
        os.kill(h.engine.pid, signal.SIGKILL)
        await wait_until(pilot, lambda: h.engine.crash_held, what="the engine's death")
        h.engine.release(drop_all_but_crash=True)
        await wait_until(pilot, lambda: replied(h), what="the crash to be noticed")
        (conv,) = h.history.conversations()
        user, reply = h.history.messages(conv.id)
        assert (reply.state, reply.content) == ("error", shown)          # kept, marked
        notice = str(h.chat.query_one("#notice").render())
        assert "SIGKILL" in notice and "F5" in notice
        assert h.chat.query(MessageView).last().state == "error"
        assert h.app.is_running

        await pilot.press("f5")
        await wait_until(pilot, lambda: ready(h), what="engine ready after restart")
        assert not h.chat.query_one("#notice").display
        await type_and_send(pilot, h, "Say hello to Bob.")
        await wait_until(pilot, lambda: replied(h), what="reply after restart")
        assert [m.state for m in h.history.messages(conv.id)] == \
            ["complete", "error", "complete", "complete"]


async def test_quit_mid_reply_keeps_it_marked(tiny, tmp_path):
    async with running_chat(tiny, tmp_path, SIZE) as (h, pilot):
        await send_and_hold(pilot, h, "Say hello to Bob.")
        shown = h.chat.reply.text
        await pilot.press("ctrl+q")
    (conv,) = h.history.conversations()
    reply = h.history.messages(conv.id)[-1]
    assert (reply.state, reply.content) == ("stopped", shown)
    assert not h.engine.alive
