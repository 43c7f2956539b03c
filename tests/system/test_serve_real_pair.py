"""`localspec serve` with the reference target (issue 44), as `make chat` runs it (no draft
model), through the real `openai` client: the streamed reply equals the plain one at temperature
0 (exact numerics: greedy speculation is the target's own greedy output bit for bit, whatever
the cache kept), a tool's next turn is served from the cache, and the statistics header says
what speculation did."""
from __future__ import annotations

import signal

import openai
import pytest
from serve_server import start_server

pytestmark = pytest.mark.real_pair

ASK = [{"role": "system", "content": "You are a careful Python reviewer."},
       {"role": "user", "content": "Write a Python function that reverses the words of a sentence."}]


def test_real_target_streamed_equals_plain_and_the_next_turn_is_cached(real_pair):
    target, _draft = real_pair
    served = start_server(None, "--ctx", "4096", "--exact", "--gpu-layers", "0", "--fixed-budget",
                          "--tree-nodes", "16", model=target)   # no calibration to wait for
    try:
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=900)
        raw = client.chat.completions.with_raw_response.create(model="x", messages=ASK, temperature=0, max_tokens=32)
        plain = raw.parse()
        text = plain.choices[0].message.content
        assert text and plain.usage.completion_tokens > 10
        assert "tokens_per_call=" in raw.headers["x-localspec-stats"]

        chunks = list(client.chat.completions.create(model="x", messages=ASK, temperature=0, max_tokens=32,
                                                     stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason

        turn = [*ASK, {"role": "assistant", "content": text}, {"role": "user", "content": "Add a docstring."}]
        second = client.chat.completions.create(model="x", messages=turn, temperature=0, max_tokens=8)
        assert second.usage.prompt_tokens_details.cached_tokens >= plain.usage.prompt_tokens
    finally:
        assert served.stop(signal.SIGTERM) == 0
