"""A stage kind: what one drafter needs from a run, declared, so that the builder names none.

The builder (engine/build.py) walks the requested stages through these hooks in one loop, in the
order a load needs: `check` each before the slow target load; open the target with what their
`needs` add up to (hidden states, the layers read beside the last, a prefill tail; torch imported
before llama.cpp where one runs in it); `load` each one's parts into `Parts`; calibrate; `settle`
each with the costs (its own cost curve, its limits, or why it sits out on this machine); `make`
its Drafter per engine. A kind that sits out is left out of the engines, and the target stops
doing what only it needed. The hooks' defaults are a drafter that needs nothing loaded: Max-Gram.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import HEAD_LIMITS, DraftLimits
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

    def close(self) -> None:
        """Free the models and the store loaded here (each closes once: closing is idempotent)."""
        for resource in (self.gguf_draft, self.torch_lm, self.store):
            if resource is not None:
                resource.close()


@dataclass(frozen=True)
class Needs:
    """What a stage needs from the target, known before it loads."""

    hidden: bool = False               # every decode hands back hidden states (Target.new_hidden)
    taps: tuple[int, ...] = ()         # the layers whose inputs come with them
    tail: int = 1                      # a prefill's last tokens whose hidden states it reads
    runtime: str = ""                  # "torch": torch imported before llama.cpp loads (the load
                                       # order every GPU measurement used); "transformers": with
                                       # the PyTorch draft's modules

    def __or__(self, other: Needs) -> Needs:
        """What two stages need together."""
        runtimes = {self.runtime, other.runtime}
        return Needs(self.hidden or other.hidden, tuple(dict.fromkeys(self.taps + other.taps)),
                     max(self.tail, other.tail),
                     "transformers" if "transformers" in runtimes else "torch" if "torch" in runtimes else "")


@dataclass(frozen=True)
class Settled:
    """A stage's parts after a hook, and what the hook found."""

    parts: Parts
    curve: Any = None                  # its own cost curve (engine.costs.Costs), measured at load
    sat_out: str | None = None         # why it sits out on this machine (it is not built)


class StageKind:
    """The hooks of one stage name (the module docstring); `make` builds its Drafter."""

    def check(self, options) -> None:
        """Refuse, before the target loads, what can be refused at once (a missing file)."""

    def needs(self, options) -> Needs:
        return Needs()

    def load(self, options, model, parts: Parts, *, remembered: bool, progress) -> Settled:
        """Load this stage's parts beside the target `model` (a LlamaModel). remembered: a sit-out
        this machine measured before counts (a load that calibrates, without --refresh)."""
        return Settled(parts)

    def settle(self, options, model, parts: Parts, costs) -> Settled:
        """After the calibration (`costs`, None where none was measured)."""
        return Settled(parts)

    def make(self, parts: Parts) -> Drafter:
        raise NotImplementedError
