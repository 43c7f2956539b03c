"""dev/synthetic_target.py: a Qwen2.5-shaped GGUF of random Q4_K_M weights, for timing model sizes
nobody here downloads. Its tiny shape is written, loaded and decoded in llama.cpp on this CPU:
the file is a model llama.cpp runs, in Q4_K_M's types, with the reference's tokenizer (the tiny
models' where the reference pair is not fetched) and finite logits."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from localspec.engine.llama_model import LlamaModel

import dev_scripts

synthetic = dev_scripts.load("synthetic_target")


@pytest.fixture(scope="module")
def tokenizer_source(request) -> Path:
    """The reference target where LOCALSPEC_BENCH_MODELS (or the default folder) has it, else the
    tiny target (built only then): either GGUF's tokenizer is copied."""
    root = Path(os.environ.get("LOCALSPEC_BENCH_MODELS", Path.home() / ".cache/localspec-bench"))
    reference = root / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    return reference if reference.is_file() else request.getfixturevalue("tiny").target_gguf


def test_tiny_shape_loads_and_decodes_with_the_reference_tokenizer(tmp_path, tokenizer_source):
    out = tmp_path / "tiny.gguf"
    assert synthetic.main(["--shape", "tiny", str(out), "--tokenizer-from", str(tokenizer_source)]) == 0
    model = LlamaModel(out, n_ctx=256, n_batch=64, n_seq_max=1, n_gpu_layers=0, n_threads=1)
    reference = LlamaModel(tokenizer_source, n_ctx=64, n_batch=64, n_seq_max=1, n_gpu_layers=0, n_threads=1)
    try:
        text = "def add(a, b):\n    return a + b  # ünïcode"
        assert model.tokenize(text) == reference.tokenize(text)
        assert model.vocab_size == reference.vocab_size
        prompt = model.tokenize(text)
        model.prefill(prompt, 0)
        n = 8
        tokens = (np.arange(n) * 31 + 5) % model.vocab_size
        model.decode(tokens, np.arange(len(prompt), len(prompt) + n))
        logits = model.logits()
        assert logits.shape == (n, model.vocab_size)
        assert np.isfinite(logits).all() and logits.std() > 0
    finally:
        model.close()
        reference.close()


def test_types_and_shapes_are_qwen25s_in_q4_k_m():
    """The 32B plan (no file written): Qwen2.5-32B's matrices, Q4_K but the output and, on the
    layers llama.cpp's Q4_K_M gives more bits, attn_v and ffn_down in Q6_K."""
    shape = synthetic.SHAPES["32b"]
    plan = {name: (kind, dims) for name, kind, dims in synthetic.tensors(shape, 152064)}
    q4, q6 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
    assert plan["output.weight"] == (q6, (152064, 5120))
    assert plan["blk.0.attn_k.weight"] == (q4, (1024, 5120))      # 8 KV heads of 128
    assert plan["blk.0.ffn_down.weight"] == (q6, (5120, 27648))
    assert plan["blk.8.ffn_down.weight"][0] == q4 and plan["blk.10.attn_v.weight"][0] == q6
    wide = sum(plan[f"blk.{i}.ffn_down.weight"][0] == q6 for i in range(shape.layers))
    assert wide == 8 + 8 + 16    # the first and last eighth, every third of the 48 between
    total = sum(synthetic.nbytes(kind, *dims) for kind, dims in plan.values()
                if kind != GGMLQuantizationType.F32)
    assert 18.5e9 < total < 20.5e9   # Qwen2.5-32B-Instruct Q4_K_M: 19.9 GB


def test_a_written_file_reads_back_with_finite_small_scales(tmp_path, tokenizer_source):
    out = tmp_path / "tiny.gguf"
    synthetic.main(["--shape", "tiny", str(out), "--tokenizer-from", str(tokenizer_source), "--seed", "3"])
    reader = GGUFReader(out)
    from gguf.quants import dequantize
    for tensor in reader.tensors:
        if tensor.tensor_type in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K):
            weights = dequantize(tensor.data, tensor.tensor_type)
            assert np.isfinite(weights).all()
            assert 0.005 < float(weights.std()) < 0.05, tensor.name
