"""Hostile chat templates: every one ends within BOUND with one LocalspecError naming the model and
the fix, and the next render (the next message) gets its answer.

Templates render in a worker process with a deadline (RENDER_SECONDS) and a memory cap
(engine/chat.py); these cases reach each limit: time (nested loops under the range limit),
memory (`'x' * 10**9`, padding to ten billion characters), the sandbox's own errors
(range(10**12), a recursive macro), output size, and the template's own raise_exception.
"""
from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.app.engine_proc import Done, EngineProcess, Error, Ready, wait_for
from localspec.engine.chat import RENDER_SECONDS, render_chat
from localspec.engine.errors import LocalspecError
from localspec.engine.options import Options

# A render ends by the deadline; a restart of the worker after a killed one, on a loaded 2-core
# machine, comes on top.
BOUND = RENDER_SECONDS + 3.0
CHAT = [{"role": "user", "content": "hi"}]
GOOD = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "repeat a string a billion times": ("{{ 'x' * 10**9 }}", "MiB"),
    "nested loops under the range limit": (NESTED, "ran past"),
    "range(10**12)": ("{% for i in range(10**12) %}{% endfor %}", "OverflowError"),
    "a recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses"),
    "huge output": ("{% for i in range(99999) %}{{ 'y' * 99999 }}{% endfor %}", "characters"),
    "pad to ten billion": ("{{ 'x'.ljust(10**10) }}", "MiB"),
    "a huge power": ("{{ 7 ** (10 ** 10) }}", ""),
    "doubling a namespace string": ("{% set ns = namespace(s='xx') %}{% for i in range(60) %}"
                                    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", ""),
    "raise_exception": ("{{ raise_exception('Only user and assistant roles') }}", "Only user"),
    "a syntax error": ("{% for %}", "TemplateSyntaxError"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_fails_within_the_bound_and_the_next_render_works(name):
    template, needle = HOSTILE[name]
    t0 = time.perf_counter()
    with pytest.raises(LocalspecError) as err:
        render_chat(template, CHAT, model="hostile.gguf")
    assert time.perf_counter() - t0 < BOUND, name
    assert "hostile.gguf" in err.value.title and needle in err.value.cause, err.value
    assert "--raw" in err.value.fix and "hostile.gguf" in err.value.fix
    t0 = time.perf_counter()
    assert render_chat(GOOD, CHAT, model="good.gguf") == "<user>hi"
    assert time.perf_counter() - t0 < BOUND


def test_a_missing_template_names_the_model_and_the_fix():
    with pytest.raises(LocalspecError, match="base.gguf has no chat template") as err:
        render_chat(None, CHAT, model="base.gguf")
    assert "--raw" in err.value.fix


def test_should_stop_ends_a_render_at_once():
    render_chat(GOOD, CHAT)                              # the worker is up
    asked = time.monotonic() + 0.3
    t0 = time.perf_counter()
    with pytest.raises(LocalspecError, match="stopped"):
        render_chat(NESTED, CHAT, model="m.gguf", should_stop=lambda: time.monotonic() > asked)
    assert time.perf_counter() - t0 < 0.3 + RENDER_SECONDS / 2
    assert render_chat(GOOD, CHAT) == "<user>hi"


def with_template(src: Path, dst: Path, template: str) -> Path:
    """A copy of the GGUF `src` whose tokenizer.chat_template is `template` (padded with a Jinja
    comment so that the tensor data keeps its alignment)."""
    data = src.read_bytes()
    key = b"tokenizer.chat_template"
    value_at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    (n,) = struct.unpack_from("<Q", data, value_at)
    new = template.encode()
    new += b"{#" + b" " * (-(len(new) + 4 - n) % 32) + b"#}"
    dst.write_bytes(data[:value_at] + struct.pack("<Q", len(new)) + new + data[value_at + 8 + n:])
    return dst


def test_chat_engine_answers_after_a_hostile_template_and_esc_cancels_a_render(tiny, tmp_path):
    """In the chat's engine process: a hanging template is an Error within the bound; a stop
    (Esc) ends a render at once; the next message, raw here, gets its answer."""
    model = with_template(Path(tiny.target_gguf), tmp_path / "hostile.gguf", NESTED)
    engine = EngineProcess(Options(model=str(model), speculation=False, personal=False,
                                      n_ctx=512))
    engine.start()
    try:
        assert isinstance(wait_for(engine, (Ready, Error), timeout=120)[-1], Ready)
        t0 = time.perf_counter()
        engine.generate("a", CHAT, max_tokens=8)
        failed = wait_for(engine, (Done, Error), timeout=60)[-1]
        assert isinstance(failed, Error) and "hostile.gguf" in failed.title, failed
        assert "--raw" in failed.fix and time.perf_counter() - t0 < BOUND
        engine.generate("b", CHAT, max_tokens=8)
        time.sleep(0.5)                                      # the render is under way
        t0 = time.perf_counter()
        engine.stop("b")
        stopped = wait_for(engine, (Done, Error), timeout=60)[-1]
        assert stopped.request_id == "b" and time.perf_counter() - t0 < RENDER_SECONDS, stopped
        engine.generate_raw("c", "class Stack:\n", max_tokens=8)
        done = wait_for(engine, (Done, Error), timeout=60)[-1]
        assert isinstance(done, Done) and done.request_id == "c" and done.text, done
    finally:
        engine.close()


def test_generate_with_a_hostile_template_exits_2(tiny, tmp_path):
    model = with_template(Path(tiny.target_gguf), tmp_path / "hostile.gguf",
                          HOSTILE["a recursive macro"][0])
    before = model.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "localspec.app.cli", "generate", "hi", "--model",
                           str(model), "--no-speculation", "--no-personal", "--max-tokens", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "hostile.gguf" in proc.stderr and "--raw" in proc.stderr and "fix:" in proc.stderr
    assert model.read_bytes() == before


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_esc_in_the_chat_cancels_a_hanging_render_and_the_next_message_is_answered(
        tiny, tmp_path, monkeypatch):
    """The chat screen on a model whose template hangs on one message: Esc stops that reply at
    once, and the next message gets its answer (the engine is not left rendering)."""
    from tiny_models import CHAT_TEMPLATE
    from tui_support import make_app, ready, replied, type_and_send, wait_until

    hang = "{% if messages[-1]['content'] == 'hang' %}" + NESTED + "{% endif %}"
    model = with_template(Path(tiny.target_gguf), tmp_path / "moody.gguf", hang + CHAT_TEMPLATE)
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    h = make_app(tiny, tmp_path, model=str(model))
    async with h.app.run_test(size=(110, 32)) as pilot:
        await wait_until(pilot, lambda: ready(h), what="engine ready")
        await type_and_send(pilot, h, "hang")
        await wait_until(pilot, lambda: h.chat.reply is not None, what="the reply row")
        await pilot.pause(0.3)                               # the engine is rendering
        await pilot.press("escape")
        assert h.chat.reply is None
        t0 = time.perf_counter()
        await type_and_send(pilot, h, "Say hello to Bob.")
        await wait_until(pilot, lambda: replied(h), timeout=60, what="the next reply")
        assert time.perf_counter() - t0 < 30
        (conv,) = h.history.conversations()
        states = [(m.role, m.state) for m in h.history.messages(conv.id)]
        assert states == [("user", "complete"), ("assistant", "stopped"),
                          ("user", "complete"), ("assistant", "complete")], states
        assert h.history.messages(conv.id)[-1].content
