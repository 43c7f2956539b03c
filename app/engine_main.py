"""The engine process's side of app/engine_proc.py: `python -m localspec.app.engine_main`.

It reads JSON requests from stdin, one a line, and writes JSON events to its stdout, one a line.
The first request is {"op": "open", "spec": Options}; the rest are generate / stop / learn /
forget / exit. A thread reads stdin the whole time, so a stop reaches a running generation, which
checks for it between rounds and closes its stream there (the next generation keeps only the
target's cache that its prompt starts with, so the engine stays consistent). The protocol owns the real stdout: file descriptor 1 is pointed at
stderr, so anything llama.cpp or a library prints lands in the stderr file the parent quotes
after a crash. Requests run one at a time, in order; an unexpected exception is a bug and ends
the process with its traceback on stderr (the parent reports Crashed).
"""
from __future__ import annotations

import faulthandler
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Callable, Sequence

from localspec.engine.native import gpu_name  # first: llama.cpp before numpy/torch (engine/native.py)
from localspec.engine.calibrate import Step
from localspec.engine.config import SamplingParams
from localspec.engine.chat import warm
from localspec.engine.errors import LocalspecError
from localspec.engine.generation import Finished, Round
from localspec.engine.options import Options, check_values, sampling_of
from localspec.engine.session import Session
from localspec.engine.snapshots import Snapshots, snapshot_key
from localspec.models.paths import data_dir

from .engine_proc import Calibrating, Done, Error, Ready, Token, encode_event
from .run_options import resolved

# Text goes out at most once per STREAM_INTERVAL_S after the first (which goes at once): every
# event wakes the parent, and behind it the chat's screen or the server's client, and on a
# machine whose cores llama.cpp's threads all use, each wake-up stalls a decode in flight. A
# round can be a few ms on a GPU; 20 updates a second still reads as a stream
# (docs/decisions/0050).
STREAM_INTERVAL_S = 0.05


@dataclass(frozen=True)
class Chunk:
    """Text for one Token, with the tokens (and their proposers) of the rounds it came from."""

    text: str
    tokens: list[int]
    sources: list[str]


class Chunks:
    """The rounds' text in Chunks: the first text at once, then at most one Chunk per `interval`
    seconds (a round's text may be held back, its tokens with it); `finish` gives what is left,
    text or tokens. Rounds whose text is still held back by the detokeniser send their tokens
    with the next text, so a Chunk's pieces can be cut by token."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self._interval, self._clock = interval, clock
        self._text: list[str] = []
        self._tokens: list[int] = []
        self._sources: list[str] = []
        self._sent: float | None = None   # when the last text went out

    def add(self, text: str, tokens: Sequence[int], sources: Sequence[str]) -> Chunk | None:
        self._text.append(text)
        self._tokens.extend(tokens)
        self._sources.extend(sources)
        if text and (self._sent is None or self._clock() - self._sent >= self._interval):
            return self._take()
        return None

    def finish(self) -> Chunk | None:
        return self._take() if self._tokens or any(self._text) else None

    def _take(self) -> Chunk:
        chunk = Chunk("".join(self._text), self._tokens, self._sources)
        self._text, self._tokens, self._sources = [], [], []
        if chunk.text:
            self._sent = self._clock()
        return chunk


class Inbox:
    """Requests from stdin, read on a thread; stops are recorded the moment they arrive."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._requests: queue.Queue[dict | None] = queue.Queue()
        self._stopped: set[str] = set()
        self._lock = threading.Lock()
        self.closed = False              # stdin ended: the parent is gone or asked us to exit
        threading.Thread(target=self._read, args=(stream,), daemon=True, name="inbox").start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            request = json.loads(line)
            if request.get("op") == "stop":
                with self._lock:
                    self._stopped.add(str(request.get("id")))
                continue
            if request.get("op") == "exit":
                self.closed = True           # a running generation stops at its next round
            self._requests.put(request)
        self.closed = True
        self._requests.put(None)

    def get(self) -> dict | None:
        return self._requests.get()

    def stopped(self, request_id: str) -> bool:
        with self._lock:
            return self.closed or request_id in self._stopped

    def done(self, request_id: str) -> None:
        with self._lock:
            self._stopped.discard(request_id)


class Server:
    def __init__(self, session: Session, inbox: Inbox, out: IO[str]) -> None:
        self.session, self.inbox, self.out = session, inbox, out
        self._left_out: tuple = ()   # what the last chat request left out of its conversation
        self._dropped = 0            # how many messages that was
        self._conversation: str | None = None   # whose tokens the target's cache holds
        self.snapshots = Snapshots(data_dir() / "kv-cache", snapshot_key(session.model),
                                   cap_bytes=session.cfg.kv_cache_mb << 20,
                                   note=lambda line: print(line, file=sys.stderr))

    def send(self, event: Ready | Token | Done | Error) -> None:
        write_event(self.out, event)

    def serve(self) -> None:
        while (request := self.inbox.get()) is not None:
            op = request.get("op")
            if op == "exit":
                return
            try:
                if op == "generate":
                    self.generate(request)
                elif op == "learn":
                    self.session.learn(request["conversation"], self.session.chat_prompt(request["messages"]))
                elif op == "forget":
                    self.snapshots.forget(str(request["conversation"]))
                    forget(self.session, request["conversation"])
                else:
                    raise LocalspecError("Unknown engine request", repr(op),
                                         "Send generate, stop, learn, forget or exit")
            except LocalspecError as err:   # request_id None would mean "the engine failed to load"
                rid = request.get("id") or f"{op}:{request.get('conversation', '')}"
                self.send(Error(str(rid), err.title, err.cause, err.fix))

    def generate(self, request: dict) -> None:
        rid = str(request["id"])
        conversation = request.get("conversation")
        try:
            t0 = time.perf_counter()
            tokens, sampling, max_tokens = self._parse(request)
            if conversation != self._conversation:
                self._switch_to(conversation, tokens)
            prepared = time.perf_counter() - t0   # the template, the tokens, a saved cache restored
            self._stream(rid, tokens, sampling, max_tokens, _check_stop(request.get("stop") or []), prepared)
        finally:
            self.inbox.done(rid)
        if conversation is not None:   # its reply is out: keep its cache for the next time
            self.snapshots.save(conversation, self.session.engine.target)

    def _switch_to(self, conversation: str | None, tokens: list[int]) -> None:
        """Another conversation than the cache holds: its saved cache, where one holds more of
        the prompt than the target's cache now does (engine/snapshots.py)."""
        self._conversation = conversation
        if conversation is not None:
            self.snapshots.restore(conversation, self.session.engine.target, tokens[:-1])

    def _parse(self, request: dict) -> tuple[list[int], SamplingParams, int]:
        max_tokens = request["max_tokens"]
        check_values({"max_tokens": max_tokens})
        sampling = sampling_of(request["temperature"], request["top_p"], request["top_k"], request["seed"])
        if "prompt" in request:
            if not request["prompt"]:
                raise LocalspecError("Empty prompt", "the prompt is empty", "Pass some text")
            self._dropped = 0
            return self.session.raw_prompt(request["prompt"]), sampling, max_tokens
        messages = _check_messages(request["messages"])
        if request.get("system"):
            messages = [{"role": "system", "content": request["system"]}, *messages]
        # Esc reaches a render too: the template renders in a worker that a stop ends
        rid = str(request["id"])
        fitted = self.session.fit_chat(messages, max_tokens, self._left_out,
                                       should_stop=lambda: self.inbox.stopped(rid))
        self._left_out, self._dropped = fitted.left_out, fitted.dropped
        return fitted.tokens, sampling, max_tokens

    def _stream(self, rid: str, tokens: list[int], sampling: SamplingParams, max_tokens: int,
                stop: tuple[str, ...] = (), prepared: float = 0.0) -> None:
        """Send the rounds' text as Chunks make it (Chunks), then Done."""
        t0 = time.perf_counter()
        chunks = Chunks(STREAM_INTERVAL_S)
        first_text: list[float] = []   # seconds from t0 to the first Token with text sent

        def send(chunk: Chunk | None) -> None:
            if chunk is None:
                return
            pieces = split_by_source(chunk.text, chunk.tokens, self.session.model.piece)
            self.send(Token(rid, chunk.text, chunk.tokens, chunk.sources, pieces))
            if chunk.text and not first_text:
                first_text.append(time.perf_counter() - t0)

        # A stop is asked for between rounds: the engine ends there and finishes with its statistics.
        # reuse: the cache still holds the conversation's last turn, and this one starts with it
        stream = self.session.generate(tokens, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                       should_stop=lambda: self.inbox.stopped(rid), reuse=True)
        for event in stream:
            match event:
                case Round(text=text, tokens=toks, sources=sources):
                    send(chunks.add(text, toks, sources))
                case Finished(generation=result):
                    send(chunks.finish())
                    stats = stats_dict(result.stats)
                    stats["wall_seconds"] = round(time.perf_counter() - t0, 4)
                    # the first text's time beside the prefill's (stats' seconds): what came
                    # between the prefill's end and the first text, inside the engine
                    stats["first_text_seconds"] = round(first_text[0], 4) if first_text else None
                    stats["prepare_seconds"] = round(prepared, 4)   # before all of these
                    stats["dropped_messages"] = self._dropped
                    self.send(Done(rid, result.finish_reason, result.text, stats))


def stats_dict(stats) -> dict:
    """DecodeStats.to_dict() plus "plain_tok_s" and "plain_rounds": the adaptive budget's measured
    plain rate and the rounds it rests on (the chat shows a speed-up only on enough of them)."""
    out = stats.to_dict()
    plain = out.get("budget", {}).get("0")
    if plain and plain.get("rounds") and plain.get("tok_s"):
        out["plain_tok_s"] = plain["tok_s"]
        out["plain_rounds"] = plain["rounds"]
    return out


def forget(session: Session, conversation_id: str) -> None:
    """Forget a conversation in this vocabulary's store, even when the personal drafter is off
    (the store then opens only if it exists: forgetting must not create one)."""
    if session.store is not None:
        session.store.forget("conversation", conversation_id)
        return
    from localspec.models.ngram_store import NgramStore, store_path, vocab_key

    key = vocab_key(session.model)
    if store_path(key).exists():
        with NgramStore.open(key, label=session.model.path.name) as store:
            store.forget("conversation", conversation_id)


def split_by_source(text: str, tokens: list[int], piece) -> list[str]:
    """`text` cut into one piece per token, so the app can colour each token by its proposer.
    Exact when the text is the tokens' own pieces (the usual round); [] when it is not (a
    character split across rounds, a held-back stop-string prefix): the app then colours the
    round as a whole."""
    try:
        out = [piece(t).decode("utf-8") for t in tokens]
    except UnicodeDecodeError:
        return []
    return out if "".join(out) == text else []


def _check_messages(messages: object) -> list[dict]:
    ok = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages)
    if not ok:
        raise LocalspecError("Bad chat messages", f"expected a non-empty list of "
                             f"{{'role': str, 'content': str}}, got {str(messages)[:200]}",
                             "Send the conversation as role/content messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _check_stop(stop: object) -> tuple[str, ...]:
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise LocalspecError("Bad stop strings", f"expected a list of non-empty strings, got {str(stop)[:200]}",
                             "Send stop as a list of strings")
    return tuple(stop)


def write_event(out: IO[str], event: Calibrating | Ready | Token | Done | Error) -> None:
    out.write(encode_event(event) + "\n")
    out.flush()


def open_session(spec: Options, out: IO[str]) -> Session:
    """The session `spec` asks for; a first calibration's steps go to the UI as they start."""
    def progress(step: Step) -> None:
        write_event(out, Calibrating(step.what, step.step, step.total))

    return Session(resolved(spec), progress)


def ready_event(session: Session) -> Ready:
    model = session.model
    layers = 0
    device = "CPU"
    if model.n_gpu_layers != 0:
        gpu = gpu_name()
        if gpu is not None:
            blocks = model.info.n_layer
            layers = model.n_gpu_layers if model.n_gpu_layers >= 0 else int(blocks or 0)
            if blocks:
                layers = min(layers, int(blocks))
            device = f"GPU ({gpu})"
    return Ready(str(model.path), str(session.cfg.draft) if session.cfg.draft else None, device,
                 layers, [d.name for d in session.stages], session.head_left_out, model.n_ctx)


def _claim_stdout() -> IO[str]:
    """The protocol keeps the real stdout; fd 1 now points at stderr (the parent's log file)."""
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def main() -> int:
    out = _claim_stdout()
    faulthandler.enable()                          # a segfault leaves a Python traceback too
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C belongs to the UI
    inbox = Inbox(sys.stdin.buffer)
    first = inbox.get()
    if first is None or first.get("op") != "open":
        return 0   # the parent went away (or closed) before opening an engine
    try:
        session = open_session(Options.from_json(first["spec"]), out)
    except LocalspecError as err:
        write_event(out, Error(None, err.title, err.cause, err.fix))
        return 0
    server = Server(session, inbox, out)
    try:
        warm(session.model)     # the first chat request as quick as the next (engine/chat.py)
        server.send(ready_event(session))
        server.serve()
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Not sys.exit: the inbox thread is blocked reading stdin, and interpreter shutdown aborts on
    # a daemon thread holding the buffered reader's lock. Everything is closed and flushed here.
    os._exit(code)
