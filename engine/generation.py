"""What a generation yields: one `Round` per round that made something final, then one `Finished`.

A stream of typed events instead of text pieces with a side channel: the tokens, their text and
who proposed each travel together, so an app that colours tokens by drafter reads them from the
same object as the text, and the result (statistics included) is the last event rather than a
generator return value that every caller would have to fish out of StopIteration. `finish` is
the one helper for callers that want the result, optionally seeing the text as it streams.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Union

if TYPE_CHECKING:   # only named: the events load nothing native (numpy), wherever they are read
    from .stats import DecodeStats


@dataclass(frozen=True, slots=True)
class Round:
    """What one round made final. `text` is the text now certain ("" while a stop string or a
    UTF-8 character may still be forming; it may also release earlier rounds' held-back text);
    `tokens` are the round's committed tokens and `sources`, one per token, the drafter that
    proposed each ("target" for the target's own). A stop between rounds releases the held-back
    text as a Round with no tokens."""

    text: str
    tokens: tuple[int, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Generation:
    """A finished generation; `text` and `tokens` exclude the prompt, `text` is the Rounds' texts
    joined and `tokens`/`sources` theirs concatenated."""

    text: str
    tokens: list[int]
    finish_reason: str               # "stop" (EOS or stop string), "length", "context", "stopped"
    stats: DecodeStats
    sources: list[str]               # per token: the drafter that proposed it, or "target"


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every generation."""

    generation: Generation


Event = Union[Round, Finished]


def finish(stream: Iterator[Event], on_text: Callable[[str], None] | None = None) -> Generation:
    """Consume a generation's events to its end, handing each Round's text (when not empty) to
    `on_text` as it arrives; the Generation."""
    for event in stream:
        match event:
            case Round(text=text):
                if text and on_text is not None:
                    on_text(text)
            case Finished(generation=generation):
                return generation
    raise RuntimeError("a generation's events ended without Finished")   # a bug in the engine
