"""`finish`, the one helper that consumes a generation's events: each Round's text in order, the
Finished generation returned, and an engine that forgets to finish is a bug said so."""
from __future__ import annotations

import pytest

from localspec.engine.generation import Finished, Generation, Round, finish
from localspec.engine.stats import DecodeStats

GENERATION = Generation("ab", [1, 2, 3], "length", DecodeStats(stages=[]), ["target", "maxgram", "target"])
EVENTS = [Round("", (1,), ("target",)),             # held back: tokens, no text yet
          Round("a", (2,), ("maxgram",)),
          Round("b", (3,), ("target",)),
          Finished(GENERATION)]


def test_finish_hands_on_each_rounds_text_and_returns_the_generation():
    seen: list[str] = []
    assert finish(iter(EVENTS), seen.append) is GENERATION
    assert seen == ["a", "b"]                       # empty texts are not handed on


def test_finish_without_a_text_callback_returns_the_generation():
    assert finish(iter(EVENTS)) is GENERATION


def test_finish_stops_reading_at_finished():
    events = iter([*EVENTS, Round("late", (), ())])
    finish(events)
    assert next(events) == Round("late", (), ())


def test_a_stream_without_finished_is_a_bug():
    with pytest.raises(RuntimeError, match="without Finished"):
        finish(iter(EVENTS[:-1]))
