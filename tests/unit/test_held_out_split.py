"""`head train`'s held-out split: whole files, never positions interleaved with training ones."""
from __future__ import annotations

import numpy as np
import torch

from localspec.engine.head_train import held_out_split


def _corpus(lengths: list[int], chunks_per_file: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """source and chunk ids [N] of files of the given token counts, each cut into chunks."""
    source = np.concatenate([np.full(m, f) for f, m in enumerate(lengths)])
    chunk = np.concatenate([f * chunks_per_file + np.arange(m) * chunks_per_file // m
                            for f, m in enumerate(lengths)])
    return source, chunk


def test_held_out_positions_are_whole_files_one_in_twenty():
    rng = np.random.default_rng(0)
    source, chunk = _corpus(rng.integers(5, 200, 60).tolist())
    held, n, of = held_out_split(source, chunk, torch.Generator().manual_seed(1))
    files_held = np.unique(source[held])
    assert f"{n} of {of}" == "3 of 60 files" and files_held.size == 3
    for f in np.unique(source):                 # a file is all held out or all training
        assert held[source == f].all() or not held[source == f].any()
    again = held_out_split(source, chunk, torch.Generator().manual_seed(1))[0]
    other = held_out_split(source, chunk, torch.Generator().manual_seed(2))[0]
    np.testing.assert_array_equal(again, held)   # the generator decides which files
    assert not np.array_equal(other, held)


def test_two_files_hold_out_one_whole_file():
    source, chunk = _corpus([50, 70])
    held, n, of = held_out_split(source, chunk, torch.Generator().manual_seed(0))
    assert f"{n} of {of}" == "1 of 2 files" and np.unique(source[held]).size == 1
    assert held.sum() in (50, 70)


def test_one_file_holds_out_its_last_chunks():
    source, chunk = _corpus([400], chunks_per_file=40)
    held, n, of = held_out_split(source, chunk, torch.Generator().manual_seed(0))
    assert f"{n} of {of}" == "2 of 40 chunks of one file"
    assert held[-1] and not held[0]
    first = int(np.argmax(held))                 # held positions are one tail, whole chunks
    assert held[first:].all() and not held[:first].any() and chunk[first] != chunk[first - 1]
