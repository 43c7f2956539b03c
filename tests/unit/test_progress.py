"""The first calibration's progress line (app/progress.py): one line rewritten in place on a
terminal, nothing at all on a pipe or a file."""
from __future__ import annotations

import io

import pytest

from localspec.app.progress import CLEAR_LINE, measuring_text, terminal_progress
from localspec.engine.calibrate import Step


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_rewritten_then_erased():
    stream = Terminal()
    with terminal_progress(stream) as progress:
        progress(Step("target 4 rows", 3, 12))
        progress(Step("draft 1 row", 4, 12))
    assert stream.getvalue() == (CLEAR_LINE + "Measuring this machine (first run): target 4 rows, 3/12"
                                 + CLEAR_LINE + measuring_text("draft 1 row", 4, 12) + CLEAR_LINE)


def test_the_line_is_erased_when_loading_fails_and_left_alone_when_nothing_was_measured():
    stream = Terminal()
    with pytest.raises(KeyboardInterrupt):
        with terminal_progress(stream) as progress:
            progress(Step("target 1 row", 1, 60))
            raise KeyboardInterrupt
    assert stream.getvalue().endswith(CLEAR_LINE)
    cached = Terminal()
    with terminal_progress(cached):
        pass
    assert cached.getvalue() == ""


def test_a_pipe_gets_nothing():
    stream = io.StringIO()
    with terminal_progress(stream) as progress:
        assert progress is None
    assert stream.getvalue() == ""
