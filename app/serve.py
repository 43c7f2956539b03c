"""`localspec serve`: an OpenAI-compatible HTTP endpoint on this machine, for the coding tools
and scripts that speak that API.

    localspec serve --model coder          # http://127.0.0.1:8080/v1

Why it is shaped so: the model, draft and sampling defaults come from the chat's settings with
the run's flags over them, as `ask` does, so the server answers as the chat would. The socket is
bound before the engine loads (a port in use is said at once, not after a minute of loading),
the engine runs in its own process (app/serve_engine.py) and uvicorn serves the FastAPI app
(app/serve_http.py) from the main thread, whose SIGINT and SIGTERM end it cleanly: the running
reply is stopped, waiting requests are refused, the engine process is closed.

Private by construction: 127.0.0.1 unless told; any other address needs an API key; nothing is
written to the history unless --history.
"""
from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import signal
import socket
import sys
import time
from pathlib import Path

from localspec.engine.errors import LocalspecError

from .terminal import printable

DEFAULT_PORT = 8080
KEY_VAR = "LOCALSPEC_API_KEY"
MAX_HOLD = 1024          # --queue's upper bound


def add_serve(sub: argparse._SubParsersAction) -> None:
    from .run_options import add_engine_options, add_model_options, add_sampling_options

    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (127.0.0.1 by default)")
    add_model_options(p, model_required=False,
                      model_help="target model: a .gguf file or an installed model's name "
                                 "(default: the chat's settings)")
    add_engine_options(p)
    add_sampling_options(p)   # a request's own values stand over these
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: a free one)")
    p.add_argument("--api-key", help=f"key clients must send as 'Authorization: Bearer KEY' (or set {KEY_VAR}, "
                                     "which keeps it out of the process list)")
    p.add_argument("--queue", type=int, default=8,
                   help="requests that may wait while one runs; more are refused with 503 (default 8)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a request may take, waiting included; a reply still running then "
                        "ends there, finish_reason length (default 600)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds a client has to send its request (default 30)")
    p.add_argument("--max-body", type=int, default=16 << 20, help="largest request body in bytes (default 16 MiB)")
    p.add_argument("--history", action="store_true",
                   help="keep each chat request and its reply in the chat's history (default: nothing is kept)")
    p.set_defaults(run=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from .ask import settings_run
    from .engine_proc import EngineProcess
    from .run_options import given

    flags = given(args)
    need_server_packages()
    key = args.api_key if args.api_key is not None else os.environ.get(KEY_VAR) or None
    _check_serve_flags(args, key)
    run, options = settings_run(flags)
    sock = bind(args.host, args.port)
    engine = EngineProcess(options)
    history = None
    signal.signal(signal.SIGTERM, _terminated)   # a clean exit through the finally below
    try:
        ready = _start(engine)
        if args.history:
            from .history import History
            history = History.open()
        model_id = _model_id(str(options.model))
        port = sock.getsockname()[1]
        _banner(args.host, port, model_id, ready, key, args.queue)
        _serve(sock, engine, ready, args, key, model_id, flags, run, history)
    except _Terminated:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sock.close()
        engine.close()
        if history is not None:
            history.close()
    return 0


def need_server_packages() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise LocalspecError("The server's packages are not installed", f"cannot import {err.name}",
                             "Install them: pip install 'localspec[serve]' (make and packaging/install.sh do)") from None


class _Terminated(Exception):
    """SIGTERM: end the server as Ctrl+C does, with exit status 0."""


def _terminated(signum, frame) -> None:
    raise _Terminated()


def _check_serve_flags(args: argparse.Namespace, key: str | None) -> None:
    from localspec.engine.options import check_values, within

    check_values({"port": args.port, "queue": args.queue, "timeout": args.timeout,
                  "read_timeout": args.read_timeout, "max_body": args.max_body},
                 {"port": within("--port", 0, 65535), "queue": within("--queue", 1, MAX_HOLD),
                  "timeout": within("--timeout", 1, 86400, integer=False),
                  "read_timeout": within("--read-timeout", 1, 3600, integer=False),
                  "max_body": within("--max-body", 1024, 1 << 30)})
    if key is not None and (len(key) < 8 or not key.isascii() or not key.isprintable()):
        raise LocalspecError("Unusable API key", "an API key must be at least 8 printable ASCII characters",
                             "Pick a longer key, e.g.: python -c 'import secrets; print(secrets.token_urlsafe())'")
    if not is_loopback(args.host) and key is None:
        raise LocalspecError("Serving beyond this machine needs an API key",
                             f"--host {args.host} lets other machines connect",
                             f"Add --api-key KEY (or set {KEY_VAR}), or leave --host out for 127.0.0.1 only")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (LocalspecError with the fix when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as err:
        sock.close()
        if isinstance(err, socket.gaierror):
            raise LocalspecError("Unknown address", f"--host {host}: {err.strerror}",
                                 "Pass an address of this machine, e.g. 127.0.0.1") from None
        fix = ("Pass another --port (0 picks a free one), or stop what listens there"
               if err.errno == errno.EADDRINUSE else "Pass an address and port this machine has and you may use "
                                       "(ports below 1024 need privileges)")
        raise LocalspecError("Cannot listen", f"{host}:{port}: {err.strerror or err}", fix) from None
    return sock


def _start(engine):
    """Start the engine process and wait until it is ready, a first calibration's steps on stderr."""
    from .engine_proc import Calibrating, Crashed, Error, Ready

    engine.start()
    while True:
        event = engine.poll(timeout=0.5)
        if isinstance(event, Ready):
            return event
        if isinstance(event, Calibrating):
            print(f"calibrating: {event.what} ({event.step}/{event.total})", file=sys.stderr, flush=True)
        elif isinstance(event, Error):
            raise LocalspecError(event.title, event.cause, event.fix)
        elif isinstance(event, Crashed):
            raise LocalspecError("The engine process died while loading", event.reason,
                                 "Check the model file (localspec list), or try a smaller --ctx")


def _model_id(model: str) -> str:
    """The name clients see: an installed model's name, or a file's name less .gguf."""
    name = Path(model).name
    return name[:-5] if name.endswith(".gguf") else name


def _banner(host: str, port: int, model_id: str, ready, key: str | None, queue: int) -> None:
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1"
    stages = ", ".join(ready.stages) if ready.stages else "none (plain decoding)"
    lines = [f"localspec serve: listening on {url}",
             f"  model {model_id} ({Path(ready.model).name}) on {ready.device}, context {ready.n_ctx} tokens, "
             f"drafters: {stages}",
             "  point a client at it:",
             f"    export OPENAI_BASE_URL={url} OPENAI_API_KEY={'<your key>' if key else 'localspec'}",
             f"    python: OpenAI(base_url=\"{url}\", api_key=\"{'<your key>' if key else 'localspec'}\")",
             f"  one request at a time, {queue} may wait; Ctrl+C stops"]
    print(printable("\n".join(lines)), flush=True)


def _serve(sock, engine, ready, args, key, model_id, flags, run, history) -> None:
    import uvicorn

    from .serve_api import Defaults
    from .serve_engine import Scheduler
    from .serve_http import Server, ServeConfig, build_app, deadlined

    defaults = Defaults(temperature=run.temperature, top_p=run.top_p, top_k=run.top_k,
                        seed=flags.get("seed", 0), max_tokens=flags.get("max_tokens"), n_ctx=ready.n_ctx)
    config = ServeConfig(model_id=model_id, defaults=defaults, api_key=key,
                         loopback_only=key is None, max_body=args.max_body, read_timeout=args.read_timeout,
                         time_limit=args.timeout, log=_log,
                         on_reply=_history_writer(history, engine, model_id) if history is not None else None)
    scheduler = Scheduler(engine, ready, args.queue, _log)
    server = Server(uvicorn.Config(build_app(scheduler, config), http=deadlined(args.read_timeout),
                                    log_level="warning", access_log=False, lifespan="on",
                                    timeout_graceful_shutdown=5, limit_concurrency=args.queue + 64,
                                    timeout_keep_alive=5), scheduler)
    server.run(sockets=[sock])
    if server.interrupted:
        # uvicorn raises the Ctrl+C again once it has shut down; where that raise is lost, the
        # command still ends as Ctrl+C ends it (130, "interrupted")
        raise KeyboardInterrupt


def _log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def _history_writer(history, engine, model_id: str):
    """--history: each chat request becomes a conversation holding its messages and the reply,
    and a complete one is learnt by the personal n-grams under that conversation's id, as the
    chat learns each finished exchange (deleting it in the chat forgets it there too)."""
    def write(generation, text: str, finish_reason: str, stats: dict) -> None:
        said = [m for m in generation.messages if m["role"] in ("user", "assistant")]
        first = next((m["content"] for m in said if m["role"] == "user"), "")
        state = "stopped" if finish_reason == "stopped" else "complete"
        conv = history.new_conversation(f"serve: {first.strip()[:60] or model_id}")
        try:
            for m in said:
                history.add_message(conv.id, m["role"], m["content"])
            reply = history.begin_reply(conv.id)
            history.finish_reply(reply.id, text, state, stats)
        finally:
            history.release(conv.id)
        if state == "complete":   # the engine learns it before the next request it is sent
            engine.learn(conv.id, [{"role": m["role"], "content": m["content"]} for m in said]
                         + [{"role": "assistant", "content": text}])

    return write
