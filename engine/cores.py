"""How many threads llama.cpp should run on: the cores other processes leave free (Linux).

ggml's threads meet at a spinning barrier after every operation of a decode, hundreds a token.
With as many threads as cores and another process running, one of them is descheduled at a
time and the rest spin until it runs again: on a 2-core machine with one core busy elsewhere,
two threads decode far slower than one (docs/decisions/0052). So a model opened without a
thread count follows the machine: once a second a `Governor` measures how much of this
process's cores other processes used in that second (the cores' busy time in /proc/stat less
this process's own CPU time) and moves the count one way or the other, with a band between
the two so that a load near the line does not flip it; each decode takes the count it holds.

Only models opened without a thread count are governed, and never exact numerics (its bits
must not depend on when the load came). A thread count changes no matmul's result (ggml splits
them by rows); attention over 512 or more cells for a single row splits by threads, whose sum
order then follows the count, as it follows `--threads` in llama.cpp itself.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

WINDOW_S = 1.0     # how often the watch looks: shorter windows see a scheduler's noise
# the watch's first window is shorter, so that a calibration soon after the first model opened
# (which waits for a reading: `settled`) waits little; the band absorbs its noise
FIRST_WINDOW_S = 0.25
# A core counts as taken once other processes use more than DOWN of it, and as free again once
# they use less than UP of it; between the two the count stays (docs/decisions/0052).
DOWN = 0.55
UP = 0.35
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def threads_after(current: int, most: int, cores: int, others: float) -> int:
    """The thread count after a window in which other processes used `others` of this process's
    `cores` (in cores), from `current`, at most `most` and at least one."""
    free = cores - others
    n = min(current, most)
    while n < most and free >= n + 1 - UP:
        n += 1
    while n > 1 and free < n - DOWN:
        n -= 1
    return max(1, n)


def busy_seconds(stat: str, cpus: set[int]) -> float | None:
    """The busy time (not idle, not waiting for I/O) of `cpus`, summed, from /proc/stat's text;
    None when one of them is missing (the line format is `cpuN user nice system idle iowait irq
    softirq steal ...` in clock ticks; steal is time another guest took: busy to us)."""
    ticks = 0
    seen = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        fields = [int(f) for f in rest.split()]
        user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
        steal = fields[7] if len(fields) > 7 else 0
        ticks += user + nice + system + irq + softirq + steal
        seen += 1
    return ticks / _TICK if seen == len(cpus) else None


def _read_stat() -> str | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Governor:
    """The process's thread count for governed models: `threads(most)` before each decode.

    A daemon thread looks every WINDOW_S, idle or not, so the count a decode reads always rests
    on the last second: a look taken at a decode after a long idle would average a load that
    may be gone (or miss one that came) and hold the next request's first second to it."""

    def __init__(self, cpus: set[int], read_stat: Callable[[], str | None] = _read_stat,
                 own_seconds: Callable[[], float] = _own_seconds,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        self.cpus = cpus
        self._read_stat, self._own, self._clock = read_stat, own_seconds, clock
        self._current = len(cpus)
        self._last: tuple[float, float, float] | None = None   # (clock, busy, own) at the last look
        self.others: float | None = None                       # cores others used in the last window
        self._background = background
        self._lock = threading.Lock()
        self._reading = threading.Event()    # set once a window was read (or nothing can be)

    def threads(self, most: int) -> int:
        """The count to decode with now, for a model whose own most is `most`."""
        if self._background:
            with self._lock:
                if self._background:
                    self._background = False
                    self.look()
                    threading.Thread(target=self._watch, name="localspec-cores", daemon=True).start()
        return max(1, min(self._current, most))

    def settled(self, timeout: float = 2 * FIRST_WINDOW_S) -> None:
        """Wait (at most `timeout`) until the count rests on a window's reading: the count
        before the first one is only the cores'."""
        self._reading.wait(timeout)

    def _watch(self) -> None:
        time.sleep(FIRST_WINDOW_S)
        while True:
            self.look()
            time.sleep(WINDOW_S)

    def look(self) -> None:
        """One window's reading: the cores others used since the last look move the count."""
        now = self._clock()
        text = self._read_stat()
        busy = None if text is None else busy_seconds(text, self.cpus)
        if busy is None:             # not Linux, or /proc hidden: nothing to go by, keep the count
            self._reading.set()
            return
        own = self._own()
        last, self._last = self._last, (now, busy, own)
        if last is not None and now > last[0]:
            others = max(0.0, (busy - last[1]) - (own - last[2])) / (now - last[0])
            self.others = others
            self._current = threads_after(self._current, len(self.cpus), len(self.cpus), others)
            self._reading.set()


def process_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


_GOVERNOR: Governor | None = None


def governor() -> Governor:
    """The process's one governor (its models share the cores)."""
    global _GOVERNOR
    if _GOVERNOR is None:
        _GOVERNOR = Governor(process_cpus())
    return _GOVERNOR
