"""Shared fixtures: the tiny real models (built once, cached) and the real reference pair."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from threads; spinning threads on a loaded 2-core machine cost a lot.
torch.set_num_threads(1)


def _one_cpu_per_worker() -> None:
    """Under pytest-xdist (make test-fast) each worker keeps to a CPU of its own, and so do the
    processes it starts: what llama.cpp and torch run on by default is every CPU a process may use
    (llama_model.default_threads), and two threads per process spinning for cores that the other
    worker holds made two workers slower than one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")   # gw0, gw1, ...
    if worker and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


_one_cpu_per_worker()

# User data (the personal n-gram store) goes to a scratch folder, never the user's real one;
# child processes (CLI tests) inherit it.
os.environ["LOCALSPEC_DATA_DIR"] = tempfile.mkdtemp(prefix="localspec-test-data-")
# Settings likewise: no test reads or writes the user's real config.
os.environ["LOCALSPEC_CONFIG_DIR"] = tempfile.mkdtemp(prefix="localspec-test-config-")

from tiny_models import TinyModels, build_tiny_models  # noqa: E402  (after the environment above)


GGML_SWITCHES = ("GGML_CPU_TILED_MM_MIN", "GGML_CPU_FA_SPLIT_KV", "GGML_CPU_MULTICOL_MIN", "GGML_CPU_MULTICOL_MAX",
                 "GGML_CUDA_MULTICOL_WIDTHS", "GGML_CUDA_MMQ_WIDTHS", "GGML_CUDA_STREAM_WIDTHS")


@pytest.fixture(autouse=True)
def ggml_switches_restored():
    """llama.cpp's process-wide switches (packaging/patches), as they were before each test: the
    engine sets them only around decodes (a calibration's floor) or while an exact model is open,
    but a test that sets one itself, or leaves an exact model open, would change later tests'
    numerics and their child processes' environment. Taken after any wider-scoped fixture is set
    up (an exact model a module holds open keeps its switches)."""
    before = {key: os.environ.get(key) for key in GGML_SWITCHES}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny() -> TinyModels:
    return build_tiny_models()


@pytest.fixture(scope="session")
def real_pair() -> tuple[Path, Path]:
    """The reference pair fetched by tools/fetch-bench-models (make test fetches it)."""
    root = Path(os.environ.get("LOCALSPEC_BENCH_MODELS", Path.home() / ".cache/localspec-bench"))
    target = root / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    draft = root / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not (target.exists() and draft.exists()):
        pytest.skip(f"reference pair not in {root}: run tools/fetch-bench-models {root}")
    return target, draft


@pytest.fixture(scope="session")
def tiny_head(tiny, tmp_path_factory) -> Path:
    """A draft head for the tiny target, trained on its own corpus (a few seconds on a CPU)."""
    from localspec.engine.head_train import collect, train
    from localspec.engine.head_train_model import TrainingModel
    from tiny_models import build_corpus

    model = TrainingModel(tiny.target_gguf, n_ctx=256, n_batch=256, n_seq_max=1, hidden=True, n_threads=1)
    try:
        corpus = collect(model, enumerate(build_corpus(n_docs=300)), 20_000, chunk=256)
    finally:
        model.close()
    out = tmp_path_factory.mktemp("head") / "tiny-head.npz"
    train(corpus, tiny.target_gguf, out, steps=200, batch=16, length=64, vocab_size=400, device="cpu")
    return out


@pytest.fixture(scope="session")
def tiny_head_taps(tiny, tmp_path_factory) -> Path:
    """A head for the tiny target that also reads the inputs of its layers 1 and 2 (taps)."""
    from localspec.engine.head_train import collect, train
    from localspec.engine.head_train_model import TrainingModel
    from tiny_models import build_corpus

    model = TrainingModel(tiny.target_gguf, n_ctx=256, n_batch=256, n_seq_max=1, hidden=True, n_threads=1,
                          taps=(1, 2))
    try:
        corpus = collect(model, enumerate(build_corpus(n_docs=300)), 20_000, chunk=256)
    finally:
        model.close()
    out = tmp_path_factory.mktemp("head") / "tiny-head-taps.npz"
    train(corpus, tiny.target_gguf, out, steps=200, batch=16, length=64, vocab_size=400, device="cpu",
          taps=(1, 2))
    return out
