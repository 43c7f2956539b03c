"""The one engine behind `localspec serve`: requests run one at a time, in arrival order.

Why it is shaped so:

* One engine process (app/engine_proc.py, as the chat's): llama.cpp runs one generation at a
  time well, and a crash costs the engine, not the server, which restarts it. Requests wait in a
  bounded FIFO (`Scheduler.submit`); a full one is refused at once (`Busy`, answered 503 with
  Retry-After) rather than queueing work no client will wait for.
* Each request is a `Job` with its own asyncio queue of engine events. A single runner task
  takes jobs in order, sends one to the engine, and routes the engine's events (read off its
  queue by a pump thread, handed to the event loop) to that job until its Done, Error or Crashed.
* Cancelling is one method, `Job.cancel`: a waiting job is dropped before it runs, a running
  one is stopped at its next round (EngineProcess.stop) and its Done is read and discarded.
  The HTTP layer calls it when a client disconnects, the runner when a request outlives its
  time limit, and `close` for every job when the server shuts down.
* Nothing here names a conversation: a tool's requests that share a prefix (its system prompt
  and files) are served from the engine's cache anyway (GenerationRequest.reuse), and a
  conversation id would have the engine save snapshots to disk for every request.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .engine_proc import Calibrating, Crashed, Done, EngineProcess, Error, Ready
from .serve_api import Generation

STOP_GRACE_S = 30.0    # a running job told to stop that sends no Done by then: the engine is restarted


class Busy(Exception):
    """The queue is full."""


@dataclass(frozen=True)
class Refused:
    """A job the server ended without running it (answered 503): shutting down, waited past its
    time limit, no engine."""

    message: str
    code: str


@dataclass
class Timing:
    queued: float               # time.monotonic() at submit
    started: float | None = None


class Job:
    """One request: its engine events arrive on `events` (Token..., then Done, Error or Crashed)."""

    _ids = itertools.count(1)

    def __init__(self, generation: Generation, deadline: float) -> None:
        self.id = f"req-{next(Job._ids)}"
        self.generation = generation
        self.deadline = deadline                  # time.monotonic() past which it is stopped
        self.events: asyncio.Queue = asyncio.Queue()
        self.timing = Timing(time.monotonic())
        self.cancelled = False                    # the client left, or the server is closing
        self.timed_out = False
        self._stop = None                         # set while running: stops it at its next round

    def cancel(self) -> None:
        """Drop it if it waits; stop it at its next round if it runs; nothing once it ended."""
        if self.cancelled:
            return
        self.cancelled = True
        if self._stop is not None:
            self._stop()


class Scheduler:
    def __init__(self, engine: EngineProcess, ready: Ready, queue_size: int, log: Callable[[str], None]) -> None:
        self.engine, self.ready = engine, ready
        self.log = log                            # what no request answers: a failed learn (--history)
        self.queue_size = queue_size
        self.state = "ok"                         # "ok", "restarting" (after a crash), "failed"
        self.served = 0
        self._waiting: asyncio.Queue[Job] = asyncio.Queue(maxsize=queue_size)
        self._engine_events: asyncio.Queue = asyncio.Queue()
        self._running: Job | None = None
        self._closing = False
        self._runner: asyncio.Task | None = None
        self._pump_stop = threading.Event()
        self._pump: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle (inside the server's event loop) -----------------------------------------------
    def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._pump = threading.Thread(target=self._pump_events, args=(loop,), daemon=True,
                                      name="localspec-serve-pump")
        self._pump.start()
        self._runner = loop.create_task(self._run())

    async def close(self) -> None:
        """Stop the running job, drop the waiting ones, end the runner and the pump."""
        self.cancel_all()
        if self._runner is not None:
            self._runner.cancel()
            try:
                await self._runner
            except asyncio.CancelledError:
                pass   # what was asked
        self._pump_stop.set()

    def cancel_all_soon(self) -> None:
        """`cancel_all` from a signal handler: run by the event loop at its next turn."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.cancel_all)

    def cancel_all(self) -> None:
        """The server is shutting down: every job ends now (waiting ones with an Error)."""
        self._closing = True
        if self._running is not None:
            self._running.cancel()
        while not self._waiting.empty():
            job = self._waiting.get_nowait()
            job.events.put_nowait(Refused("The server is shutting down: send the request again once "
                                          "it is back", "shutting_down"))

    # ---- requests -------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self._waiting.qsize()

    def submit(self, generation: Generation, time_limit: float) -> Job:
        """A job for `generation`, queued behind those before it; Busy when the queue is full or
        the server is closing."""
        if self._closing:
            raise Busy()
        job = Job(generation, time.monotonic() + time_limit)
        try:
            self._waiting.put_nowait(job)
        except asyncio.QueueFull:
            raise Busy() from None
        return job

    def retry_after(self) -> int:
        """Seconds a refused client should wait: a rough guess from the queue's length."""
        return max(1, min(60, 2 * (self.waiting + 1)))

    # ---- the runner -----------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            job = await self._waiting.get()
            if job.cancelled:
                continue
            if time.monotonic() >= job.deadline:
                job.timed_out = True
                job.events.put_nowait(Refused("The request waited in the queue past its time limit "
                                              "(localspec serve --timeout): send it again later", "timeout"))
                continue
            if self.state == "failed":
                job.events.put_nowait(Refused("The engine failed to restart after a crash: restart "
                                              "localspec serve (its log says why)", "engine_failed"))
                continue
            await self._serve(job)

    async def _serve(self, job: Job) -> None:
        self._running = job
        job.timing.started = time.monotonic()
        job._stop = lambda: self.engine.stop(job.id)
        try:
            self._send(job)
            stopped_at = None
            while True:
                wait = (job.deadline if stopped_at is None else stopped_at + STOP_GRACE_S) - time.monotonic()
                try:
                    event = await asyncio.wait_for(self._engine_events.get(), timeout=max(0.0, wait))
                except asyncio.TimeoutError:
                    if stopped_at is None:            # its time is up: stop it at the next round
                        job.timed_out = True
                        stopped_at = time.monotonic()
                        self.engine.stop(job.id)
                        continue
                    event = Crashed(None, "", "the engine did not stop a reply within "
                                              f"{STOP_GRACE_S:.0f} s of being asked")
                if job.cancelled and stopped_at is None:
                    stopped_at = time.monotonic()
                if isinstance(event, Crashed):
                    job.events.put_nowait(event)
                    await self._restart()
                    return
                if getattr(event, "request_id", None) != job.id:
                    if isinstance(event, Error) and (event.request_id or "").startswith("learn:"):
                        self.log(f"not learnt by the personal n-grams: {event.title}: {event.cause}")
                    continue                          # a late event of a job already finished
                if isinstance(event, Error) and stopped_at is not None:
                    # a stop that lands while the chat template renders ends it with an Error:
                    # the reply asked to stop has ended before its first token
                    event = Done(job.id, "stopped", "", {})
                job.events.put_nowait(event)
                if isinstance(event, (Done, Error)):
                    self.served += 1
                    return
        finally:
            job._stop = None
            self._running = None

    def _send(self, job: Job) -> None:
        g = job.generation
        sampling = dict(temperature=g.temperature, top_p=g.top_p, top_k=g.top_k, seed=g.seed,
                        max_tokens=g.max_tokens, stop=g.stop)
        if g.messages is not None:
            self.engine.generate(job.id, list(g.messages), **sampling)
        else:
            self.engine.generate_raw(job.id, g.prompt, **sampling)

    async def _restart(self) -> None:
        """The engine died (or hung): a fresh one, while requests wait."""
        self.state = "restarting"
        await asyncio.to_thread(self.engine.restart)
        while True:
            event = await self._engine_events.get()
            if isinstance(event, Ready):
                self.ready, self.state = event, "ok"
                return
            if isinstance(event, (Error, Crashed)) and getattr(event, "request_id", None) is None:
                self.state = "failed"
                return
            if isinstance(event, Calibrating):
                continue

    def _pump_events(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine's events, handed to the event loop as they arrive."""
        while not self._pump_stop.is_set():
            event = self.engine.poll(timeout=0.2)
            if event is not None:
                try:
                    loop.call_soon_threadsafe(self._engine_events.put_nowait, event)
                except RuntimeError:
                    return   # the loop closed: the server is gone
