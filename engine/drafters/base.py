"""The one protocol every drafter follows, documented once.

A drafter keeps its own view of the committed context (the prompt plus every accepted token):

- ``begin(context)``: a new generation starts; ``context`` is every committed token, the last of
  which is the tree root (not yet evaluated by the target).
- ``propose(tree, stage, budget, sampling, rng)``: grow ``tree`` by at most ``budget`` nodes,
  tagging them with ``stage`` (the drafter's index in the stage list, for statistics). Greedy
  (``sampling.greedy``): children are the drafter's most likely tokens, added deterministically.
  Sampling: a drafter with a distribution q draws children from q without replacement (excluding
  tokens already among the siblings) and records q as each child's ``proposal``; a drafter
  without q (n-gram matching) adds deterministic children (``proposal=None``).
- ``accept(tokens)``: ``tokens`` were committed after the previous root (accepted drafts plus the
  target's own token); the new root is ``tokens[-1]``. Drafters roll their state forward here,
  or keep the tokens and roll forward in an optional ``catch_up()``, which the engine calls
  before it times a propose (the personal n-gram stage, which sits out most rounds on a GPU).

Stages are an ordered list of drafters; each gets the tree after the previous one has grown it.
``uses_model`` tells a drafter that runs a neural model (whose rounds cost real time) from a free
one (Max-Gram, n-grams): the adaptive budget may run the free ones alone.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ..config import SamplingParams
from ..tree import DraftTree


class Drafter(Protocol):
    name: str
    uses_model: bool

    def begin(self, context: Sequence[int]) -> None: ...

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None: ...

    def accept(self, tokens: Sequence[int]) -> None: ...

    def close(self) -> None: ...
