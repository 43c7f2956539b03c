"""Conversation caches on disk (engine/snapshots.py), on the tiny real models: a conversation's
cache saved by one session and loaded by another (a restart) gives the tokens a fresh prefill
gives while prefilling only the new turn; a damaged, truncated or foreign snapshot is ignored
with a note and deleted, never handed to llama.cpp; the folder's cap evicts the least recently
used."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

from localspec.engine.options import Options
from localspec.engine.session import Session
from localspec.engine.snapshots import Snapshots, snapshot_key

MAX_TOKENS = 32
FIRST = [{"role": "user", "content": "Write a function that returns the largest number in a list."}]


def session_of(model) -> Session:
    return Session(Options(model, speculation=False, n_ctx=1024, n_threads=1, calibrate=False,
                           personal=False))


def first_turn(session: Session) -> list[dict]:
    """FIRST and its reply, the cache holding both; the conversation's next prompt's messages."""
    reply = session.run(session.chat_prompt(FIRST), max_tokens=MAX_TOKENS, reuse=True)
    return FIRST + [{"role": "assistant", "content": reply.text},
                    {"role": "user", "content": "Now make it return the smallest one."}]


@pytest.fixture()
def saved(tiny, tmp_path):
    """A conversation's first turn saved by a session that is then closed: (messages of the next
    turn, the snapshots, notes)."""
    notes: list[str] = []
    session = session_of(tiny.target_gguf)
    try:
        messages = first_turn(session)
        snaps = Snapshots(tmp_path / "kv", snapshot_key(session.model), note=notes.append)
        assert snaps.save("conv-1", session.engine.target)
        held = len(session.engine.target.tokens)
    finally:
        session.close()
    return messages, snaps, notes, held


def test_a_saved_conversation_restores_after_a_restart_and_prefills_only_the_new_turn(tiny, saved):
    messages, snaps, notes, held = saved
    later, fresh = session_of(tiny.target_gguf), session_of(tiny.target_gguf)
    try:
        prompt = later.chat_prompt(messages)
        restored = snaps.restore("conv-1", later.engine.target, prompt[:-1])
        assert restored.tokens > len(later.chat_prompt(FIRST)) - 1 and not notes
        got = later.run(prompt, max_tokens=MAX_TOKENS, reuse=True)
        want = fresh.run(prompt, max_tokens=MAX_TOKENS)
        assert got.stats.reused_tokens == restored.tokens
        assert got.tokens == want.tokens
    finally:
        later.close()
        fresh.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "pad", "header", "empty"])
def test_a_damaged_snapshot_is_ignored_with_a_note_and_deleted(tiny, saved, damage):
    messages, snaps, notes, held = saved
    path = snaps.path("conv-1")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) - 100] ^= 0x55          # inside the state: only the checksum can tell
    elif damage == "truncate":
        del data[len(data) // 2:]
    elif damage == "pad":
        data += b"\0" * 64
    elif damage == "header":
        data[20:30] = b"{{{{{{{{{{"
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    later = session_of(tiny.target_gguf)
    try:
        prompt = later.chat_prompt(messages)
        restored = snaps.restore("conv-1", later.engine.target, prompt[:-1])
        assert restored.tokens == 0 and restored.note and notes and not path.exists()
        assert later.engine.target.tokens == []
        later.run(prompt, max_tokens=4, reuse=True)   # the engine goes on, from a prefill
    finally:
        later.close()


def test_a_snapshot_is_not_opened_by_another_model_or_setting(tiny, saved, tmp_path):
    messages, snaps, notes, held = saved
    other = session_of(tiny.draft_gguf)      # the same vocabulary, other weights
    try:
        assert snapshot_key(other.model) != snaps.key
        theirs = Snapshots(snaps.root, snapshot_key(other.model), note=notes.append)
        prompt = other.chat_prompt(messages)
        assert theirs.restore("conv-1", other.engine.target, prompt[:-1]).tokens == 0
        assert other.engine.target.tokens == [] and not notes
        # the file itself, copied under the other key, is refused for naming another key
        theirs.folder.mkdir(parents=True, exist_ok=True)
        theirs.path("conv-1").write_bytes(snaps.path("conv-1").read_bytes())
        got = theirs.restore("conv-1", other.engine.target, prompt[:-1])
        assert got.tokens == 0 and "another model" in got.note
    finally:
        other.close()


def test_the_cap_evicts_the_least_recently_used_snapshot(tiny, tmp_path):
    session = session_of(tiny.target_gguf)
    try:
        first_turn(session)
        target = session.engine.target
        probe = Snapshots(tmp_path / "kv", snapshot_key(session.model))
        assert probe.save("a", target)
        size = probe.path("a").stat().st_size
        snaps = Snapshots(tmp_path / "kv", probe.key, cap_bytes=int(size * 2.5))
        assert snaps.save("b", target)
        os.utime(snaps.path("a"), (1, 1))        # a: used longest ago
        os.utime(snaps.path("b"), (2, 2))
        assert snaps.save("c", target)
        assert not snaps.path("a").exists() and snaps.path("b").exists() and snaps.path("c").exists()
        tiny_cap = Snapshots(tmp_path / "kv", probe.key, cap_bytes=size // 2)
        assert not tiny_cap.save("b", target) and not tiny_cap.path("b").exists()
    finally:
        session.close()


def test_a_q8_0_cache_is_another_setting_and_keeps_speculation_equal_to_plain(tiny, saved):
    """A q8_0 KV cache changes every cached number: its snapshots are under another key, and
    speculation verifies against it as plain decoding reads it (same greedy tokens)."""
    messages, snaps, notes, held = saved
    base = Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=1024, n_threads=1,
                   calibrate=False, personal=False, kv_type="q8_0")
    spec, plain = Session(base), Session(replace(base, speculation=False))
    try:
        assert spec.model.kv_type == plain.model.kv_type == "q8_0"
        assert snapshot_key(plain.model) != snaps.key
        prompt = plain.chat_prompt(messages)
        want = plain.run(prompt, max_tokens=MAX_TOKENS)
        got = spec.run(prompt, max_tokens=MAX_TOKENS)
        assert got.tokens == want.tokens and len(want.tokens) > 8
        assert got.stats.drafted_tokens > 0
    finally:
        spec.close()
        plain.close()
