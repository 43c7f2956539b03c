"""Chat input -> prompt text, through the GGUF's own chat template (Jinja, as llama.cpp ships it).

Rendered in a sandbox the way Hugging Face renders templates, with add_generation_prompt so the
model answers as the assistant. A model without a template cannot take chat input: the error says
to use --raw.
"""
from __future__ import annotations

from typing import Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import LocalspecError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def render_chat(template: str | None, messages: Sequence[dict], *, bos_token: str = "",
                eos_token: str = "") -> str:
    if not template:
        raise LocalspecError("The model has no chat template",
                             "its GGUF metadata lacks tokenizer.chat_template",
                             "Use --raw for a plain completion, or a chat/instruct model")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template).render(messages=list(messages), add_generation_prompt=True,
                                                 bos_token=bos_token, eos_token=eos_token)
    except TemplateError as err:
        raise LocalspecError("The model's chat template failed", str(err),
                             "Use --raw for a plain completion") from None
