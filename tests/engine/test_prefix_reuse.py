"""A conversation's turns keep the cache (GenerationRequest.reuse): each turn prefills only what
the target's cache does not hold yet, and gives the tokens a fresh prefill of the whole prompt
gives, with every kind of stage (Max-Gram's index, a GGUF draft's cache, a PyTorch draft's
slots, the personal n-grams' session counts) kept for the prefix; with exact numerics, bit for bit."""
from __future__ import annotations

import pytest

from localspec.engine.config import DraftLimits, TreeBudget
from localspec.engine.options import Options
from localspec.engine.session import Session

from equality import check_same_or_near_tie
from test_exact import quantised  # noqa: F401  (the fixture: the tiny target in Q5_1)

MAX_TOKENS = 40
TURNS = ["Write a function that returns the largest number in a list.",
         "Now make it return the smallest one.",
         "Add a docstring to both functions."]
# a turn whose prefill runs past ggml's 64-row attention tile and its 256-cell split-KV range
LONG_TURN = "Here is my module; make each function shorter.\n\n```python\n" + "".join(
    f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40)) + "```"
LIMITS = DraftLimits(max_depth=5, branching=2, width=4)
CONFIGS = {   # name -> Options' keywords beside the target
    "plain": dict(speculation=False),
    "maxgram": dict(budget=TreeBudget(max_nodes=8)),
    "gguf-staged": dict(draft="gguf", budget=TreeBudget(max_nodes=16), draft_limits=LIMITS),
    "torch-staged": dict(draft="torch", budget=TreeBudget(max_nodes=12), draft_limits=LIMITS),
    "personal": dict(personal=True, maxgram=False, budget=TreeBudget(max_nodes=8)),
}


def options(tiny, name: str, target=None, **more) -> Options:
    kw = dict(CONFIGS[name])
    if "draft" in kw:
        kw["draft"] = {"gguf": tiny.draft_gguf, "torch": tiny.draft_torch}[kw["draft"]]
    kw.setdefault("personal", False)
    return Options(target or tiny.target_gguf, n_ctx=1024, n_threads=1, calibrate=False, **kw, **more)


def converse(session: Session, turns=TURNS, reuse: bool = True):
    """Each turn's (prompt, generation) of a chat, the replies fed back as the template renders
    them (so a turn's prompt starts with the last one's, up to the reply's retokenisation)."""
    history, out = [], []
    for text in turns:
        history.append({"role": "user", "content": text})
        prompt = session.chat_prompt(history)
        result = session.run(prompt, max_tokens=MAX_TOKENS, reuse=reuse)
        history.append({"role": "assistant", "content": result.text})
        out.append((prompt, result))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_turn_with_the_cache_kept_equals_a_fresh_prefill(tiny, name, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    kept, fresh = Session(options(tiny, name)), Session(options(tiny, name))
    try:
        turns = converse(kept)
        for i, (prompt, got) in enumerate(turns):
            want = fresh.run(prompt, max_tokens=MAX_TOKENS, reuse=False)
            note = check_same_or_near_tie(fresh.model, prompt, want.tokens, got.tokens, 0.05)
            assert not note, f"turn {i}: {note}"   # the tiny F32 models have clear margins
            assert want.stats.reused_tokens == 0
            if i:
                # the last turn's prompt at least is in the cache, then its reply as far as the
                # template renders it as the model wrote it (and past it, where a round's
                # accepted tokens ran on into the end-of-turn tokens the template adds)
                assert len(turns[i - 1][0]) - 1 <= got.stats.reused_tokens < len(prompt)
            assert got.stats.reused_tokens + (got.stats.prompt_tokens - got.stats.reused_tokens) \
                == len(prompt)
        assert kept.engine.target.tokens[:len(turns[-1][0])] == turns[-1][0]
    finally:
        kept.close()
        fresh.close()


def test_a_changed_earlier_message_invalidates_the_cache_from_there(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    session, fresh = Session(options(tiny, "gguf-staged")), Session(options(tiny, "gguf-staged"))
    try:
        converse(session, TURNS[:2])
        edited = [{"role": "user", "content": "Write a function that returns the longest word."}]
        prompt = session.chat_prompt(edited)
        first_change = next(i for i, t in enumerate(session.engine.target.tokens) if t != prompt[i])
        got = session.run(prompt, max_tokens=MAX_TOKENS, reuse=True)
        want = fresh.run(prompt, max_tokens=MAX_TOKENS, reuse=False)
        assert got.stats.reused_tokens == first_change
        assert got.tokens == want.tokens
        # the same prompt again: everything but the root is kept, the last reply dropped
        again = session.run(prompt, max_tokens=MAX_TOKENS, reuse=True)
        assert again.stats.reused_tokens == len(prompt) - 1
        assert again.tokens == want.tokens
    finally:
        session.close()
        fresh.close()


def test_the_cache_holds_nothing_past_the_kept_prefix(tiny, tmp_path, monkeypatch):
    """keep_prefix drops every cell past the kept tokens, in every sequence (the tree paths'
    tags and nodes too), so a prefill after it starts on an empty tail."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    session = Session(options(tiny, "maxgram"))
    try:
        (prompt, _), = converse(session, TURNS[:1])
        target = session.engine.target
        assert target.n_past > len(prompt)
        keep = target.keep_prefix(prompt[:10] + [prompt[10] + 1])
        assert keep == 10 and target.n_past == 10 and target.tokens == prompt[:10]
        for seq in range(target.model.n_seq_max + target.model.n_pad_seqs):
            assert target.model.seq_pos_max(seq) < 10
    finally:
        session.close()


@pytest.mark.parametrize("name", ["maxgram", "gguf-staged"])
def test_exact_numerics_keep_plain_tokens_across_turns(tiny, quantised, name, tmp_path,  # noqa: F811
                                                       monkeypatch):
    """With --exact, a conversation decoded with speculation and the cache kept emits, turn by
    turn, plain decoding's tokens with the cache kept, bit for bit; and the tokens of plain
    decoding from a fresh prefill of each whole prompt (the cache's cells of a reply, decoded a
    round at a time, equal a prefill's: exact numerics make a row's sums batch-invariant)."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    spec = Session(options(tiny, name, target=quantised, exact=True))
    plain = Session(options(tiny, "plain", target=quantised, exact=True))
    try:
        turns = converse(spec, TURNS + [LONG_TURN])
        plain_turns = converse(plain, TURNS + [LONG_TURN])
        assert turns[-1][1].stats.prompt_tokens - turns[-1][1].stats.reused_tokens > 256
        for (prompt, got), (plain_prompt, want) in zip(turns, plain_turns):
            assert prompt == plain_prompt and got.tokens == want.tokens
        for prompt, got in turns:
            assert plain.run(prompt, max_tokens=MAX_TOKENS, reuse=False).tokens == got.tokens
        assert sum(turn.stats.reused_tokens for _, turn in turns[1:]) > 0
    finally:
        spec.close()
        plain.close()
