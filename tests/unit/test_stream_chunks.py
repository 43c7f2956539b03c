"""app/engine_main.Chunks: how the engine process gathers rounds' text into Token events (pure
logic, a scripted clock)."""
from __future__ import annotations

from localspec.app.engine_main import Chunk, Chunks


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_text_goes_at_once_then_at_most_one_chunk_an_interval():
    clock = Clock()
    chunks = Chunks(0.05, clock)
    assert chunks.add("", [1], ["target"]) is None                 # held back by the detokeniser
    assert chunks.add("Hel", [2], ["maxgram"]) == Chunk("Hel", [1, 2], ["target", "maxgram"])
    clock.now = 0.02
    assert chunks.add("lo", [3], ["target"]) is None
    clock.now = 0.04
    assert chunks.add(",", [4], ["target"]) is None
    clock.now = 0.05
    assert chunks.add(" w", [5, 6], ["ngram", "target"]) == Chunk("lo, w", [3, 4, 5, 6], ["target"] * 2 + ["ngram", "target"])
    clock.now = 0.06
    assert chunks.add("orld", [7], ["target"]) is None
    assert chunks.finish() == Chunk("orld", [7], ["target"])
    assert chunks.finish() is None


def test_a_last_round_of_text_alone_is_not_lost():
    """A stop's last round carries the detokeniser's held-back text and no token."""
    clock = Clock()
    chunks = Chunks(0.05, clock)
    assert chunks.add("a", [1], ["target"]) is not None
    clock.now = 0.1
    assert chunks.add("b", [2], ["target"]) == Chunk("b", [2], ["target"])
    clock.now = 0.11
    assert chunks.add("c!", [], []) is None
    assert chunks.finish() == Chunk("c!", [], [])


def test_tokens_without_text_at_the_end_still_go_out():
    chunks = Chunks(0.05, Clock())
    assert chunks.add("a", [1], ["target"]) is not None
    assert chunks.add("", [2], ["target"]) is None
    assert chunks.finish() == Chunk("", [2], ["target"])
