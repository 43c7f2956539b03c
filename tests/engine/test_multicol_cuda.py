"""packaging/patches' CUDA multi-column kernels (ggml-cuda's mmvq-mma.cu: Q4_K, Q5_K, Q6_K, Q8_0
and Q4_0 weights times 2..16 columns on int8 tensor cores) against ggml's own CUDA kernels
(mul_mat_vec_q up to 8 columns, mul_mat_q from 9), on random data, every width 1..16. Runs where
llama.cpp has a CUDA backend and a GPU (the GPU host: `dev/gpu-kernels.sh`); skipped elsewhere.

The kernels' switches are read once per process, so each setting runs in a process of its own
(tests/ggml_cuda.py). Up to 8 columns ggml's kernel quantizes the columns to q8_1 and sums as the
kernels do, in another order; from 9 ggml's mul_mat_q takes Q4_K's and Q5_K's min term from the
unquantized columns' sums, where both mul_mat_vec_q and the kernels sum the quantized codes, and
Q4_0's 8 from the codes, where both take it from the q8_1 block's unquantized sum."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ggml_cuda

Q4_0, Q8_0, Q4_K, Q5_K, Q6_K = 2, 8, 12, 13, 14   # enum ggml_type
NAMES = {Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
COLS = 16
# the kernels against ggml's mul_mat_vec_q (1..8 columns), relative to the output's scale: float
# summation order
TOLERANCE = 2e-5
# against ggml's mul_mat_q (9..16): Q4_K's and Q5_K's min term from the unquantized columns' sums
# (Q4_0's 8: the other way round), each within half a quantization step a code of the codes' sums
TOLERANCE_MMQ = 1e-2
# Q4_0 against mul_mat_q: its -8 a code, times the difference of the q8_1 sums, at Q4_0's coarser
# step (the gap measured, against the kernels' agreement with mul_mat_vec_q: 0026's addendum)
TOLERANCE_MMQ_Q4_0 = 2e-2
# ggml's result against the float product of the unquantized inputs: a sanity bound on the reference
QUANTIZATION_ERROR = 0.1
# the same bound for Q4_0, whose step (a block's largest |weight| / 8, no min to centre the codes
# on the block's range) is the coarsest of these types': random weights' rounding alone comes near
# the bound above
QUANTIZATION_ERROR_Q4_0 = 0.15

# (type, row length, rows): rows not a multiple of the kernels' 16, row lengths of the reference
# target's matrices (1536, 8960) and a short one (Q8_0/Q4_0: 3 blocks, a chunk count that 2 and 4
# chunks in flight do not divide)
CASES = [(Q4_K, 1536, 200), (Q6_K, 1536, 200), (Q4_K, 8960, 40), (Q6_K, 8960, 40),
         (Q4_K, 256, 1000), (Q6_K, 512, 1000),
         (Q5_K, 1536, 200), (Q8_0, 1536, 200), (Q4_0, 1536, 200),
         (Q5_K, 8960, 40), (Q8_0, 8960, 40), (Q4_0, 8960, 40),
         (Q5_K, 256, 1000), (Q8_0, 96, 1000), (Q4_0, 96, 1000)]

pytestmark = pytest.mark.skipif(not ggml_cuda.available(),
                                reason="needs llama.cpp's CUDA backend and a GPU")


def _run(tmp: Path, kind: int, weights: np.ndarray, acts: np.ndarray, name: str,
         bias: np.ndarray | None = None, mmq_widths: str | None = None, stream_widths: str | None = None,
         **switches: str) -> dict:
    """Every width's product in a process of its own, under the kernels' `switches` (GGML_CUDA_
    MULTICOL_*), the kernels from 2 columns (by default they start where they beat ggml's: 6);
    mmq_widths: GGML_CUDA_MMQ_WIDTHS; stream_widths: GGML_CUDA_STREAM_WIDTHS."""
    src, dst = tmp / f"in-{name}.npz", tmp / f"out-{name}.npz"
    extra = {} if bias is None else {"bias": bias}
    np.savez(src, kind=kind, weights=weights, acts=acts, **extra)
    env = {**os.environ, "GGML_CUDA_MULTICOL_MIN": "2",
           **{f"GGML_CUDA_MULTICOL_{key.upper()}": value for key, value in switches.items()},
           **({} if mmq_widths is None else {"GGML_CUDA_MMQ_WIDTHS": mmq_widths}),
           **({} if stream_widths is None else {"GGML_CUDA_STREAM_WIDTHS": stream_widths})}
    script = Path(ggml_cuda.__file__)
    subprocess.run([sys.executable, str(script), str(src), str(dst)], env=env, check=True,
                   cwd=script.parent)
    with np.load(dst) as out:
        return {key: out[key] for key in out.files}


def _inputs(kind: int, k: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(kind * k + rows)
    weights = rng.normal(size=(rows, k)).astype(np.float32)
    acts = rng.normal(size=(COLS, k)).astype(np.float32) * rng.uniform(0.1, 3, size=(COLS, 1))
    return weights, acts


@pytest.mark.parametrize("kind,k,rows", CASES, ids=[f"{NAMES[c[0]]}-{c[1]}x{c[2]}" for c in CASES])
def test_cuda_multicol_matches_ggml_at_every_width_and_columns_agree_across_widths(tmp_path, kind, k, rows):
    weights, acts = _inputs(kind, k, rows)
    stock = _run(tmp_path, kind, weights, acts, "stock", max="0")
    assert stock["calls"] in (0, -1), "the kernels ran although switched off"
    unquantized = acts @ weights.T
    scale = float(np.abs(unquantized).max())
    sanity = QUANTIZATION_ERROR_Q4_0 if kind == Q4_0 else QUANTIZATION_ERROR
    for n in range(1, COLS + 1):
        assert np.abs(stock[f"w{n}"] - unquantized[:n]).max() <= sanity * scale
    # each number of a warp's chunks in flight is its own kernel
    for inflight in ("1", "2", "4"):
        kernels = _run(tmp_path, kind, weights, acts, f"inflight{inflight}", inflight=inflight)
        assert kernels["calls"] == COLS - 1, "the kernels did not take widths 2..16"
        widest = kernels[f"w{COLS}"]
        for n in range(1, COLS + 1):
            reference, got = stock[f"w{n}"], kernels[f"w{n}"]
            err = float(np.abs(got - reference).max()) / scale
            bound = TOLERANCE if n <= 8 else TOLERANCE_MMQ_Q4_0 if kind == Q4_0 else TOLERANCE_MMQ
            assert err <= bound, f"{inflight} in flight, {n} columns: {err:.2e} of the output's scale from ggml's"
            if n >= 2:   # one column keeps ggml's kernel
                assert np.array_equal(got, widest[:n]), f"a column's output changed at {n} columns"


@pytest.mark.parametrize("kind", [Q4_K, Q6_K, Q8_0], ids=["Q4_K", "Q6_K", "Q8_0"])
def test_cuda_widths_mask_sends_exactly_its_widths_to_the_kernels(tmp_path, kind):
    """packaging/patches' ggml-cuda-width-dispatch: GGML_CUDA_MULTICOL_WIDTHS (bit n-1: n columns)
    stands over MIN/MAX and names the kernels' widths, one row included; every other width gives
    ggml's own product bit for bit, and a named width the kernels' product at every width."""
    weights, acts = _inputs(kind, 1536, 200)
    widths = {1, 3, 8, 9, 12, 16}
    mask = sum(1 << (n - 1) for n in widths)
    stock = _run(tmp_path, kind, weights, acts, "stock", max="0")
    every = _run(tmp_path, kind, weights, acts, "every", widths=str((1 << COLS) - 1))
    some = _run(tmp_path, kind, weights, acts, "some", widths=hex(mask), max="0")   # MAX=0 ignored
    assert every["calls"] == COLS and some["calls"] == len(widths)
    for n in range(1, COLS + 1):
        assert np.array_equal(some[f"w{n}"], (every if n in widths else stock)[f"w{n}"]), f"{n} columns"


@pytest.mark.parametrize("kind", [Q4_K, Q6_K])
def test_cuda_mmq_widths_send_small_batches_to_mul_mat_q(tmp_path, kind):
    """GGML_CUDA_MMQ_WIDTHS sends widths 2..8 to ggml's mul_mat_q instead of its mat-vec: their
    products come out of mul_mat_q (Q4_K: its min term from the unquantized columns, so not the
    mat-vec's bits; within TOLERANCE_MMQ of them), the kernels keep the widths both masks name,
    and one column stays on the mat-vec."""
    weights, acts = _inputs(kind, 1536, 200)
    stock = _run(tmp_path, kind, weights, acts, "stock", max="0")
    mmq = _run(tmp_path, kind, weights, acts, "mmq", widths=str(1 << 3), mmq_widths=str(0xFF))
    assert mmq["calls"] == 1                       # width 4: both masks name it, the kernels take it
    scale = float(np.abs(stock[f"w{COLS}"]).max())
    assert np.array_equal(mmq["w1"], stock["w1"])
    moved = [n for n in (2, 3, 5, 6, 7, 8) if not np.array_equal(mmq[f"w{n}"], stock[f"w{n}"])]
    for n in range(2, 9):
        assert float(np.abs(mmq[f"w{n}"] - stock[f"w{n}"]).max()) / scale <= TOLERANCE_MMQ, f"{n} columns"
    if kind == Q4_K:
        assert moved == [2, 3, 5, 6, 7, 8], "mul_mat_q did not take the widths the mask names"


@pytest.mark.parametrize("switch,counter", [("GGML_CUDA_MULTICOL_WIDTHS", "localspec_cuda_multicol_calls"),
                                            ("GGML_CUDA_STREAM_WIDTHS", "localspec_cuda_stream_calls")],
                         ids=["multicol", "stream"])
def test_cuda_graph_captured_under_one_width_choice_is_not_replayed_under_another(tmp_path, switch, counter):
    """A model's decodes of one batch shape replay a CUDA graph from the third call on (no host
    code runs, so the kernels' counter stands still). The width switches (the multi-column
    kernels', the streaming kernel's) change between decodes: a graph captured under one choice
    must not be replayed under the other (the choice is in the graph's key), and going back
    replays the first choice's graph."""
    import dev_scripts
    from localspec.engine.llama_model import LlamaModel

    synthetic = dev_scripts.load("synthetic_target")
    root = Path(os.environ.get("LOCALSPEC_BENCH_MODELS", Path.home() / ".cache/localspec-bench"))
    reference = root / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not reference.is_file():
        pytest.skip(f"needs the reference target's tokenizer: no {reference}")
    path = tmp_path / "tiny.gguf"
    synthetic.main(["--shape", "tiny", str(path), "--tokenizer-from", str(reference)])
    model = LlamaModel(path, n_ctx=256, n_batch=64, n_seq_max=1, n_gpu_layers=-1)
    n = 12
    tokens, positions = (np.arange(n) * 31 + 5) % model.vocab_size, np.arange(16, 16 + n)

    def decodes(mask: int, times: int = 4) -> tuple[int, np.ndarray]:
        os.environ[switch] = str(mask)   # conftest puts them back
        # the other kernels off, so that "off" is ggml's own (the multi-column kernels' defaults
        # take 12 columns, with the streaming kernel's bits on this model)
        os.environ["GGML_CUDA_MULTICOL_WIDTHS" if switch != "GGML_CUDA_MULTICOL_WIDTHS" else "GGML_CUDA_STREAM_WIDTHS"] = "0"
        before = ggml_cuda.kernel_calls(counter)
        for _ in range(times):
            model.decode(tokens, positions)
            logits = model.logits().copy()
            model.seq_rm(0, 16, -1)
        return ggml_cuda.kernel_calls(counter) - before, logits

    try:
        model.prefill(list(range(100, 116)), 0)
        none, off = decodes(0)
        taken, on = decodes(1 << (n - 1))
        again, back = decodes(0)
        assert none == 0 and again == 0
        assert taken > 0, "a graph captured without the kernels was replayed with them switched on"
        assert not np.array_equal(on, off) and np.array_equal(back, off)
        assert np.allclose(on, off, rtol=0, atol=5e-2 * float(np.abs(off).max()))
    finally:
        model.close()


@pytest.mark.parametrize("kind", list(NAMES), ids=list(NAMES.values()))
def test_cuda_multicol_adds_a_bias_row_in_its_store_with_the_bits_of_a_separate_add(tmp_path, kind):
    """ggml fuses a bias add into its mat-vec for one column only; the kernels take it for their
    widths: the product, then the bias, as ggml's add would give them."""
    weights, acts = _inputs(kind, 1536, 200)
    bias = np.random.default_rng(7).normal(size=200).astype(np.float32)
    plain = _run(tmp_path, kind, weights, acts, "plain")
    fused = _run(tmp_path, kind, weights, acts, "bias", bias=bias)
    assert fused["bias_calls"] == COLS - 1, "the bias add was not fused into the kernels"
    for n in range(2, COLS + 1):
        assert np.array_equal(fused[f"w{n}"], plain[f"w{n}"] + bias), f"{n} columns"
    assert np.allclose(fused["w1"], plain["w1"] + bias, rtol=1e-6, atol=1e-6 * float(np.abs(plain["w1"]).max()))


@pytest.mark.parametrize("kind", [Q4_K, Q6_K])
def test_cuda_matmuls_by_the_same_columns_share_one_q8_1_copy_until_it_is_written_over(tmp_path, kind):
    """packaging/patches' ggml-cuda-shared-q8_1: three matmuls by the same columns in one graph
    quantize them once (the second and third find the copy held) and give, bit for bit, what each
    gives alone. A copy written over the columns between the first and the second makes the
    second quantize them anew: the second and third give the products of the new columns. Every
    width 1..16: ggml's mat-vec at one column, the kernels from two (where ggml might otherwise
    pick its tiled mul_mat_q, which quantizes in its own layout and shares nothing). CUDA graphs
    off: a replayed graph runs no host code, so it would count no copy held."""
    rng = np.random.default_rng(kind)
    weights = rng.normal(size=(3, 200, 1536)).astype(np.float32)
    acts, over = (rng.normal(size=(COLS, 1536)).astype(np.float32) for _ in range(2))
    src, dst = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(src, kind=kind, weights=weights, acts=acts, overwrite=over)
    script = Path(ggml_cuda.__file__)
    subprocess.run([sys.executable, str(script), "--shared", str(src), str(dst)], check=True,
                   cwd=script.parent,
                   env={**os.environ, "GGML_CUDA_DISABLE_GRAPHS": "1", "GGML_CUDA_MULTICOL_MIN": "2"})
    with np.load(dst) as out:
        for n in range(1, COLS + 1):
            assert out[f"held{n}"] == 2, f"{n} columns: the copy was not shared"
            assert out[f"held_over{n}"] == 1, f"{n} columns: not forgotten when written over, or not shared after"
            for i in range(3):
                assert np.array_equal(out[f"s{n}_{i}"], out[f"a{n}_{i}"]), f"{n} columns, matmul {i}"
            assert np.array_equal(out[f"o{n}_0"], out[f"a{n}_0"])
            for i in (1, 2):
                assert np.array_equal(out[f"o{n}_{i}"], out[f"z{n}_{i}"]), f"{n} columns, matmul {i} after the copy"
