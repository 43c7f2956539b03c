"""A kill -9 of the chat UI mid-reply loses nothing already shown: every streamed piece is
checkpointed before it is shown (app/history.py, app/tui/reply.py)."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
from tui_support import make_app, ready, replied, type_and_send, wait_until

from localspec.app.history import History

# What the chat screen does per streamed piece: checkpoint, then show ("shown" on stdout).
WRITER = textwrap.dedent("""
    import sys
    from localspec.app.history import History
    h = History.open(sys.argv[1])
    conv = h.new_conversation("streaming")
    reply = h.begin_reply(conv.id)
    print("reply", reply.id, flush=True)
    text, segments, i = "", [], 0
    while True:
        piece = f"<{i}>"
        text += piece
        segments.append((piece, "target"))
        h.checkpoint(reply.id, text, segments)
        print("shown", piece, flush=True)
        i += 1
""")


def test_sigkill_mid_reply_keeps_every_piece_shown(tmp_path):
    path = tmp_path / "history.sqlite"
    rng = random.Random(4)
    replies: dict[int, str] = {}
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                                text=True)
        reply_id = int(proc.stdout.readline().split()[1])
        shown, wanted = "", rng.randint(1, 400)
        for line in proc.stdout:
            shown += line.split()[1]
            if len(shown) >= wanted:
                break
        time.sleep(rng.random() * 0.01)          # land anywhere in a later piece's write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        replies[reply_id] = shown
    with History.open(path) as h:
        assert h.integrity_ok()
        rows = {m.id: m for c in h.conversations() for m in h.messages(c.id)}
    for reply_id, shown in replies.items():
        reply = rows[reply_id]
        assert reply.state == "partial" and reply.content.startswith(shown), (shown, reply.content)
        assert "".join(t for t, _ in reply.segments) == reply.content



@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_chat_screen_saves_each_piece_before_showing_it(tiny, tmp_path, monkeypatch):
    """Held right after the first token (well within a second of the reply's start): what the
    screen shows is already committed, as another connection reads it."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    h = make_app(tiny, tmp_path)
    async with h.app.run_test(size=(110, 32)) as pilot:
        await wait_until(pilot, lambda: ready(h), what="engine ready")
        h.engine.hold_after_first_token = True
        await type_and_send(pilot, h, "Say hello to Bob.")
        await wait_until(pilot, lambda: h.engine.holding, what="first token")
        shown = h.chat.reply.view.content
        with sqlite3.connect(h.history.path) as other:
            saved, state = other.execute("SELECT content, state FROM messages WHERE id = ?",
                                         (h.chat.reply.message_id,)).fetchone()
        assert shown and (saved, state) == (shown, "streaming")
        h.engine.release()
        await wait_until(pilot, lambda: replied(h), what="reply")
