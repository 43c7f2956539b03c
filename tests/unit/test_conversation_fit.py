"""Which oldest messages a conversation longer than the context leaves out (engine/conversation.py),
with a render that counts a message's words as its tokens; and the common prefix of two token
sequences (engine/prefix.py)."""
from __future__ import annotations

import pytest

from localspec.engine.conversation import SHRINK_TO, fit, reply_room
from localspec.engine.errors import LocalspecError
from localspec.engine.prefix import common_prefix


def render(messages: list[dict]) -> list[int]:
    tokens = []
    for m in messages:
        tokens += [hash(m["role"]) % 97] + [len(w) for w in m["content"].split()]
    return tokens


def chat(turns: int, words: int = 9) -> list[dict]:
    out = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i} " + "w " * words})
        out.append({"role": "assistant", "content": f"answer {i} " + "w " * words})
    return out


def test_a_conversation_that_fits_is_left_whole():
    messages = chat(3)[:-1]
    got = fit(messages, render, room=len(render(messages)))
    assert got.dropped == 0 and got.tokens == render(messages) and got.left_out == ()


def test_an_outgrown_conversation_keeps_the_system_prompt_and_starts_with_a_user_message():
    messages = chat(10)[:-1]                     # ends with the new question
    room = len(render(messages)) // 2
    got = fit(messages, render, room)
    kept = [messages[0]] + messages[1 + got.dropped:]
    assert got.tokens == render(kept) and len(got.tokens) <= room * SHRINK_TO
    assert kept[0]["role"] == "system" and kept[1]["role"] == "user"
    assert got.left_out == tuple(messages[1:1 + got.dropped])
    # no fewer left out than needed: one user message fewer and it would not fit the target
    assert len(render([messages[0]] + messages[1 + got.dropped - 2:])) > room * SHRINK_TO


def test_what_was_left_out_stays_out_while_the_rest_fits():
    """The next turn starts from the last one's left_out, so the prompt's start (and the cache
    built for it) stays; only when the room runs out again does more go, at once."""
    messages = chat(10)[:-1]
    room = len(render(messages)) // 2
    first = fit(messages, render, room)
    grown = messages + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    second = fit(grown, render, room, first.left_out)
    assert second.dropped == first.dropped
    assert second.tokens[:len(first.tokens)] == first.tokens
    longer = grown + chat(6)[1:-1]
    third = fit(longer, render, room, second.left_out)
    assert third.dropped > second.dropped and len(third.tokens) <= room * SHRINK_TO
    # another conversation does not start with those messages: they do not carry over
    other = [{"role": "user", "content": "hello"}]
    assert fit(other, render, room, third.left_out).dropped == 0


def test_a_last_message_longer_than_the_room_is_refused_with_the_fix():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "w " * 50}]
    with pytest.raises(LocalspecError) as err:
        fit(messages, render, room=20)
    assert "--ctx" in err.value.fix


def test_the_reply_keeps_its_room_up_to_a_quarter_of_the_context():
    assert reply_room(4096, 256) == 256
    assert reply_room(4096, 100_000) == 1024
    assert reply_room(8, 0) == 1


def test_common_prefix():
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix(list(range(50_000)), list(range(49_999)) + [7]) == 49_999


def test_the_status_bar_says_how_much_of_the_context_the_conversation_fills():
    from localspec.app.tui.format import context_line

    assert context_line({}) == ""
    stats = {"context_size": 32768, "prompt_tokens": 1200, "tokens": 34}
    assert context_line(stats) == "context 1,234 of 32,768"
    assert context_line({**stats, "dropped_messages": 4}) == "context 1,234 of 32,768 (dropped 4 oldest messages)"
