"""The HTTP side of `localspec serve`: a FastAPI app over the Scheduler, and its guards.

Why it is shaped so:

* Every request passes one pure-ASGI guard (`Guard`) before FastAPI sees it: the Host header
  (a server on 127.0.0.1 without a key answers only to names of this machine, so a web page
  cannot reach it by DNS rebinding), the API key (compared in constant time), and the body,
  read whole here under a size cap and a deadline (a client sending a byte a second is cut off,
  a 100 MB body refused from its Content-Length). It also turns anything unforeseen into a 500
  in OpenAI's error shape, never a traceback, and prints the one log line of each request.
* A connection must finish its request's headers within the same deadline (`deadlined`: uvicorn
  itself waits for them forever).
* Each generation is a Job (app/serve_engine.py). While its client waits, a watcher reads the
  connection for a disconnect and cancels the job; a stream's end, however it ends, cancels it
  too (a no-op once the job is done). A stream's headers go out with its first token, so an
  error before it (a prompt longer than the context) is still a plain 4xx.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import signal
import sys
import time
import traceback
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .engine_proc import Crashed, Done, Error, Token
from .serve_api import (ApiError, ChatRequest, CompletionRequest, Defaults, Generation, chunk, completion,
                        generation, stats_header, summary)
from .serve_engine import Busy, Job, Refused, Scheduler
from .terminal import printable

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@dataclass(frozen=True)
class ServeConfig:
    model_id: str                     # what /v1/models lists and responses name
    defaults: Defaults
    api_key: str | None
    loopback_only: bool               # Host must name this machine (no key, bound to loopback)
    max_body: int                     # bytes
    read_timeout: float               # seconds to send a request's headers and body
    time_limit: float                 # seconds a request may take, waiting in the queue included
    log: Callable[[str], None]
    on_reply: Callable[[Generation, str, str, dict], None] | None = None   # --history


# ---- the guard ----------------------------------------------------------------------------------
class Guard:
    def __init__(self, app, config: ServeConfig) -> None:
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        sent = {"status": None}
        note = scope.setdefault("localspec", {})   # what the route adds to the log line

        async def send_noting(message) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
            await send(message)

        try:
            self._admit(scope)
            body = await self._read_body(scope, receive)
            if body is None:
                note["outcome"] = "client left while sending"
                return
            await self.app(scope, _replay(body, receive), send_noting)
        except ApiError as err:
            if sent["status"] is None:
                await respond(send_noting, err, close=err.status in (408, 413))
        except Exception as err:   # a bug: said once in the log, answered as a 500 without detail
            self.config.log(f"bug: {type(err).__name__}: {str(err)[:300]} (LOCALSPEC_DEBUG=1 for the traceback)")
            if os.environ.get("LOCALSPEC_DEBUG") == "1":
                traceback.print_exc(file=sys.stderr)
            if sent["status"] is None:
                await respond(send_noting, ApiError(500, "Internal error in localspec serve (its log says more)",
                                                    type="server_error"))
        finally:
            self.config.log(log_line(scope, sent["status"], time.monotonic() - t0, note))

    def _admit(self, scope) -> None:
        headers = dict(scope["headers"])
        if self.config.loopback_only:
            host = headers.get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in LOOPBACK_NAMES:
                raise ApiError(403, "This server answers only to 127.0.0.1 or localhost as the Host "
                                    "(start it with --host and --api-key to serve other names)",
                               code="host_not_allowed")
        key = self.config.api_key
        if key is not None and scope["path"] != "/health":
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + key.encode()):
                raise ApiError(401, "Missing or wrong API key: send the header 'Authorization: Bearer KEY' "
                                    "with the key localspec serve was started with", code="invalid_api_key")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.config.max_body):
            raise _too_large(self.config.max_body)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The whole body, under the size cap and the read deadline; None if the client left."""
        deadline = time.monotonic() + self.config.read_timeout
        parts, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise ApiError(408, f"The request body did not arrive within {self.config.read_timeout:g} s",
                               code="request_timeout") from None
            if message["type"] == "http.disconnect":
                return None
            size += len(message.get("body", b""))
            if size > self.config.max_body:
                raise _too_large(self.config.max_body)
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(parts)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than {limit} bytes (localspec serve --max-body)",
                    code="request_too_large")


def _replay(body: bytes, receive):
    """A receive that gives the app the body read already, then what the connection says next
    (a disconnect)."""
    replayed = False

    async def again():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def respond(send, err: ApiError, close: bool = False) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((k.lower().encode(), v.encode()) for k, v in err.headers.items())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def log_line(scope, status: int | None, seconds: float, note: dict) -> str:
    line = f"{scope['method']} {scope['path'][:200]} {status or '-'} {1e3 * seconds:.0f} ms"
    if "id" in note:
        line += f" {note['id']}"
    if "stats" in note:
        s, st = summary(note["stats"]), note["stats"]
        accepted = " ".join(f"{k} {v}" for k, v in s["accepted"].items())
        line += (f" | {s['tokens']} tokens {s['tokens_per_second']:.1f} tok/s {s['tokens_per_call']:.2f} tokens/call"
                 f", prompt {s['prompt_tokens']} ({s['reused_tokens']} cached), waited "
                 f"{note.get('waited', 0.0):.2f} s, first token {note.get('first', 0.0):.3f} s (prefill "
                 f"{st.get('seconds', {}).get('prefill', 0.0):.3f} s), {note.get('finish', '')}"
                 + (f" | accepted {accepted}" if accepted else "")
                 + (f" | {st['dropped_messages']} oldest messages left out" if st.get("dropped_messages") else ""))
    if "outcome" in note:
        line += f" | {note['outcome']}"
    return printable(line)


def deadlined(seconds: float) -> type:
    """uvicorn's h11 protocol, closing a connection that has not finished a request's headers
    within `seconds` of opening (or of its last response)."""
    class Deadlined(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self.loop.call_later(seconds, self._expire, self.cycle)

        def _expire(self, cycle) -> None:
            if self.cycle is cycle and not self.transport.is_closing():   # no request since armed
                self.transport.close()

    return Deadlined


class Server(uvicorn.Server):
    """uvicorn's server; a signal also stops the running reply and refuses those waiting, so that
    open streams end now instead of at the graceful shutdown's limit."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self.scheduler = scheduler
        self.interrupted = False     # a SIGINT ended it (the command then exits 130)

    def handle_exit(self, sig, frame) -> None:
        self.interrupted = self.interrupted or sig == signal.SIGINT
        super().handle_exit(sig, frame)
        self.scheduler.cancel_all_soon()


# ---- the app ------------------------------------------------------------------------------------
def build_app(scheduler: Scheduler, config: ServeConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        try:
            yield
        finally:
            await scheduler.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, config=config)
    _errors(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = scheduler.state == "ok"
        return JSONResponse({"status": scheduler.state, "waiting": scheduler.waiting,
                             "served": scheduler.served}, status_code=200 if ok else 503)

    def model_entry() -> dict:
        return {"id": config.model_id, "object": "model", "created": int(time.time()), "owned_by": "localspec",
                "context_length": config.defaults.n_ctx}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_entry()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        if model_id != config.model_id:
            raise ApiError(404, f"No model {model_id!r} here: this server serves {config.model_id!r}",
                           param="model", code="model_not_found")
        return model_entry()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        return await _generate(scheduler, config, "chat", body, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _generate(scheduler, config, "text", body, request)

    return app


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        e = validation_error(err)
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        what = {404: f"Unknown route {request.method} {request.url.path}: this server has GET /v1/models, "
                     "POST /v1/chat/completions, POST /v1/completions and GET /health",
                405: f"{request.method} is not allowed on {request.url.path}"}
        e = ApiError(err.status_code, printable(what.get(err.status_code, str(err.detail))),
                     code={404: "not_found", 405: "method_not_allowed"}.get(err.status_code))
        return JSONResponse(e.body(), status_code=e.status)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "TextPart", "ContentPart"})


def validation_error(err: RequestValidationError) -> ApiError:
    """The first problem pydantic found, with its parameter as OpenAI's `param`
    ("messages[0].content")."""
    first = err.errors()[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"The body is not valid JSON ({first.get('ctx', {}).get('error', 'malformed')})",
                        code="invalid_json")
    param = ""
    for part in first["loc"][1:] if first["loc"][:1] == ("body",) else first["loc"]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part not in _UNION_TAGS and part.isidentifier():   # not a union member's tag ("list[str]")
            param += f".{part}" if param else part
    where = param or "the body"
    return ApiError(400, printable(f"{where}: {first['msg']}"), param=param or None,
                    code="missing_parameter" if first["type"] == "missing" else "invalid_value")


# ---- generations --------------------------------------------------------------------------------
async def _generate(scheduler: Scheduler, config: ServeConfig, kind: str, body, request: Request) -> Response:
    g = generation(body, config.defaults)
    try:
        job = scheduler.submit(g, config.time_limit)
    except Busy:
        raise ApiError(503, f"The server is busy: {scheduler.waiting} requests are waiting for the one "
                            "engine (localspec serve --queue)", type="server_error", code="queue_full",
                       headers={"Retry-After": str(scheduler.retry_after())}) from None
    note = request.scope["localspec"]
    note["id"] = job.id
    watcher = asyncio.ensure_future(_until_disconnect(request.receive))
    watcher.add_done_callback(lambda t: None if t.cancelled() else (job.cancel(), note.update(outcome="client left")))
    handed_over = False
    try:
        first = await job.events.get()
        note["waited"] = (job.timing.started or time.monotonic()) - job.timing.queued
        note["first"] = time.monotonic() - (job.timing.started or job.timing.queued)
        _raise_for(first)
        if body.stream:
            handed_over = True
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventStream(job, first, kind, config, include_usage, watcher, note)
        text, event = [], first
        while not isinstance(event, Done):
            _raise_for(event)
            text.append(event.text)
            event = await job.events.get()
        reason = _finished(job, event, note)
        _record(config, g, event, note)
        return JSONResponse(completion(kind, job.id, config.model_id, event.text, reason, event.stats),
                            headers={"X-Localspec-Stats": stats_header(event.stats)})
    finally:
        if not handed_over:
            watcher.cancel()
            job.cancel()


def _raise_for(event) -> None:
    if isinstance(event, Refused):
        raise ApiError(503, event.message, type="server_error", code=event.code, headers={"Retry-After": "5"})
    if isinstance(event, Crashed):
        raise ApiError(500, f"The engine crashed ({event.reason}); it restarts: send the request again",
                       type="server_error", code="engine_crashed")
    if isinstance(event, Error):
        code = "context_length_exceeded" if "longer than the context" in event.title else "invalid_value"
        raise ApiError(400, printable(f"{event.title}: {event.cause}. {event.fix}"), code=code)


def _finished(job: Job, done: Done, note: dict) -> str:
    """The engine's finish reason for the response; a time limit that stopped it is a length."""
    reason = "length" if job.timed_out else done.finish_reason
    note["stats"], note["finish"] = done.stats, ("time limit" if job.timed_out else done.finish_reason)
    return reason


def _record(config: ServeConfig, g: Generation, done: Done, note: dict) -> None:
    if config.on_reply is not None and g.messages is not None:
        try:
            config.on_reply(g, done.text, done.finish_reason, done.stats)
        except Exception as err:   # the reply is good; the history could not keep it: said, not fatal
            note["outcome"] = f"not kept in the history: {type(err).__name__}: {str(err)[:200]}"


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(Response):
    """Server-sent events: each round's text as a chunk, the finish (with the statistics), the
    usage when asked, then `data: [DONE]`."""

    def __init__(self, job: Job, first, kind: str, config: ServeConfig, include_usage: bool,
                 watcher: asyncio.Future, note: dict) -> None:
        super().__init__(status_code=200, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]   # it streams
        self.job, self.first, self.kind, self.config = job, first, kind, config
        self.include_usage, self.watcher, self.note = include_usage, watcher, note

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for event in self._chunks():
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.note["outcome"] = "client left"
        finally:
            self.watcher.cancel()
            self.job.cancel()

    async def _chunks(self):
        job, kind, model = self.job, self.kind, self.config.model_id
        created = int(time.time())

        def sse(data: dict) -> bytes:
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        if kind == "chat":
            yield sse(chunk(kind, job.id, model, created, role=True))
        event = self.first
        while not isinstance(event, Done):
            if isinstance(event, Token) and event.text:
                yield sse(chunk(kind, job.id, model, created, text=event.text))
            elif not isinstance(event, Token):   # an error after the first token: said in the stream
                try:
                    _raise_for(event)
                except ApiError as err:
                    self.note["outcome"] = err.message
                    yield sse(err.body())
                    return
            event = await job.events.get()
        reason = _finished(job, event, self.note)
        yield sse(chunk(kind, job.id, model, created, reason=reason, stats=event.stats))
        if self.include_usage:
            yield sse(chunk(kind, job.id, model, created, stats=event.stats, with_usage=True))
        yield b"data: [DONE]\n\n"
        _record(self.config, job.generation, event, self.note)
