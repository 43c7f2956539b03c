"""The draft tree: what drafters grow and the target verifies in one batch.

Node 0 is the root: the last committed token, which the target has not evaluated yet. Every other
node is a drafted continuation of its parent. Children are kept in the order they were proposed,
because sampling verification tries them in that order (each child was drawn from its proposal
distribution with the earlier siblings excluded). Nodes are appended, so a parent's index is
always smaller than its children's; the layout for llama.cpp (positions and one sequence id per
root-to-leaf path) follows from that in one reverse pass.

The tree is reset and reused every round: no allocation per token on the hot path.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from .distribution import Dist

HINTS = 8   # confidence classes a drafter may tag its nodes with (prune.AcceptanceModel, 0020)
_PROB_EDGES = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)


def prob_hint(p: float) -> int:
    """The confidence class of a node its drafter gave probability `p` given its parent."""
    return bisect_right(_PROB_EDGES, p)


@dataclass(frozen=True)
class TreeLayout:
    """What a batch needs: per node, its depth below the root and the sequence ids it belongs to."""

    depth: np.ndarray            # [n] int32, root = 0
    seq_ids: tuple[tuple[int, ...], ...]  # [n] ids of the root-to-leaf paths through each node
    leaf_seq: dict[int, int]     # leaf node -> its sequence id


_ROOT_DEPTH = np.zeros(1, np.int32)
_ROOT_DEPTH.flags.writeable = False
_ROOT_ALONE = TreeLayout(depth=_ROOT_DEPTH, seq_ids=((0,),), leaf_seq={0: 0})


class DraftTree:
    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.tokens = np.zeros(capacity, np.int32)
        self.parent = np.full(capacity, -1, np.int32)
        self.depth = np.zeros(capacity, np.int32)
        self.logp = np.zeros(capacity, np.float64)   # log prob of the path under its drafter
        self.drafter = np.full(capacity, -1, np.int16)  # index of the stage that proposed it
        self.hint = np.zeros(capacity, np.int8)      # its drafter's confidence class, < HINTS
        self.children: list[list[int]] = [[] for _ in range(capacity)]
        # Distribution each node was drawn from, given its parent (None: proposed deterministically).
        self.proposal: list[Dist | None] = [None] * capacity
        self.n = 0
        self.parent[0], self.depth[0], self.logp[0], self.drafter[0], self.hint[0] = -1, 0, 0.0, -1, 0

    def reset(self, root_token: int) -> None:
        # the root's parent, depth, logp, drafter and hint never change (add writes index >= 1)
        children, proposal = self.children, self.proposal
        for i in range(self.n):
            children[i].clear()
            proposal[i] = None
        self.n = 1
        self.tokens[0] = root_token

    @property
    def room(self) -> int:
        return self.capacity - self.n

    def add(self, parent: int, token: int, logp: float, drafter: int,
            proposal: Dist | None = None, hint: int = 0) -> int:
        """Append a child of `parent`; returns its index. Tokens must be unique among siblings.
        hint: the drafter's confidence class for it (0..HINTS-1), what pruning conditions on."""
        if self.n >= self.capacity:
            raise IndexError("draft tree is full")
        i = self.n
        self.n += 1
        self.tokens[i] = token
        self.parent[i] = parent
        self.depth[i] = self.depth[parent] + 1
        self.logp[i] = logp
        self.drafter[i] = drafter
        self.proposal[i] = proposal
        self.hint[i] = hint
        self.children[parent].append(i)
        return i

    def copy_kept(self, keep: np.ndarray, out: DraftTree) -> DraftTree:
        """`out` := the nodes of this tree where keep is True (a parent- and sibling-order-closed
        set, the root included), in the same order; returns `out`."""
        index = np.cumsum(keep) - 1                 # old node -> new node (where kept)
        out.reset(int(self.tokens[0]))
        for i in range(1, self.n):
            if keep[i]:
                out.add(int(index[self.parent[i]]), int(self.tokens[i]), float(self.logp[i]),
                        int(self.drafter[i]), self.proposal[i], int(self.hint[i]))
        return out

    def copy_depth_first(self, out: DraftTree, score: list[float] | None = None) -> DraftTree:
        """`out` := this tree in depth-first order, each node's likeliest child (highest `score`;
        None: the first) visited first, so the likeliest path becomes nodes 0..d: the batch
        prefix exact numerics keep in place when it is accepted (target.py). Sibling lists keep
        their order (sampling tries children in it); returns `out`."""
        out.reset(int(self.tokens[0]))
        new = [0] * self.n                     # old node -> new node
        stack = self._visit_order(0, score)
        while stack:
            node = stack.pop()
            new[node] = out.add(new[int(self.parent[node])], int(self.tokens[node]), float(self.logp[node]),
                                int(self.drafter[node]), self.proposal[node], int(self.hint[node]))
            stack.extend(self._visit_order(node, score))
        if score is not None:
            for node in range(self.n):
                if len(self.children[node]) > 1:
                    out.children[new[node]][:] = [new[c] for c in self.children[node]]
        return out

    def _visit_order(self, node: int, score: list[float] | None) -> list[int]:
        """`node`'s children as a stack (the one to visit first last)."""
        kids = self.children[node]
        if score is None or len(kids) < 2:
            return kids[::-1]
        ranked = sorted(range(len(kids)), key=lambda j: (score[kids[j]], -j))
        return [kids[j] for j in ranked]

    def child_tokens(self, node: int) -> list[int]:
        return [int(self.tokens[c]) for c in self.children[node]]

    def child_with_token(self, node: int, token: int) -> int:
        for c in self.children[node]:
            if self.tokens[c] == token:
                return c
        return -1

    def path_tokens(self, node: int) -> list[int]:
        """Tokens from the root's first child down to `node` (the root itself excluded)."""
        out: list[int] = []
        while node > 0:
            out.append(int(self.tokens[node]))
            node = int(self.parent[node])
        out.reverse()
        return out

    def layout(self) -> TreeLayout:
        """One sequence id per leaf; a node carries the ids of all leaves below it."""
        n = self.n
        if n == 1:   # the root alone (a plain step): most rounds where nothing was worth a guess
            return _ROOT_ALONE
        leaves = [i for i in range(n) if not self.children[i]]
        leaf_seq = {leaf: s for s, leaf in enumerate(leaves)}
        sets: list[list[int]] = [[] for _ in range(n)]
        for leaf, s in leaf_seq.items():
            sets[leaf].append(s)
        for i in range(n - 1, 0, -1):  # children come after parents: one reverse pass
            sets[int(self.parent[i])].extend(sets[i])
        return TreeLayout(
            depth=self.depth[:n].copy(),
            seq_ids=tuple(tuple(sorted(s)) for s in sets),
            leaf_seq=leaf_seq,
        )

    def first_leaf_below(self, node: int) -> int:
        while self.children[node]:
            node = self.children[node][0]
        return node
