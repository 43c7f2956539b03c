"""Chat history: conversations, message states, search, and durability under kill -9."""
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

from localspec.app.history import History
from localspec.engine.errors import LocalspecError


def test_conversations_messages_and_states(tmp_path):
    with History.open(tmp_path / "h.sqlite") as h:
        a = h.new_conversation("First   chat\n")
        b = h.new_conversation()
        assert a.title == "First chat" and b.title == "New chat"
        h.add_message(a.id, "user", "hello there")
        reply = h.begin_reply(a.id)
        h.checkpoint(reply.id, "Hi", [("Hi", "target")])
        done = h.finish_reply(reply.id, "Hi Bob", "complete", {"tokens": 3},
                              [("Hi", "target"), (" Bob", "maxgram")])
        assert (done.state, done.content, done.stats) == ("complete", "Hi Bob", {"tokens": 3})
        assert done.segments == (("Hi", "target"), (" Bob", "maxgram"))
        assert [m.seq for m in h.messages(a.id)] == [1, 2]
        assert [c.id for c in h.conversations()] == [a.id, b.id]   # a was used last
        h.rename(b.id, "Renamed")
        assert h.conversation(b.id).title == "Renamed"
        h.truncate(a.id, 2)
        assert [m.role for m in h.messages(a.id)] == ["user"]
        h.delete(a.id)
        assert [c.id for c in h.conversations()] == [b.id] and h.messages(a.id) == []
        with pytest.raises(LocalspecError, match="Conversation not found"):
            h.add_message(a.id, "user", "x")
        with pytest.raises(LocalspecError):
            h.rename(a.id, "x")


def test_search_titles_and_contents(tmp_path):
    with History.open(tmp_path / "h.sqlite") as h:
        a = h.new_conversation("Quicksort in Python")
        b = h.new_conversation("Other")
        h.add_message(b.id, "user", "what does 100% of x_y mean?")
        c = h.new_conversation("Nothing")
        assert [x.id for x in h.search("quicksort")] == [a.id]
        assert [x.id for x in h.search("100%")] == [b.id]        # LIKE wildcards are literal
        assert [x.id for x in h.search("x_y")] == [b.id]
        assert h.search("absent") == []
        assert {x.id for x in h.search("  ")} == {a.id, b.id, c.id}


def test_streaming_reply_left_by_a_dead_process_becomes_partial(tmp_path):
    path = tmp_path / "h.sqlite"
    h = History.open(path)
    conv = h.new_conversation()
    reply = h.begin_reply(conv.id)
    h.checkpoint(reply.id, "half a rep")
    h.close()                                   # as if the process died here
    with History.open(path) as again:
        (msg,) = again.messages(conv.id)
        assert (msg.state, msg.content) == ("partial", "half a rep")


def test_unusable_and_newer_files_are_explained(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LocalspecError, match="unusable"):
        History.open(bad)
    newer = tmp_path / "newer.sqlite"
    History.open(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute("INSERT INTO schema_version VALUES (99, 'future', 0)")
    with pytest.raises(LocalspecError, match="newer"):
        History.open(newer)


WRITER = textwrap.dedent("""
    import sys
    from localspec.app.history import History
    h = History.open(sys.argv[1])
    conv = h.new_conversation("durability")
    print("conv", conv.id, flush=True)
    i = 0
    while True:
        m = h.add_message(conv.id, "user", f"message {i}")
        print("ack", m.id, f"message {i}", flush=True)
        r = h.begin_reply(conv.id)
        h.checkpoint(r.id, f"reply {i} part")
        h.finish_reply(r.id, f"reply {i} " + "x" * 2000, "complete", {"i": i})
        print("ack", r.id, f"reply {i}", flush=True)
        i += 1
""")


def test_kill_minus_9_loses_nothing_acknowledged(tmp_path):
    """A writer prints an ack after each commit; SIGKILL at random moments, five times over the
    same file: every acked message is there, in its final state, and the file is intact."""
    path = tmp_path / "h.sqlite"
    rng = random.Random(5)
    acked: dict[int, str] = {}
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                                text=True)
        wanted = rng.randint(3, 60)
        lines = 0
        for line in proc.stdout:
            kind, _, rest = line.partition(" ")
            if kind == "ack":
                mid, _, text = rest.partition(" ")
                acked[int(mid)] = text.strip()
                lines += 1
                if lines >= wanted:
                    break
        time.sleep(rng.random() * 0.02)          # land at a random point of a later write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with History.open(path) as h:
        assert h.integrity_ok()
        rows = {m.id: m for c in h.conversations() for m in h.messages(c.id)}
    for mid, text in acked.items():
        assert mid in rows, f"acked message {mid} ({text}) lost"
        msg = rows[mid]
        assert msg.content.startswith(text)
        if msg.role == "assistant":
            assert msg.state == "complete" and msg.stats is not None
    assert all(m.state != "streaming" for m in rows.values())   # a half reply is 'partial'
