"""The PyTorch draft stage: a small transformer grows the draft tree, one forward per tree layer.

Growth policy lives in `grow`; this module only answers its three questions (evaluate the root,
evaluate a batch of nodes, roll back) on top of `TorchLM`'s slot-addressed KV cache. Committed
tokens occupy slots 0..n-1 at positions 0..n-1. Tree nodes of the current round take the slots
after them and are forgotten by clearing a dict: a slot that no mask row points at is never read,
and the next round's committed tokens simply overwrite it. Tokens accepted since the last round are
fed together with the root in one forward, so a round costs 1 + (number of grow steps) forwards.

Distributions are processed on the device (softmax, top-k, top-p over the full vocabulary row) and
only the small support crosses to numpy, mirroring `distribution.process` for the target's rows.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import DraftLimits, SamplingParams
from ..distribution import (  # same probe width as the target's processing
    _NUCLEUS_PROBE,
    Dist,
)
from ..errors import LocalspecError
from ..prefix import common_prefix
from ..tree import DraftTree
from .base import States
from .grow import GrowLimits, grow

if TYPE_CHECKING:
    from ..costs import Costs
    from ..torch_lm import TorchLM   # transformers: seconds to import, which a head never needs

# Committed tokens are fed in chunks of this many so a long prompt's attention scores stay small.
_PREFILL_CHUNK = 512


def process_rows(logits: torch.Tensor, params: SamplingParams) -> list[Dist]:
    """`distribution.process` (temperature, top-k, top-p) for a batch of rows, on their device.

    logits: [n, V] float32. Only each row's support (top-k, or the nucleus probe) leaves the device.
    """
    vocab = logits.shape[1]
    scaled = logits / params.temperature                                  # [n, V]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k == vocab and params.top_p >= 1.0:   # temperature only: whole vocabulary in id order
        probs_np = torch.softmax(scaled.double(), dim=-1).cpu().numpy()    # [n, V]
        ids_all = np.arange(vocab, dtype=np.int64)
        return [Dist(ids_all, p) for p in probs_np]
    if k < vocab:
        vals, ids = scaled.topk(k, dim=-1)                                # [n, k] descending
        probs = torch.softmax(vals, dim=-1)                               # renormalised over top-k
    else:
        probe = min(_NUCLEUS_PROBE, vocab) if params.top_p < 1.0 else vocab
        log_z = torch.logsumexp(scaled, dim=-1, keepdim=True)             # [n, 1]
        vals, ids = (scaled.topk(probe, dim=-1) if probe < vocab
                     else scaled.sort(dim=-1, descending=True, stable=True))  # [n, probe]
        probs = (vals - log_z).exp()                                      # full-softmax mass
        if probe < vocab and params.top_p < 1.0 and bool((probs.sum(-1) < params.top_p).any()):
            vals, ids = scaled.sort(dim=-1, descending=True, stable=True)  # nucleus wider than probe
            probs = (vals - log_z).exp()                                  # [n, V]
    ids_np = ids.cpu().numpy().astype(np.int64)                           # [n, support]
    probs_np = probs.to(torch.float64).cpu().numpy()                      # [n, support]
    out: list[Dist] = []
    for row_ids, p in zip(ids_np, probs_np):
        if params.top_p < 1.0:
            cut = int(np.searchsorted(np.cumsum(p), params.top_p, side="left")) + 1
            row_ids, p = row_ids[:cut], p[:cut]
        out.append(Dist(row_ids, p / p.sum()))
    return out


def greedy_rows(logits: torch.Tensor, branching: int) -> list[Dist]:
    """Top-`branching` ids per row with their full-softmax probabilities (not renormalised)."""
    top = torch.softmax(logits, dim=-1).topk(min(branching, logits.shape[1]), dim=-1)  # [n, b]
    ids = top.indices.cpu().numpy().astype(np.int64)
    probs = top.values.to(torch.float64).cpu().numpy()
    return [Dist(i, p) for i, p in zip(ids, probs)]


def torch_draft_costs(costs: Costs, lm: TorchLM, path: Path | None) -> Costs:
    """`costs` with the PyTorch draft's forward times, measured now, as the draft curve, and
    learnt estimates kept apart from the GGUF draft's and the target's own."""
    tag = hashlib.sha256(str(Path(path).resolve() if path else "").encode()).hexdigest()[:8]
    file = costs.file.with_name(f"{costs.file.stem}-torch-{tag}.json") if costs.file else None
    return replace(costs, draft=measure_forward(lm), file=file)


def measure_forward(lm: TorchLM, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 5,
                    context: int = 64) -> dict[int, float]:
    """Seconds per forward of n tree rows after `context` cached tokens: the draft's cost curve
    for the adaptive budget (`costs.Costs.draft`). Fastest of `reps`; the first call of each
    size (graph capture on a GPU) is not timed. Leaves nothing the next `begin` relies on."""
    sizes = [n for n in sizes if context + n <= lm.max_len]
    idx = torch.arange(context)
    lm.forward(torch.arange(context) % lm.vocab_size, idx, idx,
               torch.ones(context, context, dtype=torch.bool).tril())
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    best = {n: float("inf") for n in sizes}
    for rep in range(reps + 1):
        for n in sizes:
            pos = torch.arange(context, context + n)
            attend = torch.ones(n, context + n, dtype=torch.bool).tril(context)
            sync()
            t = time.perf_counter()
            lm.forward((pos * 7 + 1000) % lm.vocab_size, pos, pos, attend)
            sync()
            if rep:
                best[n] = min(best[n], time.perf_counter() - t)
    return best


class TorchDraft:
    """A `Drafter` (and `grow`'s `TreeEvaluator`) backed by a `TorchLM`."""

    name = "torch-draft"
    uses_model = True
    copies = False

    def __init__(self, lm: TorchLM, limits: DraftLimits = DraftLimits(),
                 source: Path | None = None) -> None:
        """source: the path the draft came from; it keeps learnt estimates per draft."""
        self.lm, self.limits, self.source = lm, limits, source
        self.vocab_size = lm.vocab_size
        self.context: list[int] = []   # every committed token; the last is the tree root
        self.n_cached = 0              # context[:n_cached] is in slots 0..n_cached-1
        self._slot: dict[int, int] = {}                 # tree node -> cache slot, this round only
        self._root_logits: torch.Tensor | None = None   # [V], until the context changes
        self._sampling = SamplingParams()
        self._mask = np.zeros((limits.width, lm.max_len), dtype=bool)  # [rows, slots], reused

    @classmethod
    def load(cls, path: str | Path, *, max_len: int = 4096, limits: DraftLimits = DraftLimits(),
             device: str | None = None, dtype: torch.dtype | None = None,
             static_shapes: bool | None = None) -> TorchDraft:
        from ..torch_lm import TorchLM

        return cls(TorchLM.load(path, max_len=max_len, device=device, dtype=dtype,
                                static_shapes=static_shapes), limits, Path(path))

    # -- Drafter -------------------------------------------------------------------------------

    def begin(self, context: Sequence[int], states: States = None) -> None:
        if not context:
            raise ValueError("a generation starts with at least one committed token (the root)")
        if len(context) > self.lm.max_len:
            raise LocalspecError(
                "Conversation too long for the draft model",
                f"{len(context)} tokens, but the draft's KV cache holds {self.lm.max_len}",
                "Load the draft with a larger max_len (TorchDraft.load(..., max_len=N)), "
                "or start a new conversation")
        context = [int(t) for t in context]
        # slots hold positions: the part of the cache this context starts with stays (a
        # conversation's next turn; never the root, fed with its round); later slots are
        # overwritten before any mask points at them
        self.n_cached = common_prefix(self.context[:self.n_cached], context[:-1])
        self.context = context
        self._slot.clear()
        self._root_logits = None

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None:
        # Slots this round may need: the context, nodes already in the tree (adoptable), new nodes.
        budget = min(budget, self.lm.max_len - len(self.context) - (tree.n - 1))
        if budget <= 0:
            return  # the draft's cache is full: this stage sits the round out
        self._sampling = sampling
        try:
            grow(tree, stage, GrowLimits.of(budget, self.limits), sampling, rng, self)
        finally:
            self.rollback()

    def accept(self, tokens: Sequence[int], states: States = None) -> None:
        if len(tokens):
            self.context.extend(int(t) for t in tokens)  # cached at the next evaluate_root
            self._root_logits = None

    def catch_up(self) -> None:
        """The engine times this apart from the round (decode.py)."""
        self._read_backlog()

    def _read_backlog(self) -> None:
        """The committed tokens not cached yet, all but the root, into the cache; the root goes
        in at evaluate_root."""
        end = len(self.context) - 1
        if self._root_logits is not None or end <= self.n_cached:
            return
        self._forward_context(self.n_cached, end)
        self.n_cached = end

    def _forward_context(self, start: int, end: int) -> torch.Tensor:
        """Committed tokens start..end-1 into their cache slots, _PREFILL_CHUNK at a time; the
        last one's logits [1, V]."""
        ctx = torch.tensor(self.context[start:end], dtype=torch.int64)   # [m]
        for a in range(start, end, _PREFILL_CHUNK):
            b = min(a + _PREFILL_CHUNK, end)
            idx = torch.arange(a, b)                                  # positions == slots
            causal = torch.ones(b - a, b, dtype=torch.bool).tril(a)   # row i sees slots 0..a+i
            logits = self.lm.forward(ctx[a - start:b - start], idx, idx, causal, last_only=True)
        return logits

    def cost_curve(self, costs: Costs) -> Costs:
        return torch_draft_costs(costs, self.lm, self.source)

    def close(self) -> None:
        self.lm.close()

    # -- TreeEvaluator ---------------------------------------------------------------------------

    def evaluate_root(self, tree: DraftTree) -> Dist:
        if int(tree.tokens[0]) != self.context[-1]:
            raise ValueError(f"tree root {int(tree.tokens[0])} is not the last committed token "
                             f"{self.context[-1]}; call accept() with every committed token")
        if self._root_logits is None:
            self._read_backlog()
            end = len(self.context)
            start = min(self.n_cached, end - 1)  # the root is re-fed if its logits were dropped
            logits = self._forward_context(start, end)
            self.n_cached = end
            self._root_logits = logits[0].clone()   # [V]; the static path reuses its buffer
        return self._dists(self._root_logits[None])[0]

    def evaluate(self, tree: DraftTree, nodes: Sequence[int]) -> list[Dist]:
        n, base = len(nodes), len(self.context)  # tree slots start after the committed ones
        if n > self._mask.shape[0]:
            self._mask = np.zeros((n, self.lm.max_len), dtype=bool)
        mask = self._mask[:n]                                             # [n, max_len]
        mask[:] = False
        mask[:, :base] = True                                             # the committed context
        tokens = np.empty(n, np.int64)
        positions = np.empty(n, np.int64)
        slots = np.empty(n, np.int64)
        for r, node in enumerate(nodes):
            slot = self._slot[node] = base + len(self._slot)
            tokens[r], slots[r] = tree.tokens[node], slot
            positions[r] = base - 1 + tree.depth[node]                    # the root sits at base-1
            a = node
            while a > 0:                                                  # itself and its ancestors
                mask[r, self._slot[a]] = True
                a = int(tree.parent[a])
        s = base + len(self._slot)
        logits = self.lm.forward(torch.from_numpy(tokens), torch.from_numpy(positions),
                                 torch.from_numpy(slots), torch.from_numpy(mask[:, :s]))  # [n, V]
        return self._dists(logits)

    def rollback(self) -> None:
        self._slot.clear()  # committed slots stay; tree slots are unreachable from now on

    def _dists(self, logits: torch.Tensor) -> list[Dist]:
        if self._sampling.greedy:
            return greedy_rows(logits, self.limits.branching)
        return process_rows(logits, self._sampling)
