"""`localspec bench --serve`: bench's prompts through the OpenAI HTTP API, beside bench's own run.

What it checks (issue 44's goals): the default engine keeps its speed through `localspec serve`,
it stays ahead of llama.cpp's `llama-server` with its own speculation, and the first streamed
byte comes soon after the prefill's end.

Why it is shaped so:

* One run, interleaved: bench's in-process configurations decode a prompt, then `localspec
  serve` does, then each llama-server mode, before the next prompt, so machine noise falls on
  every side alike (bench's rule). Each server is its own process, started here and idle while
  the others decode.
* The server is started as a user starts it (`python -m localspec.app.cli serve`, 127.0.0.1,
  a free port) with the run's model, draft, context, threads and numerics, an empty settings
  folder (so nothing of the user's settings, such as a system prompt or another draft, slips
  in) and no installed head; bench runs the same engine in process as its "default"
  configuration (engine/options.py's defaults). The first reply's drafters are checked against
  it, so a mismatch is said, not measured.
* Everything is timed at the client, each request streamed (what a coding tool does):
  - decode tok/s = completion tokens / (the request's whole time less the server's own prefill
    time): the HTTP round trip, the chat template, the queue and the stream all count against
    the server, so "within 5% of bench" is a lower bound on what it keeps;
  - first byte after the prefill = the time to the first content byte less the server's prefill
    time for that request (localspec's statistics, llama-server's `timings.prompt_ms`):
    everything but the prefill counts on both sides alike (the template too, though it comes
    before the prefill), so the 50 ms goal is bounded from above. Beside it, localspec's own
    parts: its first round after the prefill (`first_text_seconds` less the prefill) and its
    template and tokens (`prepare_seconds`); the rest is HTTP and the pipes.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from localspec.engine.config import SamplingParams
from localspec.engine.errors import LocalspecError

from .workloads import Prompt

WORKLOADS = ("edit", "chat", "longchat")   # the chat-template workloads (messages to send)
START_S = 900          # to a server's readiness: a first calibration on a slow CPU included
REQUEST_S = 1800       # one request's limit: a long reply on a slow CPU
# llama-server's modes: its plain decoding and its n-gram speculation (the types its --spec-type
# takes, and --spec-default, its own suggested ngram-mod settings); "draft" runs the run's draft
# model beside it (-md)
LLAMA_MODES = {"plain": (), "ngram-simple": ("--spec-type", "ngram-simple"),
               "ngram-mod": ("--spec-type", "ngram-mod"), "ngram-map-k": ("--spec-type", "ngram-map-k"),
               "spec-default": ("--spec-default",), "draft": ()}
DEFAULT_LLAMA_MODES = "plain,ngram-simple,ngram-mod,spec-default"


def served_config(draft: Path | None) -> str:
    """bench's configuration that runs the served engine: the default one, with or without a draft."""
    return "default" if draft is not None else "adaptive-nomodel"


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int
    ttfb: float                 # s from the request sent to its first content byte
    total: float                # s from the request sent to the stream's end
    prefill: float              # s the server says it spent on the prompt
    engine_tok_s: float         # the decode rate the server reports
    engine_first: float | None  # localspec: s from the engine's start on the prompt to its first text
    stats: dict                 # the server's own statistics of the reply, as sent

    @property
    def decode(self) -> float:
        return max(1e-9, self.total - self.prefill)

    @property
    def after_prefill_ms(self) -> float:
        return 1e3 * (self.ttfb - self.prefill)


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))   # 127.0.0.1: never a proxy


def stream_chat(url: str, body: dict, timeout: float = REQUEST_S) -> tuple[str, float, float, list[dict]]:
    """POST a streamed chat completion; (text, seconds to the first content byte, seconds to
    the end, every event's JSON)."""
    request = urllib.request.Request(url, json.dumps({**body, "stream": True}).encode(),
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    first, text, events = None, [], []
    try:
        with _opener().open(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                events.append(event)
                for choice in event.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        if first is None:
                            first = time.perf_counter() - started
                        text.append(piece)
    except urllib.error.HTTPError as err:
        raise LocalspecError("A server refused a benchmark request", f"{url}: {err.code} "
                             f"{err.read()[:500].decode('utf-8', 'replace')}",
                             "Check its log in the --out folder") from None
    except OSError as err:   # refused, reset, timed out (URLError is one): the server went away
        raise LocalspecError("A server stopped answering", f"{url}: {err}",
                             "Check its log in the --out folder") from None
    total = time.perf_counter() - started
    return "".join(text), total if first is None else first, total, events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One HTTP server process of the run: started, asked prompt by prompt, stopped."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict | None = None) -> None:
        self.name, self.command, self.log = name, command, log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, env=env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def died(self, what: str) -> LocalspecError:
        tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
        return LocalspecError(f"{self.name} {what}", f"exit status {self.proc.poll()}; its log ends: {tail}",
                              f"Run its command by hand to see why: {shlex.join(self.command)}")


class LocalspecServer(Server):
    """`localspec serve` with the run's engine options; the address read from its banner."""

    def __init__(self, target: Path, draft: Path | None, n_ctx: int, n_threads: int | None, exact: bool,
                 log: Path, settings_dir: Path) -> None:
        command = [sys.executable, "-m", "localspec.app.cli", "serve", "--model", str(target), "--port", "0",
                   "--no-head", "--queue", "1", "--timeout", str(REQUEST_S),
                   *(["--draft", str(draft)] if draft is not None else []),
                   *(["--ctx", str(n_ctx)] if n_ctx else []),
                   *(["--threads", str(n_threads)] if n_threads else []), *(["--exact"] if exact else [])]
        super().__init__("localspec serve", command, log,
                         env={**os.environ, "LOCALSPEC_CONFIG_DIR": str(settings_dir)})
        try:
            self.url = self._address()
            with _opener().open(self.url + "/models", timeout=30) as r:
                (entry,) = json.load(r)["data"]
            self.model_id, self.n_ctx = entry["id"], int(entry["context_length"])
        except BaseException:   # not started, or interrupted while starting: no process left behind
            self.stop()
            raise

    def _address(self) -> str:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout] and None, daemon=True).start()
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5).decode("utf-8", "replace")
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise self.died("did not start") from None
                continue
            if m := re.search(r"listening on (http://\S+/v1)", line):
                return m.group(1)
        raise self.died(f"was not ready within {START_S} s")

    def ask(self, prompt: Prompt, max_tokens: int, sampling: SamplingParams) -> Reply:
        body = {"model": self.model_id, "messages": list(prompt.messages), "max_tokens": max_tokens,
                **_sampling(sampling), "stream_options": {"include_usage": True}}
        text, ttfb, total, events = stream_chat(self.url + "/chat/completions", body)
        stats = next((e["localspec"] for e in events if "localspec" in e), None)
        usage = next((e["usage"] for e in events if e.get("usage")), None)
        if stats is None or usage is None:
            raise self.died("answered without its statistics")
        return Reply(text, int(usage["completion_tokens"]), ttfb, total, float(stats["prefill_seconds"]),
                     float(stats["tokens_per_second"]), stats.get("first_text_seconds"), stats)


class LlamaServer(Server):
    """llama.cpp's llama-server in one mode, one slot, on the run's context."""

    def __init__(self, binary: Path, mode: str, target: Path, draft: Path | None, n_ctx: int,
                 n_threads: int | None, log: Path) -> None:
        self.port = free_port()
        extra = ["-md", str(draft)] if mode == "draft" else list(LLAMA_MODES[mode])
        command = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port),
                   "-c", str(n_ctx), "-np", "1", "-ngl", "99", "--no-webui",
                   *(["-t", str(n_threads)] if n_threads else []), *extra]
        super().__init__(f"llama-server {mode}", command, log)
        self.base = f"http://127.0.0.1:{self.port}"
        try:
            self._wait_ready()
        except BaseException:   # not started, or interrupted while starting: no process left behind
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self.died("did not start")
            try:
                with _opener().open(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass   # not listening yet, or loading (503)
            time.sleep(0.5)
        raise self.died(f"was not ready within {START_S} s")

    def ask(self, prompt: Prompt, max_tokens: int, sampling: SamplingParams) -> Reply:
        body = {"messages": list(prompt.messages), "max_tokens": max_tokens, **_sampling(sampling),
                "cache_prompt": True}
        text, ttfb, total, events = stream_chat(self.base + "/v1/chat/completions", body)
        timings = next((e["timings"] for e in reversed(events) if e.get("timings")), None)
        if timings is None:
            raise self.died("answered without its timings")
        stats = {k: timings.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                             "predicted_per_second", "draft_n", "draft_n_accepted")}
        return Reply(text, int(timings["predicted_n"]), ttfb, total, float(timings["prompt_ms"]) / 1e3,
                     float(timings["predicted_per_second"] or 0.0), None, stats)


def _sampling(s: SamplingParams) -> dict:
    return {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed}


@dataclass(frozen=True)
class Plan:
    """What `bench --serve` was asked for, checked before anything loads."""

    config: str                        # bench's configuration of the served engine
    llama_server: Path | None
    llama_modes: tuple[str, ...]

    def start(self, target: Path, draft: Path | None, options, out: Path,
              progress: Callable[[str], None]) -> Beside:
        """The servers, loaded and answering (`options`: bench's run, whose context, threads,
        numerics, max tokens and sampling they take)."""
        return Beside(target, draft, options.n_ctx, options.n_threads, options.exact, options.max_tokens,
                      options.sampling, out, self.llama_server, self.llama_modes, progress)


def check(args) -> Plan:
    """bench's flags for --serve, --llama-server and --llama-server-modes (LocalspecError naming
    the fix for a combination it cannot compare)."""
    from .serve import need_server_packages

    if not args.serve:
        raise LocalspecError("--llama-server without --serve", "the llama-server side runs beside the "
                             "localspec server's", "Add --serve")
    if args.workload not in WORKLOADS:
        raise LocalspecError("bench --serve sends chat requests", f"--workload {args.workload} is not a chat",
                             f"Use --workload {', '.join(WORKLOADS[:-1])} or {WORKLOADS[-1]}")
    for flag, given in (("--learn", args.learn), ("--head", args.head), ("--torch-draft", args.torch_draft)):
        if given:   # the server runs the personal store and a llama.cpp draft, with no head
            raise LocalspecError(f"bench --serve with {flag}", f"the server cannot run what {flag} asks "
                                 "for, so bench's figure would be another engine's", f"Leave out {flag}")
    need_server_packages()
    binary = None
    if args.llama_server:
        binary = Path(args.llama_server).expanduser()
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise LocalspecError("No llama-server there", f"--llama-server {args.llama_server} is not an "
                                 "executable file", "Pass llama.cpp's server binary (built with its "
                                 "llama-server target, e.g. /tmp/cb/bin/llama-server from dev/gpu-build.sh)")
    modes = tuple(m.strip() for m in (args.llama_server_modes or DEFAULT_LLAMA_MODES).split(",") if m.strip())
    if args.llama_server_modes and binary is None:
        raise LocalspecError("--llama-server-modes without --llama-server", "no llama-server to run them",
                             "Add --llama-server PATH")
    unknown = [m for m in modes if m not in LLAMA_MODES]
    if unknown or ("draft" in modes and not args.draft):
        raise LocalspecError("Unknown llama-server mode" if unknown else "llama-server draft mode without --draft",
                             f"--llama-server-modes {args.llama_server_modes}",
                             f"Choose from {', '.join(LLAMA_MODES)} (draft needs --draft)")
    return Plan(served_config(Path(args.draft) if args.draft else None), binary, modes if binary else ())


def add_to(report: dict, beside: Beside, prompts: Sequence[Prompt]) -> None:
    """bench's report gets the servers' figures as "via_http", their texts beside its own in
    "completions" (completions.json)."""
    via = beside.report(report, prompts)
    for row, texts in zip(report.get("completions", []), via.pop("completions")):
        row.update({k: v for k, v in texts.items() if k != "prompt"})
    report["via_http"] = via


@dataclass
class Side:
    server: Server
    replies: list[Reply] = field(default_factory=list)


class Beside:
    """The servers of a `bench --serve` run; `ask` sends one prompt to each, in turn."""

    def __init__(self, target: Path, draft: Path | None, n_ctx: int, n_threads: int | None, exact: bool,
                 max_tokens: int, sampling: SamplingParams, out: Path, llama_server: Path | None = None,
                 llama_modes: Sequence[str] = (), progress: Callable[[str], None] = lambda s: None) -> None:
        self.max_tokens, self.sampling, self.progress = max_tokens, sampling, progress
        self.config = served_config(draft)
        out.mkdir(parents=True, exist_ok=True)
        self._settings = tempfile.TemporaryDirectory(prefix="localspec-bench-settings-")
        self.sides: list[Side] = []
        try:
            progress("starting localspec serve")
            served = LocalspecServer(target, draft, n_ctx, n_threads, exact, out / "serve.log",
                                     Path(self._settings.name))
            self.sides.append(Side(served))
            # llama-server's own default is the physical cores; localspec's every core it may use
            threads = n_threads or len(os.sched_getaffinity(0))
            for mode in llama_modes:
                progress(f"starting llama-server {mode}")
                self.sides.append(Side(LlamaServer(llama_server, mode, target, draft, served.n_ctx, threads,
                                                   out / f"llama-server-{mode}.log")))
        except BaseException:
            self.close()
            raise

    def ask(self, prompt: Prompt) -> None:
        for side in self.sides:
            side.replies.append(side.server.ask(prompt, self.max_tokens, self.sampling))
        self.progress("  via HTTP: " + "  ".join(
            f"{s.server.name} {_tok_s(s.replies):.1f}" for s in self.sides) + " tok/s (client)")

    def close(self) -> None:
        for side in self.sides:
            side.server.stop()
        self._settings.cleanup()

    def report(self, bench: dict, prompts: Sequence[Prompt]) -> dict:
        """The sides' figures beside bench's rows (its config and plain); raises LocalspecError
        when the server ran other drafters than bench's configuration."""
        rows = {r["config"]: r for r in bench["rows"]}
        mine, plain = rows.get(self.config), rows.get("plain")
        served = self.sides[0]
        ran = sorted(served.replies[0].stats.get("accepted", {})) if served.replies else []
        if mine is not None and ran != sorted(mine["stages"]):
            raise LocalspecError("The server ran other drafters than bench", f"serve: {ran or 'none'}, bench's "
                                 f"{self.config}: {sorted(mine['stages'])}",
                                 "Check serve.log in the --out folder (a draft the server could not load?)")
        texts = [c.get(self.config) for c in bench.get("completions", [])]
        llama_plain = next((s for s in self.sides if s.server.name == "llama-server plain"), None)
        out = []
        for side in self.sides:
            r = side.replies
            base = (plain["tok_s"] if side is served and plain else
                    _tok_s(llama_plain.replies) if llama_plain is not None and side is not served else None)
            row = {"side": side.server.name, "command": side.server.command,
                   "tok_s": round(_tok_s(r), 2),
                   "engine_tok_s": round(sum(x.tokens for x in r)
                                         / max(1e-9, sum(x.tokens / x.engine_tok_s for x in r if x.engine_tok_s)), 2),
                   "speedup": round(_tok_s(r) / base, 3) if base else None,
                   "tokens": sum(x.tokens for x in r),
                   "first_byte_after_prefill_ms": _spread([x.after_prefill_ms for x in r]),
                   "prefill_ms": _spread([1e3 * x.prefill for x in r])}
            if side is served:
                row["vs_bench"] = round(_tok_s(r) / mine["tok_s"], 3) if mine and mine["tok_s"] else None
                row["bench_config"] = self.config
                row["engine_first_text_after_prefill_ms"] = _spread(
                    [1e3 * (x.engine_first - x.prefill) for x in r if x.engine_first is not None])
                # the template and tokens, before the prefill but inside the client's wait
                row["engine_prepare_ms"] = _spread([1e3 * (x.stats.get("prepare_seconds") or 0.0) for x in r])
                row["same_text_as_bench"] = f"{sum(x.text == t for x, t in zip(r, texts))}/{len(r)}"
            out.append(row)
        per_prompt = [{"prompt": p.name, **{s.server.name: {
            "tokens": s.replies[i].tokens, "ttfb_ms": round(1e3 * s.replies[i].ttfb, 1),
            "total_s": round(s.replies[i].total, 3), "prefill_ms": round(1e3 * s.replies[i].prefill, 1),
            "engine_tok_s": s.replies[i].engine_tok_s, "stats": s.replies[i].stats} for s in self.sides}}
            for i, p in enumerate(prompts)]
        return {"compared_with": self.config, "n_ctx": served.server.n_ctx, "rows": out, "prompts": per_prompt,
                "completions": [{"prompt": p.name, **{s.server.name: s.replies[i].text for s in self.sides}}
                                for i, p in enumerate(prompts)]}


def _tok_s(replies: Sequence[Reply]) -> float:
    """Completion tokens over the requests' time less the servers' prefill, summed as bench sums."""
    seconds = sum(r.decode for r in replies)
    return sum(r.tokens for r in replies) / seconds if seconds else 0.0


def _spread(values: Sequence[float]) -> dict | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 1), "max": round(max(values), 1),
            "each": [round(v, 1) for v in values]}


def format_table(via: dict, bench: dict) -> str:
    rows = {r["config"]: r for r in bench["rows"]}
    mine = rows.get(via["compared_with"])
    lines = [f"through the HTTP API, the same prompts interleaved (context {via['n_ctx']}; tok/s at the "
             f"client: tokens / (request time - the server's prefill)); bench's {via['compared_with']}: "
             + (f"{mine['tok_s']:.2f} tok/s" if mine else "not run"),
             f"{'side':<26}{'tok/s':>8}{'engine':>8}{'speedup':>9}{'vs bench':>10}"
             f"{'1st byte-prefill ms (med/max)':>31}{'  engine part':>14}{'  template':>11}",
             "-" * 117]
    for r in via["rows"]:
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        vs = f"{r['vs_bench']:.3f}" if r.get("vs_bench") is not None else "-"
        fb, eng = r["first_byte_after_prefill_ms"], r.get("engine_first_text_after_prefill_ms")
        first = f"{fb['median']:.1f} / {fb['max']:.1f}" if fb else "-"
        part = f"{eng['median']:.1f}" if eng else "-"
        prep = f"{r['engine_prepare_ms']['median']:.1f}" if r.get("engine_prepare_ms") else "-"
        lines.append(f"{r['side']:<26}{r['tok_s']:>8.2f}{r['engine_tok_s']:>8.2f}{sp:>9}{vs:>10}{first:>31}"
                     f"{part:>14}{prep:>11}")
    lines.append("speedup: over bench's plain (localspec) or llama-server plain; vs bench: the served tok/s over "
                 "bench's in-process tok/s of the same engine; engine part: the engine's first round after its "
                 "prefill; template: the engine's template and tokens, before its prefill (medians, ms)")
    served = via["rows"][0]
    lines.append(f"localspec serve's text equals bench's {via['compared_with']} on {served['same_text_as_bench']} prompts")
    return "\n".join(lines)
