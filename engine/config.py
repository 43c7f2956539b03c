"""Frozen configuration shared by the decode loop, the drafters and the CLI."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .budget import Arm


@dataclass(frozen=True)
class SamplingParams:
    """temperature == 0 means greedy; top_k == 0 and top_p == 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")


DEFAULT_TREE_NODES = 32   # largest adaptive tree: a long Max-Gram copy, pruned to what pays (0018)


@dataclass(frozen=True)
class TreeBudget:
    """How big a draft tree each round may grow. adaptive: each round picks a budget from
    0 (plain) up to max_nodes by measured throughput (engine/budget.py)."""

    max_nodes: int = 16
    adaptive: bool = False

    def arms(self, with_models: bool = True, pruned: bool = False,
             with_free: bool = True) -> tuple[Arm, ...]:
        """Fixed: the one tree size. Adaptive: plain, free drafters alone, and all drafters, at a
        few sizes up to max_nodes (the model drafters at `tuning.MODEL_ARM_NODES`). pruned: each round keeps only the nodes that pay (prune.py), which
        picks the free drafters' size round by round, so they get one arm, the largest, and it
        stands in for plain decoding: a round whose guesses do not pay is pruned to its root, a
        plain step, so there is no plain arm beside it (a held one kept speculation off for whole
        stretches, also where a long Max-Gram match would have paid)."""
        from . import tuning
        from .budget import Arm

        if not self.adaptive or self.max_nodes <= 0:
            return (Arm(self.max_nodes),)
        sizes = sorted({min(n, self.max_nodes) for n in tuning.MODEL_ARM_NODES})
        full = tuple(Arm(n) for n in sizes) if with_models else ()
        if not with_free:
            return (Arm(0), *full)
        if pruned:
            return (Arm(self.max_nodes, models=False), *full)
        return (Arm(0), *(Arm(n, models=False) for n in sorted({*sizes, self.max_nodes})), *full)

@dataclass(frozen=True)
class DraftLimits:
    """How a neural draft grows its part of the tree: depth, children per node, nodes per forward."""

    max_depth: int = 8
    branching: int = 2
    width: int = 4
    chain: int = 8      # cheaper stages' nodes the draft checks along in each forward (0: off)
    # Growth stops below this path probability under the drafter (0: grows its whole budget):
    # a node costs a verify row and, alone at its depth, a drafter step, which a guess less
    # likely than this does not return on this machine. None: `Costs.growth_floor` where the
    # load measures costs (a head's: drafters/head_stage.py), else 0.
    floor: float | None = None

    @property
    def pad_rows(self) -> int:
        """Rows of every draft forward when shapes are kept stable. A linear draft (width 1, no
        chain) decodes one token per forward, which needs no padding; otherwise the most a forward
        evaluates (width nodes and chain nodes checked along) and at least one row of padding,
        which keeps the count of distinct sequence ids fixed (LlamaModel.decode)."""
        if self.width + self.chain <= 1:
            return 1
        return max(3, self.width + self.chain + 1)


# A draft head (drafters/head.py) steps in a fraction of a target call: deep trees, best-first, one
# step a layer; more children a node and more nodes a step grew trees no deeper, only wider (0011).
HEAD_LIMITS = DraftLimits(max_depth=8, branching=2, width=4, chain=0)
# A prompt's last tokens whose target states the head reads (its context when a generation
# starts; later the generated text's): each is an output row of logits in the prefill (0024).
HEAD_CONTEXT = 128


@dataclass(frozen=True)
class GenerationRequest:
    tokens: tuple[int, ...]
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    # keep what the target's cache (and every stage) holds of the prompt's start from the last
    # generation, prefilling only the rest: a conversation's turns. Off, every generation prefills
    # its whole prompt (one-prompt commands, benchmarks of a prompt's own cost).
    reuse: bool = False
