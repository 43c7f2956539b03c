"""A model opened without a thread count follows the cores other processes leave free
(engine/cores.py), on the tiny real target: with one of two cores reported busy, its decodes
run on one thread, and the thread count changes none of the logits."""
from __future__ import annotations

import time

import llama_cpp as lc
import numpy as np
import pytest

from localspec.engine import cores
from localspec.engine.llama_model import LlamaModel, default_threads


class OneCoreBusy:
    """/proc/stat's text as if another process kept one core busy beside this process's own time."""

    def __init__(self) -> None:
        self.start, self.own = time.monotonic(), cores._own_seconds()

    def __call__(self) -> str:
        busy = (cores._own_seconds() - self.own) + (time.monotonic() - self.start)   # seconds, both cores
        half = 10_000 + int(busy * cores._TICK / 2)
        return f"cpu0 {half} 0 0 999999 0 0 0 0\ncpu1 {half} 0 0 999999 0 0 0 0\n"


def test_a_model_without_a_thread_count_decodes_on_the_cores_left_free(tiny, monkeypatch):
    if default_threads() < 2:
        pytest.skip("needs two cores")
    governor = cores.Governor({0, 1}, OneCoreBusy(), background=False)
    monkeypatch.setattr(cores, "_GOVERNOR", governor)
    governed = LlamaModel(tiny.target_gguf, n_ctx=256)
    fixed = LlamaModel(tiny.target_gguf, n_ctx=256, n_threads=2)
    try:
        tokens = governed.tokenize("def add(a, b):\n    return", special=False)
        governor.look()                  # what its watch does each second: a baseline,
        time.sleep(0.3)
        governor.look()                  # then a window with one core busy elsewhere
        for i, tok in enumerate(tokens):
            governed.decode([tok], [i])
            fixed.decode([tok], [i])
            assert np.array_equal(governed.logits()[0], fixed.logits()[0]), i
        assert governed.threads_now == 1 and lc.llama_n_threads(governed._ctx) == 1
        assert fixed.threads_now == 2 and lc.llama_n_threads(fixed._ctx) == 2
        assert governed.n_threads == 2           # what it was opened with (calibration's key)
    finally:
        governed.close()
        fixed.close()
