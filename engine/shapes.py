"""How a round's batch is shaped for the target: one mode per engine, chosen once.

On a CPU a verify costs what its rows cost, so a tree is verified at its own size (FREE). On a
GPU llama.cpp replays a captured CUDA graph only for a batch shape it has seen recently. Where a
change of shape is cheap (`Costs.cheap_switch`: llama.cpp keeps a graph per shape) a tree is padded
up to one of a few sizes (`tuning.BUCKET_SIZES`), so those graphs stay few and warm, and rounds
still choose freely (BUCKETS). Where a change of shape is dear, every speculative round is padded to its arm's full
size and the policy holds its choice for a while, so the shape repeats round after round (STABLE).
In every mode a round that verifies the root alone stays one token: padding it would make every
plain step pay for the speculative shape.

The padding rule and the price of a verify under it live together here because pruning must
price a tree as it will be verified.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from . import tuning

if TYPE_CHECKING:
    from .costs import Costs


def bucket(n: int, top: int) -> int:
    """Rows a verify of n tokens is padded to where shapes change cheaply: the smallest of
    `tuning.BUCKET_SIZES` of at least n, else `top` (the arm's full tree)."""
    return next((b for b in tuning.BUCKET_SIZES if n <= b < top), max(n, top))


class Shapes(enum.Enum):
    FREE = "free"        # a CPU: every tree at its own size, choices made round by round
    BUCKETS = "buckets"  # a GPU with cheap shape changes: trees padded to tuning.BUCKET_SIZES
    STABLE = "stable"    # a GPU: trees padded to the arm's size, choices held (tuning.HOLD)

    @staticmethod
    def of(offloaded: bool, costs: Costs | None) -> Shapes:
        """The mode for a target offloaded to a GPU or not, given its calibration (None: not
        calibrated, so shape changes count as dear)."""
        if not offloaded:
            return Shapes.FREE
        if costs is not None and costs.cheap_switch:
            return Shapes.BUCKETS
        return Shapes.STABLE

    def padding(self, n: int, nodes: int, room: int) -> tuple[int, bool]:
        """(pad_to, top_up) for `Target.verify` of an n-token tree drafted under an arm of `nodes`
        nodes, with `room` tokens left in the target's context. pad_to 0: unpadded."""
        if n <= 1 or not nodes or self is Shapes.FREE:
            return 0, True
        if self is Shapes.BUCKETS:   # rows only: no padding sequence topped up past the bucket
            return min(bucket(n, nodes + 1), room), False
        return min(nodes + 2, room), True

    def cost_table(self, costs: Costs, nodes: int, after_plain: bool, n: int) -> list[float]:
        """[k] seconds a verify of k tokens costs under this mode (index 0 unused), for k up to at
        least n and the arm's full tree. after_plain: the previous round verified the root alone,
        so a round that speculates changes the batch shape and pays `Costs.switch` (0 on a CPU)."""
        curve = costs.target_cost
        switch = costs.switch if after_plain else 0.0
        size = max(n, nodes + 1) + 1
        if self is Shapes.STABLE:    # any tree beyond the root is verified at the arm's full size
            return [0.0, curve(1)] + [curve(nodes + 2) + switch] * (size - 2)
        if self is Shapes.BUCKETS:
            return [0.0, curve(1)] + [curve(bucket(k, nodes + 1)) + switch for k in range(2, size)]
        return [0.0] + [curve(k) for k in range(1, size)]
