"""dev/synthetic_target.py: a Qwen2.5-shaped GGUF of random Q4_K_M (or Q5_K_M, Q8_0) weights, for
timing model sizes nobody here downloads. Its tiny shape is written, loaded and decoded in
llama.cpp on this CPU in each file type: the file is a model llama.cpp runs, in the type's tensor
types, with the reference's tokenizer (the tiny models' where the reference pair is not fetched)
and finite logits."""
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


@pytest.fixture(scope="module", params=list(synthetic.TYPES))
def tiny_file(request, tmp_path_factory, tokenizer_source) -> tuple[str, Path]:
    """The tiny shape written once in each file type (a write takes ~15 s, most of it the tokenizer)."""
    types = request.param
    out = tmp_path_factory.mktemp(types) / "tiny.gguf"
    assert synthetic.main(["--shape", "tiny", str(out), "--types", types, "--tokenizer-from", str(tokenizer_source),
                           "--seed", "3"]) == 0
    return types, out


def test_tiny_shape_loads_and_decodes_with_the_reference_tokenizer(tiny_file, tokenizer_source):
    types, out = tiny_file
    written = {t.name: t.tensor_type for t in GGUFReader(out).tensors}
    assert written["blk.0.ffn_up.weight"] == synthetic.TYPES[types].base
    assert written["output.weight"] == synthetic.TYPES[types].output
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


def test_a_written_file_reads_back_with_finite_small_scales(tiny_file):
    """Every quantized matrix's weights: finite, spread ~0.02 and centred, whatever the type."""
    types, out = tiny_file
    reader = GGUFReader(out)
    from gguf.quants import dequantize
    seen = set()
    for tensor in reader.tensors:
        if tensor.tensor_type != GGMLQuantizationType.F32:
            weights = dequantize(tensor.data[:1024], tensor.tensor_type)   # the vocabulary's first rows will do
            assert np.isfinite(weights).all()
            assert 0.005 < float(weights.std()) < 0.05, tensor.name
            assert abs(float(weights.mean())) < 0.005, tensor.name
            seen.add(tensor.tensor_type)
    kinds = synthetic.TYPES[types]
    assert seen == {kinds.base, kinds.wide, kinds.output}
