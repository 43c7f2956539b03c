"""Personal n-gram drafter: a tree of likely continuations from the user's own conversations.

The lowest stage of the cascade (draft² in Staged Speculative Decoding). Counts come from the
on-disk personal store (`localspec.models.ngram_store`) plus the n-grams of the current context,
which it learns in memory as tokens are committed.

Why it is shaped so:

* **Interpolated Witten-Bell, not Katz.** For history h with c(h) tokens seen after it, T(h) of
  them distinct:  P(w|h) = (c(h,w) + T(h) P(w|h')) / (c(h) + T(h)),  h' = h without its first
  token, down to the unigram MLE c(w)/N; an unseen h passes P(w|h') through. It is normalised
  (node logp is a real log probability, so the threshold means something), parameter-free, and
  needs only the counts that follow the looked-up contexts. Katz needs Good-Turing
  count-of-counts over the whole store, which every add, forget and prune would make stale, and
  which are unstable on small personal corpora.
* **Deterministic children, also when sampling.** Drawing children from q would need q over the
  whole vocabulary; deterministic children (proposal=None) are verified by the exact-match rule,
  which stays lossless. So `sampling` and `rng` are unused.
* **Cheap propose, no per-vocabulary work.** Each context's counts live in a `_Counts`: a dict
  plus the tokens in descending count order, kept sorted in O(1) per committed token. A node's
  candidates are read off the front of those lists: a token whose probability exceeds the
  threshold τ must, at some level k of K, have W_k c_k(w)/c_k > τ/K (W_k the level's mixture
  weight), so only the few tokens above that count are scored exactly.
* **Caches live as long as the drafter.** Store lookups stay cached across generations; the first
  `begin` loads the unigrams and the (longest) continuation lists of the most frequent tokens.
  Any write to the store (a reply learnt, a forget, a wipe: its `revision` counter, checked in
  `begin`) drops the cache, so new counts reach the next reply and forgotten ones leave memory. When the new context extends
  the previous one (a chat going on), `begin` only rolls forward.
* **Best-first growth, expanded lazily.** A heap of candidate children ordered by path
  probability: the budget goes to the most probable nodes of the whole tree, and a root's most
  likely child comes first. A node's own children are looked up only when its path probability
  tops the heap, so the last nodes grown cost no store lookups.
* **Only likely nodes query the store.** A store query with its Python is a sizeable share of a
  GPU's plain step; a node below `fetch_above` path probability grows from what is in memory (the
  context's own n-grams, contexts fetched before). Its children could be accepted at most as
  often as it is, and on new text they nearly never are, while a phrase the user wrote before
  keeps its path probability high and is followed from the store (docs/decisions/0029).
* Once the app has learnt a conversation into the store, its tokens count twice while it is the
  current context (store + memory): a deliberate, bounded recency weighting.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from ..config import SamplingParams
from ..prefix import common_prefix
from ..tree import DraftTree, prob_hint
from .base import States

if TYPE_CHECKING:
    from ..costs import Costs


class CountSource(Protocol):
    """What the drafter needs of a store (`NgramStore` is one)."""

    max_n: int

    def lookup(self, contexts: Sequence[Sequence[int]]) -> dict[tuple[int, ...], dict[int, int]]: ...

    def revision(self) -> int: ...


@dataclass(frozen=True)
class NgramLimits:
    max_n: int = 4            # longest n-gram: contexts of up to max_n - 1 tokens
    branching: int = 2        # children per node
    max_depth: int = 6        # below the root
    threshold: float = 0.1    # propose a child only if P(child | path) exceeds this
    max_cached: int = 200_000  # store contexts kept in memory before the cache is dropped
    prefetch: int = 256       # with the unigrams, fetch the contexts of this many top tokens
    fetch_above: float = 0.15  # a node this likely grows from the store; a less likely one from memory

    def __post_init__(self) -> None:
        if self.max_n < 2 or self.branching < 1 or self.max_depth < 1:
            raise ValueError("need max_n >= 2, branching >= 1, max_depth >= 1")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError("threshold must be in (0, 1)")
        if not 0.0 < self.fetch_above <= 1.0:
            raise ValueError("fetch_above must be in (0, 1]")


class _Counts:
    """Tokens seen after one context: count per token, tokens in descending count order."""

    __slots__ = ("count", "order", "pos", "first", "total")

    def __init__(self, count: dict[int, int]) -> None:
        self.count = count
        self.order = sorted(count, key=count.__getitem__, reverse=True)
        self.pos = {t: i for i, t in enumerate(self.order)}
        self.first: dict[int, int] = {}       # count -> index of its first token in `order`
        for i, t in enumerate(self.order):
            self.first.setdefault(count[t], i)
        self.total = sum(count.values())

    def bump(self, t: int) -> None:
        """count[t] += 1, keeping `order` sorted: swap t to the front of its count's block."""
        count, order, pos, first = self.count, self.order, self.pos, self.first
        self.total += 1
        c = count.get(t, 0)
        count[t] = c + 1
        if c == 0:
            pos[t] = len(order)
            order.append(t)
            first.setdefault(1, pos[t])     # the 1-block is always last
            return
        i, j = pos[t], first[c]
        u = order[j]
        order[i], order[j] = u, t
        pos[u], pos[t] = i, j
        if j + 1 < len(order) and count[order[j + 1]] == c:
            first[c] = j + 1
        else:
            del first[c]
        first.setdefault(c + 1, j)          # t ends the (c+1)-block, or starts it


class PersonalNgram:
    name = "personal-ngram"
    uses_model = False
    copies = False
    vocab_size = None         # the store is keyed by the target's vocabulary (vocab_key)

    def __init__(self, store: CountSource | None = None,
                 limits: NgramLimits = NgramLimits()) -> None:
        self.store = store
        self.limits = limits
        self.max_n = min(limits.max_n, store.max_n) if store is not None else limits.max_n
        self._revision: int | None = None
        self._stored: dict[tuple[int, ...], dict[int, int]] = {}  # store lookups (cache)
        self._session: dict[tuple[int, ...], dict[int, int]] = {}  # n-grams of the context
        self._merged: dict[tuple[int, ...], _Counts] = {}          # stored + session
        self._tokens: list[int] = []
        self._pending: list[int] = []   # committed, not learnt yet (learnt when next needed)

    # ---- Drafter protocol ---------------------------------------------------------------------
    def begin(self, context: Sequence[int], states: States = None) -> None:
        """Keep the session's counts of the part of the last context this one starts with (a
        conversation's next turn, or the same prompt again) and learn the rest: a turn costs its
        new tokens. A store that changed since drops only the merged counts built from it."""
        if self.store is not None and self._load_store():
            self._merged = {}
        self.catch_up()
        keep = common_prefix(self._tokens, context)
        self._truncate(keep)
        self._learn(context[keep:])

    def _truncate(self, keep: int) -> None:
        """Unlearn the tokens from position `keep` on: their counts out of the session, the merged
        counts of their contexts dropped (rebuilt from store and session when next needed)."""
        toks, session, merged = self._tokens, self._session, self._merged
        for end in range(len(toks) - 1, keep - 1, -1):
            token = toks[end]
            for n in range(min(self.max_n - 1, end) + 1):
                ctx = tuple(toks[end - n:end])
                seen = session[ctx]
                if seen[token] == 1:
                    del seen[token]
                    if not seen:
                        del session[ctx]
                else:
                    seen[token] -= 1
                merged.pop(ctx, None)
        del toks[keep:]

    def _load_store(self) -> bool:
        """(Re)load the cache if the store changed (learnt, forgot) or the cache grew too big."""
        revision = self.store.revision()
        if revision == self._revision and len(self._stored) <= self.limits.max_cached:
            return False
        self._stored = self.store.lookup([()])          # unigrams: every node needs them
        top = list(self._stored[()])[:self.limits.prefetch]
        self._stored.update(self.store.lookup([(t,) for t in top]))  # the longest lists
        self._revision = revision
        return True

    def accept(self, tokens: Sequence[int], states: States = None) -> None:
        # Learnt when the drafter next proposes: it sits out every round whose arm does not run it
        # (plain rounds), and learning each of those rounds' tokens would cost a noticeable share
        # of a fast step (docs/decisions/0015).
        self._pending.extend(tokens)

    def catch_up(self) -> None:
        """Learn the tokens accepted since the last propose (the engine calls it before timing a
        propose, so a stage that sat out is not charged for the rounds it skipped)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._learn(pending)

    def _learn(self, tokens: Sequence[int]) -> None:
        toks, session, merged = self._tokens, self._session, self._merged
        for token in tokens:
            token = int(token)
            end = len(toks)
            for n in range(min(self.max_n - 1, end) + 1):   # contexts of 0..max_n-1 tokens
                ctx = tuple(toks[end - n:end])
                seen = session.setdefault(ctx, {})
                seen[token] = seen.get(token, 0) + 1
                counts = merged.get(ctx)
                if counts is not None:
                    counts.bump(token)
            toks.append(token)

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None:
        budget = min(budget, tree.room)
        self.catch_up()
        if budget <= 0 or not self._tokens:
            return
        keep, max_depth = self.max_n - 1, self.limits.max_depth
        fetch_logp = math.log(self.limits.fetch_above)
        # best first, expanded lazily: a node's children are looked up only when its own path
        # probability (which bounds theirs) tops the heap, so the nodes grown last, when the
        # budget runs out, cost no lookups. Entries: (-path logp, tie, parent node, token or
        # -1 for "expand the parent", history after the parent, P(token | parent)).
        heap: list = [(0.0, 0, 0, -1, tuple(self._tokens[-keep:]), 1.0)]
        tie = 1
        while heap and budget > 0:
            neg, _, parent, token, hist, p = heapq.heappop(heap)
            if token < 0:
                for q, t in self.next_tokens(hist, -neg >= fetch_logp):
                    heapq.heappush(heap, (neg - math.log(q), tie, parent, t, hist, q))
                    tie += 1
                continue
            child = tree.child_with_token(parent, token)
            if child < 0:                     # an earlier stage's child is adopted for free
                child = tree.add(parent, token, -neg, stage, hint=prob_hint(p))
                budget -= 1
            if tree.depth[child] < max_depth:
                heapq.heappush(heap, (neg, tie, child, -1, (hist + (token,))[-keep:], 1.0))
                tie += 1

    def cost_curve(self, costs: Costs) -> Costs:
        return costs              # free: no curve of its own

    def close(self) -> None:
        self._stored, self._session, self._merged, self._tokens, self._pending = {}, {}, {}, [], []
        self._revision = None

    # ---- the model ----------------------------------------------------------------------------
    def next_tokens(self, hist: tuple[int, ...], fetch: bool = True) -> list[tuple[float, int]]:
        """Up to `branching` (P(w | hist), w) with P above the threshold, most probable first.
        fetch=False: contexts not in memory count only what this context taught (no store query)."""
        levels, weights = self._mixture(hist, fetch)
        if not levels:
            return []
        tau = self.limits.threshold
        candidates: set[int] = set()
        for counts, w in zip(levels, weights):
            cutoff = tau / (len(levels) * w) * counts.total   # P(w) > tau needs count > cutoff
            cnt = counts.count
            for t in counts.order:
                if cnt[t] <= cutoff:
                    break
                candidates.add(t)
        scored = [(p, t) for t in candidates if (p := _mix(levels, weights, t)) > tau]
        scored.sort(key=lambda pt: (-pt[0], pt[1]))
        return scored[:self.limits.branching]

    def probability(self, hist: Sequence[int], token: int) -> float:
        """P(token | the last max_n - 1 tokens of hist) under the back-off model."""
        levels, weights = self._mixture(tuple(int(t) for t in hist)[-(self.max_n - 1):])
        return _mix(levels, weights, int(token)) if levels else 0.0

    def _mixture(self, hist: tuple[int, ...], fetch: bool = True
                 ) -> tuple[list[_Counts], list[float]]:
        """Seen levels, longest context first, and each one's weight W_k in the interpolation."""
        self.catch_up()
        top = min(len(hist), self.max_n - 1)
        ctxs = [hist[len(hist) - k:] for k in range(top, -1, -1)]   # ..., (b, c), (c,), ()
        unfetched: list[tuple[int, ...]] = []
        if self.store is not None:
            missing = [c for c in ctxs if c not in self._stored and c not in self._merged]
            if missing and fetch:
                self._stored.update(self.store.lookup(missing))
            elif missing:
                unfetched = missing
        levels, weights, rest = [], [], 1.0
        for ctx in ctxs:
            # an unfetched context is not kept as merged: a later fetch must still find it missing
            counts = self._counts(ctx, keep=ctx not in unfetched)
            if counts.total == 0:
                continue
            lam = counts.total / (counts.total + len(counts.count)) if ctx else 1.0
            levels.append(counts)
            weights.append(rest * lam)
            rest *= 1.0 - lam
        return levels, weights

    def _counts(self, ctx: tuple[int, ...], keep: bool = True) -> _Counts:
        """The store's and this session's counts after `ctx`, kept as merged unless `keep` is False."""
        counts = self._merged.get(ctx)
        if counts is None:
            merged = dict(self._stored.get(ctx, ()))
            for t, c in self._session.get(ctx, {}).items():
                merged[t] = merged.get(t, 0) + c
            counts = _Counts(merged)
            if keep:
                self._merged[ctx] = counts
        return counts


def _mix(levels: list[_Counts], weights: list[float], token: int) -> float:
    return sum(w * c.count.get(token, 0) / c.total for c, w in zip(levels, weights))
