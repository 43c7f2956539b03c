"""Drafter factories by name: the builder walks an options' stage list through this table.

Why a table: which drafter a stage name means is plain data, looked up exactly (an unknown name
lists the known ones), not a switch on names spread over the session and bench. Each factory
takes the `Parts` already loaded for this run (the target, the draft model, the head, the
n-gram store) and returns a Drafter; what a factory needs but the run lacks is the caller's
error to report (bench skips such a configuration, the session never asks for it).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import HEAD_LIMITS, DraftLimits
from ..errors import LocalspecError
from .base import Drafter


@dataclass(frozen=True)
class Parts:
    """What the stages of one engine are built from (loaded once, shared by bench's engines)."""

    target: Any                        # engine.target.Target (the head reads its hidden states)
    gguf_draft: Any = None             # a LlamaModel: the draft in llama.cpp
    torch_lm: Any = None               # a TorchLM: the draft in PyTorch
    head: Any = None                   # a DraftHead
    store: Any = None                  # an NgramStore for the personal n-gram stage
    draft_limits: DraftLimits = DraftLimits()
    head_limits: DraftLimits = HEAD_LIMITS
    draft_stable: bool = False         # the GGUF draft pads its forwards to one shape (GPUs)
    draft_path: Path | None = None     # where the PyTorch draft came from (keys its learnt costs)

    def has(self, name: str) -> bool:
        """Whether this run holds what stage `name` needs."""
        need = {"personal": self.store, "ngram": self.store, "draft": self.gguf_draft,
                "torch-draft": self.torch_lm, "head": self.head}
        return name not in need or need[name] is not None


def _maxgram(parts: Parts) -> Drafter:
    from .maxgram import MaxGram
    return MaxGram()


def _personal(parts: Parts) -> Drafter:
    from .ngram import PersonalNgram
    return PersonalNgram(parts.store)


def _gguf_draft(parts: Parts) -> Drafter:
    from .llama_draft import LlamaDraft
    return LlamaDraft(parts.gguf_draft, parts.draft_limits, stable_shapes=parts.draft_stable)


def _torch_draft(parts: Parts) -> Drafter:
    from .torch_draft import TorchDraft   # torch is heavy: imported only when used
    return TorchDraft(parts.torch_lm, parts.draft_limits, parts.draft_path)


def _head(parts: Parts) -> Drafter:
    from .head import HeadDrafter         # torch is heavy: imported only when used
    return HeadDrafter(parts.head, parts.target, parts.head_limits)


DRAFTERS: dict[str, Callable[[Parts], Drafter]] = {
    "maxgram": _maxgram,
    "personal": _personal,
    "ngram": _personal,            # bench's name for the same stage
    "draft": _gguf_draft,
    "torch-draft": _torch_draft,
    "head": _head,
}


def make(name: str, parts: Parts) -> Drafter:
    try:
        factory = DRAFTERS[name]
    except KeyError:
        raise LocalspecError("Unknown drafter", repr(name),
                             f"Choose from: {', '.join(DRAFTERS)}") from None
    return factory(parts)
