"""Stage kinds by name: the builder walks an options' stage list through this table.

Why a table: which drafter a stage name means is plain data, looked up exactly (an unknown name
lists the known ones), not a switch on names spread over the session and bench. Each kind
(stage.py) declares what it needs from the target, loads its parts, settles after calibration
and makes its Drafter from the `Parts` loaded for this run; what a kind needs but the run lacks
is the caller's error to report (bench skips such a configuration, the session never asks for
it). The draft head's kind is its own module (head_stage.py).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterable

from ..errors import LocalspecError, vocab_mismatch
from .base import Drafter
from .head_stage import HeadStage
from .stage import Needs, Parts, Settled, StageKind

__all__ = ["DRAFTERS", "Needs", "Parts", "Settled", "StageKind", "first_imports", "kind", "make", "needs_of"]


class MaxGramStage(StageKind):
    def make(self, parts: Parts) -> Drafter:
        from .maxgram import MaxGram
        return MaxGram()


class PersonalStage(StageKind):
    """The personal n-gram model: its store, one per vocabulary."""

    def load(self, options, model, parts: Parts, *, remembered: bool, progress) -> Settled:
        from localspec.models.ngram_store import NgramStore, vocab_key
        return Settled(replace(parts, store=NgramStore.open(vocab_key(model), label=model.path.name)))

    def make(self, parts: Parts) -> Drafter:
        from .ngram import PersonalNgram
        return PersonalNgram(parts.store)


def check_same_vocab(target, draft) -> None:
    """A GGUF draft (a LlamaModel) must spell every token as the target does."""
    if draft.vocab_size != target.vocab_size:
        raise vocab_mismatch(draft.path.name, draft.vocab_size, target.path.name, target.vocab_size)
    step = max(1, target.vocab_size // 997)
    for token in range(0, target.vocab_size, step):
        if target.token_text(token) != draft.token_text(token):
            raise LocalspecError("Draft vocabulary does not match the target",
                                 f"token {token} is {target.token_text(token)!r} in the target but "
                                 f"{draft.token_text(token)!r} in the draft (both {target.vocab_size} tokens)",
                                 "Use a draft from the target's model family (same tokenizer)")


class GGUFDraftStage(StageKind):
    """A draft model in llama.cpp, beside the target (the calibration measures it too). On a GPU
    it pads its forwards to one shape unless a change of shape is cheap there."""

    def load(self, options, model, parts: Parts, *, remembered: bool, progress) -> Settled:
        from ..llama_model import LlamaModel

        gguf = LlamaModel(Path(options.draft).expanduser(), n_ctx=model.n_ctx,
                          n_seq_max=options.budget.max_nodes + 1, n_gpu_layers=options.n_gpu_layers,
                          n_threads=options.n_threads, n_pad_seqs=options.draft_limits.pad_rows - 1)
        try:
            check_same_vocab(model, gguf)
        except BaseException:
            gguf.close()
            raise
        return Settled(replace(parts, gguf_draft=gguf, draft_limits=options.draft_limits))

    def settle(self, options, model, parts: Parts, costs) -> Settled:
        stable = options.stable_shapes if options.stable_shapes is not None else parts.gguf_draft.n_gpu_layers != 0
        return Settled(replace(parts, draft_stable=stable and not (costs is not None and costs.cheap_switch)))

    def make(self, parts: Parts) -> Drafter:
        from .llama_draft import LlamaDraft
        return LlamaDraft(parts.gguf_draft, parts.draft_limits, stable_shapes=parts.draft_stable)


class TorchDraftStage(StageKind):
    """A transformers draft in PyTorch (engine/torch_lm.py)."""

    def needs(self, options) -> Needs:
        return Needs(runtime="transformers")

    def load(self, options, model, parts: Parts, *, remembered: bool, progress) -> Settled:
        from ..torch_lm import TorchLM

        path = Path(options.draft).expanduser()
        lm = TorchLM.load(path, max_len=model.n_ctx)
        if lm.vocab_size != model.vocab_size:
            lm.close()
            raise vocab_mismatch(path.name, lm.vocab_size, model.path.name, model.vocab_size)
        return Settled(replace(parts, torch_lm=lm, draft_limits=options.draft_limits,
                               draft_path=Path(options.draft)))

    def make(self, parts: Parts) -> Drafter:
        from .torch_draft import TorchDraft   # torch is heavy: imported only when used
        return TorchDraft(parts.torch_lm, parts.draft_limits, parts.draft_path)


DRAFTERS: dict[str, StageKind] = {
    "maxgram": MaxGramStage(),
    "personal": PersonalStage(),
    "ngram": PersonalStage(),      # bench's name for the same stage
    "draft": GGUFDraftStage(),
    "torch-draft": TorchDraftStage(),
    "head": HeadStage(),
}


def kind(name: str) -> StageKind:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise LocalspecError("Unknown drafter", repr(name),
                             f"Choose from: {', '.join(DRAFTERS)}") from None


def make(name: str, parts: Parts) -> Drafter:
    return kind(name).make(parts)


def first_imports(needs: Needs) -> None:
    """Import what a stage runs in before any llama.cpp model loads: the one place that keeps
    that order (torch first: the load order every GPU measurement used, with the system
    libstdc++ preloaded, dev/gpu-env.sh)."""
    if needs.runtime == "transformers":
        from .. import torch_lm  # noqa: F401
    elif needs.runtime == "torch":   # torch alone: transformers' import would add seconds to each start
        import torch  # noqa: F401


def needs_of(needs: Iterable[Needs]) -> Needs:
    """What stages need together."""
    total = Needs()
    for n in needs:
        total = total | n
    return total
