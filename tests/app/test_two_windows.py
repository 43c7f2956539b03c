"""Two chat windows on one data dir (issue 20): a conversation is written by one window at a time
(app/leases.py). The other shows it read-only and never appends to it; a lease held by a killed
process does not block; a reply still streaming in one window is not marked interrupted when
another opens the history."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from tui_support import SPEC, ScriptedEngine, demo_history, wait_until

from localspec.app.engine_proc import Done
from localspec.app.history import History
from localspec.app.settings import Settings
from localspec.app.tui.app import ChatApp
from localspec.app.tui.widgets import MessageView
from localspec.engine.errors import LocalspecError

TIMEOUT_S = 30


def test_a_conversation_is_written_by_one_history_at_a_time(tmp_path):
    path = tmp_path / "history.sqlite"
    with History.open(path) as a:
        conv = a.new_conversation("mine")
        a.add_message(conv.id, "user", "hello")
        reply = a.begin_reply(conv.id)
        a.checkpoint(reply.id, "Hi", [("Hi", "target")])
        with History.open(path) as b:
            assert b.messages(conv.id)[-1].state == "streaming"      # a is still writing it
            assert not b.claim(conv.id) and b.holder(conv.id) == os.getpid()
            for write in (lambda: b.add_message(conv.id, "user", "interleaved"),
                          lambda: b.begin_reply(conv.id), lambda: b.truncate(conv.id, 1),
                          lambda: b.rename(conv.id, "theirs"), lambda: b.delete(conv.id)):
                with pytest.raises(LocalspecError, match="open in another window"):
                    write()
            a.checkpoint(reply.id, "Hi Bob", [("Hi", "target"), (" Bob", "target")])
            a.finish_reply(reply.id, "Hi Bob", "complete")
            theirs = b.new_conversation("theirs")                    # b writes its own
            b.add_message(theirs.id, "user", "x")
            assert not a.claim(theirs.id)
            a.release(conv.id)                                        # a moves on
            assert b.claim(conv.id)
            b.add_message(conv.id, "user", "now from b")
            assert not a.claim(conv.id)
        assert a.claim(conv.id)                                       # b closed: its leases went
        assert [(m.content, m.state) for m in a.messages(conv.id)] == [
            ("hello", "complete"), ("Hi Bob", "complete"), ("now from b", "complete")]
        a.delete(conv.id)
        assert a.claim(theirs.id) and a.conversation(conv.id) is None


# A window that streams a reply, then is killed -9 mid-reply.
WINDOW = textwrap.dedent("""
    import sys, time
    from localspec.app.history import History
    h = History.open(sys.argv[1])
    conv = h.new_conversation("streaming")
    reply = h.begin_reply(conv.id)
    h.checkpoint(reply.id, "partly", [("partly", "target")])
    print(conv.id, flush=True)
    time.sleep(600)
""")


def test_a_lease_held_by_a_killed_window_does_not_block(tmp_path):
    path = tmp_path / "history.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", WINDOW, str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        conv_id = proc.stdout.readline().strip()
        with History.open(path) as h:
            assert h.messages(conv_id)[-1].state == "streaming"     # alive: not interrupted
            assert not h.claim(conv_id) and h.holder(conv_id) == proc.pid
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT_S)
            assert h.claim(conv_id)                                  # the kernel dropped its lock
            h.add_message(conv_id, "user", "carry on")
        with History.open(path) as h:
            assert [(m.content, m.state) for m in h.messages(conv_id)] == [
                ("partly", "partial"), ("carry on", "complete")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _notice(app) -> str:
    notice = app.chat.query_one("#notice")
    return str(notice.render()) if notice.display else ""


@pytest.mark.anyio
async def test_the_second_window_shows_it_read_only_and_takes_over_when_it_is_free(tmp_path):
    path = tmp_path / "history.sqlite"
    demo_history(path).close()
    other = History.open(path)                          # the first window
    latest = other.conversations()[0]
    assert other.claim(latest.id)
    history = History.open(path)
    app = ChatApp(Settings(model="qwen2.5-coder-7b"), history, engine_factory=ScriptedEngine,
                  engine_spec=SPEC, settings_file=tmp_path / "settings.json")
    try:
        async with app.run_test(size=(110, 34)) as pilot:
            await pilot.pause()
            chat = app.chat
            assert chat.conversation.id == latest.id and chat.read_only
            assert "read-only" in _notice(app) and f"process {os.getpid()}" in _notice(app)
            before = other.messages(latest.id)
            prompt = chat.query_one("#prompt")
            prompt.text = "Typed in the second window."
            await pilot.press("enter")
            for key in ("ctrl+r", "ctrl+e", "ctrl+d", "f2"):         # nothing here writes to it
                await pilot.press(key)
            await pilot.pause()
            assert app.screen is chat and prompt.text == "Typed in the second window."
            assert other.messages(latest.id) == before and not app.engine.requests

            other.add_message(latest.id, "user", "Added in the first window.")
            other.release(latest.id)                         # the first window moves on
            await pilot.press("enter")
            await pilot.pause()
            shown = [v.content for v in chat.query(MessageView)]
            assert shown[-1] == "Added in the first window." and not chat.read_only
            assert "let go" in _notice(app) and prompt.text == "Typed in the second window."
            assert not app.engine.requests                   # not sent after unseen text

            await pilot.press("enter")                        # now it is sent
            await wait_until(pilot, lambda: app.engine.requests, timeout=TIMEOUT_S)
            rows = other.messages(latest.id)
            assert [m.content for m in rows[-3:-1]] == ["Added in the first window.",
                                                        "Typed in the second window."]
            assert not other.claim(latest.id)                # the second window holds it now

            await pilot.press("ctrl+n")                      # moves on, its reply still streaming
            assert not other.claim(latest.id)
            (_op, (request_id, *_), _kw) = app.engine.requests[-1]
            app.engine.inject(Done(request_id, "stop", "Done.", {}))
            await wait_until(pilot, lambda: chat.reply is None, timeout=TIMEOUT_S)
            assert other.claim(latest.id)                    # released once the reply ended
            assert other.messages(latest.id)[-1].content == "Done."
    finally:
        history.close()
        other.close()
