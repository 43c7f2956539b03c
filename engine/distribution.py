"""Sparse next-token distributions, computed from a logits row without copying the vocabulary.

A row is a zero-copy numpy view of the model's logits buffer. Temperature, top-k and top-p leave
a support that is usually small, so every later step (rejection tests, residuals) works on that
support only; only the softmax normaliser and the top-k partition touch the whole row, in numpy.
Target and drafters process logits with the same function so their distributions are comparable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import SamplingParams

# Top-p first looks at this many best tokens; the whole row is sorted only if they hold < top_p.
_NUCLEUS_PROBE = 1024


@dataclass(frozen=True)
class Dist:
    """A distribution over token ids: ids[i] has probability probs[i], summing to 1.

    Sorted by descending probability, except the temperature-only case (the whole vocabulary in
    id order), where sorting would cost more than everything else in a round.
    """

    ids: np.ndarray    # [k] int64
    probs: np.ndarray  # [k] float64

    def prob_of(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.ids[draw_index(self.probs, rng)])


def draw_index(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index i with probability probs[i] / probs.sum()."""
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, probs.size - 1)


def _nucleus(ids: np.ndarray, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep the smallest descending prefix holding top_p of the mass; renormalise it."""
    if top_p >= 1.0:
        return ids, probs
    cut = int(np.searchsorted(np.cumsum(probs), top_p, side="left")) + 1
    return ids[:cut], probs[:cut] / probs[:cut].sum()


def process(row: np.ndarray, params: SamplingParams) -> Dist:
    """Apply temperature, then top-k, then top-p (llama.cpp's order) to one logits row."""
    vocab = row.shape[0]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k == vocab and params.top_p >= 1.0:  # temperature only: the whole vocabulary, unsorted
        logits = row.astype(np.float64) / params.temperature
        probs = np.exp(logits - logits.max())
        return Dist(np.arange(vocab, dtype=np.int64), probs / probs.sum())
    if k < vocab:
        ids = top_ids(row, k)
    else:
        probe = min(_NUCLEUS_PROBE, vocab) if params.top_p < 1.0 else vocab
        ids = np.argpartition(row, vocab - probe)[vocab - probe:] if probe < vocab else np.arange(vocab)
    logits = row[ids].astype(np.float64) / params.temperature
    order = np.argsort(-logits, kind="stable")
    ids, logits = ids[order], logits[order]
    top = logits[0]
    if k < vocab:
        probs = np.exp(logits - top)
        probs /= probs.sum()
    else:  # normalise over the whole vocabulary, not only the probed tokens
        total = np.exp((row.astype(np.float64) / params.temperature) - top).sum()
        probs = np.exp(logits - top) / total
        if params.top_p < 1.0 and probs.sum() < params.top_p and ids.size < vocab:
            return process_full_sort(row, params)
    ids, probs = _nucleus(ids, probs, params.top_p)
    return Dist(ids.astype(np.int64), probs)


def process_full_sort(row: np.ndarray, params: SamplingParams) -> Dist:
    """Reference path: sort the whole row. Used when the nucleus is wider than the probe, and in tests."""
    logits = row.astype(np.float64) / params.temperature
    ids = np.argsort(-logits, kind="stable")
    if 0 < params.top_k < row.shape[0]:
        ids = ids[: params.top_k]
    lg = logits[ids]
    probs = np.exp(lg - lg[0])
    probs /= probs.sum()
    ids, probs = _nucleus(ids, probs, params.top_p)
    return Dist(ids.astype(np.int64), probs)


def top_ids(row: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest entries of `row`, largest first: exactly those of a partition of
    the whole row, found through the column maxima of its [_GROUPS, n / _GROUPS] view (the k
    largest lie in the k columns with the largest maxima): cheaper than np.argpartition over the
    whole row for top-k sampling's small k (docs/decisions/0016)."""
    n = row.shape[0]
    k = min(k, n)
    width = n // _GROUPS
    if width < 2 * k:
        ids = np.argpartition(row, n - k)[n - k:]
        return ids[np.argsort(-row[ids], kind="stable")]
    return _top_in_columns(row, row[:width * _GROUPS].reshape(_GROUPS, width).max(axis=0), k)


def _top_in_columns(row: np.ndarray, maxima: np.ndarray, k: int) -> np.ndarray:
    """The k largest of `row` given the column maxima of its [_GROUPS, width] view: k columns
    reach the k-th largest maximum, so every one of the k largest entries is at least that; one
    comparison pass finds the few that are (the tail beyond the grid included)."""
    global _above
    width = maxima.shape[0]
    if k == 1:
        return np.array([int(row.argmax())])
    floor = np.partition(maxima, width - k)[width - k]
    if _above.shape[0] < row.shape[0]:
        _above = np.empty(row.shape[0], bool)
    above = np.greater_equal(row, floor, out=_above[:row.shape[0]])
    ids = np.flatnonzero(above)
    if ids.shape[0] > k:
        ids = ids[np.argpartition(row[ids], ids.shape[0] - k)[ids.shape[0] - k:]]
    return ids[np.argsort(-row[ids], kind="stable")]


_above = np.empty(0, bool)         # _top_in_columns' comparison buffer, reused
_scratch = np.empty(0, np.float32)   # top_dist's softmax buffer, reused: one per process
_GROUPS = 256      # top_dist splits the row into this many interleaved groups (0016)
_MARGIN = 12.0     # softmax sum over the columns whose max lies within this of the row's max (0016)


def top_dist(row: np.ndarray, k: int) -> Dist:
    """The k most likely tokens with their softmax probabilities (not renormalised to 1).

    Greedy drafting ranks candidates by these (path probabilities, confidence classes); sampling
    uses `process` instead, which is exact. This runs once per drafted node on a 152k-entry row,
    so it reads the row once as a [_GROUPS, n / _GROUPS] matrix for its column maxima (an
    elementwise max of contiguous rows). The top k are exact: they lie in the k columns
    with the highest maxima. The softmax sum is taken over the columns whose max lies within
    _MARGIN of the row's when those are under half the row; the rest of the vocabulary is left
    out, which overstates the probabilities by the mass left out (small on a draft's peaked rows).
    A peaked row then costs a fraction of a partition and an exp pass over the whole row
    (docs/decisions/0016).
    """
    global _scratch
    n = row.shape[0]
    k = min(k, n)
    width = n // _GROUPS
    body = width * _GROUPS
    if width < 2 * k:            # a tiny vocabulary: the whole row
        ids = np.argsort(-row, kind="stable")[:k]
        top = row[ids].astype(np.float64)
        return Dist(ids.astype(np.int64), np.exp(top - top[0]) / np.exp(row - top[0]).sum(dtype=np.float64))
    grid = row[:body].reshape(_GROUPS, width)        # entry (g, c) is token g * width + c
    maxima = grid.max(axis=0)                        # [width]
    ids = _top_in_columns(row, maxima, k)
    top = row[ids].astype(np.float64)
    hot = np.flatnonzero(maxima > top[0] - _MARGIN)
    if hot.shape[0] * 2 <= width:
        part = grid[:, hot] - np.float32(top[0])
        total = float(np.exp(part, out=part).sum(dtype=np.float64))
        total += float(np.exp(row[body:].astype(np.float64) - top[0]).sum())
    else:
        if _scratch.shape[0] < n or _scratch.dtype != row.dtype:
            _scratch = np.empty(n, row.dtype)
        buf = _scratch[:n]
        np.subtract(row, row.dtype.type(top[0]), out=buf)
        total = float(np.exp(buf, out=buf).sum(dtype=np.float64))
    return Dist(ids.astype(np.int64), np.exp(top - top[0]) / total)
