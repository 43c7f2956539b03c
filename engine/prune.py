"""Verify only the nodes that pay: expected accepted tokens against this machine's batch cost.

Drafters grow a tree up to the round's budget; verifying all of it is not always worth it. On the
2-core CPU every extra token in the target's batch costs ~10-50% of a plain step, so a personal
n-gram guess accepted 12% of the time costs more than it returns, while a Max-Gram chain accepted
70% of the time pays. On a GPU the batch is nearly free and everything stays.

`AcceptanceModel` keeps, per stage, confidence class and depth, decayed counts of how often a node was accepted
given that its parent was (the only case in which the verifier looks at it). A node's chance to be
accepted is the product of those rates along its path. `choose` sorts the nodes by that chance and
keeps the prefix that maximises (1 + expected accepted tokens) / cost(nodes + 1), the round's
expected throughput under the calibrated cost curve. Two rules keep the pruned tree valid for the
verifier: a node is kept only with its parent, and a child only with every sibling proposed before
it (sampled children were drawn from q with the earlier ones excluded, so only a suffix of a
sibling list may go).
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from .tree import HINTS, DraftTree


class AcceptanceModel:
    """P(node accepted | parent accepted), per stage, confidence class (`DraftTree.hint`) and depth,
    from decayed counts.

    A cell (stage, hint, depth) backs off to its (stage, hint) pool across depths with the weight
    of BACKOFF observations, that pool to the stage's own rate with POOL_BACKOFF, and the stage to
    1/2 with one: a class seen a few times at depth 3 borrows what it showed at the other depths
    instead of starting from a coin flip. The shrinkage is strong on purpose: pruning keeps the
    nodes whose estimates are highest, so a cell that looks good by chance would be picked.
    """

    BACKOFF = 8.0
    POOL_BACKOFF = 4.0

    def __init__(self, n_stages: int, max_depth: int = 32, decay: float = 0.995) -> None:
        shape = (max(1, n_stages), HINTS, max_depth + 1)
        self.accepted = np.zeros(shape)
        self.proposed = np.zeros(shape)
        self.decay = decay
        self.max_depth = max_depth

    def state(self) -> dict:
        return {"accepted": self.accepted.tolist(), "proposed": self.proposed.tolist()}

    def load(self, state: dict) -> None:
        """A previous run's counts, where their shape matches (the same stages)."""
        accepted, proposed = np.asarray(state["accepted"], float), np.asarray(state["proposed"], float)
        if (accepted.shape == self.accepted.shape == proposed.shape
                and (proposed >= accepted).all() and (accepted >= 0).all()):
            self.accepted, self.proposed = accepted, proposed

    def rates(self) -> np.ndarray:
        """[stages, HINTS, depth] the smoothed acceptance rates."""
        stage = (self.accepted.sum((1, 2)) + 0.5) / (self.proposed.sum((1, 2)) + 1.0)
        pool = ((self.accepted.sum(-1) + self.POOL_BACKOFF * stage[:, None])
                / (self.proposed.sum(-1) + self.POOL_BACKOFF))
        return (self.accepted + self.BACKOFF * pool[..., None]) / (self.proposed + self.BACKOFF)

    def node_probs(self, tree: DraftTree) -> np.ndarray:
        """[tree.n] chance each node is accepted (the root: 1)."""
        n = tree.n
        depth = np.minimum(tree.depth[:n], self.max_depth)
        stage = np.maximum(tree.drafter[:n], 0)
        local = self.rates()[stage, tree.hint[:n], depth]
        probs = np.empty(n)
        probs[0] = 1.0
        parent = tree.parent
        for i in range(1, n):                 # parents come first: one pass
            probs[i] = probs[parent[i]] * local[i]
        return probs

    def _cell(self, tree: DraftTree, node: int) -> tuple[int, int, int]:
        """(stage, hint, depth) of a node: where its acceptance is counted."""
        return (max(int(tree.drafter[node]), 0), int(tree.hint[node]),
                min(int(tree.depth[node]), self.max_depth))

    def update(self, tree: DraftTree, path: tuple[int, ...]) -> None:
        """Count the nodes whose parent was accepted, and which of them were."""
        self.accepted *= self.decay
        self.proposed *= self.decay
        on_path = {0, *path}
        accepted = set(path)
        for i in range(1, tree.n):
            if int(tree.parent[i]) in on_path:
                cell = self._cell(tree, i)
                self.proposed[cell] += 1.0
                self.accepted[cell] += float(i in accepted)

    def observe_pruned(self, tree: DraftTree, keep: np.ndarray, tokens: list[int], greedy: bool) -> None:
        """Count the nodes pruned this round by what the target then chose (`tokens`, the round's
        committed tokens). A node the verifier judges by exact match (every node when greedy, a
        deterministic one when sampling) would have been accepted exactly when its token is the
        target's, so its fate is known once the tokens below its parent are. Without this, a
        class pruned while its rate was still a guess would never be seen again."""
        node = 0
        for token in tokens:
            matched = -1
            for c in tree.children[node]:
                if not keep[c] and (greedy or tree.proposal[c] is None):
                    cell = self._cell(tree, c)
                    self.proposed[cell] += 1.0
                    self.accepted[cell] += float(tree.tokens[c] == token)
                if tree.tokens[c] == token:
                    matched = c
            if matched < 0:
                return
            node = matched


def choose(tree: DraftTree, probs: np.ndarray, cost: Callable[[int], float]) -> np.ndarray:
    """[tree.n] bool: the nodes worth verifying (the root always)."""
    n = tree.n
    keep = np.zeros(n, bool)
    keep[0] = True
    if n == 1:
        return keep
    # Best-first over the nodes that may join: the first child of a chosen node, and the next
    # sibling of a chosen node. Every prefix of `chosen` is then parent- and sibling-closed.
    heap: list[tuple[float, int]] = []

    def offer(node: int) -> None:
        heapq.heappush(heap, (-float(probs[node]), node))

    if tree.children[0]:
        offer(tree.children[0][0])
    chosen: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        chosen.append(i)
        if tree.children[i]:
            offer(tree.children[i][0])
        siblings = tree.children[int(tree.parent[i])]
        at = siblings.index(i)
        if at + 1 < len(siblings):
            offer(siblings[at + 1])
    best_k, best_rate, expected = 0, 1.0 / cost(1), 1.0
    for k, i in enumerate(chosen, start=1):
        expected += probs[i]
        rate = expected / cost(k + 1)
        if rate > best_rate:
            best_k, best_rate = k, rate
    keep[chosen[:best_k]] = True
    return keep
