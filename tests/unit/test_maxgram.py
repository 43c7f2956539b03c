"""Max-Gram: what it copies, and the confidence class it tags each chain with."""
from __future__ import annotations

import numpy as np
from localspec.engine.config import SamplingParams
from localspec.engine.drafters.maxgram import MaxGram, MaxGramLimits, match_hint
from localspec.engine.tree import DraftTree

RNG = np.random.default_rng(0)


def propose(context: list[int], budget: int = 32, limits: MaxGramLimits | None = None) -> DraftTree:
    d = MaxGram(limits or MaxGramLimits())
    d.begin(context)
    tree = DraftTree(64)
    tree.reset(context[-1])
    d.propose(tree, 0, budget, SamplingParams(), RNG)
    return tree


def chains(tree: DraftTree) -> list[list[int]]:
    return [tree.path_tokens(tree.first_leaf_below(c)) for c in tree.children[0]]


def test_copies_what_followed_the_most_recent_match_first():
    block = list(range(100, 140))
    context = [1, 2, 3, 50, 51] + [9, 9] + [1, 2, 3, 60, 61, 62] + [7] + [1, 2, 3]
    tree = propose(context)
    assert chains(tree) == [[60, 61, 62, 7, 1, 2, 3], [50, 51, 9, 9, 1, 2, 3, 60, 61, 62, 7, 1, 2, 3]]
    # a long copied block: one chain as deep as the budget allows (no fixed 8-token cap)
    tree = propose(block + [0] + block[:20], budget=16)
    assert chains(tree) == [block[20:36]]


def test_hint_is_the_length_of_the_suffix_looked_up():
    block = list(range(100, 160))
    short = propose([5, 1, 2, 3, 40, 41, 42, 43, 6, 1, 2, 3])           # a 3-token coincidence
    five = propose([7, 1, 2, 3, 4, 5, 40, 41, 6, 1, 2, 3, 4, 5])         # the longest suffix seen: 5
    long = propose(block + [0] + block[:40])                             # 40 tokens copied so far
    assert short.hint[1] == match_hint(3) < five.hint[1] == match_hint(5)
    assert long.hint[1] == match_hint(MaxGramLimits().max_n)             # not the 40 tokens agreeing
    assert (long.hint[1:long.n] == long.hint[1]).all()                 # the whole chain shares it
    assert [match_hint(n) for n in (2, 3, 4, 6, 8, 12, 16, 32, 99)] == [*range(8), 7]


def test_no_match_shorter_than_min_n():
    assert propose([1, 2, 9, 1, 2]).n == 1
    assert propose([1, 2, 9, 1, 2], limits=MaxGramLimits(min_n=2)).n > 1


def test_a_new_context_keeps_the_index_of_the_part_it_starts_with():
    """begin() on a conversation's next turn (the old context extended), on an edited one (a
    shared start, then other tokens) and on a shorter one leaves the index a fresh begin builds."""
    rng = np.random.default_rng(1)
    first = [int(t) for t in rng.integers(0, 6, 300)]      # a small alphabet: n-grams recur
    for second in (first + [int(t) for t in rng.integers(0, 6, 80)],
                   first[:150] + [int(t) for t in rng.integers(0, 6, 120)],
                   first[:40]):
        kept = MaxGram()
        kept.begin(first)
        kept.accept([3, 4, 5])                               # a reply's tokens, then the next turn
        kept.begin(second)
        fresh = MaxGram()
        fresh.begin(second)
        assert kept._tokens == fresh._tokens and kept._follow == fresh._follow
