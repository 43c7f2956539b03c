"""A first calibration's progress, as the user sees it: one line rewritten in place on a terminal.

Why: the first run on a machine measures what batches cost (engine/calibrate.py), tens of seconds
on a small CPU, and a user who sees nothing for that long thinks it hangs. Why only on a
terminal: stderr that goes to a file or a program stays clean, as scripts expect. The chat shows
the same text in its status bar (app/tui), so the wording lives here, where nothing native is
imported.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, TextIO

if TYPE_CHECKING:
    from localspec.engine.calibrate import Step

CLEAR_LINE = "\r\x1b[K"   # back to the line's start, then erase it


def measuring_text(what: str, step: int, total: int) -> str:
    """'Measuring this machine (first run): target 4 rows, 3/12'; a step of no total is a wait
    (engine/model_lock.py): 'Waiting for another localspec process measuring this model'."""
    if not total:
        return what[:1].upper() + what[1:]
    return f"Measuring this machine (first run): {what}, {step}/{total}"


@contextmanager
def terminal_progress(stream: TextIO) -> Iterator[Callable[[Step], None] | None]:
    """A progress callback for Session/calibrate that rewrites one line of `stream`, or None when
    `stream` is not a terminal; the line is erased when the block ends, however it ends."""
    if not stream.isatty():
        yield None
        return
    shown = False

    def show(step: Step) -> None:
        nonlocal shown
        stream.write(CLEAR_LINE + measuring_text(step.what, step.step, step.total))
        stream.flush()
        shown = True

    try:
        yield show
    finally:
        if shown:
            stream.write(CLEAR_LINE)
            stream.flush()
