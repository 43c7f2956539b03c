"""`head train`'s progress (app/head_progress.py): the terminal line per phase, a log's lines, and
the reporter that redraws one line on a terminal and writes plain lines elsewhere."""
from __future__ import annotations

import io

from localspec.app.head_progress import HeadReport, bar_line, duration, head_report, plain_line
from localspec.app.progress import CLEAR_LINE
from localspec.engine.head_train import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_terminal_line_of_each_phase():
    assert bar_line(Progress("reading", 150_000, 500_000, 50_000.0)) == (
        "reading text [######..............]  150,000/500,000 tokens  7 s left  50,000/s")
    assert bar_line(Progress("generating", 1_000_000, 1_000_000, 900.0)) == (
        "generating continuations [####################]  1,000,000/1,000,000 tokens  900/s")
    training = Progress("training", 900, 3000, 4.0, held_out_top1=(0.523, 0.31, 0.18))
    assert bar_line(training) == (
        "training [######..............]  step 900/3000  8 min 45 s left  held-out top-1 by depth 0.52 0.31 0.18")
    assert bar_line(Progress("training", 3, 3000, 0.0)) == (
        "training [....................]  step 3/3000  held-out top-1: not yet")


def test_the_terminal_line_fits_the_terminal_with_shorter_words_then_a_shorter_bar():
    training = Progress("training", 900, 3000, 4.0, held_out_top1=(0.523, 0.31, 0.18))
    assert bar_line(training, 90) == (
        "training [######..............]  step 900/3000  8 min 45 s left  top-1 0.52 0.31 0.18")
    assert bar_line(training, 79) == "training [###.......]  step 900/3000  8 min 45 s left  top-1 0.52 0.31 0.18"
    assert bar_line(Progress("generating", 8192, 1_000_000, 900.0), 79) == (
        "generating [....................]  8,192/1,000,000 tokens  18 min 22 s left")
    assert len(bar_line(training, 40)) == 40


def test_durations():
    assert [duration(s) for s in (0.4, 59, 61, 3599, 3600, 7 * 3600 + 125)] == [
        "0 s", "59 s", "1 min 01 s", "59 min 59 s", "1 h 00 min", "7 h 02 min"]


def test_a_logs_lines_are_the_milestones_and_notes():
    assert plain_line(Progress("reading", 6400, 500_000, 45_859.2)) is None
    assert plain_line(Progress("reading", 6400, 500_000, 45_859.2, milestone=True)) == (
        "reading text: 6400/500000 tokens (45859/s)")
    assert plain_line(Progress("generating", 8192, 1_000_000, 900.0, milestone=True)) == (
        "generating continuations: 8192/1000000 tokens (900/s)")
    assert plain_line(Progress("training", 500, 3000, 2.5, 2.3104, (0.52, 0.31), milestone=True)) == (
        "step 500/3000 loss 2.310 held-out top-1 by depth [0.52, 0.31] (2.5 steps/s, 1000 s left)")
    assert plain_line(Progress("training", 40, 3000, note="2000 steps fit in 600 s")) == "2000 steps fit in 600 s"


def test_on_a_terminal_one_line_is_redrawn_lines_said_go_above_it_and_it_is_erased_at_the_end():
    out = Terminal()
    now = [0.0]
    with head_report(out) as report:
        report.clock = lambda: now[0]
        report(Progress("reading", 10, 100, 5.0))
        report(Progress("reading", 20, 100, 5.0))           # within 0.1 s of the last redraw: not drawn
        now[0] = 1.0
        report(Progress("reading", 30, 100, 5.0))
        report.say("skipped x.py: binary")
    text = out.getvalue()
    first, third = bar_line(Progress("reading", 10, 100, 5.0)), bar_line(Progress("reading", 30, 100, 5.0))
    assert text == (CLEAR_LINE + first + CLEAR_LINE + third
                    + CLEAR_LINE + "skipped x.py: binary\n" + third + CLEAR_LINE)


def test_off_a_terminal_only_plain_lines():
    out = io.StringIO()
    report = HeadReport(out)
    report(Progress("training", 1, 3000, 2.0))
    report(Progress("training", 500, 3000, 2.0, 2.0, (0.5,), milestone=True))
    report.say("training on 20,000 tokens")
    report.clear()
    assert out.getvalue() == ("step 500/3000 loss 2.000 held-out top-1 by depth [0.5] (2.0 steps/s, 1250 s left)\n"
                              "training on 20,000 tokens\n")
