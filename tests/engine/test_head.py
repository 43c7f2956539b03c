"""The draft head: the target's hidden states, training a head, loading one, and its errors.

Greedy equality with the head drafting is in test_greedy_equality.py, sampling exactness in
test_sampling_distribution.py, the bench's head configurations in test_bench.py.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from localspec.engine.config import TreeBudget
from localspec.engine.drafters.head import DraftHead, target_tables
from localspec.engine.errors import LocalspecError
from localspec.engine.llama_model import LlamaModel
from localspec.engine.session import Session
from localspec.engine.options import Options

import torch  # noqa: E402

ONLY_TEXT = ("--no-history", "--no-stdlib", "--no-site-packages")   # `head train` on --text alone


def test_hidden_states_are_the_output_matrix_input_and_leave_logits_alone(tiny):
    plain = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1)
    hidden = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, hidden=True)
    try:
        tokens = plain.tokenize("def add_3(x):\n    return x + 3\n", special=False)
        pos = np.arange(len(tokens))
        mask = np.zeros(len(tokens), bool)
        mask[[1, 4]] = True
        for logits in (True, False, mask):   # all rows, the last, a mask: the same rows either way
            plain.clear()
            hidden.clear()
            plain.decode(tokens, pos, logits=logits)
            hidden.decode(tokens, pos, logits=logits)
            # (llama.cpp outputs every row with hidden states: its output matmul has another
            # shape, which moves the last bits)
            np.testing.assert_allclose(plain.logits(), hidden.logits(), atol=1e-5, rtol=1e-5)
        hidden.clear()
        hidden.decode(tokens, pos, logits=True)
        _, out, _ = target_tables(tiny.target_gguf, None)
        states = np.stack([hidden.hidden_row(i) for i in range(len(tokens))])
        np.testing.assert_array_equal(hidden.hidden_rows(), states)   # one view, the same rows
        np.testing.assert_allclose(states @ out.T, hidden.logits(), atol=1e-3, rtol=1e-4)
    finally:
        plain.close()
        hidden.close()


def test_taps_hand_back_layer_inputs_after_the_final_state(tiny):
    """A target opened with taps: each row's final state as without, then the input state of each
    tapped layer (layer 0's: the token's embedding row), and none of it with hidden states off."""
    from localspec.engine.drafters.head import tensor_rows

    plain = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, hidden=True)
    tapped = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, hidden=True, taps=(0, 2))
    try:
        d = tapped.n_embd
        assert tapped.n_feature == 3 * d and plain.n_feature == d
        tokens = plain.tokenize("def add_3(x):\n    return x + 3\n", special=False)
        for model in (plain, tapped):
            model.decode(tokens, np.arange(len(tokens)), logits=True)
        wide = tapped.hidden_rows().copy()
        assert wide.shape == (len(tokens), 3 * d)
        np.testing.assert_allclose(wide[:, :d], plain.hidden_rows(), atol=1e-5, rtol=1e-5)
        emb = tensor_rows(tapped.info, "token_embd.weight", tokens)
        np.testing.assert_allclose(wide[:, d:2 * d], emb, atol=1e-6, rtol=1e-6)
        layer2 = wide[:, 2 * d:]
        assert np.isfinite(layer2).all() and not np.allclose(layer2, wide[:, d:2 * d])
        np.testing.assert_array_equal(tapped.hidden_row(3), wide[3])
        tapped.set_hidden(False)        # bench's configurations without the head
        tapped.clear()
        tapped.decode(tokens, np.arange(len(tokens)), logits=False)
        with pytest.raises(RuntimeError):
            tapped.hidden_rows()
        tapped.set_hidden(True)
        tapped.clear()
        tapped.decode(tokens, np.arange(len(tokens)), logits=True)
        np.testing.assert_allclose(tapped.hidden_rows(), wide, atol=1e-5, rtol=1e-5)
    finally:
        plain.close()
        tapped.close()
    with pytest.raises(LocalspecError, match="No such layers"):
        LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, hidden=True, taps=(4,))


def test_head_with_taps_learns_and_needs_a_target_read_at_its_taps(tiny, tiny_head_taps):
    from localspec.engine.drafters.head_stage import head_taps, load_head

    meta = json.loads(str(np.load(tiny_head_taps)["meta"]))
    assert meta["shape"]["taps"] == [1, 2] and head_taps(tiny_head_taps) == (1, 2)
    assert meta["held_out_top1"][0] > 0.3, meta
    model = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, hidden=True)
    try:
        with pytest.raises(LocalspecError, match=r"reads the target's layers \[1, 2\]"):
            load_head(tiny_head_taps, model)
    finally:
        model.close()


def test_taps_flag_names_layers_in_range(tiny):
    from localspec.app.head_cmd import tap_layers

    assert tap_layers("none", tiny.target_gguf) == ()
    assert tap_layers("auto", tiny.target_gguf) == (2,)      # 4 layers: the middle one
    assert tap_layers("3,1", tiny.target_gguf) == (1, 3)
    for bad in ("4", "x", "1,,"):
        with pytest.raises(LocalspecError, match="Invalid --taps"):
            tap_layers(bad, tiny.target_gguf)


def test_head_is_trained_to_predict_the_target(tiny, tiny_head):
    meta = json.loads(str(np.load(tiny_head)["meta"]))
    assert meta["vocab_size"] == tiny.vocab_size and meta["tokens"] > 10_000
    # held-out positions: the head's first guess is the target's choice far above chance
    assert meta["held_out_top1"][0] > 0.3, meta
    head = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu")
    assert head.vocab.size == meta["draft_vocab"] and np.all(np.diff(head.vocab) > 0)


@pytest.mark.slow
def test_cli_trains_and_describes_a_head(tiny, tmp_path):
    text = tmp_path / "notes"
    text.mkdir()
    (text / "a.py").write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "h.npz"
    run = subprocess.run([sys.executable, "-m", "localspec.app.cli", "head", "train", "--model",
                          str(tiny.target_gguf), "--text", str(text), *ONLY_TEXT, "--out", str(out),
                          "--steps", "20", "--batch", "64", "--ctx", "128"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert out.exists() and "held-out top-1" in run.stdout
    info = subprocess.run([sys.executable, "-m", "localspec.app.cli", "head", "info", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and "target: target.gguf" in info.stdout


def test_head_train_dequantises_the_target_tables_once(tiny, tmp_path, monkeypatch):
    """Generating the target's continuations and training both need its output matrix (and
    training its embedding): `localspec head train` dequantises each whole table once."""
    from localspec.app.cli import build_parser
    from localspec.engine.drafters import head

    text = tmp_path / "notes"
    text.mkdir()
    (text / "a.py").write_text('def add(a, b):\n    """The sum."""\n    return a + b\n\n' * 40)
    whole = []   # the tables read whole (dequantised from the file)
    tensor_rows = head.tensor_rows

    def counted(info, name, rows=None):
        if rows is None:
            whole.append(name)
        return tensor_rows(info, name, rows)
    monkeypatch.setattr(head, "tensor_rows", counted)
    out = tmp_path / "h.npz"
    args = build_parser().parse_args(["head", "train", "--model", str(tiny.target_gguf), "--text", str(text),
                                      *ONLY_TEXT, "--out", str(out), "--max-tokens", "2000",
                                      "--generated-tokens", "300", "--parallel", "4", "--steps", "20", "--batch", "64", "--ctx", "128"])
    assert args.run(args) == 0 and out.exists()
    assert sorted(whole) == ["output.weight", "output_norm.weight", "token_embd.weight"]


@pytest.mark.slow
def test_cli_names_the_fix_for_bad_training_input(tiny, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * 30)
    for args, fix in ((["--text", str(empty), "--out", str(tmp_path / "h.npz")], "Name files or folders"),
                      (["--text", str(empty), "--out", str(tmp_path / "h.bin")], ".npz"),
                      (["--text", str(short), "--out", str(tmp_path / "h.npz"), "--generated-tokens", "0"],
                       "Name more text")):
        run = subprocess.run([sys.executable, "-m", "localspec.app.cli", "head", "train", "--model",
                              str(tiny.target_gguf), *ONLY_TEXT, *args], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and fix in run.stderr, run.stderr


def test_a_head_for_another_target_or_a_broken_file_is_refused(tiny, tiny_head, tmp_path):
    with pytest.raises(LocalspecError) as err:
        DraftHead(tiny_head, tiny.other_vocab_gguf, n_embd=32, vocab_size=300, device="cpu")
    assert "head train" in err.value.render() and "512 tokens" in err.value.render()
    broken = tmp_path / "broken.npz"
    broken.write_bytes(tiny_head.read_bytes()[:1000])
    with pytest.raises(LocalspecError, match="Not a usable draft head"):
        DraftHead(broken, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu")
    with pytest.raises(LocalspecError, match="Draft head not found"):
        Session(Options(tiny.target_gguf, head=tmp_path / "missing.npz", n_ctx=256, n_threads=1))


def test_one_token_prompt_drafts_nothing_then_drafts(tiny, tiny_head):
    """No hidden state before the root on a one-token prompt: the head sits the first round out."""
    session = Session(Options(tiny.target_gguf, head=tiny_head, maxgram=False, personal=False,
                                   n_ctx=256, n_threads=1, budget=TreeBudget(max_nodes=16)))
    try:
        plain = Session(Options(tiny.target_gguf, speculation=False, n_ctx=256, n_threads=1))
        prompt = session.raw_prompt("def")[:1]
        expect = plain.run(prompt, max_tokens=24).tokens
        plain.close()
        got = session.run(prompt, max_tokens=24)
    finally:
        session.close()
    assert got.tokens == expect
    assert sum(sum(s.proposed) for s in got.stats.stages if s.name == "head") > 0   # from round 2 on


def test_embedding_rows_outside_the_draft_vocabulary_come_from_the_file(tiny, tiny_head, monkeypatch):
    import localspec.engine.drafters.head as head_module

    monkeypatch.setattr(head_module, "_EXTRA", 8)   # small, so the extra rows fill and start over
    import torch

    head = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu",
                     dtype=torch.float32)   # (bfloat16 where faster here: the rows, not their rounding)
    emb, _, _ = target_tables(tiny.target_gguf, None)
    outside = [t for t in range(tiny.vocab_size) if t not in set(head.vocab.tolist())][:20]
    inside = head.vocab[:3].tolist()
    # the last two: tokens already in extra rows next to new ones, when the rows start over
    for batch in (outside[:5], outside[5:11], inside + outside[11:14], outside[:2], outside[12:14] + outside[14:20]):
        slots = head._slots(batch)
        assert (slots >= 0).all()
        np.testing.assert_allclose(head.emb[slots].numpy(), emb[batch], rtol=0, atol=0)
    assert len(head._extra) <= 8


def test_new_hidden_holds_the_states_a_prefill_and_a_padded_commit_put_in_the_cache(tiny):
    """The rows the head drafts from: a prefill's last token, then the root and the accepted path
    of a padded verify (not its rejected sibling, not the padding)."""
    from localspec.engine.target import Target
    from localspec.engine.tree import DraftTree

    model = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, n_seq_max=8, n_pad_seqs=8,
                       hidden=True)
    fresh = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=64, n_threads=1, hidden=True)
    try:
        prompt = model.tokenize("def add_3(x):\n    return x + 3\n", special=False)
        target = Target(model)
        target.reset()
        target.prefill(prompt[:-1])

        def expected(tokens):   # [len(tokens), n_embd] hidden states of `tokens`, decoded plainly
            fresh.clear()
            fresh.decode(tokens, np.arange(len(tokens)), logits=True)
            return fresh.hidden_rows().copy()

        start, rows = target.new_hidden()
        assert start == len(prompt) - 2 and len(rows) == 1
        np.testing.assert_allclose(rows, expected(prompt[:-1])[-1:], atol=1e-3, rtol=1e-3)
        tree = DraftTree(16)
        tree.reset(prompt[-1])
        a = tree.add(0, 11, 0.0, 0)
        tree.add(0, 12, 0.0, 0)            # a sibling, not committed
        b = tree.add(a, 13, 0.0, 0)
        target.verify(tree, pad_to=8)
        target.commit(tree, [a, b])
        start, rows = target.new_hidden()
        assert start == len(prompt) - 1    # the root's position, then the path's
        np.testing.assert_allclose(rows, expected(prompt + [11, 13])[-3:], atol=1e-3, rtol=1e-3)
        target.reset()
        assert target.new_hidden() is None
    finally:
        model.close()
        fresh.close()


def test_bench_head_without_a_head_configuration_names_the_fix(tiny, tiny_head):
    run = subprocess.run([sys.executable, "-m", "localspec.app.cli", "bench", "--model", str(tiny.target_gguf),
                          "--head", str(tiny_head), "--configs", "plain,maxgram"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "adaptive-head" in run.stderr, run.stderr


@pytest.mark.slow
def test_calibrate_measures_the_head_in_the_draft_models_place(tiny, tiny_head, tmp_path):
    run = subprocess.run([sys.executable, "-m", "localspec.app.cli", "calibrate", "--model", str(tiny.target_gguf),
                          "--draft", str(tiny.draft_gguf), "--head", str(tiny_head), "--ctx", "256"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"draft {tiny_head.name}: 1:" in run.stdout and "budget" in run.stdout


@pytest.mark.parametrize("int8", [None, True], ids=["numerics-picked", "int8-weights"])
def test_head_drafts_the_targets_tokens_far_above_chance_and_output_stays_plain(tiny, tiny_head, int8,
                                                                                monkeypatch):
    """In real decoding of held-out text, the head's first guess is the target's next token in
    at least 40% of the rounds it drafts (chance: 1 in its ~100-token draft vocabulary), its
    chains go deeper than one token, and the output is plain decoding's: with the numerics a run
    picks here, and with int8 weights (what a CPU picks where they step fastest)."""
    from tiny_models import held_out_corpus

    from localspec.engine.drafters import head_stage

    if int8:
        monkeypatch.setattr(head_stage, "load_head", lambda path, model: DraftHead(
            path, model.path, n_embd=model.n_embd, vocab_size=model.vocab_size, device="cpu", int8=True))

    options = dict(n_ctx=512, n_threads=1)
    session = Session(Options(tiny.target_gguf, head=tiny_head, maxgram=False, personal=False,
                              budget=TreeBudget(max_nodes=12, adaptive=False), **options))
    plain = Session(Options(tiny.target_gguf, speculation=False, **options))
    rounds = first = deeper = 0
    try:
        for doc in held_out_corpus(12)[1:]:     # the first runs into a loop no drafter predicts
            prompt = session.raw_prompt(doc[:60])
            got = session.run(prompt, max_tokens=48)
            assert got.tokens == plain.run(prompt, max_tokens=48).tokens
            head = next(s for s in got.stats.stages if s.name == "head")
            if not head.proposed:     # a reply of one round (the first: its root alone) drafts nothing
                continue
            rounds += head.proposed[0] and got.stats.target_calls - 1   # every round but the first
            first += head.accepted[0]
            deeper += sum(head.accepted[1:])
    finally:
        session.close()
        plain.close()
    assert rounds > 10 and first / rounds >= 0.4 and deeper > 0, (first, rounds, deeper)


def test_a_head_whose_step_is_cheap_drafts_as_a_free_stage_above_its_floor(tiny, tiny_head, monkeypatch):
    """Where the head's step is a twentieth of the target's (a CPU's share), the adaptive engine
    runs it with Max-Gram in the free arm (no bandit), its trees stop at the growth floor the
    costs give, it drafts tokens the target accepts, and greedy output stays plain decoding's."""
    from tiny_models import held_out_corpus

    from localspec.engine import build
    from localspec.engine.budget import Arm
    from localspec.engine.costs import Costs

    # a CPU-like target step (50 ms: the stages' worth sets their real Python time against it)
    # and a head's step of a twentieth of it
    flat = Costs({1: 0.05, 2: 0.0525, 4: 0.055, 8: 0.06, 16: 0.07, 32: 0.09}, {})
    monkeypatch.setattr(build, "calibrate", lambda *a, **k: flat)
    monkeypatch.setattr(DraftHead, "measure", lambda self, sizes=(1, 2, 4, 8), reps=5: {n: 2.5e-3 for n in sizes})
    options = dict(n_ctx=512, n_threads=1)
    session = Session(Options(tiny.target_gguf, head=tiny_head, personal=False, **options))
    plain = Session(Options(tiny.target_gguf, speculation=False, **options))
    try:
        policy = session.engine.policy
        assert policy.arms == (Arm(32, models=False),) and policy.bandit is None
        head = next(d for d in session.stages if d.name == "head")
        priced = Costs(flat.target, {n: 2.5e-3 for n in (1, 2, 4, 8)})   # with the head's step
        assert head.limits.floor == pytest.approx(priced.growth_floor(head.limits.width))
        assert 0 < head.limits.floor < 0.2
        accepted = proposed = 0
        for doc in held_out_corpus(8)[1:]:
            prompt = session.raw_prompt(doc[:60])
            got = session.run(prompt, max_tokens=32)
            assert got.tokens == plain.run(prompt, max_tokens=32).tokens
            stats = next(s for s in got.stats.stages if s.name == "head")
            accepted += sum(stats.accepted)
            proposed += sum(stats.proposed)
    finally:
        session.close()
        plain.close()
    assert accepted > 0 and proposed > accepted, (accepted, proposed)


def test_a_head_for_another_target_of_the_same_shape_is_refused(tiny, tiny_head, tmp_path):
    """The target's fingerprint, not only its sizes, must match: a head made for other weights
    of the same shape (a fine-tune) drafts nothing useful."""
    from localspec.models.head_file import read_head, save_head

    meta, arrays = read_head(tiny_head)
    vocab = arrays.pop("vocab")
    other = tmp_path / "other.npz"
    save_head(other, arrays, vocab, {**{k: v for k, v in meta.items() if k != "format"},
                                     "target_id": "0123456789abcdef", "target": "finetune.gguf"})
    with pytest.raises(LocalspecError) as err:
        DraftHead(other, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu")
    text = err.value.render()
    assert "another target" in text and "finetune.gguf" in text and "head train" in text


def test_the_heads_cache_gives_what_recomputing_the_window_gives(tiny, tiny_head):
    """Pairs added round by round (each a step against the ring) leave the same state as one
    causal step over all of them: the cache's positions and masks are the training's."""
    import torch

    from localspec.engine.drafters.head import TREE, WINDOW

    head = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu",
                     dtype=torch.float32)
    rng = np.random.default_rng(0)
    n = 9
    feats = torch.from_numpy(rng.standard_normal((n, 128)).astype(np.float32))
    toks = head.vocab[rng.integers(0, len(head.vocab), n)].tolist()
    pos = np.arange(100, 100 + n)

    def causal(rows):   # a step over `rows` of the pairs, each seeing the ring up to itself
        p = pos[rows]
        mask = np.zeros((len(rows), WINDOW + TREE), bool)
        seen = np.full(WINDOW, -1)
        seen[pos[:rows[-1] + 1] % WINDOW] = pos[:rows[-1] + 1]
        mask[:, :WINDOW] = (seen[None] >= 0) & (seen[None] <= p[:, None])
        return head.step(feats[rows], [toks[i] for i in rows], p, p % WINDOW, mask)[0].clone()

    whole = causal(list(range(n)))
    head.k.zero_()
    head.v.zero_()
    parts = [causal([0, 1, 2]), causal([3]), causal([4, 5, 6, 7, 8])]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-4, atol=1e-4)


def test_pairs_stored_without_outputs_leave_the_cache_a_step_leaves(tiny, tiny_head):
    """`store` (a backlog's keys and values alone) writes the cache rows a full step of the same
    pairs writes, so the rows after them attend to the same keys."""
    import torch

    from localspec.engine.drafters.head import TREE, WINDOW

    head = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu",
                     dtype=torch.float32)
    rng = np.random.default_rng(1)
    n = 40
    feats = torch.from_numpy(rng.standard_normal((n, 128)).astype(np.float32))
    toks = rng.integers(0, tiny.vocab_size, n).tolist()   # some outside the draft vocabulary
    pos = np.arange(500, 500 + n)
    mask = np.zeros((n, WINDOW + TREE), bool)
    mask[np.arange(n), pos % WINDOW] = True
    head.step(feats, toks, pos, pos % WINDOW, mask)
    stepped = (head.k.clone(), head.v.clone())
    head.k.zero_()
    head.v.zero_()
    head.store(feats, toks, pos, pos % WINDOW)
    torch.testing.assert_close((head.k, head.v), stepped, rtol=1e-5, atol=1e-5)


def test_a_long_backlog_goes_in_by_store_and_drafts_as_before(tiny, tiny_head, monkeypatch):
    """After rounds the head sat out, the backlog (more pairs than a round's first step takes
    along) goes in as keys and values alone, and the root's guesses are what one step over the
    whole backlog gives."""
    import torch

    from localspec.engine.config import HEAD_LIMITS, SamplingParams
    from localspec.engine.drafters import head as head_mod
    from localspec.engine.tree import DraftTree

    dh = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu",
                   dtype=torch.float32)
    rng = np.random.default_rng(2)
    n = head_mod._FOLD + 20
    states = rng.standard_normal((n, 128)).astype(np.float32)
    toks = dh.vocab[rng.integers(0, len(dh.vocab), n)].tolist()

    def guesses(fold: int):
        monkeypatch.setattr(head_mod, "_FOLD", fold)
        dh.k.zero_()
        dh.v.zero_()
        drafter = head_mod.HeadDrafter(dh, HEAD_LIMITS)
        drafter.begin([0] * 10 + toks, (10, states))   # the target's states of the committed text
        stored = []
        monkeypatch.setattr(dh, "store", lambda *a, _s=dh.store: (stored.append(len(a[1])), _s(*a)))
        drafter.catch_up()
        tree = DraftTree(16)
        tree.reset(toks[-1])
        drafter._sampling = SamplingParams()
        dist = drafter.evaluate_root(tree)
        monkeypatch.undo()
        return dist, stored

    by_store, stored = guesses(head_mod._FOLD)
    assert stored == [n - 1]   # all but the root's pair, keys and values alone
    by_step, none = guesses(10 ** 6)
    assert none == []
    np.testing.assert_array_equal(by_store.ids, by_step.ids)
    np.testing.assert_allclose(by_store.probs, by_step.probs, rtol=1e-4, atol=1e-5)


def test_int8_weights_move_a_steps_logits_a_little_and_its_guesses_hardly(tiny, tiny_head):
    """int8 weights (a CPU's pick where they step fastest) against float32, on the target's own
    hidden states of held-out text, one causal step over them: the head's first guesses agree on
    nearly every row and the logits move by a small part of their spread."""
    import torch
    from tiny_models import held_out_corpus

    from localspec.engine.drafters.head import TREE, WINDOW

    model = LlamaModel(tiny.target_gguf, n_ctx=256, n_batch=256, n_threads=1, hidden=True)
    try:
        tokens = model.tokenize(held_out_corpus(2)[1][:400], special=False)[:120]
        model.decode(tokens, np.arange(len(tokens)), logits=True)
        states = torch.from_numpy(model.hidden_rows()[:-1].copy())
    finally:
        model.close()
    n = len(states)
    pos = np.arange(n)
    mask = np.zeros((n, WINDOW + TREE), bool)
    mask[:, :n] = np.tril(np.ones((n, n), bool))
    outs = []
    for int8 in (False, True):
        head = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size, device="cpu",
                         dtype=torch.float32, int8=int8)
        assert head.int8 == int8
        outs.append(head.step(states, tokens[1:], pos, pos % WINDOW, mask)[1])
    f32, i8 = outs
    agree = float((f32.argmax(1) == i8.argmax(1)).float().mean())
    moved = float((i8 - f32).abs().max() / f32.std())
    assert agree >= 0.95 and moved <= 0.15, (agree, moved)


def _steps(head: DraftHead, rows: int, seed: int):
    """One step of `rows` distinct random rows against the window: (states, logits) on the host."""
    from localspec.engine.drafters.head import window_rows

    g = torch.Generator().manual_seed(seed)
    f = torch.randn(rows, head.out.shape[1], generator=g).to(head.device, head.dtype)
    state, logits, _, _ = head.step(f, [(7 + 5 * i) % head.vocab_size for i in range(rows)],
                                    *window_rows(rows))
    return state.float().cpu(), logits.cpu()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's compiled step")
def test_gpu_step_compiled_computes_the_eager_step(tiny, tiny_head):
    """On a GPU every bucket's step is compiled and captured at load (`prepare`); it computes
    what the eager kernels do, to bfloat16's rounding, in every bucket."""
    heads = [DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size) for _ in range(2)]
    eager, compiled = heads
    eager.compiled = False
    for head in heads:
        head.prepare()
    assert compiled.compiled and compiled.compile_error is None
    for rows in (1, 3, 8, 20):
        (s_e, l_e), (s_c, l_c) = (_steps(h, rows, rows) for h in heads)
        torch.testing.assert_close(s_c, s_e, atol=0.05, rtol=0.05)
        torch.testing.assert_close(l_c, l_e, atol=0.1 * float(l_e.abs().max()), rtol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's compiled step")
def test_gpu_step_falls_back_to_eager_kernels_where_compiling_fails(tiny, tiny_head, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here\nsecond line")
    monkeypatch.setattr(torch, "compile", broken)
    head = DraftHead(tiny_head, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size)
    head.prepare()
    assert not head.compiled and head.compile_error == "RuntimeError: no compiler here"
    assert head.graphs and len(_steps(head, 2, 0)[1]) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's graphed step")
def test_gpu_step_fuses_the_targets_features_in_its_graph(tiny, tiny_head_taps):
    """A round's first step takes the target's features (final states and taps) as they come,
    fused inside the step's graph; a tree node's step after it, in the same graph, reads its
    parent's state with the taps zeroed. Both compute what fusing first and stepping eagerly
    does."""
    from localspec.engine.drafters.head import window_rows

    heads = [DraftHead(tiny_head_taps, tiny.target_gguf, n_embd=128, vocab_size=tiny.vocab_size)
             for _ in range(2)]
    eager, graphed = heads
    eager.graphs = False
    graphed.prepare()
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(3, 128 * 3, generator=g).numpy()
    parents = torch.randn(4, 128, generator=g).to(graphed.device, graphed.dtype)
    host = lambda out: [t.float().cpu() for t in out[:2]]   # noqa: E731  (a graph's buffers: read now)
    for i, head in enumerate(heads):
        root = host(head.step_features(feats, [5, 9, 11], *window_rows(3)))
        fused = host(head.step(head.fuse(feats), [5, 9, 11], *window_rows(3)))
        node = host(head.step(parents, [7, 8, 9, 10], *window_rows(4)))   # the same graph as the root's
        heads[i] = [root[0], root[1], fused[0], node[0], node[1]]
    (r_e, rl_e, f_e, n_e, nl_e), (r_g, rl_g, f_g, n_g, nl_g) = heads
    torch.testing.assert_close(r_g, r_e, atol=0.05, rtol=0.05)
    torch.testing.assert_close(rl_g, rl_e, atol=0.1 * float(rl_e.abs().max()), rtol=0.05)
    torch.testing.assert_close(r_g, f_g, atol=0.05, rtol=0.05)
    torch.testing.assert_close(n_g, n_e, atol=0.05, rtol=0.05)
    torch.testing.assert_close(nl_g, nl_e, atol=0.1 * float(nl_e.abs().max()), rtol=0.05)


def test_a_head_loads_without_transformers(tiny, tiny_head):
    """Loading a target with a head imports torch, not transformers (which only the PyTorch
    draft model needs): on this project's 2-core EPYC, transformers' import was ~2.3 s of every
    start with a head (docs/decisions/0043)."""
    code = ("import sys; from localspec.engine.build import load; from localspec.engine.options import Options;"
            f"loaded = load(Options({str(tiny.target_gguf)!r}, head={str(tiny_head)!r}, n_ctx=256, n_threads=1),"
            " ['head'], measure=False); assert loaded.parts.head is not None; loaded.close();"
            " print('torch' in sys.modules, 'transformers' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "False"]
