"""The engine in its own process, behind one narrow interface: requests in, events out.

Why a process: llama.cpp aborts its whole process on a GGML_ASSERT (a malformed GGUF can trigger
one) and on some CUDA out-of-memory paths. In a child process that costs the engine, not the UI:
the parent sees its pipe close, reports `Crashed` with the tail of the child's stderr, and
`restart()` brings a fresh engine up with the same spec while the UI keeps the conversation.

Why a plain subprocess speaking JSON lines (not multiprocessing): the protocol is explicit and
small (app/engine_main.py holds the child's side), nothing is pickled, the child never re-imports
the UI's `__main__`, and its stderr goes to a file we can quote after a crash. The child runs in
its own session (a Ctrl-C in the terminal is the UI's to handle) and exits when its stdin closes,
so it never outlives the UI.

The UI never blocks: requests go through a writer thread, a reader thread turns the child's lines
into frozen event dataclasses on a queue, and `poll()` takes from that queue.
"""
from __future__ import annotations

import errno
import json
import os
import queue
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import IO, Iterator, Sequence, Union

from localspec.engine.errors import LocalspecError
from localspec.engine.options import Options


# ---- events -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """The engine loaded its models. model/draft are the resolved file paths."""

    model: str
    draft: str | None
    device: str                 # "CPU" or "GPU (<name>)"
    gpu_layers: int             # layers offloaded to the GPU (0 on CPU)
    stages: list[str]           # drafters, cheapest first; [] without speculation
    head_left_out: str | None = None   # why the model's installed draft head sits out here
    n_ctx: int = 0              # the context the engine opened, in tokens (0: not told)


@dataclass(frozen=True)
class Calibrating:
    """Before Ready, on a first run on this machine: the engine is timing batches
    (engine/calibrate.Step): `what` ("target 4 rows"), step `step` of `total`."""

    what: str
    step: int
    total: int


@dataclass(frozen=True)
class Token:
    """One round's emitted tokens and the text they completed (text may be "" mid-character)."""

    request_id: str
    text: str
    tokens: list[int]
    sources: list[str]          # per token: the drafter that proposed it, "target" for its own
    pieces: list[str] = field(default_factory=list)   # text per token, parallel to sources; [] if it cannot be cut


@dataclass(frozen=True)
class Done:
    """finish_reason: "stop" | "length" | "context" | "stopped". stats: DecodeStats.to_dict() plus
    "wall_seconds", and "plain_tok_s" / "plain_rounds" when the adaptive budget measured plain
    decoding (a stopped generation ends at a round boundary and keeps its statistics too)."""

    request_id: str
    finish_reason: str
    text: str
    stats: dict


@dataclass(frozen=True)
class Error:
    """A LocalspecError inside the engine, or a bad request. request_id None: the engine itself
    (loading failed; the process has exited cleanly). A failed learn or forget reports
    "learn:<conversation id>" / "forget:<conversation id>"."""

    request_id: str | None
    title: str
    cause: str
    fix: str


@dataclass(frozen=True)
class Crashed:
    """The engine process died: killed by a signal (exitcode -N), an abort in llama.cpp, OOM."""

    exitcode: int | None
    detail: str                 # the tail of its stderr
    cause: str = ""             # its most telling line (a GGML_ASSERT, a CUDA error, ...), or ""

    @property
    def reason(self) -> str:
        """One line for the user: how it died, and why when stderr says."""
        if self.exitcode is None:
            how = "the engine process stopped answering"
        elif self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = f"signal {-self.exitcode}"
            how = f"the engine process was killed by {name}"
        else:
            how = f"the engine process exited with status {self.exitcode}"
        cause = self.cause or (BUS_ERROR_CAUSE if self.exitcode == -signal.SIGBUS else "")
        return f"{how} ({cause})" if cause else how


# SIGBUS: a page of a mapped file is gone, and the engine maps its model's weights
# (engine/model_files.py)
BUS_ERROR_CAUSE = ("a model file it runs was truncated or overwritten while in use: do not overwrite "
                   "a model file while localspec runs it; quit first, or write the new file beside it "
                   "and rename it over")


Event = Union[Calibrating, Ready, Token, Done, Error, Crashed]
_WIRE: dict[str, type] = {"calibrating": Calibrating, "ready": Ready, "token": Token, "done": Done,
                          "error": Error}


def encode_event(event: Calibrating | Ready | Token | Done | Error) -> str:
    kind = next(k for k, cls in _WIRE.items() if cls is type(event))
    return json.dumps({"event": kind, **asdict(event)})


def decode_event(line: str) -> Calibrating | Ready | Token | Done | Error:
    data = json.loads(line)
    cls = _WIRE[data.pop("event")]
    return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# ---- the parent side ----------------------------------------------------------------------------
STDERR_TAIL = 4000      # characters of the child's stderr quoted in Crashed.detail
STDERR_SCAN = 256_000   # bytes of its end searched for the line that says why it died
CLOSE_GRACE = 5.0       # seconds close() waits for a clean exit before killing


@dataclass
class _Child:
    """One incarnation of the engine process and its two threads."""

    proc: subprocess.Popen
    stderr: IO[bytes]
    outbox: queue.Queue = field(default_factory=queue.Queue)   # request lines; None ends the writer
    expected_exit: bool = False                                # close()/restart(): no Crashed
    threads: list[threading.Thread] = field(default_factory=list)


class EngineProcess:
    # What the engine process loads, and restart() reloads: engine/options.Options, sent as JSON.
    # model and draft as the user gave them (a path or an installed model's name: the child resolves
    # them, app/paths.resolve_models); use_draft False: no draft, not even an installed model's own.
    def __init__(self, spec: Options) -> None:
        self.spec = spec
        self._events: queue.Queue[Event] = queue.Queue()
        self._child: _Child | None = None
        self._closed = False
        self._deferred: dict[str, str] = {}   # conversation id -> its last learn/forget sent while down

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the engine and return at once; Ready, or Error(None, ...) / Crashed, follows
        (Calibrating before Ready while a first run measures this machine). A process the
        machine will not start (no file descriptors or processes left): LocalspecError, and
        start() may be called again."""
        if self._child is not None and self._child.proc.poll() is None:
            raise RuntimeError("the engine process is already running")
        self._closed = False
        stderr = None
        try:
            stderr = tempfile.TemporaryFile(prefix="localspec-engine-")
            proc = subprocess.Popen([sys.executable, "-m", "localspec.app.engine_main"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                    start_new_session=True, env=_child_env())
        except OSError as err:
            if stderr is not None:
                stderr.close()
            raise cannot_start(err) from None
        child = _Child(proc, stderr)
        child.outbox.put(json.dumps({"op": "open", "spec": self.spec.to_json()}))
        for line in self._deferred.values():   # run once the engine is up, in order
            child.outbox.put(line)
        self._deferred.clear()
        child.threads = [threading.Thread(target=self._write, args=(child,), daemon=True,
                                          name="localspec-engine-writer"),
                         threading.Thread(target=self._read, args=(child,), daemon=True,
                                          name="localspec-engine-reader")]
        for t in child.threads:
            t.start()
        self._child = child

    def restart(self) -> None:
        """Kill the engine if it runs, then start it again with the same spec."""
        self._stop_child(grace=0.0)
        self.start()

    def close(self) -> None:
        """Ask the engine to exit, kill it after a grace period; idempotent."""
        self._closed = True
        self._stop_child(grace=CLOSE_GRACE)

    @property
    def alive(self) -> bool:
        return self._child is not None and self._child.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._child.proc.pid if self._child is not None else None

    # ---- requests -------------------------------------------------------------------------------
    def generate(self, request_id: str, messages: list[dict], *, temperature: float = 0.0,
                 top_p: float = 0.95, top_k: int = 40, seed: int = 0, max_tokens: int = 512,
                 system: str | None = None, conversation: str | None = None,
                 stop: Sequence[str] = ()) -> None:
        """Reply to chat messages [{"role", "content"}] through the model's chat template.
        conversation: its id, under which the engine keeps the conversation's cache between
        turns and across restarts (engine/snapshots.py). stop: strings that end the reply (left out
        of it)."""
        self._send(request_id, {"op": "generate", "id": request_id, "messages": messages,
                                "system": system, "temperature": temperature, "top_p": top_p,
                                "top_k": top_k, "seed": seed, "max_tokens": max_tokens,
                                "conversation": conversation, "stop": list(stop)})

    def generate_raw(self, request_id: str, prompt: str, *, temperature: float = 0.0,
                     top_p: float = 0.95, top_k: int = 40, seed: int = 0, max_tokens: int = 512,
                     system: str | None = None, stop: Sequence[str] = ()) -> None:
        """Plain completion of prompt, no chat template (system is ignored)."""
        self._send(request_id, {"op": "generate", "id": request_id, "prompt": prompt,
                                "temperature": temperature, "top_p": top_p, "top_k": top_k,
                                "seed": seed, "max_tokens": max_tokens, "stop": list(stop)})

    def stop(self, request_id: str) -> None:
        """Stop that generation at its next round; Done(finish_reason="stopped") follows."""
        self._send(None, {"op": "stop", "id": request_id})

    def learn(self, conversation_id: str, messages: list[dict]) -> None:
        """The personal n-gram drafter learns a finished exchange (the whole conversation).
        While the engine is down, the last learn or forget of each conversation waits for start()."""
        self._send_store(conversation_id, {"op": "learn", "conversation": conversation_id,
                                           "messages": messages})

    def forget(self, conversation_id: str) -> None:
        """Forget a deleted conversation's n-grams (also when the personal drafter is off)."""
        self._send_store(conversation_id, {"op": "forget", "conversation": conversation_id})

    def _send_store(self, conversation_id: str, request: dict) -> None:
        if self.alive:
            self._child.outbox.put(json.dumps(request))
        else:
            self._deferred.pop(conversation_id, None)
            self._deferred[conversation_id] = json.dumps(request)

    def _send(self, request_id: str | None, request: dict) -> None:
        if not self.alive:
            if request_id is not None:
                self._events.put(Error(request_id, "The engine is not running",
                                       "it stopped or was never started",
                                       "Restart the engine, then send the message again"))
            return
        self._child.outbox.put(json.dumps(request))

    # ---- events ---------------------------------------------------------------------------------
    def poll(self, timeout: float | None = 0.0) -> Event | None:
        """The next event, or None: at once for timeout 0, after timeout seconds, or (None) never."""
        try:
            if timeout is not None and timeout <= 0:
                return self._events.get_nowait()
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def events(self) -> Iterator[Event]:
        """Every event as it arrives, until close() and the queue is drained."""
        while True:
            event = self.poll(timeout=0.1)
            if event is not None:
                yield event
            elif self._closed:
                return

    # ---- threads --------------------------------------------------------------------------------
    def _write(self, child: _Child) -> None:
        pipe = child.proc.stdin
        while (line := child.outbox.get()) is not None:
            try:
                pipe.write(line.encode() + b"\n")
                pipe.flush()
            except (BrokenPipeError, ValueError):   # the child died (the reader reports it) or closed
                return
        try:
            pipe.close()
        except BrokenPipeError:
            pass   # the child is gone already; closing our end is all that was asked

    def _read(self, child: _Child) -> None:
        for line in child.proc.stdout:
            if not line.endswith(b"\n"):
                break   # torn by the child's death mid-write: the crash is what to report
            self._events.put(decode_event(line.decode()))
        code = child.proc.wait()
        child.outbox.put(None)
        if not child.expected_exit and code != 0:
            self._events.put(_crash_report(code, child.stderr))
        child.stderr.close()

    def _stop_child(self, grace: float) -> None:
        child = self._child
        if child is None:
            return
        child.expected_exit = True
        if child.proc.poll() is None and grace > 0:
            child.outbox.put(json.dumps({"op": "exit"}))
            child.outbox.put(None)
            try:
                child.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass   # killed below
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait()
        for t in child.threads:
            t.join(timeout=5.0)


# What to do about each limit that starting a process runs into.
_START_FIXES = {
    errno.EMFILE: "Raise the limit on open files in the shell that starts localspec (`ulimit -n "
                  "1024`), then restart the engine (F5 in the chat)",
    errno.ENFILE: "The system has no open files left: close other programs, then restart the "
                  "engine (F5 in the chat)",
    errno.EAGAIN: "No processes left for your user: close other programs (or raise `ulimit -u`), "
                  "then restart the engine (F5 in the chat)",
    errno.ENOMEM: "Close other programs to free memory, then restart the engine (F5 in the chat)",
}


def cannot_start(err: OSError) -> LocalspecError:
    """The error for an engine process the machine would not start (`err`, from starting it)."""
    cause = err.strerror or str(err)
    if err.errno == errno.EMFILE:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cause += f" (this process may hold {soft} open files: `ulimit -n`)"
    return LocalspecError("Cannot start the engine process", cause,
                          _START_FIXES.get(err.errno, "Check the machine's limits (`ulimit -a`), "
                                                      "then restart the engine (F5 in the chat)"))


def _crash_report(code: int | None, stderr: IO[bytes]) -> Crashed:
    stderr.flush()
    size = stderr.seek(0, os.SEEK_END)
    stderr.seek(max(0, size - STDERR_SCAN))
    text = stderr.read().decode("utf-8", errors="replace").strip()
    return Crashed(code, text[-STDERR_TAIL:], telling_line(text))


# Lines that say why a process died, most specific first: llama.cpp's asserts and aborts, CUDA.
_TELLING = (re.compile(r"GGML_(ASSERT|ABORT).*|ggml_abort.*"),
            re.compile(r"CUDA error.*|.*out of memory.*", re.IGNORECASE),
            re.compile(r"Fatal Python error: .*"))


def telling_line(stderr_text: str) -> str:
    """The line of a dead process's stderr that says why it died, or ""."""
    lines = [line.strip() for line in stderr_text.splitlines() if line.strip()]
    for pattern in _TELLING:
        for line in reversed(lines):
            if m := pattern.search(line):
                return m.group(0)[:300]
    if "Traceback (most recent call last)" in stderr_text:   # a Python exception: its last line
        last = [line for line in stderr_text.splitlines() if line.strip() and not line[0].isspace()]
        return last[-1].strip()[:300] if last else ""
    return ""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")        # the engine never touches the network
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("GGML_NO_BACKTRACE", "1")     # ggml would attach gdb on an abort: the Python
                                                 # traceback (faulthandler) is what we quote
    return env


def wait_for(engine: EngineProcess, kinds: tuple[type, ...], timeout: float) -> list[Event]:
    """Collect events until one of `kinds` (or Crashed) arrives; for scripts and tests."""
    deadline = time.monotonic() + timeout
    seen: list[Event] = []
    while (left := deadline - time.monotonic()) > 0:
        event = engine.poll(timeout=left)
        if event is None:
            break
        seen.append(event)
        if isinstance(event, kinds) or isinstance(event, Crashed):
            return seen
    raise TimeoutError(f"no {'/'.join(k.__name__ for k in kinds)} within {timeout}s; saw {seen}")
