"""The longest common prefix of two token sequences: what a cache built for one still holds for the
other. Every part that keeps per-token state across generations (the target's KV cache, a draft
model's, Max-Gram's index) keeps this much and rebuilds only the rest."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. Compared in numpy: conversations run to tens of
    thousands of tokens, and this runs at the start of every turn."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(differ[0]) if differ.size else n
