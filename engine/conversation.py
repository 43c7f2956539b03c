"""A conversation longer than the context: which of its oldest messages to leave out.

The chat keeps working past the context: the system prompt stays and the oldest turns go, a whole
message at a time, so the rest still starts with a user's message. Two rules keep the cache of
the conversation (engine/target.py's `keep_prefix`) paying after that:
- once left out, a message stays out: each turn starts from the messages the last one left out,
  so the prompt's start, and the cache built for it, stays the same turn after turn;
- when more must go, enough goes that the prompt fills at most half of what it may (`SHRINK_TO`):
  leaving out changes the prompt's start, which costs a prefill of the whole rest, so it should
  happen once every several turns, not at every turn (llama.cpp's server shifts half its context
  for the same reason).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .chat import PromptTooLong
from .errors import LocalspecError

SHRINK_TO = 0.5   # of the prompt's room, what a conversation is cut to when it outgrows it


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the reply: its max_tokens, but at most a quarter of the context (a
    reply that runs out of room ends with finish_reason "context", as it would anyway)."""
    return max(1, min(max_tokens, n_ctx // 4))


@dataclass(frozen=True)
class Fitted:
    tokens: list[int]        # the prompt
    dropped: int             # oldest non-system messages left out
    left_out: tuple          # those messages, to start the next turn from (`fit`'s `after`)


def fit(messages: Sequence[dict], render: Callable[[list[dict]], list[int]], room: int,
        after: Sequence[dict] = ()) -> Fitted:
    """The prompt for `messages` in at most `room` tokens, leaving out the oldest messages after
    the leading system ones if it must. `after`: the messages the last turn left out; where this
    conversation still starts with them, they stay out. Raises when even the last message (with
    the system prompt) does not fit."""
    messages = list(messages)
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    system, rest = messages[:head], messages[head:]

    def prompt(k: int) -> list[int]:
        return render(system + rest[k:])

    def fits(k: int, limit: int) -> bool:
        try:                         # messages too long to render (chat.PromptTooLong) fit no context
            return len(prompt(k)) <= limit
        except PromptTooLong:
            return False

    start = len(after) if list(after) == rest[:len(after)] and len(after) < len(rest) else 0
    try:
        tokens = prompt(start)
        if len(tokens) <= room:
            return Fitted(tokens, start, tuple(rest[:start]))
    except PromptTooLong:
        if not rest:
            raise
    if not rest:
        raise _too_long(len(tokens), room, system)
    target = int(room * SHRINK_TO)
    cuts = [k for k in range(start + 1, len(rest)) if rest[k].get("role") != "assistant"]
    cuts.append(len(rest) - 1)       # the last message alone, whoever wrote it
    lo, hi = 0, len(cuts) - 1        # the first cut whose prompt fits the target: lengths fall as k grows
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(cuts[mid], target):
            hi = mid
        else:
            lo = mid + 1
    k = cuts[lo]
    tokens = prompt(k)               # PromptTooLong here: the last message alone is too long
    if len(tokens) > room:
        raise _too_long(len(tokens), room, system)
    return Fitted(tokens, k, tuple(rest[:k]))


def _too_long(need: int, room: int, system: Sequence[dict]) -> LocalspecError:
    chars = sum(len(m.get("content") or "") for m in system)
    return LocalspecError("Message longer than the context",
                          f"the last message needs {need} tokens with the system prompt"
                          + (f" ({chars:,} characters)" if chars else "") + f"; the "
                          f"context leaves {room} for it (the rest is the reply's room)",
                          "Send a shorter message (an excerpt of the file)"
                          + (", shorten the system prompt" if chars else "") + ", or raise the context "
                          "with --ctx")
