"""Head training's progress events (engine/head_train.py `Progress`) and its resumable
checkpoints, on the tiny target at a tiny scale (how well a head learns: test_head.py)."""
from __future__ import annotations

import pytest

from localspec.engine.head_train import Progress, collect, train


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def corpus(tiny):
    from localspec.engine.llama_model import LlamaModel
    from tiny_models import build_corpus

    model = LlamaModel(tiny.target_gguf, n_ctx=128, n_batch=128, n_seq_max=1, hidden=True, n_threads=1)
    events: list[Progress] = []
    try:
        got = collect(model, enumerate(build_corpus(n_docs=60)), 6000, chunk=64, progress=events.append)
    finally:
        model.close()
    assert [e.phase for e in events] == ["reading"] * len(events) and events[-1].done == len(got.tokens)
    assert all(e.total == 6000 and e.rate > 0 for e in events)
    assert [e.done for e in events] == sorted(e.done for e in events)
    assert len(events) > 50 and [i for i, e in enumerate(events) if e.milestone] == list(range(49, len(events), 50))
    return got


def test_training_reports_every_step_measures_at_milestones_and_resumes_from_its_checkpoint(tiny, corpus,
                                                                                            tmp_path):
    out, ckpt = tmp_path / "h.npz", tmp_path / "h.npz.ckpt"
    settings = dict(steps=30, batch=4, length=32, vocab_size=64, device="cpu", checkpoint=ckpt, checkpoint_every=10)
    events: list[Progress] = []

    def stop_at_15(ev: Progress) -> None:
        events.append(ev)
        if ev.done == 15:
            raise Stop
    with pytest.raises(Stop):
        train(corpus, tiny.target_gguf, out, progress=stop_at_15, **settings)
    assert [e.done for e in events] == list(range(1, 16))
    assert [e.done for e in events if e.milestone] == [10]
    tenth = events[9]
    assert tenth.loss is not None and len(tenth.held_out_top1) == 3          # by depth: 3 passes
    assert events[10].held_out_top1 == tenth.held_out_top1 and events[10].loss is None
    assert ckpt.exists() and not out.exists()

    events.clear()
    info = train(corpus, tiny.target_gguf, out, progress=events.append, **settings)
    assert events[0].note == f"resumed at step 10 from {ckpt}" and events[1].done == 11
    assert [e.done for e in events if e.milestone] == [20, 30] and events[-1].done == events[-1].total == 30
    assert out.exists() and not ckpt.exists() and info["held_out_top1"] == list(events[-1].held_out_top1)
