"""Line-mode chat on the tiny real model: replies stream, each exchange feeds the personal n-gram
store, and a later generation drafted by that personal drafter still equals plain greedy output."""
from __future__ import annotations

import io

from localspec.app.repl import chat_loop
from localspec.engine.config import SamplingParams, TreeBudget
from localspec.engine.session import Session
from localspec.engine.options import Options


def test_chat_learns_and_personal_drafter_stays_exact(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    session = Session(Options(tiny.target_gguf, personal=True, n_ctx=1024, n_threads=1,
                                   budget=TreeBudget(max_nodes=8)))
    plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=1024, n_threads=1))
    try:
        out = io.StringIO()
        chat_loop(session, SamplingParams(), 48,
                  stdin=io.StringIO("Say hello to Bob.\nWrite a function that adds 2 to a number.\n/quit\n"),
                  stdout=out)
        text = out.getvalue()
        assert text.count("> ") >= 3 and len(text) > 80, text
        info = session.store.info()
        assert info.n_sources == 1 and info.n_ngrams > 0       # one conversation, updated twice
        assert [s.kind for s in info.sources] == ["conversation"]

        # the same request again: now the personal drafter has seen it
        prompt = session.chat_prompt([{"role": "user", "content": "Say hello to Bob."}])
        got = session.run(prompt, max_tokens=48)
        want = plain.run(prompt, max_tokens=48)
        assert got.tokens == want.tokens
        personal = {s.name: s for s in got.stats.stages}["personal-ngram"]
        assert sum(personal.accepted) > 0, got.stats.summary()
    finally:
        session.close()
        plain.close()


def test_a_chat_longer_than_the_context_keeps_going_without_its_oldest_turns(tiny, tmp_path, monkeypatch):
    """Line mode with a small context: the conversation outgrows it, the chat says so and goes on
    (the system prompt kept, the oldest turns left out), each later turn keeping the cache of
    the last; a single message too long for the context is refused and the chat goes on."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    session = Session(Options(tiny.target_gguf, personal=False, n_ctx=256, n_threads=1,
                              budget=TreeBudget(max_nodes=8)))
    try:
        lines = [f"Write a function number {i} that adds {i} to a number and explain it." for i in range(12)]
        lines.insert(6, "word " * 300)                      # alone longer than the context
        out = io.StringIO()
        chat_loop(session, SamplingParams(), 24, stdin=io.StringIO("\n".join(lines + ["/stats", "/quit"]) + "\n"),
                  stdout=out)
        text = out.getvalue()
        assert "the conversation outgrew the context" in text, text
        assert "Message longer than the context" in text
        assert text.count("\n> ") == len(lines) + 2          # every line answered, then /stats, /quit
        assert "kept from the last reply" in text            # the last turn reused the cache
    finally:
        session.close()
