"""The one protocol every drafter follows, documented once.

A drafter keeps its own view of the committed context (the prompt plus every accepted token):

- ``begin(context, states)``: a new generation starts; ``context`` is every committed token, the
  last of which is the tree root (not yet evaluated by the target).
- ``propose(tree, stage, budget, sampling, rng)``: grow ``tree`` by at most ``budget`` nodes,
  tagging them with ``stage`` (the drafter's index in the stage list, for statistics). Greedy
  (``sampling.greedy``): children are the drafter's most likely tokens, added deterministically.
  Sampling: a drafter with a distribution q draws children from q without replacement (excluding
  tokens already among the siblings) and records q as each child's ``proposal``; a drafter
  without q (n-gram matching) adds deterministic children (``proposal=None``).
- ``accept(tokens, states)``: ``tokens`` were committed after the previous root (accepted drafts
  plus the target's own token); the new root is ``tokens[-1]``. Drafters roll their state forward here,
  or keep the tokens and roll forward in ``catch_up()``, which the engine calls before each
  propose and times apart: the round's arm is not charged for it (a stage owes it for the
  tokens of rounds it sat out, whichever arm runs it next). The personal
  n-gram stage learns its pending tokens there; the draft models and the head put the committed
  tokens they have not read, all but the root, into their caches there; Max-Gram does nothing.
- ``states`` in both is how the target hands every stage what its last batch computed beyond the
  logits: the final hidden states of the tokens it put in its cache (a prefill's tail; a verify's
  root and accepted path), as ``(position of the first, [r, n_embd] rows)``, or None where no
  stage asked for them (``stage.Needs.hidden``). A draft head reads them; the others ignore them.
- ``cost_curve(costs)``: the measured costs with this drafter's own curve as the draft curve. A
  GGUF draft's is measured by calibrate.py beside the target's, so it and the free drafters
  return ``costs`` as they are; a PyTorch draft and a head time their own steps.
- ``close()``: free what the drafter holds (a model it loaded itself).

What the engine reads without calling: ``name`` (statistics, token sources); ``uses_model``, which
tells a drafter that runs a neural model (whose rounds cost real time) from a free one (Max-Gram,
n-grams), so the adaptive budget may run the free ones alone (a model whose measured step is a
small share of the target's counts as free too: ``policy.free_stages``); ``vocab_size``, checked against the
target's (None: the drafter proposes the target's own tokens); ``limits``, how it grows its part of
the tree (a neural drafter's DraftLimits, whose width and depth the cost model reads); ``copies``,
true for a drafter whose nodes copy the text where it repeats (Max-Gram): a model stage that runs
free drafts after the stages that copy and before the other free ones (``policy.draft_order``).

Stages are an ordered list of drafters, cheapest first, built by name through registry.py; a
round's plan runs them in `policy.draft_order` (that order, but a free model stage before the
free stages that do not copy), each getting the tree after the previous one has grown it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from ..config import SamplingParams
from ..tree import DraftTree

if TYPE_CHECKING:
    from ..costs import Costs

# What a target's batch hands the stages beside its logits (`Target.new_hidden`): (position of the
# first token, [r, n_embd] final hidden states), or None without hidden states.
States = tuple[int, np.ndarray] | None


class Drafter(Protocol):
    name: str
    uses_model: bool
    copies: bool
    vocab_size: int | None
    limits: object        # DraftLimits for a neural drafter; its own limits type for the free ones

    def begin(self, context: Sequence[int], states: States = None) -> None: ...

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None: ...

    def accept(self, tokens: Sequence[int], states: States = None) -> None: ...

    def catch_up(self) -> None: ...

    def cost_curve(self, costs: Costs) -> Costs: ...

    def close(self) -> None: ...
