"""Best-first tree growth for neural drafters, batched by layer.

A neural drafter evaluates nodes in batches (one forward per step, not one per token): each step
takes the `width` most probable candidates (by path probability under the drafter), adds them to the
tree, and evaluates them together to get their own candidates. Leaves added in the last step are
never evaluated: only expansion needs the drafter's distribution.

Candidates of a node come in draw order: greedy takes the top tokens; sampling draws without
replacement from q (Gumbel top-k), and a later draw may enter the tree only after the earlier one
did, because the verifier assumes child i was drawn from q with children 1..i-1 excluded.
Children proposed earlier by a cheaper stage are excluded from the draws; in greedy mode a draw equal
to such a child adopts it (it costs no budget and is expanded further).

Vertical cascade (greedy): the cheaper stages' chains below the nodes of a forward ride along in the
same forward, so the drafter checks a whole Max-Gram or n-gram continuation in one batch instead of
decoding it token by token. Their distributions are kept; when a later draw adopts such a node, its
children are known at once, with no forward. A chain node extends its parent's cache sequence, so a
chain follows one child per node (the first the cheaper stage proposed).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..config import DraftLimits, SamplingParams
from ..distribution import Dist
from ..tree import DraftTree, prob_hint


class TreeEvaluator(Protocol):
    """A drafter model that evaluates tree nodes in batches (llama.cpp or PyTorch)."""

    def evaluate_root(self, tree: DraftTree) -> Dist:
        """Bring the committed context into the cache, evaluate the root; its next-token dist."""
        ...

    def evaluate(self, tree: DraftTree, nodes: Sequence[int]) -> list[Dist]:
        """Evaluate `nodes` (their ancestors are evaluated) in one batch; a dist per node."""
        ...

    def rollback(self) -> None:
        """Forget every tree node; keep the committed context."""
        ...


@dataclass(frozen=True)
class GrowLimits:
    budget: int       # nodes this stage may add
    max_depth: int    # below the root
    branching: int    # children per node
    width: int        # nodes evaluated per forward
    chain: int = 8    # cheaper stages' nodes checked along per forward (greedy vertical cascade)
    floor: float = 0.0   # no node whose path probability under the drafter is below it (0: off)

    @classmethod
    def of(cls, budget: int, limits: DraftLimits) -> GrowLimits:
        """This round's limits: `budget` nodes, grown as the drafter's `limits` say."""
        return cls(budget, limits.max_depth, limits.branching, limits.width, limits.chain,
                   limits.floor or 0.0)


class _Draws:
    """The ordered candidate tokens of one evaluated node."""

    __slots__ = ("node", "tokens", "logq", "next", "proposal")

    def __init__(self, node: int, tokens: np.ndarray, logq: np.ndarray,
                 proposal: Dist | None) -> None:
        self.node, self.tokens, self.logq, self.next = node, tokens, logq, 0
        self.proposal = proposal  # what the tokens were drawn from; None when taken greedily


def _draws_for(tree: DraftTree, node: int, dist: Dist, branching: int, sampling: SamplingParams,
               rng: np.random.Generator) -> _Draws:
    existing = tree.child_tokens(node)
    ids, probs = dist.ids, dist.probs
    if sampling.greedy:
        k = min(branching, ids.size)
        return _Draws(node, ids[:k], np.log(np.maximum(probs[:k], 1e-30)), None)
    keep = ~np.isin(ids, existing) if existing else slice(None)
    ids, probs = ids[keep], probs[keep]
    if ids.size == 0:
        return _Draws(node, ids, probs, dist)
    # Gumbel top-k == sequential draws without replacement from q (restricted to non-siblings)
    keys = np.log(np.maximum(probs, 1e-300)) + rng.gumbel(size=probs.size)
    k = min(branching, ids.size)
    order = np.argpartition(-keys, k - 1)[:k] if k < ids.size else np.arange(ids.size)
    order = order[np.argsort(-keys[order], kind="stable")]
    return _Draws(node, ids[order], np.log(np.maximum(probs[order], 1e-300)), dist)


def grow(tree: DraftTree, stage: int, limits: GrowLimits, sampling: SamplingParams,
         rng: np.random.Generator, ev: TreeEvaluator) -> int:
    """Grow `tree` best-first from its root; returns the number of nodes added. Growth ends
    early where the likeliest candidate's path probability is below `limits.floor`: best-first,
    every later candidate is less likely still (a later draw of a parent enters the heap only
    after the earlier one, so a sampled sibling list is never left with a gap)."""
    added = 0
    budget = min(limits.budget, tree.room)
    if budget <= 0 or limits.max_depth <= 0:
        return 0
    heap: list[tuple[float, int, _Draws]] = []  # (-path logp, tie-break, draws)
    tick = 0

    def push(d: _Draws) -> None:
        nonlocal tick
        if d.next < d.tokens.size:
            tick += 1
            heapq.heappush(heap, (-(tree.logp[d.node] + d.logq[d.next]), tick, d))

    known: dict[int, Dist] = {}   # cheaper stages' nodes evaluated along, not yet adopted
    cascade = sampling.greedy and limits.chain > 0
    floor = -math.log(limits.floor) if limits.floor > 0 else math.inf   # on the heap's negated logp
    push(_draws_for(tree, 0, ev.evaluate_root(tree), limits.branching, sampling, rng))
    while heap and added < budget:
        batch: list[int] = []
        while heap and len(batch) < limits.width and added < budget and heap[0][0] <= floor:
            _, _, d = heapq.heappop(heap)
            token, lq = int(d.tokens[d.next]), float(d.logq[d.next])
            d.next += 1
            node = tree.child_with_token(d.node, token)
            if node < 0:
                node = tree.add(d.node, token, tree.logp[d.node] + lq, stage, d.proposal,
                                prob_hint(math.exp(lq)))
                added += 1
            elif tree.drafter[node] != stage:
                tree.logp[node] = tree.logp[d.node] + lq   # adopted: its path logp under this drafter
            push(d)  # the next draw of the same parent becomes eligible
            if tree.depth[node] < limits.max_depth:
                dist = known.pop(node, None)
                if dist is not None:      # checked along earlier: expand without a forward
                    push(_draws_for(tree, node, dist, limits.branching, sampling, rng))
                else:
                    batch.append(node)
        if not batch or added >= budget:
            break
        along = _chains_below(tree, batch, stage, limits) if cascade else []
        dists = ev.evaluate(tree, batch + along)
        for node, dist in zip(batch, dists):
            push(_draws_for(tree, node, dist, limits.branching, sampling, rng))
        known.update(zip(along, dists[len(batch):]))
    return added


def _chains_below(tree: DraftTree, batch: list[int], stage: int, limits: GrowLimits) -> list[int]:
    """Cheaper stages' nodes below `batch`: one chain per batch node (first child each step), in
    parent-before-child order, at most `limits.chain` in all, none at the depth limit."""
    out: list[int] = []
    for node in batch:
        while len(out) < limits.chain:
            kids = tree.children[node]
            if not kids or tree.drafter[kids[0]] == stage or tree.depth[kids[0]] >= limits.max_depth:
                break
            node = kids[0]
            out.append(node)
    return out
