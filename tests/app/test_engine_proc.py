"""The engine process (app/engine_proc.py) on the tiny real models: what the UI relies on.

Streams equal the in-process engine's output; a stop ends a reply at once and leaves the engine
consistent; a killed engine is reported, not fatal, and restarts; a missing model is an Error;
learn/forget reach the personal n-gram store.
"""
from __future__ import annotations

import os
import signal
import struct
import time
from pathlib import Path

import pytest

from localspec.app.engine_main import STREAM_INTERVAL_S
from localspec.app.engine_proc import (CLOSE_GRACE, Calibrating, Crashed, Done, EngineProcess,
                                       Error, Ready, Token, telling_line, wait_for)
from localspec.engine.session import Session
from localspec.models.ngram_store import NgramStore, store_paths
from localspec.engine.options import Options

CHAT = [{"role": "user", "content": "Write a function that returns the largest number in a list."}]
RAW = "class Stack:\n"
# Near-uniform sampling: long replies (an end token is ~1 in 250 draws), so a stop or a kill
# lands mid-reply.
WILD = dict(temperature=50.0, top_k=0, top_p=1.0, max_tokens=1500)


@pytest.fixture()
def engine(tiny):
    proc = EngineProcess(Options(model=str(tiny.target_gguf), draft=str(tiny.draft_gguf), n_ctx=2048))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def expected(tiny):
    """In-process greedy replies of the same target: (chat text, chat tokens, raw text)."""
    session = Session(Options(model=tiny.target_gguf, speculation=False, n_ctx=2048))
    try:
        chat = session.run(session.chat_prompt(CHAT), max_tokens=64)
        raw = session.run(session.raw_prompt(RAW), max_tokens=64)
    finally:
        session.close()
    return chat.text, chat.tokens, raw.text


def ready(engine: EngineProcess) -> Ready:
    events = wait_for(engine, (Ready, Error), timeout=120)
    assert isinstance(events[-1], Ready), events
    return events[-1]


def reply(engine: EngineProcess, request_id: str) -> tuple[list[Token], Done]:
    events = wait_for(engine, (Done, Error), timeout=120)
    assert isinstance(events[-1], Done), events
    tokens = [e for e in events if isinstance(e, Token)]
    assert all(t.request_id == request_id for t in tokens)
    return tokens, events[-1]


def test_streams_equal_the_in_process_engine(engine, tiny, expected):
    info = ready(engine)
    assert info.device == "CPU" and info.gpu_layers == 0
    assert info.model == str(tiny.target_gguf) and info.draft == str(tiny.draft_gguf)
    assert info.stages == ["maxgram", "personal-ngram", "gguf-draft"]

    engine.generate("c1", CHAT, max_tokens=64)
    tokens, done = reply(engine, "c1")
    assert "".join(t.text for t in tokens) == done.text == expected[0]
    assert [i for t in tokens for i in t.tokens] == expected[1]
    assert all(len(t.sources) == len(t.tokens) for t in tokens)
    assert {s for t in tokens for s in t.sources} <= {"target", *info.stages}
    assert done.finish_reason == "stop" and done.stats["tokens"] == len(expected[1])
    assert done.stats["stages"] and "budget" in done.stats

    engine.generate_raw("r1", RAW, max_tokens=64)
    tokens, done = reply(engine, "r1")
    assert "".join(t.text for t in tokens) == done.text == expected[2]

    engine.generate("bad", CHAT, temperature=-1.0)        # a bad request: an Error, engine lives on
    (error,) = wait_for(engine, (Error,), timeout=60)
    assert error.request_id == "bad" and error.title == "Bad option value" and engine.alive
    assert "--temperature" in error.cause


def test_text_goes_out_at_most_once_an_interval_after_the_first(engine):
    """Every event wakes the parent and what it feeds (the screen, a server's client): after the
    first text, the rounds' text is gathered and sent at most once per STREAM_INTERVAL_S, none of
    it lost. The tiny models' rounds take a few ms, so a long reply has many more rounds than
    that allows."""
    ready(engine)
    engine.generate("w1", CHAT, **{**WILD, "max_tokens": 200})
    # a loaded machine starves llama.cpp's threads: a busy core made 400 such tokens outlast 120 s
    events = wait_for(engine, (Done, Error), timeout=600)
    assert isinstance(events[-1], Done), events[-1]
    tokens, done = [e for e in events if isinstance(e, Token)], events[-1]
    sent = [t for t in tokens if t.text]
    assert "".join(t.text for t in tokens) == done.text and len(done.text) > 0
    assert sum(len(t.tokens) for t in tokens) == done.stats["tokens"]
    assert len(sent) <= 2 + done.stats["wall_seconds"] / STREAM_INTERVAL_S, (len(sent), done.stats["wall_seconds"])


def test_the_template_renderer_is_up_before_ready(engine):
    """A first chat request pays no interpreter start: the engine process starts its chat-template
    worker (engine/chat.py) and compiles the model's template before it says Ready."""
    ready(engine)
    children = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == engine.pid]
    assert any(b"template_worker.py" in _cmdline(p) for p in children), children


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):   # gone meanwhile
        return None


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_stop_ends_a_reply_quickly_and_keeps_the_engine_consistent(engine, expected):
    ready(engine)
    # a stop string that never comes holds back the text's last 3 characters: the stop's last
    # round then carries text and no token, which must reach the stream too
    for seed in range(5):   # a sampled reply may end by itself before the stop lands: try again
        engine.generate_raw(f"long{seed}", RAW, seed=seed, stop=["\u27e6\u27e7\u27e6\u27e7"], **WILD)
        first = wait_for(engine, (Token, Done), timeout=60)[-1]
        asked = time.monotonic()
        engine.stop(f"long{seed}")
        events = wait_for(engine, (Done,), timeout=60)
        done = events[-1]
        if done.finish_reason == "stopped":
            break
    assert done.finish_reason == "stopped", "every sampled reply ended before its stop"
    assert time.monotonic() - asked < 5.0
    streamed = first.text + "".join(e.text for e in events if isinstance(e, Token))
    assert done.text == streamed and done.stats["tokens"] >= 1

    engine.generate_raw("after", RAW, max_tokens=64)
    _, done = reply(engine, "after")
    assert done.text == expected[2]

    engine.generate_raw("running", RAW, **WILD)      # a stop for a queued request: it never runs
    engine.generate_raw("queued", RAW, max_tokens=64)
    engine.stop("queued")
    engine.stop("running")
    dones = {}
    while len(dones) < 2:
        event = wait_for(engine, (Done,), timeout=60)[-1]
        dones[event.request_id] = event
    assert dones["queued"].finish_reason == "stopped" and dones["queued"].text == ""
    assert dones["running"].finish_reason in ("stopped", "stop")


def test_close_stops_a_running_reply_and_exits_cleanly(engine):
    ready(engine)
    engine.generate_raw("long", RAW, **WILD)
    wait_for(engine, (Token, Done), timeout=60)
    t0 = time.monotonic()
    engine.close()
    assert time.monotonic() - t0 < CLOSE_GRACE / 2 and not engine.alive   # not killed at the grace
    engine.close()                                                         # idempotent
    assert not [e for e in engine.events() if isinstance(e, (Crashed, Error))]


def test_a_killed_engine_is_reported_and_restarts(engine, expected):
    ready(engine)
    engine.generate_raw("doomed", RAW, **WILD)
    wait_for(engine, (Token, Done), timeout=60)
    os.kill(engine.pid, signal.SIGKILL)
    crash = wait_for(engine, (Crashed,), timeout=60)[-1]
    assert isinstance(crash, Crashed) and crash.exitcode == -signal.SIGKILL
    assert "SIGKILL" in crash.reason and not engine.alive

    engine.generate("lost", CHAT)                 # while down: an Error, not a hang
    assert wait_for(engine, (Error,), timeout=5)[-1].request_id == "lost"

    engine.restart()
    ready(engine)
    engine.generate_raw("again", RAW, max_tokens=64)
    _, done = reply(engine, "again")
    assert done.text == expected[2]

    os.kill(engine.pid, signal.SIGABRT)           # what a GGML_ASSERT does: stderr is quoted
    crash = wait_for(engine, (Crashed,), timeout=60)[-1]
    assert crash.exitcode == -signal.SIGABRT and "Fatal Python error: Aborted" in crash.detail


def patched_gguf(src: Path, dst: Path, key: str, value: int) -> Path:
    """A copy of a GGUF with one uint32 metadata value replaced (same size, so it passes the
    file checks and reaches llama.cpp)."""
    data = bytearray(src.read_bytes())
    name = key.encode()
    at = data.find(struct.pack("<Q", len(name)) + name)
    assert at >= 0, key
    at += 8 + len(name)
    assert struct.unpack_from("<I", data, at)[0] == 4   # GGUF_TYPE_UINT32
    struct.pack_into("<I", data, at + 4, value)
    dst.write_bytes(data)
    return dst


def test_an_abort_inside_llama_cpp_is_reported_and_restart_still_works(tiny, tmp_path):
    """block_count 0 passes the GGUF checks and trips a GGML_ASSERT, which aborts the process."""
    bad = patched_gguf(Path(tiny.target_gguf), tmp_path / "bad.gguf", "qwen2.block_count", 0)
    engine = EngineProcess(Options(model=str(bad), speculation=False, n_ctx=512))
    engine.start()
    try:
        crash = wait_for(engine, (Ready, Error), timeout=120)[-1]
        assert isinstance(crash, Crashed) and crash.exitcode == -signal.SIGABRT
        assert crash.cause.startswith("GGML_ASSERT(") and "GGML_ASSERT" in crash.reason
        assert "llama_model.py" in crash.detail       # faulthandler's Python traceback
    finally:
        engine.close()


def test_telling_line_picks_why_it_died():
    assert telling_line("x\n/src/ggml.c:12: GGML_ASSERT(a > 0) failed\nFatal Python error: Aborted\n"
                        "  File x") == "GGML_ASSERT(a > 0) failed"
    assert telling_line("CUDA error: out of memory\n  current device: 0") == "CUDA error: out of memory"
    assert telling_line("Traceback (most recent call last):\n  File 'a', line 1\nKeyError: 'x'\n") \
        == "KeyError: 'x'"
    assert telling_line("just noise\n") == ""


def test_use_draft_false_loads_no_draft_model(tiny):
    engine = EngineProcess(Options(model=str(tiny.target_gguf), draft=str(tiny.draft_gguf),
                                      use_draft=False, personal=False, n_ctx=512))
    engine.start()
    try:
        assert ready(engine).stages == ["maxgram"]
    finally:
        engine.close()


def test_a_first_run_reports_its_calibration_before_ready(tiny, tmp_path, monkeypatch):
    """On a fresh data dir the engine times batches before it is ready, and says so step by step
    (the chat shows it); the next start finds the measurement cached and says nothing."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))   # the child inherits it
    spec = Options(model=str(tiny.target_gguf), draft=str(tiny.draft_gguf), personal=False,
                      n_ctx=512, n_threads=1)

    def until_ready() -> list:
        engine = EngineProcess(spec)
        engine.start()
        try:
            events = wait_for(engine, (Ready, Error), timeout=180)
        finally:
            engine.close()
        assert isinstance(events[-1], Ready), events
        return events[:-1]

    first = until_ready()
    assert first and all(isinstance(e, Calibrating) for e in first)
    total = first[0].total
    assert [e.step for e in first] == list(range(1, total + 1)) and {e.total for e in first} == {total}
    assert {e.what.split()[0] for e in first} >= {"target", "draft"}
    assert until_ready() == []


def assert_exited_cleanly(engine: EngineProcess) -> None:
    """The engine process ends on its own after an Error at start, with no Crashed."""
    deadline = time.monotonic() + 30
    while engine.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.alive and engine.poll() is None


def test_missing_model_is_an_error_not_a_crash(tmp_path):
    engine = EngineProcess(Options(model=str(tmp_path / "nope.gguf")))
    engine.start()
    try:
        error = wait_for(engine, (Error,), timeout=120)[-1]
        assert isinstance(error, Error) and error.request_id is None
        assert error.title == "Model not found" and ".gguf" in error.fix
        assert_exited_cleanly(engine)
    finally:
        engine.close()


def _conversation_rows(name: str) -> int:
    total = 0
    for path in store_paths():
        with NgramStore.open_existing(path) as store:
            total += sum(s.n_ngrams for s in store.info().sources
                         if (s.kind, s.name) == ("conversation", name))
    return total


def test_learn_then_forget_changes_the_store(engine):
    ready(engine)
    name = f"conv-{os.getpid()}-{time.time_ns()}"
    engine.learn(name, CHAT + [{"role": "assistant", "content": "def largest(xs): return max(xs)"}])
    engine.generate_raw("barrier1", RAW, max_tokens=4)    # requests run in order
    reply(engine, "barrier1")
    assert _conversation_rows(name) > 0
    engine.forget(name)
    engine.generate_raw("barrier2", RAW, max_tokens=4)
    reply(engine, "barrier2")
    assert _conversation_rows(name) == 0


def test_forget_reaches_the_store_with_the_personal_drafter_off(engine, tiny):
    ready(engine)
    name = f"conv-{os.getpid()}-{time.time_ns()}"
    engine.learn(name, CHAT + [{"role": "assistant", "content": "def largest(xs): return max(xs)"}])
    engine.close()                                     # runs what it was sent, then exits
    assert _conversation_rows(name) > 0
    off = EngineProcess(Options(model=str(tiny.target_gguf), personal=False, n_ctx=512))
    off.forget(name)                                   # sent while down: runs once it is up
    off.start()
    try:
        assert "personal-ngram" not in ready(off).stages
        off.generate_raw("barrier", RAW, max_tokens=4)
        reply(off, "barrier")
        assert _conversation_rows(name) == 0
    finally:
        off.close()


def test_a_context_too_small_for_the_tree_is_an_error_each_time_not_an_abort(tiny):
    """chat --ctx 60 aborted inside llama.cpp, and F5 aborted again: the engine now refuses the
    context with the size that works, and a restart refuses it the same way."""
    engine = EngineProcess(Options(model=str(tiny.target_gguf), n_ctx=60))
    try:
        for begin in (engine.start, engine.restart):   # the first start, then what F5 does
            begin()
            error = wait_for(engine, (Error,), timeout=120)[-1]
            assert isinstance(error, Error), error
            assert error.title == "Context too small for speculation" and "--ctx 66" in error.fix
            assert_exited_cleanly(engine)
    finally:
        engine.close()


def test_a_conversations_cache_outlives_the_engine_process(tiny, tmp_path, monkeypatch):
    """The engine saves a conversation's cache when its reply ends; a new engine process (an app
    restart) loads it for that conversation's next turn and prefills only the new messages, with
    the reply a fresh prefill gives; deleting the conversation deletes its cache."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    spec = Options(model=str(tiny.target_gguf), n_ctx=1024, personal=False, use_draft=False)
    first = EngineProcess(spec)
    first.start()
    try:
        ready(first)
        first.generate("t1", CHAT, max_tokens=32, conversation="conv-a")
        _, done = reply(first, "t1")
    finally:
        first.close()
    saved = list((tmp_path / "kv-cache").glob("*/*.kv"))
    assert len(saved) == 1
    turn2 = CHAT + [{"role": "assistant", "content": done.text},
                    {"role": "user", "content": "Now make it return the smallest one."}]
    session = Session(Options(model=tiny.target_gguf, speculation=False, n_ctx=1024))
    try:
        want = session.run(session.chat_prompt(turn2), max_tokens=32)
    finally:
        session.close()
    second = EngineProcess(spec)
    second.start()
    try:
        ready(second)
        second.generate("t2", turn2, max_tokens=32, conversation="conv-a")
        _, done2 = reply(second, "t2")
        assert done2.stats["reused_tokens"] >= done.stats["prompt_tokens"] - 1
        assert done2.text == want.text
        second.forget("conv-a")
        deadline = time.monotonic() + 30
        while saved[0].exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not saved[0].exists()
    finally:
        second.close()


def test_a_chat_longer_than_the_context_goes_on_without_its_oldest_messages(tiny, tmp_path, monkeypatch):
    """The chat screen's path: the engine process fits a conversation that outgrew its context
    (engine/conversation.py) and says how many messages it left out; the reply still comes."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    proc = EngineProcess(Options(model=str(tiny.target_gguf), n_ctx=256, personal=False, use_draft=False))
    proc.start()
    try:
        ready(proc)
        messages = []
        for i in range(8):
            messages += [{"role": "user", "content": f"Question {i}: write a function that adds {i} to x."},
                         {"role": "assistant", "content": f"def add{i}(x):\n    return x + {i}\n" * 3}]
        messages.append({"role": "user", "content": "And one that adds 9?"})
        proc.generate("long", messages, max_tokens=16, system="Be brief.", conversation="c-long")
        _, done = reply(proc, "long")
        assert done.stats["dropped_messages"] > 0 and done.finish_reason in ("stop", "length")
        assert done.stats["prompt_tokens"] + 16 <= done.stats["context_size"] == 256
        proc.generate("next", messages + [{"role": "assistant", "content": done.text},
                                          {"role": "user", "content": "Thanks."}],
                      max_tokens=16, system="Be brief.", conversation="c-long")
        _, later = reply(proc, "next")
        assert later.stats["dropped_messages"] == done.stats["dropped_messages"]   # still out, no more
        assert later.stats["reused_tokens"] >= done.stats["prompt_tokens"] - 1     # the cache kept
    finally:
        proc.close()
