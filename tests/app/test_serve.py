"""`localspec serve` on the tiny models, through the real `openai` client (issue 44).

One server for the module, started as a user starts it (tests/serve_server.py); a few tests start
their own (an API key, a signal). What they hold: the client's plain and streamed replies are the
engine's own greedy replies, token for token; stop strings, usage and the statistics header; a
shared prefix served from the cache; several clients at once all answered, in order, or refused
with 503 and Retry-After, and the server healthy after; an API key checked; SIGINT and SIGTERM
end it cleanly with the engine process gone.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from serve_server import CLI, start_server

from localspec.app.history import History, history_path
from localspec.engine.options import Options
from localspec.engine.session import Session

CHAT = [{"role": "user", "content": "Write a function that returns the largest number in a list."}]
RAW = "class Stack:\n"
CTX = "2048"


@pytest.fixture(scope="module")
def server(tiny):
    served = start_server(tiny, "--ctx", CTX, "--fixed-budget", "--queue", "2", "--read-timeout", "2")
    yield served
    assert served.stop(signal.SIGTERM) == 0, served.log_text()[-2000:]


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def expected(tiny):
    """In-process greedy replies of the same target: (chat text, raw text)."""
    session = Session(Options(model=tiny.target_gguf, speculation=False, n_ctx=int(CTX)))
    try:
        chat = session.run(session.chat_prompt(CHAT), max_tokens=64)
        raw = session.run(session.raw_prompt(RAW), max_tokens=64)
    finally:
        session.close()
    return chat.text, len(chat.tokens), raw.text


def test_plain_and_streamed_replies_are_the_engines_own(client, expected):
    (model,) = client.models.list().data
    assert model.id == "target"
    plain = client.chat.completions.create(model=model.id, messages=CHAT, temperature=0, max_tokens=64)
    assert plain.choices[0].message.content == expected[0]
    assert plain.choices[0].finish_reason == "stop"
    assert plain.usage.completion_tokens == expected[1] and plain.usage.prompt_tokens > 0

    stream = client.chat.completions.create(model=model.id, messages=CHAT, temperature=0, max_tokens=64,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected[0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == expected[1]

    raw = client.completions.create(model=model.id, prompt=RAW, temperature=0, max_tokens=64)
    assert raw.choices[0].text == expected[2]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model.id, prompt=RAW, temperature=0, max_tokens=64, stream=True))
    assert streamed == expected[2]


def test_stop_strings_max_tokens_and_the_statistics_header(client, expected):
    stop = expected[2][12:16]
    raw = client.completions.create(model="target", prompt=RAW, max_tokens=64, stop=[stop])
    assert raw.choices[0].text == expected[2][:expected[2].index(stop)]
    assert raw.choices[0].finish_reason == "stop"

    short = client.chat.completions.create(model="target", messages=CHAT, max_completion_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3

    response = client.chat.completions.with_raw_response.create(model="target", messages=CHAT, max_tokens=16)
    header = response.headers["x-localspec-stats"]
    assert "tokens_per_call=" in header and "accepted=" in header and "gguf-draft:" in header
    assert response.parse().choices[0].message.content


def test_a_shared_prefix_is_served_from_the_cache(client):
    system = {"role": "system", "content": "You review Python code. " * 40}
    first = client.chat.completions.create(model="target", messages=[system, *CHAT], max_tokens=8)
    turn = [system, *CHAT, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Now make it shorter."}]
    second = client.chat.completions.create(model="target", messages=turn, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 2, (cached, first.usage.prompt_tokens)


def test_refusals_name_the_parameter(client):
    for kwargs, param in [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"),
                          ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
                          ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10**6}, "max_tokens"),
                          ({"temperature": 7}, "temperature"), ({"presence_penalty": 1.0}, "presence_penalty")]:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="target", messages=CHAT, **kwargs)
        assert err.value.status_code == 400 and err.value.body["param"] == param, (kwargs, err.value.body)
        assert "Traceback" not in err.value.message


def test_several_clients_at_once_are_answered_in_order_or_refused(server, client):
    """Queue of 2. With the engine paused (SIGSTOP), 8 requests at once: one runs, two wait, five
    are refused at once with 503 and Retry-After; resumed, the three finish in arrival order. Then
    8 at once on a running engine: each answered or refused, none lost, answered in order."""
    (engine,) = _children(server.proc.pid)
    os.kill(engine, signal.SIGSTOP)
    try:
        paused = _at_once(server, 8, until=lambda results: len(results) >= 5)   # the refusals
    finally:
        os.kill(engine, signal.SIGCONT)
    results = paused.join()
    answered, refused = _answered_in_order(server, results)
    # one running and two waiting (two when the second arrives before the runner took the first)
    assert len(answered) in (2, 3) and len(refused) == 8 - len(answered)
    assert all('"code":"queue_full"' in body and int(retry) >= 1 for body, retry in refused)
    answered, refused = _answered_in_order(server, _at_once(server, 8).join())
    assert len(answered) + len(refused) == 8 and answered
    assert server.healthy()
    assert client.chat.completions.create(model="target", messages=CHAT, max_tokens=4).choices


class _Clients:
    def __init__(self, threads: list[threading.Thread], results: dict) -> None:
        self.threads, self.results = threads, results

    def join(self) -> dict:
        for t in self.threads:
            t.join(timeout=120)
        return self.results


def _at_once(server, n: int, until=None) -> _Clients:
    """n clients posting at the same moment; returns once `until(results)` holds (or at once)."""
    results: dict[int, tuple] = {}
    barrier = threading.Barrier(n)

    def send(i: int) -> None:
        with httpx.Client(timeout=120) as http:
            barrier.wait()
            r = http.post(f"{server.url}/chat/completions", json={
                "model": "target", "messages": [{"role": "user", "content": f"Write function number {i}."}],
                "temperature": 2.0, "top_k": 0, "seed": i, "max_tokens": 40})
        results[i] = (r.status_code, time.monotonic(), r.json()["id"] if r.status_code == 200 else r.text,
                      r.headers.get("retry-after"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while until is not None and not until(dict(results)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _Clients(threads, results)


def _answered_in_order(server, results: dict) -> tuple[list, list]:
    """The answered request ids, the refused (body, Retry-After); none lost, and the answered
    finished in arrival order (ids are given in arrival order; the server logs each request as it
    ends)."""
    assert len(results) == 8 and {code for code, *_ in results.values()} <= {200, 503}, results
    answered = sorted((int(rid.split("-")[1]) for code, _, rid, _ in results.values() if code == 200))
    # the server logs a request once its response is out: the client can hold it first
    deadline = time.monotonic() + 10
    while True:
        ended = [int(m) for m in re.findall(r" 200 \d+ ms req-(\d+) ", server.log_text())]
        if set(answered) <= set(ended) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [i for i in ended if i in answered] == answered
    return answered, [(body, retry) for code, _, body, retry in results.values() if code == 503]


def test_an_api_key_is_checked_and_required_beyond_this_machine(tiny):
    refused = subprocess.run([*CLI, "serve", "--model", str(tiny.target_gguf), "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--api-key" in refused.stderr and "Traceback" not in refused.stderr

    key = "s3cret-key-for-tests"
    served = start_server(tiny, "--ctx", CTX, "--fixed-budget", "--no-personal", env={"LOCALSPEC_API_KEY": key})
    try:
        assert "s3cret" not in " ".join(served.lines)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=served.url, api_key="wrong-key-123", max_retries=0).models.list()
        good = openai.OpenAI(base_url=served.url, api_key=key, max_retries=0)
        assert good.chat.completions.create(model="target", messages=CHAT, max_tokens=4).choices
        assert served.healthy()   # /health needs no key
    finally:
        assert served.stop(signal.SIGTERM) == 0


@pytest.mark.slow   # kills an engine
def test_history_is_opt_in_the_time_limit_ends_a_reply_and_a_crash_is_survived(client, tiny, tmp_path):
    """The module's server keeps nothing; one with --history keeps each exchange. --timeout ends
    a long reply there (finish_reason length); a killed engine answers its request 500 and is
    restarted, and the next request is served."""
    assert client.chat.completions.create(model="target", messages=CHAT, max_tokens=4).choices
    if history_path().exists():
        with History.open() as history:
            assert not [c for c in history.conversations() if c.title.startswith("serve: ")]
    data = tmp_path / "data"
    served = start_server(tiny, "--ctx", CTX, "--fixed-budget", "--no-personal", "--history", "--timeout", "3",
                          env={"LOCALSPEC_DATA_DIR": str(data)})
    try:
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="target", messages=CHAT, max_tokens=16)
        # the engine paused past the time limit: the running reply ends there (length), the one
        # waiting behind it is refused (503 timeout)
        (engine,) = _children(served.proc.pid)
        outcomes = {}

        def late(name: str) -> None:
            try:
                outcomes[name] = client.chat.completions.create(model="target", messages=CHAT, max_tokens=64)
            except openai.APIStatusError as err:
                outcomes[name] = err

        os.kill(engine, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            first, second = (threading.Thread(target=late, args=(n,)) for n in ("first", "second"))
            first.start()
            time.sleep(0.3)
            second.start()
            time.sleep(3.5)
        finally:
            os.kill(engine, signal.SIGCONT)
        first.join(timeout=60)
        second.join(timeout=60)
        assert outcomes["first"].choices[0].finish_reason == "length" and time.monotonic() - t0 < 3 + 10
        assert outcomes["second"].status_code == 503 and outcomes["second"].body["code"] == "timeout"

        crashed = {}

        def ask() -> None:
            try:
                client.chat.completions.create(model="target", messages=CHAT, temperature=2.0, top_p=1.0,
                                               extra_body={"top_k": 0}, max_tokens=1500)
            except openai.InternalServerError as err:
                crashed["error"] = err

        asking = threading.Thread(target=ask)
        os.kill(engine, signal.SIGSTOP)   # held: the request is in the engine's hands when it dies,
        asking.start()                    # whenever a sampled reply would have ended
        time.sleep(0.5)
        os.kill(engine, signal.SIGKILL)
        asking.join(timeout=60)
        assert crashed["error"].status_code == 500 and crashed["error"].body["code"] == "engine_crashed"
        deadline = time.monotonic() + 60
        while not served.healthy() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.chat.completions.create(model="target", messages=CHAT, max_tokens=4).choices
    finally:
        assert served.stop(signal.SIGTERM) == 0
    with History.open(history_path(data)) as history:
        kept = history.conversations()
        texts = [[m.content for m in history.messages(c.id)] for c in kept]
    assert [CHAT[0]["content"], reply.choices[0].message.content] in texts
    assert all(c.title.startswith("serve: ") for c in kept)


def test_history_feeds_the_personal_ngrams_as_the_chat_does(tiny, tmp_path):
    """With --history a complete exchange is learnt under its conversation's id (so deleting it
    in the chat forgets it); without, nothing is."""
    from localspec.models.ngram_store import NgramStore, store_paths

    data = tmp_path / "data"
    served = start_server(tiny, "--ctx", CTX, "--fixed-budget", "--history", env={"LOCALSPEC_DATA_DIR": str(data)})
    try:
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
        assert client.chat.completions.create(model="target", messages=CHAT, max_tokens=16).choices
        # the learn is the engine's next request: one more reply has waited for it
        assert client.chat.completions.create(model="target", messages=CHAT, max_tokens=2).choices
    finally:
        assert served.stop(signal.SIGTERM) == 0, served.log_text()[-2000:]
    with History.open(history_path(data)) as history:
        kept = {c.id for c in history.conversations()}
    learnt = set()
    for path in store_paths(data):
        with NgramStore.open_existing(path) as store:
            learnt |= {s.name for s in store.info().sources if s.kind == "conversation"}
    assert len(kept) == 2 and learnt == kept


def test_sigint_mid_stream_ends_the_server_and_its_engine(tiny):
    served = start_server(tiny, "--ctx", CTX, "--fixed-budget", "--no-personal")
    engines = _children(served.proc.pid)
    assert engines
    with httpx.stream("POST", f"{served.url}/chat/completions", timeout=60, json={
            "messages": CHAT, "stream": True, "temperature": 2.0, "top_k": 0, "max_tokens": 1500}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        t0 = time.monotonic()
        status = served.stop(signal.SIGINT)
    assert status == 130 and time.monotonic() - t0 < 15
    assert "Traceback" not in served.log_text()
    for pid in engines:
        assert not _alive(pid)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the engine process of a server), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue   # it exited meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:       # a zombie has exited
        return f.read().split(")")[-1].split()[0] != "Z"
