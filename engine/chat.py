"""Chat input -> prompt text, through the GGUF's own chat template (Jinja, as llama.cpp ships it).

Rendered in a sandbox the way Hugging Face renders templates, with add_generation_prompt so the
model answers as the assistant. A model without a template cannot take chat input.

Why in another process: a chat template is a program that comes with the model file. Jinja's
sandbox stops it reaching Python's internals but not from working without end: `'x' * 10**9`,
nested loops each under the sandbox's range limit, padding a string to a billion characters,
a recursive macro. Counting work in-process would mean predicting the size of every C-level
operation a template can reach (repetition, padding, joins, formatting, big-integer powers);
one missed is an unbounded allocation inside the engine. So templates render in a small worker
(template_worker.py: jinja2 only, its address space capped), started once and reused: a render
costs a pipe round trip, not a process. The worker answers within RENDER_SECONDS or is killed
(and restarted for the next render); a caller's `should_stop` (the chat's Esc) kills it the same
way. Every failure is one LocalspecError naming the model and the fix.
"""
from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Sequence

from .errors import LocalspecError

RENDER_SECONDS = 2.0     # a real template renders in milliseconds; this is the hostile one's limit
START_SECONDS = 30.0     # starting the worker (an interpreter and jinja2) on a loaded machine
POLL_SECONDS = 0.05      # how often a waiting render looks at should_stop
WORKER = Path(__file__).with_name("template_worker.py")
# The most characters the messages of one prompt may hold: about a million tokens, more than any
# context. Longer ones are refused before rendering, as too long, not as the template's failure;
# the worker stops a render past them and the template's own text (TEMPLATE_CHARS more).
MAX_PROMPT_CHARS = 4 << 20
TEMPLATE_CHARS = 1 << 20


class PromptTooLong(LocalspecError):
    """The messages alone hold more than MAX_PROMPT_CHARS: no context can take them (the
    conversation's fit leaves old messages out until they are fewer)."""


def template_fix(model: str) -> str:
    return (f"Run `localspec generate --raw --model {model}` for a plain completion without the "
            "template, or use a model whose chat template works (chat and ask need one)")


def render_chat(template: str | None, messages: Sequence[dict], *, bos_token: str = "",
                eos_token: str = "", model: str = "the model",
                should_stop: Callable[[], bool] | None = None) -> str:
    """The prompt text for `messages`; `model` names the model in errors; `should_stop` is
    polled while the render runs and ends it (LocalspecError "stopped") when it says so."""
    if not template:
        raise LocalspecError(f"{model} has no chat template",
                             "its GGUF metadata lacks tokenizer.chat_template", template_fix(model))
    check_length(messages)
    request = {"template": template, "messages": list(messages), "bos_token": bos_token,
               "eos_token": eos_token, "max_output": MAX_PROMPT_CHARS + TEMPLATE_CHARS}
    answer = _RENDERER.render(json.dumps(request, ensure_ascii=False), model, should_stop)
    if "text" in answer:
        return answer["text"]
    raise LocalspecError(f"The chat template of {model} failed", str(answer["error"]),
                         template_fix(model))


def check_length(messages: Sequence[dict]) -> None:
    """PromptTooLong, naming the system prompt's share, where the messages' text alone is longer
    than any prompt may be."""
    sizes = [len(m["content"]) if isinstance(m.get("content"), str) else 0 for m in messages]
    total = sum(sizes)
    if total <= MAX_PROMPT_CHARS:
        return
    system = sum(n for m, n in zip(messages, sizes) if m.get("role") == "system")
    raise PromptTooLong("Prompt too long",
                        f"the messages hold {total:,} characters" + (f", the system prompt {system:,} of them"
                                                                     if system else "")
                        + f"; a prompt holds at most {MAX_PROMPT_CHARS:,}, more than any context",
                        "Shorten the system prompt (the chat's settings, Ctrl+O, or ask --system)"
                        if system > MAX_PROMPT_CHARS // 2 else "Send a shorter message (an excerpt)")


def chat_tokens(model, messages: Sequence[dict],
                should_stop: Callable[[], bool] | None = None) -> list[int]:
    """The prompt tokens for `messages` through the chat template of `model` (a LlamaModel)."""
    text = render_chat(model.meta("tokenizer.chat_template"), messages,
                       bos_token=model.token_text(model.special_token("bos")),
                       eos_token=model.token_text(model.special_token("eos")),
                       model=model.path.name, should_stop=should_stop)
    return model.tokenize(text, special=True)


def warm(model) -> None:
    """Start the template worker and compile `model`'s template now, before a first chat request
    would: that request then pays a pipe round trip, not an interpreter's start and jinja2's
    import. A model without a template, or whose template fails, says so when a request comes."""
    if not model.meta("tokenizer.chat_template"):
        return
    try:
        chat_tokens(model, [{"role": "user", "content": "hello"}])
    except LocalspecError:
        pass


class _Renderer:
    """The worker process, started on first use; one render at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def render(self, request: str, model: str, should_stop: Callable[[], bool] | None) -> dict:
        with self._lock:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            try:
                proc.stdin.write(request + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self._stop()
                raise _crashed(model, "the worker went away") from None
            try:
                line, why = _read_line(proc.stdout, time.monotonic() + RENDER_SECONDS, should_stop)
            except BaseException:        # Ctrl+C: the answer would be read by the next render
                self._stop()
                raise
            if line:
                return json.loads(line)
            self._stop()
            if why == "stopped":
                raise LocalspecError("Reply stopped", f"the prompt for {model} was being rendered",
                                     "Send the message again")
            if why == "deadline":
                raise LocalspecError(f"The chat template of {model} failed",
                                     f"rendering it ran past {RENDER_SECONDS:g} s (a template "
                                     "that loops or builds text without end)", template_fix(model))
            raise _crashed(model, "the worker exited")

    def _start(self) -> subprocess.Popen:
        self._stop()
        proc = subprocess.Popen([sys.executable, "-I", str(WORKER)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                encoding="utf-8", bufsize=1)
        self._proc = proc
        line, _ = _read_line(proc.stdout, time.monotonic() + START_SECONDS, None)
        if not line:
            self._stop()
            raise LocalspecError("Could not start the chat template renderer",
                                 f"{sys.executable} {WORKER} did not start",
                                 "Check the localspec installation (jinja2 must be importable)")
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


def _read_line(stream: IO[str], deadline: float, should_stop: Callable[[], bool] | None
               ) -> tuple[str, str]:
    """A line from the worker, or ("", why): "deadline", "stopped" or "eof"."""
    while True:
        if should_stop is not None and should_stop():
            return "", "stopped"
        left = deadline - time.monotonic()
        if left <= 0:
            return "", "deadline"
        ready, _, _ = select.select([stream], [], [], min(left, POLL_SECONDS))
        if ready:
            line = stream.readline()       # the worker writes whole lines
            return (line, "") if line.endswith("\n") else ("", "eof")


def _crashed(model: str, what: str) -> LocalspecError:
    return LocalspecError(f"The chat template of {model} failed",
                          f"{what} while rendering it (a template that exhausts its memory)",
                          template_fix(model))


_RENDERER = _Renderer()
