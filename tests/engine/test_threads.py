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
        assert governed.n_threads == 2           # what it was opened with
    finally:
        governed.close()
        fixed.close()


def test_a_calibration_holds_the_thread_count_it_is_keyed_by(tiny, tmp_path, monkeypatch):
    """Curves measured on one thread (the cores reported busy) are cached under one thread's key
    and never stand for two threads' (another count measures again); the count stays put for
    the whole calibration even when the governor's moves mid-way."""
    from localspec.engine import calibrate as cal

    if default_threads() < 2:
        pytest.skip("needs two cores")
    governor = cores.Governor({0, 1}, OneCoreBusy(), background=False)
    monkeypatch.setattr(cores, "_GOVERNOR", governor)
    model = LlamaModel(tiny.target_gguf, n_ctx=256, n_seq_max=4)
    try:
        governor.look()
        time.sleep(0.3)
        governor.look()                      # one core busy elsewhere: one thread
        assert governor.threads(2) == 1
        counts = []

        def mid_way(step):                   # the governor moves between the steps...
            governor._current = 2 if step.step % 2 else 1
            counts.append(lc.llama_n_threads(model._ctx))   # ...and the decodes keep one count

        busy = cal.calibrate(model, None, 4, cache_dir=tmp_path, progress=mid_way)
        assert counts and set(counts) == {1}
        governor._current = 2                # the machine quiet again: two threads, another curve
        steps = []
        quiet = cal.calibrate(model, None, 4, cache_dir=tmp_path, progress=steps.append)
        assert steps and quiet.file != busy.file and model.threads_now == 2
        steps.clear()
        governor._current = 1
        again = cal.calibrate(model, None, 4, cache_dir=tmp_path, progress=steps.append)
        assert not steps and again.file == busy.file   # one thread's curve, from its cache
        governor._current = 2
        model.decode([1], [0])
        assert lc.llama_n_threads(model._ctx) == 2     # governed again once it ended
    finally:
        model.close()
