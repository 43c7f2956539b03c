"""dev/ablate.py's run on the tiny models: one load, every variant beside plain decoding and the
baseline, greedy tokens the same as plain decoding's (F32 tiny models: exact), every constant
back as it was afterwards, the GPU's variants under its policy, and the report written."""
from __future__ import annotations

import json

import pytest
from localspec.app.workloads import Prompt
from localspec.engine import build as build_module
from localspec.engine.config import GenerationRequest, SamplingParams
from localspec.engine.costs import Costs
from localspec.engine.options import Options
from localspec.engine.session import Session
from localspec.models.ngram_store import NgramStore, vocab_key
from tiny_models import held_out_corpus

import dev_scripts

ablate = dev_scripts.load("ablate")


@pytest.fixture(scope="module")
def blocks_and_store(tiny, tmp_path_factory):
    """Two blocks of two held-out documents' openings, and a store learnt from other documents."""
    session = Session(Options(tiny.target_gguf, speculation=False, n_ctx=512, n_threads=1))
    store = NgramStore.open(vocab_key(tiny.target_gguf), tmp_path_factory.mktemp("ngrams") / "ngrams.sqlite")
    try:
        docs = held_out_corpus(40)
        prompts = [Prompt(f"doc{i}", tuple(session.raw_prompt(d[:80]))) for i, d in enumerate(docs[:4])]
        for i, doc in enumerate(docs[10:]):
            store.add("file", f"doc{i}", session.raw_prompt(doc))
    finally:
        session.close()
    yield [ablate.Block("doc#1", "doc", tuple(prompts[:2])), ablate.Block("doc#2", "doc", tuple(prompts[2:]))], store
    store.close()


def request(tokens: tuple) -> GenerationRequest:
    return GenerationRequest(tokens, 16, SamplingParams())


def test_every_variant_runs_interleaved_and_the_constants_are_back_afterwards(tiny, blocks_and_store, tmp_path,
                                                                            monkeypatch):
    blocks, store = blocks_and_store
    # the tiny models' measured cost curve is timer noise, and on a loaded machine it may price
    # every draft-model arm out (Costs.viable): one arm, no bandit, and ablate rightly skips the
    # variants that need several arms. A flat, GPU-like curve (test_greedy_equality's), so every
    # variant's need holds whatever the machine's load
    flat = Costs({1: 1e-3, 2: 1.05e-3, 4: 1.1e-3, 8: 1.2e-3, 16: 1.4e-3, 32: 1.8e-3},
                 {1: 3e-4, 2: 3.1e-4, 4: 3.2e-4, 8: 3.3e-4})   # a draft model's step: in arms
    monkeypatch.setattr(build_module, "calibrate", lambda *a, **k: flat)
    patches = [p for v in ablate.variants() for p in v.patches]
    owners = [ablate._owner(p.where) for p in patches]
    before = [vars(owner)[name] for owner, name in owners]
    options = Options(tiny.target_gguf, draft=tiny.draft_gguf, use_head=False, n_ctx=512, n_threads=1)
    report = ablate.run(options, blocks, store, "held-out documents", tmp_path, request, quiet=None)
    assert all(vars(owner)[name] is value for (owner, name), value in zip(owners, before))

    assert report["rows"] == json.loads((tmp_path / "ablation.json").read_text())["rows"]
    assert report["complete"] and report["blocks"] == ["doc#1", "doc#2"] and report["shapes"] == "free"
    assert report["stages"] == ["maxgram", "personal", "draft"]
    assert report["arms"] == ["32 free", "4", "8", "16"]     # several: the bandit's variants run
    run_here = [v.name for v in ablate.variants()
                if v.needs in (None, ablate.Need.MODEL_STAGE, ablate.Need.SEVERAL_ARMS)]
    assert [r["config"] for r in report["rows"]] == ["plain", "baseline", *run_here]
    assert set(report["skipped"]) == {"hold-1"}     # a GPU's
    assert len(report["runs"]) == 4 * len(report["rows"]) and all(r["tokens"] > 0 for r in report["rows"])
    assert all(r["identical"] for r in report["runs"] if r["config"] != "plain")
    for row in report["rows"][2:]:
        assert row["ratio"] > 0 and row["interval"][0] <= row["interval"][1]
        assert row["verdict"] == f"fewer than {ablate.MIN_PROMPTS} prompts"
    assert "no-pruning" in (tmp_path / "ablation.txt").read_text()


def test_the_gpu_policy_runs_its_one_free_arm_and_skips_the_held_shapes(tiny, blocks_and_store, tmp_path):
    """A GPU's arms and shapes on this CPU, whose shape changes are free: bucketed shapes, so the
    held shapes' variant has nothing to change; without a draft model the pruned free arm is the
    only arm, as on a CPU."""
    blocks, store = blocks_and_store
    options = Options(tiny.target_gguf, use_head=False, n_ctx=512, n_threads=1, stable_shapes=True)
    report = ablate.run(options, blocks[:1], store, "held-out documents", tmp_path, request, quiet=None,
                        wanted=["tree-16", "hold-1"])
    assert report["shapes"] == "buckets" and report["arms"] == ["32 free"]
    assert [r["config"] for r in report["rows"]] == ["plain", "baseline", "tree-16"]
    assert report["skipped"] == {"hold-1": ablate.Need.STABLE_SHAPES.value}
    assert all(r["identical"] for r in report["runs"] if r["config"] != "plain")
