"""`localspec head train`'s progress, as the user sees it: one line rewritten in place on a
terminal, plain lines in a log.

Why: training reads text, has the target generate, then trains, minutes to an hour in all, and a
user watching wants to see which phase it is in, how far along, and (training) how well the head
guesses so far and how long is left; a bar redrawn in place says that without scrolling the
screen away. Why plain lines off a terminal: a script or a log file (`2>train.log`) wants lines it
can read back, and only the milestones (engine/head_train.py's `Progress.milestone`), not a
redraw per step. The engine sends events and never prints; the wording lives here.
"""
from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, TextIO

from .progress import CLEAR_LINE

if TYPE_CHECKING:
    from localspec.engine.head_train import Progress

PHASES = {"reading": "reading text", "generating": "generating continuations", "training": "training"}
BAR = 20          # the bar's cells
REDRAW_S = 0.1    # a terminal line is redrawn at most this often (milestones and notes: at once)


def duration(seconds: float) -> str:
    """'45 s', '4 min 10 s', '1 h 05 min'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s // 60 % 60:02d} min"


def _left(ev: Progress) -> str:
    return f"{duration((ev.total - ev.done) / ev.rate)} left" if ev.rate > 0 and ev.done < ev.total else ""


def _top1(ev: Progress) -> str:
    return " ".join(f"{a:.2f}" for a in ev.held_out_top1)


def bar_line(ev: Progress, width: int | None = None) -> str:
    """The terminal line: phase, a bar, how far, the time left, and the rate or (training) the
    held-out top-1 by depth (the latest measurement), in at most `width` characters (a line that
    wraps cannot be redrawn): shorter words and a shorter bar where the full line does not fit.
    'training [######..............]  step 900/3000  8 min 45 s left  held-out top-1 by depth 0.52 0.31 0.18'"""
    lines = [_line(ev, BAR, False), _line(ev, BAR, True), _line(ev, BAR // 2, True)]
    return next((line for line in lines if width is None or len(line) <= width), lines[-1][:width])


def _line(ev: Progress, cells: int, short: bool) -> str:
    filled = min(cells, cells * ev.done // ev.total) if ev.total > 0 else 0
    parts = [f"{ev.phase if short else PHASES[ev.phase]} [{'#' * filled}{'.' * (cells - filled)}]"]
    if ev.phase == "training":
        parts += [f"step {ev.done}/{ev.total}", _left(ev)]
        if ev.held_out_top1:
            parts.append(f"{'top-1' if short else 'held-out top-1 by depth'} {_top1(ev)}")
        else:
            parts.append("" if short else "held-out top-1: not yet")
    else:
        parts += [f"{ev.done:,}/{ev.total:,} tokens", _left(ev), "" if short else f"{ev.rate:,.0f}/s"]
    return "  ".join(p for p in parts if p)


def plain_line(ev: Progress) -> str | None:
    """A log's line for a milestone or a note (None for the events that only move a bar):
    'reading text: 150000/500000 tokens (41200/s)',
    'step 500/3000 loss 2.310 held-out top-1 by depth [0.52, 0.31, 0.18] (3.1 steps/s, 806 s left)'."""
    if ev.note:
        return ev.note
    if not ev.milestone:
        return None
    if ev.phase == "training":
        loss = "" if ev.loss is None else f" loss {ev.loss:.3f}"
        return (f"step {ev.done}/{ev.total}{loss} held-out top-1 by depth {list(ev.held_out_top1)} "
                f"({ev.rate:.1f} steps/s, {(ev.total - ev.done) / max(ev.rate, 1e-9):.0f} s left)")
    return f"{PHASES[ev.phase]}: {ev.done}/{ev.total} tokens ({ev.rate:.0f}/s)"


class HeadReport:
    """Progress events and lines of text to `stream`: on a terminal one line redrawn in place
    (the lines said go above it), elsewhere the milestones' lines (`plain_line`) and the lines
    said. `clear` erases the bar (a phase ended: the lines said next go where it was)."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.clock = stream, clock
        self.tty = stream.isatty()
        self._bar = ""        # what the terminal line shows now
        self._drawn_at = -REDRAW_S

    def __call__(self, ev: Progress) -> None:
        if not self.tty:
            line = plain_line(ev)
            if line is not None:
                self.say(line)
            return
        if ev.note:
            self.say(ev.note)
        now = self.clock()
        if ev.milestone or ev.note or now - self._drawn_at >= REDRAW_S:
            self._draw(bar_line(ev, shutil.get_terminal_size().columns - 1), now)

    def say(self, line: str) -> None:
        """A line that stays (a summary, a skipped file): above the bar, which is redrawn."""
        if self.tty and self._bar:
            self.stream.write(CLEAR_LINE + line + "\n" + self._bar)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self._bar:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
            self._bar = ""

    def _draw(self, line: str, now: float) -> None:
        self._bar = line
        self.stream.write(CLEAR_LINE + self._bar)
        self.stream.flush()
        self._drawn_at = now


@contextmanager
def head_report(stream: TextIO) -> Iterator[HeadReport]:
    """A HeadReport whose bar is erased when the block ends, however it ends."""
    report = HeadReport(stream)
    try:
        yield report
    finally:
        report.clear()
