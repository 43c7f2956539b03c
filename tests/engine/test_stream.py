"""A generation's events on the tiny models: Rounds, then exactly one Finished; the Rounds' texts
joined are the Finished text, their tokens and sources the Finished tokens and sources, one
source per token; stop strings hold text back until it is certain and a stop releases it."""
from __future__ import annotations

import pytest

from localspec.engine.config import TreeBudget
from localspec.engine.generation import Finished, Generation, Round
from localspec.engine.session import Session
from localspec.engine.stats import DecodeStats
from localspec.engine.options import Options

from test_greedy_equality import PROMPTS

RAW = [text for kind, text in PROMPTS if kind == "raw"]
MAX_TOKENS = 48
NEVER = "\x00a stop string that never occurs, long enough to hold text back"


@pytest.fixture(scope="module")
def sessions(tiny):
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    spec = Session(Options(tiny.target_gguf, draft=tiny.draft_gguf, n_ctx=512, n_threads=1,
                                personal=False, budget=TreeBudget(max_nodes=8)))
    yield {"plain": plain, "speculative": spec}
    spec.close()
    plain.close()


def checked(events: list) -> tuple[list[Round], Generation]:
    """The stream's Rounds and its Generation, after checking the invariants every stream keeps."""
    *rounds, last = events
    assert all(isinstance(r, Round) for r in rounds) and isinstance(last, Finished)
    gen = last.generation
    assert isinstance(gen.stats, DecodeStats) and gen.stats.tokens == len(gen.tokens)
    assert all(r.text or r.tokens for r in rounds)                # a Round made something final
    assert all(len(r.sources) == len(r.tokens) for r in rounds)   # one proposer per token
    assert "".join(r.text for r in rounds) == gen.text
    assert [t for r in rounds for t in r.tokens] == gen.tokens
    assert [s for r in rounds for s in r.sources] == gen.sources
    assert sum(1 for r in rounds if r.tokens) <= gen.stats.target_calls
    return rounds, gen


def decoded(session: Session, tokens: list[int]) -> str:
    return b"".join(session.model.piece(t) for t in tokens).decode("utf-8", errors="replace")


@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_rounds_then_one_finished(sessions, kind):
    session = sessions[kind]
    drafted = 0
    for text in RAW:
        rounds, gen = checked(list(session.generate(session.raw_prompt(text), max_tokens=MAX_TOKENS)))
        assert gen.finish_reason in ("stop", "length") and gen.text == decoded(session, gen.tokens)
        if kind == "plain":
            eos = gen.finish_reason == "stop"      # the round that drew the end of text emits nothing
            assert len(rounds) == gen.stats.target_calls - eos and all(len(r.tokens) == 1 for r in rounds)
            assert set(gen.sources) <= {"target"}
        drafted += sum(s != "target" for s in gen.sources)
    assert kind == "plain" or drafted > 0, "no round of the repetitive prompts took a drafted token"


@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_a_stop_string_cuts_the_text_and_the_rounds_agree(sessions, kind):
    session = sessions[kind]
    tokens = session.raw_prompt(RAW[-1])
    full = session.run(tokens, max_tokens=MAX_TOKENS).text
    stop = full[len(full) // 2:len(full) // 2 + 4]
    assert len(stop) == 4 and stop in full
    rounds, gen = checked(list(session.generate(tokens, max_tokens=MAX_TOKENS, stop=[stop])))
    assert gen.text == full.split(stop)[0] and gen.finish_reason == "stop"


def test_held_back_text_follows_later_and_a_stop_releases_it(sessions):
    session = sessions["speculative"]
    tokens = session.raw_prompt(RAW[0])
    full = session.run(tokens, max_tokens=MAX_TOKENS)
    # a stop string that never matches: no text is certain until it could no longer become one
    rounds, gen = checked(list(session.generate(tokens, max_tokens=MAX_TOKENS, stop=[NEVER])))
    assert gen.text == full.text and gen.tokens == full.tokens
    assert not rounds[0].text and rounds[0].tokens                # held back: tokens, no text
    # stopped between rounds: the held-back text comes out as a last Round without tokens
    events: list = []
    for event in session.generate(tokens, max_tokens=MAX_TOKENS, stop=[NEVER],
                                  should_stop=lambda: len(events) >= 2):
        events.append(event)
    rounds, gen = checked(events)
    assert gen.finish_reason == "stopped" and gen.stats.target_calls == 2
    assert rounds[-1].text and not rounds[-1].tokens
    assert gen.text == decoded(session, gen.tokens) and full.text.startswith(gen.text)
