"""Verify only the nodes that pay: expected accepted tokens against this machine's batch cost.

Drafters grow a tree up to the round's budget; verifying all of it is not always worth it. On a
CPU every extra token in the target's batch costs a good fraction of a plain step, so a rarely
accepted guess (a personal n-gram's) costs more than it returns, while an often accepted Max-Gram
chain pays. On a GPU the batch is nearly free and everything stays.

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

from . import tuning
from .tree import HINTS, DraftTree


class AcceptanceModel:
    """P(node accepted | parent accepted), per stage, confidence class (`DraftTree.hint`) and depth,
    from decayed counts.

    A cell (stage, hint, depth) backs off to its (stage, hint) pool across depths with the weight
    of `tuning.BACKOFF` observations, that pool to the stage's own rate with `POOL_BACKOFF`, and
    the stage to 1/2 with one: a class seen a few times at depth 3 borrows what it showed at the
    other depths instead of starting from a coin flip.
    """

    def __init__(self, n_stages: int, max_depth: int = 32, decay: float | None = None) -> None:
        """max_depth: the deepest cell (deeper nodes share it); decay: tuning.ACCEPT_DECAY unless given."""
        shape = (max(1, n_stages), HINTS, max_depth + 1)
        self.accepted = np.zeros(shape)
        self.proposed = np.zeros(shape)
        self.decay = tuning.ACCEPT_DECAY if decay is None else decay
        self.max_depth = max_depth
        self._owed = 0          # rounds whose decay is not applied yet (root-only rounds)
        self._rates: np.ndarray | None = None   # rates() until the counts change

    def _settle(self) -> None:
        """Apply the decay of the rounds that only counted (decay^k at once, not k passes)."""
        if self._owed:
            f = self.decay ** self._owed
            self.accepted *= f
            self.proposed *= f
            self._owed = 0
            self._rates = None

    def state(self) -> dict:
        self._settle()
        return {"accepted": self.accepted.tolist(), "proposed": self.proposed.tolist()}

    def load(self, state: dict) -> None:
        """A previous run's counts, where their shape matches (the same stages)."""
        accepted, proposed = np.asarray(state["accepted"], float), np.asarray(state["proposed"], float)
        if (accepted.shape == self.accepted.shape == proposed.shape
                and (proposed >= accepted).all() and (accepted >= 0).all()):
            self.accepted, self.proposed, self._owed, self._rates = accepted, proposed, 0, None

    def rates(self) -> np.ndarray:
        """[stages, HINTS, depth] the smoothed acceptance rates (kept until the counts change)."""
        self._settle()
        if self._rates is None:
            stage = (self.accepted.sum((1, 2)) + 0.5) / (self.proposed.sum((1, 2)) + 1.0)
            pool = ((self.accepted.sum(-1) + tuning.POOL_BACKOFF * stage[:, None])
                    / (self.proposed.sum(-1) + tuning.POOL_BACKOFF))
            self._rates = (self.accepted + tuning.BACKOFF * pool[..., None]) / (self.proposed + tuning.BACKOFF)
        return self._rates

    def node_probs(self, tree: DraftTree) -> np.ndarray:
        """[tree.n] chance each node is accepted (the root: 1)."""
        n = tree.n
        depth = np.minimum(tree.depth[:n], self.max_depth)
        stage = np.maximum(tree.drafter[:n], 0)
        local = self.rates()[stage, tree.hint[:n], depth].tolist()
        parent = tree.parent[:n].tolist()
        probs = [1.0] * n
        for i in range(1, n):                 # parents come first: one pass (over lists: a
            probs[i] = probs[parent[i]] * local[i]   # numpy scalar costs far more than a float)
        return np.array(probs)

    def _count(self, tree: DraftTree, nodes: list[int], hits: list[bool]) -> None:
        """Count `nodes` as proposed with their parent accepted, and `hits` of them accepted."""
        drafter, hint, depth = tree.drafter, tree.hint, tree.depth
        top = self.max_depth
        for node, hit in zip(nodes, hits):
            cell = (max(int(drafter[node]), 0), int(hint[node]), min(int(depth[node]), top))
            self.proposed[cell] += 1.0
            if hit:
                self.accepted[cell] += 1.0
        self._rates = None

    def update(self, tree: DraftTree, path: tuple[int, ...]) -> None:
        """Count the nodes whose parent was accepted, and which of them were."""
        self._owed += 1
        n = tree.n
        if n <= 1:   # nothing to count: the decay waits for the next counted round
            return
        self._settle()
        on_path = {0, *path}
        accepted = set(path)
        parent = tree.parent[:n].tolist()
        nodes = [i for i in range(1, n) if parent[i] in on_path]
        self._count(tree, nodes, [i in accepted for i in nodes])

    def observe_pruned(self, tree: DraftTree, keep: np.ndarray, tokens: list[int], greedy: bool) -> None:
        """Count the nodes pruned this round by what the target then chose (`tokens`, the round's
        committed tokens). A node the verifier judges by exact match (every node when greedy, a
        deterministic one when sampling) would have been accepted exactly when its token is the
        target's, so its fate is known once the tokens below its parent are. Without this, a
        class pruned while its rate was still a guess would never be seen again."""
        self._settle()
        nodes: list[int] = []
        hits: list[bool] = []
        node = 0
        for token in tokens:
            matched = -1
            for c in tree.children[node]:
                if not keep[c] and (greedy or tree.proposal[c] is None):
                    nodes.append(c)
                    hits.append(bool(tree.tokens[c] == token))
                if tree.tokens[c] == token:
                    matched = c
            if matched < 0:
                break
            node = matched
        if nodes:
            self._count(tree, nodes, hits)


def choose(tree: DraftTree, probs: np.ndarray, cost: Callable[[int], float]) -> np.ndarray:
    """[tree.n] bool: the nodes worth verifying (the root always). `cost(k)`: seconds a verify of
    k tokens costs; it is called for every k up to tree.n, so make it a table lookup."""
    n = tree.n
    keep = np.zeros(n, bool)
    keep[0] = True
    if n == 1:
        return keep
    p = probs.tolist()
    children = tree.children
    if all(len(children[i]) <= 1 for i in range(n)):
        chosen = range(1, n)   # one chain: children come after parents, so in index order
    else:
        chosen = _best_first(tree, p)
    best_k, best_rate, expected = 0, 1.0 / cost(1), 1.0
    for k, i in enumerate(chosen, start=1):
        expected += p[i]
        rate = expected / cost(k + 1)
        if rate > best_rate:
            best_k, best_rate = k, rate
    keep[list(chosen[:best_k])] = True
    return keep


def _best_first(tree: DraftTree, p: list[float]) -> list[int]:
    """The nodes in best-first order over those that may join: the first child of a chosen node,
    and the next sibling of a chosen node. Every prefix of the order is then parent- and
    sibling-closed."""
    children, parent = tree.children, tree.parent[:tree.n].tolist()
    heap: list[tuple[float, int]] = []
    if children[0]:
        heap.append((-p[children[0][0]], children[0][0]))
    chosen: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        chosen.append(i)
        if children[i]:
            first = children[i][0]
            heapq.heappush(heap, (-p[first], first))
        siblings = children[parent[i]]
        at = siblings.index(i)
        if at + 1 < len(siblings):
            nxt = siblings[at + 1]
            heapq.heappush(heap, (-p[nxt], nxt))
    return chosen
