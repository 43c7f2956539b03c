"""Head training's progress events (engine/head_train.py `Progress`) and its resumable
checkpoints, on the tiny target at a tiny scale (how well a head learns: test_head.py)."""
from __future__ import annotations

import re

import pytest

from localspec.engine.head_train import Progress, collect, train


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def corpus(tiny):
    from localspec.engine.head_train_model import TrainingModel
    from tiny_models import build_corpus

    model = TrainingModel(tiny.target_gguf, n_ctx=128, n_batch=128, n_seq_max=1, hidden=True, n_threads=1)
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


def test_a_kept_corpus_trains_again_without_reading_and_is_refused_for_another_target(tiny, tmp_path, capsys):
    """`head train --corpus F`: the first run keeps what the target read there, the next trains
    from it alone (no text needed, none read); another target's corpus is refused with the fix."""
    from localspec.app.cli import build_parser
    from localspec.engine import llama_model
    from localspec.engine.errors import LocalspecError

    text = tmp_path / "notes"
    text.mkdir()
    for i in range(3):
        (text / f"m{i}.py").write_text(f'def add_{i}(a, b):\n    """The sum."""\n    return a + b + {i}\n\n' * 30)
    kept = tmp_path / "corpus.npz"
    common = ["head", "train", "--steps", "12", "--batch", "4", "--length", "32", "--ctx", "128",
              "--no-history", "--no-stdlib", "--no-site-packages", "--corpus", str(kept)]
    first = build_parser().parse_args([*common, "--model", str(tiny.target_gguf), "--text", str(text),
                                       "--out", str(tmp_path / "a.npz"), "--max-tokens", "1500",
                                       "--generated-tokens", "0"])
    assert first.run(first) == 0 and kept.exists()
    opened = []
    real = llama_model.LlamaModel.__init__
    llama_model.LlamaModel.__init__ = lambda self, *a, **k: (opened.append(a), real(self, *a, **k))[1]
    try:
        again = build_parser().parse_args([*common, "--model", str(tiny.target_gguf), "--text", str(text),
                                           "--out", str(tmp_path / "b.npz")])
        assert again.run(again) == 0
    finally:
        llama_model.LlamaModel.__init__ = real
    assert opened == [] and (tmp_path / "b.npz").exists()   # the target never ran again
    assert "kept in" in capsys.readouterr().err
    other = build_parser().parse_args([*common, "--model", str(tiny.draft_gguf), "--text", str(text),
                                       "--out", str(tmp_path / "c.npz")])
    with pytest.raises(LocalspecError, match="another target") as err:
        other.run(other)
    assert "another --corpus" in err.value.render()


def test_a_corpus_kept_with_taps_trains_a_head_with_them_or_without_and_refuses_other_layers(tiny, tmp_path):
    """`head train --taps 1,2 --corpus F` keeps the tapped states; from F, no --taps trains with
    the same taps, --taps none on the last layer's states alone, other layers are refused."""
    import json

    import numpy as np

    from localspec.app.cli import build_parser
    from localspec.engine.errors import LocalspecError

    text = tmp_path / "notes"
    text.mkdir()
    for i in range(3):
        (text / f"m{i}.py").write_text(f'def add_{i}(a, b):\n    """The sum."""\n    return a + b + {i}\n\n' * 30)
    kept = tmp_path / "corpus.npz"
    common = ["head", "train", "--model", str(tiny.target_gguf), "--text", str(text), "--steps", "12",
              "--batch", "4", "--length", "32", "--ctx", "128", "--no-history", "--no-stdlib",
              "--no-site-packages", "--corpus", str(kept)]

    def run(out: str, *flags: str) -> list:
        args = build_parser().parse_args([*common, "--out", str(tmp_path / out), *flags])
        assert args.run(args) == 0
        return json.loads(str(np.load(tmp_path / out)["meta"]))["shape"]["taps"]

    assert run("a.npz", "--taps", "1,2", "--max-tokens", "1500", "--generated-tokens", "0") == [1, 2]
    assert run("b.npz") == [1, 2]
    assert run("c.npz", "--taps", "none") == []
    other = build_parser().parse_args([*common, "--out", str(tmp_path / "d.npz"), "--taps", "1"])
    with pytest.raises(LocalspecError, match="read at other layers"):
        other.run(other)


def test_head_train_reads_the_taps_by_default_only_where_the_corpus_they_triple_fits(tiny, tmp_path,
                                                                                  monkeypatch):
    """--taps left out: the target's 'auto' layers where the corpus with them (the last layer's
    states and one more a tap, f16) takes at most half the free memory, and half the free disk
    when --corpus keeps it; none, saying why and what asks for them anyway, where it would not
    or where the free memory is unknown. A real run without --taps (a small corpus, which fits):
    a head with the taps."""
    import json
    import shutil
    from collections import namedtuple

    import numpy as np
    import torch

    from localspec.app.cli import build_parser
    from localspec.app.head_cmd import default_taps
    from localspec.models import fit
    from localspec.models.gguf_file import read_gguf

    info = read_gguf(tiny.target_gguf)
    width = info.metadata[f"{info.architecture}.embedding_length"]
    need = 10_000 * width * 2 * 2       # the tiny target has 4 layers: 'auto' is layer 2 alone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(fit, "mem_available", lambda: 2 * need)
    taps, why = default_taps(tiny.target_gguf, 10_000, None)
    assert taps == (2,) and why.startswith("taps: layers 2 beside the last")
    for free in (2 * need - 1, None):
        monkeypatch.setattr(fit, "mem_available", lambda free=free: free)
        taps, why = default_taps(tiny.target_gguf, 10_000, None)
        assert taps == () and "memory" in why and "--taps auto" in why
    monkeypatch.setattr(fit, "mem_available", lambda: 100 * need)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(need, 0, need))
    taps, why = default_taps(tiny.target_gguf, 10_000, tmp_path / "corpus.npz")
    assert taps == () and "disk" in why and "memory" not in why
    monkeypatch.undo()

    text = tmp_path / "notes"
    text.mkdir()
    (text / "m.py").write_text('def add(a, b):\n    """The sum."""\n    return a + b\n\n' * 60)
    args = build_parser().parse_args(["head", "train", "--model", str(tiny.target_gguf), "--text", str(text),
                                      "--no-history", "--no-stdlib", "--no-site-packages", "--steps", "4",
                                      "--batch", "4", "--length", "32", "--ctx", "128", "--max-tokens", "1500",
                                      "--generated-tokens", "0", "--out", str(tmp_path / "h.npz")])
    assert args.run(args) == 0
    assert json.loads(str(np.load(tmp_path / "h.npz")["meta"]))["shape"]["taps"] == [2]


def test_generated_continuations_are_the_targets_greedy_text_with_its_states(tiny):
    """generate_corpus runs several prompts side by side, one KV stream each (their prompts packed
    into batches that straddle sequences: n_batch 40 against 3 x 23 prompt tokens): every chunk
    must be what the target alone says after its prompt (greedy), and each pair's state the
    target's. The last event says where the time went."""
    import numpy as np

    from localspec.engine.head_train import generate_corpus
    from localspec.engine.head_train_model import TrainingModel
    from localspec.engine.llama_model import LlamaModel
    from tiny_models import build_corpus

    whole = "\n".join(build_corpus(n_docs=60))   # cut mid-text: the continuations go on
    texts = [(i, whole[a:a + 200]) for i, a in enumerate(range(0, 1500, 300))]
    width, prompt_tokens, gen = 3, 24, 12
    many = TrainingModel(tiny.target_gguf, n_ctx=width * 64, n_batch=40, n_seq_max=width, hidden=True,
                         unified=False, greedy_on_device=True, n_threads=1)
    events = []
    try:
        got = generate_corpus(many, iter(texts), 10_000, gen_tokens=gen, prompt_tokens=prompt_tokens,
                              progress=events.append)
    finally:
        many.close()
    assert re.fullmatch(r"\d+ s generating: prompts [\d.]+ s, steps [\d.]+ s, the rest -?[\d.]+ s", events[-1].note)
    one = LlamaModel(tiny.target_gguf, n_ctx=64, n_batch=64, n_seq_max=1, hidden=True, n_threads=1)
    try:
        chunks = np.unique(got.chunk)
        assert chunks.size == len(texts)          # five prompts: a group of three, then two
        assert np.bincount(got.chunk).max() >= 8  # (and at least one went on for a while)
        for c in chunks:
            rows = np.flatnonzero(got.chunk == c)
            file_id = int(got.source[rows[0]])
            ids = one.tokenize(texts[file_id][1], special=False, add_bos=False)[-prompt_tokens:]
            one.clear()
            one.decode(ids, np.arange(len(ids), dtype=np.int32), logits=True)
            said = [int(np.argmax(one.logits()[-1]))]
            states = [one.hidden_rows()[-1].copy()]
            for k in range(len(rows) - 1):
                one.decode([said[-1]], np.asarray([len(ids) + k], np.int32), logits=True)
                said.append(int(np.argmax(one.logits()[0])))
                states.append(one.hidden_rows()[0].copy())
            # fed: the prompt's last token, then what the target chose after each
            assert got.tokens[rows].tolist() == [ids[-1], *said[:-1]]
            np.testing.assert_allclose(got.hidden[rows].astype(np.float32), np.stack(states), atol=2e-2, rtol=2e-2)
    finally:
        one.close()


def test_noise_on_the_states_changes_training_not_the_held_out_check_and_is_recorded(tiny, corpus, tmp_path):
    """`noise` perturbs the states the first level reads in training steps only: the same seed
    trains another head, the held-out check (no noise) still runs, and the head's meta says so."""
    settings = dict(steps=12, batch=4, length=32, vocab_size=64, device="cpu")
    from localspec.models.head_file import read_head

    plain = train(corpus, tiny.target_gguf, tmp_path / "plain.npz", **settings)
    noisy = train(corpus, tiny.target_gguf, tmp_path / "noisy.npz", noise=0.2, **settings)
    assert plain["noise"] == 0.0 and noisy["noise"] == 0.2
    assert read_head(tmp_path / "noisy.npz")[0]["noise"] == 0.2
    _, a = read_head(tmp_path / "plain.npz")
    _, b = read_head(tmp_path / "noisy.npz")
    assert any(not (a[k] == b[k]).all() for k in a if hasattr(a[k], "shape") and a[k].dtype.kind == "f")
    train(corpus, tiny.target_gguf, tmp_path / "plain2.npz", **settings)
    _, c = read_head(tmp_path / "plain2.npz")
    assert all((a[k] == c[k]).all() for k in a if hasattr(a[k], "shape"))   # the seed alone decides


def test_generation_stops_at_its_time_limit_with_whole_continuations(tiny):
    """seconds=0: the first step of the first group is all there is time for; each prompt's one
    fed token and its state are kept, the note says it stopped, and the target is left clear."""
    from localspec.engine.head_train import generate_corpus
    from localspec.engine.head_train_model import TrainingModel
    from tiny_models import build_corpus

    whole = "\n".join(build_corpus(n_docs=60))
    texts = [(i, whole[a:a + 200]) for i, a in enumerate(range(0, 1500, 300))]
    many = TrainingModel(tiny.target_gguf, n_ctx=3 * 64, n_batch=64, n_seq_max=3, hidden=True,
                         unified=False, greedy_on_device=True, n_threads=1)
    events = []
    try:
        got = generate_corpus(many, iter(texts), 10_000, gen_tokens=12, prompt_tokens=24,
                              progress=events.append, seconds=0)
        assert many.seq_pos_max(0) == -1
    finally:
        many.close()
    # one step: each of the first group's 3 rows was fed one token (fewer than 2 are not kept)
    assert len(got.tokens) == 0 and "stopped at the time limit" in events[-1].note


def test_backend_greedy_samplers_choose_each_rows_argmax_for_many_rows_and_sequences(tiny):
    """greedy_on_device: llama.cpp picks every output row's most likely token where the model
    runs (packaging/patches: one argmax over all the rows when every sequence samples greedily),
    several rows of one sequence included (what `collect` would read text with): the same tokens
    as the argmax of the logits of the same batch decoded without samplers."""
    import numpy as np

    from localspec.engine.head_train_model import TrainingModel

    kw = dict(n_ctx=128, n_batch=32, n_seq_max=2, hidden=True, unified=False, n_threads=1)
    sampled = TrainingModel(tiny.target_gguf, greedy_on_device=True, **kw)
    plain = TrainingModel(tiny.target_gguf, **kw)
    try:
        a = sampled.tokenize("def add_3(x):\n    return x + 3\n", special=False)[:10]
        b = sampled.tokenize("class Counter:\n    def __init__(self):\n", special=False)[:10]
        tokens = np.asarray(a + b, np.int32)
        pos = np.r_[np.arange(len(a)), np.arange(len(b))].astype(np.int32)
        seqs = [(0,)] * len(a) + [(1,)] * len(b)
        for model in (sampled, plain):
            model.decode(tokens, pos, seqs, logits=True)
        want = plain.logits().argmax(axis=1)
        np.testing.assert_array_equal(sampled.sampled(range(len(tokens))), want)
        np.testing.assert_array_equal(sampled.hidden_rows(), plain.hidden_rows())
    finally:
        sampled.close()
        plain.close()


def test_backend_greedy_samplers_of_every_row_take_one_argmax(tiny, monkeypatch):
    """The batched argmax (packaging/patches) is the graph llama.cpp builds when every output
    row's sequence samples greedily: ggml's scheduler, asked to print its node assignments
    (GGML_SCHED_DEBUG=2), names the one argmax node of all the rows. It once went unused while
    its tokens stayed right: a backend-initialised greedy sampler is named "+greedy"."""
    import ctypes

    import llama_cpp as lc
    import numpy as np

    from localspec.engine import native
    from localspec.engine.head_train_model import TrainingModel

    lines: list[str] = []

    @lc.llama_log_callback
    def keep(level, text, user_data):
        lines.append(text.decode("utf-8", errors="replace") if text else "")

    monkeypatch.setenv("GGML_SCHED_DEBUG", "2")   # read when a context makes its scheduler
    lc.llama_log_set(keep, ctypes.c_void_p(0))
    try:
        model = TrainingModel(tiny.target_gguf, n_ctx=64, n_batch=16, n_seq_max=2, hidden=True,
                              unified=False, greedy_on_device=True, n_threads=1)
        try:
            lines.clear()   # the reserve graphs at open; the decode below is the one asked about
            tokens = np.asarray(model.tokenize("def f(x):\n    return x\n", special=False)[:6], np.int32)
            model.decode(tokens, np.r_[0:3, 0:3].astype(np.int32), [(0,)] * 3 + [(1,)] * 3, logits=True)
            model.sampled(range(6))
        finally:
            model.close()
    finally:
        lc.llama_log_set(native._log_to_buffer, ctypes.c_void_p(0))
    log = "".join(lines)
    assert "greedy_argmax_all" in log
    assert log.count("ARGMAX") == 1   # not one argmax a row


@pytest.mark.parametrize("damage", ["truncated", "fifo"])
def test_a_checkpoint_that_cannot_be_read_is_said_and_training_starts_over(tiny, corpus, tmp_path, damage):
    """Hostile input (issue 45): a checkpoint is read through models/own_files (a regular file of
    bounded size); a damaged one only loses the steps it saved."""
    import os

    out, ckpt = tmp_path / "h.npz", tmp_path / "h.npz.ckpt"
    if damage == "fifo":
        os.mkfifo(ckpt)
    else:
        ckpt.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    events: list[Progress] = []
    train(corpus, tiny.target_gguf, out, progress=events.append, steps=4, batch=4, length=32, vocab_size=64,
          device="cpu", checkpoint=ckpt, checkpoint_every=10)
    assert "cannot be resumed from" in events[0].note and "starting over" in events[0].note, events[0].note
    assert events[1].done == 1 and out.exists()
