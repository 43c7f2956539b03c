"""Hostile input, round two (issue 45): prompts too long for any context.

A 200 MB system prompt was blamed on the chat template (its render stopped at the worker's output
cap). Now: a system prompt is at most SYSTEM_PROMPT_MAX_CHARS in the settings (the file is refused
with that bound named, and the chat screen's settings will not save one longer); messages longer
than MAX_PROMPT_CHARS together are refused before rendering as too long, naming the system
prompt's share; and a conversation past that bound leaves out its oldest messages as one past the
context does. Each case ends within BOUND.
"""
from __future__ import annotations

import json
import os
import time

import pytest
from test_hostile_cli import QUICK_S, assert_clean_error, run_cli

from localspec.app.settings import SYSTEM_PROMPT_MAX_CHARS
from localspec.engine.chat import MAX_PROMPT_CHARS, PromptTooLong

BOUND = 60.0    # seconds: renders and tokenizes of a few MiB of text on a loaded 2-core machine


@pytest.fixture(scope="module")
def session(tiny):
    from localspec.engine.options import Options
    from localspec.engine.session import Session

    return Session(Options(model=tiny.target_gguf, n_ctx=256, speculation=False, max_tokens=8))


def test_a_system_prompt_longer_than_any_prompt_is_named_not_the_template(session):
    t0 = time.monotonic()
    with pytest.raises(PromptTooLong) as err:
        session.fit_chat([{"role": "system", "content": "w" * (MAX_PROMPT_CHARS + 1)},
                          {"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < BOUND
    e = err.value
    assert e.title == "Prompt too long" and "template" not in e.title + e.cause, e
    assert f"the system prompt {MAX_PROMPT_CHARS + 1:,} of them" in e.cause and "Shorten the system prompt" in e.fix


def test_a_conversation_past_the_bound_leaves_out_its_oldest_messages(session):
    words = "lorem ipsum " * (MAX_PROMPT_CHARS // 12 // 2 + 1)        # half the bound, a little over
    messages = [{"role": "user", "content": words}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": words}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "hi"}]
    t0 = time.monotonic()
    fitted = session.fit_chat(messages)
    assert time.monotonic() - t0 < BOUND
    assert fitted.dropped == 4 and len(fitted.tokens) < 64


def test_a_system_prompt_past_the_settings_bound_is_refused_naming_it(tiny, tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"system_prompt": "w" * (SYSTEM_PROMPT_MAX_CHARS + 1)}))
    env = dict(os.environ, LOCALSPEC_CONFIG_DIR=str(tmp_path), LOCALSPEC_DATA_DIR=str(tmp_path / "data"))
    proc = run_cli("ask", "hi", "--model", str(tiny.target_gguf), env=env, timeout=QUICK_S)
    assert_clean_error(proc, "Settings file is unreadable",
                       f"system_prompt of {SYSTEM_PROMPT_MAX_CHARS + 1:,} characters", "attach")
