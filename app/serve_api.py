"""What `localspec serve` accepts and answers, in OpenAI's shapes: request models and responses.

Why it is shaped so:

* The request models are pydantic, strict: a string where a number belongs, a negative
  max_tokens, a temperature of 1e9 are refused before anything reaches the engine, each with the
  parameter named. Fields a client may send that do not change the output (`user`, `metadata`,
  `store`, ...) are ignored, as OpenAI-compatible servers do; those that would change it and that
  localspec cannot honour (`n` > 1, `logprobs`, tools, penalties, `logit_bias`, a JSON
  `response_format`) are refused by `unsupported`, naming the parameter, rather than silently
  answered with output the client did not ask for.
* A request becomes one `Generation` (frozen, plain data): what the engine process is asked for.
  Defaults for what a request leaves out come from the run (the flags over the settings, as
  `ask`), so `localspec serve --temperature 0.2` is every request's default.
* Responses are built here from the engine's events, so the HTTP layer (app/serve_http.py) only
  moves them: `completion` for a whole reply, `chunk` for each server-sent event of a stream.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's own ranges; the engine takes any temperature >= 0, but a client sending 50 has a bug
MAX_TEMPERATURE = 2.0
MAX_STOPS = 4                  # OpenAI allows up to 4 stop sequences
MAX_STOP_CHARS = 256
MAX_INT = (1 << 31) - 1


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ContentPart(_Strict):
    """Any other part (an image, audio, a file): accepted by the model, refused by `chat_messages`."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str


class Message(_Strict):
    model_config = ConfigDict(strict=True, extra="allow")   # name, tool_calls, ...: looked at below
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[Union[TextPart, ContentPart]], None] = None


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """The fields chat and plain completions share."""

    model: str = Field(default="", max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    temperature: float | None = Field(default=None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT)      # not OpenAI's; llama.cpp's servers take it
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 63)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # refused when they would change the output (`unsupported`)
    n: int | None = None
    logprobs: Union[bool, int, None] = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1, max_length=100_000)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    tools: list | None = None
    functions: list | None = None
    tool_choice: Union[str, dict, None] = None
    function_call: Union[str, dict, None] = None
    response_format: dict | None = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str]]


def unsupported(request: _Sampling) -> None:
    """ApiError 400 naming the first parameter given that would change the output and that
    localspec cannot honour; parameters at their no-op values pass."""
    given = request.model_dump(exclude_unset=True)
    checks = [
        ("n", given.get("n") not in (None, 1), "only one choice per request (n = 1)"),
        ("logprobs", given.get("logprobs") not in (None, False, 0), "log probabilities are not returned"),
        ("top_logprobs", given.get("top_logprobs") not in (None, 0), "log probabilities are not returned"),
        ("presence_penalty", given.get("presence_penalty") not in (None, 0, 0.0), "penalties are not applied"),
        ("frequency_penalty", given.get("frequency_penalty") not in (None, 0, 0.0), "penalties are not applied"),
        ("logit_bias", bool(given.get("logit_bias")), "logit bias is not applied"),
        ("echo", bool(given.get("echo")), "the prompt is not echoed"),
        ("best_of", given.get("best_of") not in (None, 1), "only one candidate per request (best_of = 1)"),
        ("suffix", bool(given.get("suffix")), "fill-in-the-middle is not supported"),
        ("tools", bool(given.get("tools")), "tool calls are not supported"),
        ("functions", bool(given.get("functions")), "function calls are not supported"),
        ("tool_choice", given.get("tool_choice") not in (None, "none", "auto"), "tool calls are not supported"),
        ("function_call", given.get("function_call") not in (None, "none", "auto"), "function calls are not supported"),
        ("response_format", (given.get("response_format") or {"type": "text"}).get("type") != "text",
         "only plain text replies (response_format text)"),
    ]
    for param, refused, why in checks:
        if refused:
            raise ApiError(400, f"Unsupported parameter '{param}': {why} by localspec serve. "
                                "Leave it out.", param=param, code="unsupported_parameter")


@dataclass(frozen=True)
class Defaults:
    """What a request leaves out: the run's sampling (its flags over the settings) and context."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int | None      # None: until the model ends or the context is full
    n_ctx: int


@dataclass(frozen=True)
class Generation:
    """One request, as the engine process is asked for it."""

    messages: tuple[dict, ...] | None   # a chat's messages ({"role", "content"}), or None
    prompt: str | None                  # a plain completion's prompt, or None
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    stop: tuple[str, ...]


def generation(request: ChatRequest | CompletionRequest, defaults: Defaults) -> Generation:
    """The engine request for an API request (ApiError 400 for what the engine cannot do)."""
    unsupported(request)
    if isinstance(request, ChatRequest):
        if request.max_tokens is not None and request.max_completion_tokens is not None \
                and request.max_tokens != request.max_completion_tokens:
            raise ApiError(400, "max_tokens and max_completion_tokens differ: send one of them",
                           param="max_completion_tokens")
        asked = request.max_completion_tokens or request.max_tokens
        messages, prompt = tuple(chat_messages(request.messages)), None
    else:
        asked, messages, prompt = request.max_tokens, None, _one_prompt(request.prompt)
    param = "max_completion_tokens" if getattr(request, "max_completion_tokens", None) else "max_tokens"
    if asked is not None and asked > defaults.n_ctx:
        raise ApiError(400, f"{param} {asked} is more than the model's context of {defaults.n_ctx} "
                            f"tokens: ask for at most {defaults.n_ctx}", param=param, code="invalid_value")
    temperature = defaults.temperature if request.temperature is None else request.temperature
    top_p = defaults.top_p if request.top_p is None else request.top_p
    if top_p == 0:     # OpenAI's top_p 0 keeps the likeliest token alone: greedy
        temperature, top_p = 0.0, 1.0
    return Generation(messages, prompt, temperature, top_p,
                      defaults.top_k if request.top_k is None else request.top_k,
                      defaults.seed if request.seed is None else request.seed % (1 << 32),
                      asked or defaults.max_tokens or defaults.n_ctx, _stops(request.stop))


def chat_messages(messages: list[Message]) -> list[dict]:
    """The engine's {"role", "content"} messages: a developer message is a system one, text parts
    are joined; tool traffic and non-text parts are refused (ApiError 400 naming where)."""
    out = []
    for i, m in enumerate(messages):
        extra = m.model_extra or {}
        if m.role in ("tool", "function") or extra.get("tool_calls") or extra.get("function_call"):
            raise ApiError(400, f"messages[{i}]: tool and function calls are not supported by "
                                "localspec serve", param=f"messages[{i}]", code="unsupported_parameter")
        if isinstance(m.content, list):
            other = [p.type for p in m.content if not isinstance(p, TextPart)]
            if other:
                raise ApiError(400, f"messages[{i}].content: only text parts are supported, not "
                                    f"{other[0]!r}", param=f"messages[{i}].content", code="unsupported_parameter")
            text = "".join(p.text for p in m.content)
        else:
            text = m.content or ""
        out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    return out


def _one_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(400, "prompt: one prompt per request (a string, or a list of one)",
                           param="prompt", code="unsupported_parameter")
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt", code="invalid_value")
    return prompt


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(400, f"stop: at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} "
                            "characters", param="stop", code="invalid_value")
    return tuple(stops)


# ---- responses ----------------------------------------------------------------------------------
def finish_reason(engine_reason: str) -> str:
    """OpenAI's finish_reason for the engine's: a full context or a time limit is "length"."""
    return "stop" if engine_reason == "stop" else "length"


def usage(stats: dict) -> dict:
    prompt, completion = int(stats.get("prompt_tokens", 0)), int(stats.get("tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": int(stats.get("reused_tokens", 0))}}


def completion(kind: str, rid: str, model: str, text: str, reason: str, stats: dict) -> dict:
    """A whole reply: kind "chat" (chat.completion) or "text" (text_completion)."""
    choice: dict = {"index": 0, "finish_reason": finish_reason(reason), "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice], "usage": usage(stats)}


def chunk(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          reason: str | None = None, stats: dict | None = None, with_usage: bool = False) -> dict:
    """One server-sent event of a stream. with_usage: the closing chunk of stream_options
    include_usage (no choices, the usage); a chunk with a finish_reason carries the speculation
    statistics as "localspec" (clients ignore fields they do not know)."""
    out: dict = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                 "created": created, "model": model}
    if with_usage:
        return {**out, "choices": [], "usage": usage(stats or {})}
    choice: dict = {"index": 0, "finish_reason": None if reason is None else finish_reason(reason),
                    "logprobs": None}
    if kind == "chat":
        choice["delta"] = ({"role": "assistant", "content": ""} if role else
                           {} if text is None else {"content": text})
    else:
        choice["text"] = text or ""
    out["choices"] = [choice]
    if reason is not None and stats is not None:
        out["localspec"] = summary(stats)
    return out


def summary(stats: dict) -> dict:
    """The speculation statistics a response carries: tokens, target calls, tokens per call,
    tok/s, the prompt and what of it the cache kept, the engine's prefill and its first text
    (seconds from the engine's start on the prompt's tokens: a client's time to the first byte
    less the prefill is what came after the prefill's end), the template's and tokens' time
    before them, and per drafter accepted/proposed."""
    return {"tokens": stats.get("tokens", 0), "target_calls": stats.get("target_calls", 0),
            "tokens_per_call": stats.get("tokens_per_call", 0.0),
            "tokens_per_second": stats.get("tokens_per_second", 0.0),
            "prompt_tokens": stats.get("prompt_tokens", 0), "reused_tokens": stats.get("reused_tokens", 0),
            "wall_seconds": stats.get("wall_seconds", 0.0),
            "prefill_seconds": stats.get("seconds", {}).get("prefill", 0.0),
            "first_text_seconds": stats.get("first_text_seconds"),
            "prepare_seconds": stats.get("prepare_seconds"),   # the template and tokens, before those
            "accepted": {s["name"]: f"{s['accepted']}/{s['proposed']}" for s in stats.get("stages", [])}}


def stats_header(stats: dict) -> str:
    """`summary` on one header line: "tokens=64; target_calls=20; ...; accepted=maxgram:10/14,..."."""
    s = summary(stats)
    accepted = ",".join(f"{name}:{ratio}" for name, ratio in s.pop("accepted").items())
    return "; ".join([*(f"{k}={v}" for k, v in s.items()), f"accepted={accepted or '-'}"])
