"""The thread count that follows the cores other processes leave free (engine/cores.py): the
rule, /proc/stat's reading and the governor's windows, with scripted readings."""
from __future__ import annotations

import pytest

from localspec.engine import cores
from localspec.engine.cores import Governor, busy_seconds, threads_after

TICK = cores._TICK


@pytest.mark.parametrize("current, most, n_cores, others, expect", [
    (2, 2, 2, 1.0, 1),     # a busy process on one of two cores: one thread
    (2, 2, 2, 0.67, 1),    # what it gets beside two spinning threads: still one
    (2, 2, 2, 0.4, 2),     # a light load keeps both
    (1, 2, 2, 0.5, 1),     # inside the band: no flip back
    (1, 2, 2, 0.3, 2),     # the load left: both again
    (8, 8, 8, 1.0, 7),
    (8, 8, 8, 2.7, 5),
    (1, 8, 8, 0.0, 8),     # back up in one look, not a thread a window
    (4, 4, 8, 0.0, 4),     # never past the model's own most
    (2, 2, 2, 5.0, 1),     # never below one
])
def test_threads_after(current, most, n_cores, others, expect):
    assert threads_after(current, most, n_cores, others) == expect


def stat(*cpus: tuple[int, int, int]) -> str:
    """/proc/stat text: per cpu (user, system, idle) in ticks, and the total line first."""
    lines = [f"cpu  {sum(c[0] for c in cpus)} 0 {sum(c[1] for c in cpus)} {sum(c[2] for c in cpus)} 0 0 0 0 0 0"]
    lines += [f"cpu{i} {u} 0 {s} {idle} 7 1 1 2 0 0" for i, (u, s, idle) in enumerate(cpus)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"


def test_busy_seconds_sums_the_process_cpus_without_idle_and_iowait():
    text = stat((100, 50, 900), (300, 0, 10), (5, 5, 5))
    assert busy_seconds(text, {0, 1}) == pytest.approx((150 + 4 + 300 + 4) / TICK)   # irq, softirq, steal
    assert busy_seconds(text, {2}) == pytest.approx(14 / TICK)
    assert busy_seconds(text, {0, 5}) is None       # a cpu /proc/stat does not list


class Machine:
    """Two cores whose busy time and this process's own CPU time the test moves by hand."""

    def __init__(self) -> None:
        self.now, self.busy_ticks, self.own = 100.0, 0, 0.0
        self.readable = True

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.now += seconds
        self.own += own_cores * seconds
        self.busy_ticks += round((own_cores + other_cores) * seconds * TICK)

    def governor(self) -> Governor:
        def read() -> str | None:
            half = self.busy_ticks // 2
            return stat((half, 0, 10**6), (self.busy_ticks - half, 0, 10**6)) if self.readable else None
        return Governor({0, 1}, read, lambda: self.own, lambda: self.now, background=False)


def test_each_look_moves_the_count_by_the_last_window():
    m = Machine()
    g = m.governor()
    g.look()                                    # the first look is a baseline
    assert g.threads(2) == 2 and g.others is None
    m.run(1.0, own_cores=1.33, other_cores=0.67)    # a busy process came, beside two threads
    g.look()
    assert g.threads(2) == 1 and g.others == pytest.approx(0.67, abs=0.02)
    m.run(1.0, own_cores=1.0, other_cores=1.0)      # alone on its core it takes all of it
    g.look()
    assert g.threads(2) == 1
    m.run(1.0, own_cores=1.0, other_cores=0.05)     # it left
    g.look()
    assert g.threads(2) == 2


def test_a_model_gets_at_most_its_own_count():
    m = Machine()
    g = m.governor()
    assert g.threads(2) == 2
    assert g.threads(1) == 1                    # a draft opened with one thread's worth of cores


def test_without_proc_stat_the_count_stays():
    m = Machine()
    m.readable = False
    g = m.governor()
    g.look()
    m.run(2.0, own_cores=1.0, other_cores=1.0)
    g.look()
    assert g.threads(2) == 2 and g.others is None


def test_settled_waits_for_the_first_window_only():
    m = Machine()
    g = m.governor()
    g.look()
    start = cores.time.monotonic()
    g.settled(timeout=0.05)                     # a baseline alone is no reading: it waits it out
    assert cores.time.monotonic() - start >= 0.05
    m.run(1.0, own_cores=1.0, other_cores=1.0)
    g.look()
    start = cores.time.monotonic()
    g.settled(timeout=5)
    assert cores.time.monotonic() - start < 1 and g.threads(2) == 1
    m.readable = False
    blind = m.governor()
    blind.look()                                # nothing to read: nothing to wait for
    start = cores.time.monotonic()
    blind.settled(timeout=5)
    assert cores.time.monotonic() - start < 1


def test_the_watch_looks_in_the_background(monkeypatch):
    monkeypatch.setattr(cores, "WINDOW_S", 0.01)
    monkeypatch.setattr(cores, "FIRST_WINDOW_S", 0.01)
    looks = []
    g = Governor({0}, lambda: looks.append(1) or "cpu0 1 0 0 9 0 0 0 0\n", lambda: 0.0)
    assert g.threads(1) == 1
    deadline = cores.time.monotonic() + 5
    while len(looks) < 3 and cores.time.monotonic() < deadline:
        cores.time.sleep(0.01)
    assert len(looks) >= 3                      # no decode asked: the thread looked on its own
