"""Max-Gram: propose what followed the longest earlier occurrence of the context's suffix.

Cascade Speculative Drafting's statistical drafter. Costless next to any model call, and strong on
code edits and repeated material. An index maps every n-gram (n <= max_n) to the positions right
after its occurrences, updated incrementally as tokens are committed; proposing looks up the longest
suffix that occurred before and copies the continuation of its most recent occurrences, one chain
per distinct next token. It has no distribution q, so its children are deterministic (the verifier's
exact-match rule).

Each chain is tagged (`DraftTree.hint`) with the length of the suffix it was found by, which
predicts acceptance: inside a block being copied the longest suffix looked up matches and the copy
runs on for dozens of tokens; a 3-token coincidence in new prose mostly misses. Pruning (prune.py)
learns the rate per class and depth, so a chain can be long (`max_depth`) and only the part that
pays is verified.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..config import SamplingParams
from ..prefix import common_prefix
from ..tree import DraftTree
from .base import States

if TYPE_CHECKING:
    from ..costs import Costs

_MATCH_EDGES = (3, 4, 6, 8, 12, 16, 32)     # match length -> hint 0..7


def match_hint(length: int) -> int:
    """The confidence class of a chain copied after a match of `length` tokens."""
    return bisect_right(_MATCH_EDGES, length)


@dataclass(frozen=True)
class MaxGramLimits:
    max_n: int = 8        # longest suffix looked up
    min_n: int = 3        # shortest suffix worth trusting (1-2 token matches mostly miss)
    max_depth: int = 64   # tokens copied per chain (the tree budget and pruning keep what pays)
    branching: int = 2    # distinct continuations (chains) proposed


class MaxGram:
    name = "maxgram"
    uses_model = False
    copies = True
    vocab_size = None     # it copies the context's own tokens

    def __init__(self, limits: MaxGramLimits = MaxGramLimits()) -> None:
        self.limits = limits
        self._tokens: list[int] = []
        self._follow: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions right after it

    def begin(self, context: Sequence[int], states: States = None) -> None:
        """Keep the index of the part of the last context this one starts with (a conversation's
        next turn) and index the rest: a turn costs its new tokens, not the conversation's."""
        keep = common_prefix(self._tokens, context)
        self._truncate(keep)
        self.accept(context[keep:])

    def _truncate(self, keep: int) -> None:
        """Forget the tokens from position `keep` on. Each position was appended last to its
        n-grams' lists when it was indexed, so undoing positions newest first pops list tails."""
        toks, follow = self._tokens, self._follow
        min_n, max_n = self.limits.min_n, self.limits.max_n
        for end in range(len(toks) - 1, keep - 1, -1):
            for n in range(min_n, min(max_n, end) + 1):
                key = tuple(toks[end - n:end])
                starts = follow[key]
                starts.pop()
                if not starts:
                    del follow[key]
        del toks[keep:]

    def accept(self, tokens: Sequence[int], states: States = None) -> None:
        toks, follow = self._tokens, self._follow
        min_n, max_n = self.limits.min_n, self.limits.max_n
        for token in tokens:
            # index the n-grams ending just before this token: they are followed by it (only the
            # lengths propose looks up: min_n..max_n)
            end = len(toks)
            for n in range(min_n, min(max_n, end) + 1):
                key = tuple(toks[end - n:end])
                starts = follow.get(key)
                if starts is None:
                    follow[key] = [end]
                else:
                    starts.append(end)
            toks.append(int(token))

    def propose(self, tree: DraftTree, stage: int, budget: int, sampling: SamplingParams,
                rng: np.random.Generator) -> None:
        toks, lim = self._tokens, self.limits
        end = len(toks)
        for n in range(min(lim.max_n, end), lim.min_n - 1, -1):
            starts = self._follow.get(tuple(toks[end - n:end]))
            if starts:
                break
        else:
            return
        hint = match_hint(n)                       # every chain was found by the same suffix
        seen: set[int] = set()
        for start in reversed(starts):             # most recent occurrence first
            if budget <= 0 or len(seen) >= lim.branching:
                break
            if start >= end or toks[start] in seen:
                continue
            seen.add(toks[start])
            node = 0
            for tok in toks[start:start + lim.max_depth]:
                child = tree.child_with_token(node, tok)
                if child < 0:
                    if budget <= 0:
                        break
                    child = tree.add(node, tok, 0.0, stage, hint=hint)
                    budget -= 1
                node = child

    def catch_up(self) -> None:
        pass                  # it learns each round's tokens in accept

    def cost_curve(self, costs: Costs) -> Costs:
        return costs          # free: no curve of its own

    def close(self) -> None:
        self._tokens, self._follow = [], {}
