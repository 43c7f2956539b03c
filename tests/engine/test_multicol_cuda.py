"""packaging/patches' CUDA multi-column kernels (ggml-cuda's mmvq-mma.cu: Q4_K and Q6_K weights
times 2..16 columns on int8 tensor cores) against ggml's own CUDA kernels (mul_mat_vec_q up to 8
columns, mul_mat_q from 9), on random data, every width 1..16. Runs where llama.cpp has a CUDA
backend and a GPU (the GPU host: `dev/gpu-kernels.sh`); skipped elsewhere.

The kernels' switches are read once per process, so each setting runs in a process of its own
(tests/ggml_cuda.py). Up to 8 columns ggml's kernel quantizes the columns to q8_1 and sums as the
kernels do, in another order; from 9 ggml's mul_mat_q takes Q4_K's min term from the unquantized
columns' sums, where both mul_mat_vec_q and the kernels sum the quantized codes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ggml_cuda

Q4_K, Q6_K = 12, 14   # enum ggml_type
COLS = 16
# the kernels against ggml's mul_mat_vec_q (1..8 columns), relative to the output's scale: float
# summation order
TOLERANCE = 2e-5
# against ggml's mul_mat_q (9..16): Q4_K's min term from the unquantized columns' sums, each within
# half a quantization step a code of the codes' sums
TOLERANCE_MMQ = 1e-2
# ggml's result against the float product of the unquantized inputs: a sanity bound on the reference
QUANTIZATION_ERROR = 0.1

# (type, row length, rows): rows not a multiple of the kernels' 16, row lengths of the reference
# target's matrices (1536, 8960) and a short one
CASES = [(Q4_K, 1536, 200), (Q6_K, 1536, 200), (Q4_K, 8960, 40), (Q6_K, 8960, 40),
         (Q4_K, 256, 1000), (Q6_K, 512, 1000)]

pytestmark = pytest.mark.skipif(not ggml_cuda.available(),
                                reason="needs llama.cpp's CUDA backend and a GPU")


def _run(tmp: Path, kind: int, weights: np.ndarray, acts: np.ndarray, switch: str) -> dict:
    """Every width's product in a process of its own, with GGML_CUDA_MULTICOL_MAX=switch and the
    kernels from 2 columns (by default they start where they beat ggml's: 5)."""
    src, dst = tmp / f"in-{switch}.npz", tmp / f"out-{switch}.npz"
    np.savez(src, kind=kind, weights=weights, acts=acts)
    env = {**os.environ, "GGML_CUDA_MULTICOL_MAX": switch, "GGML_CUDA_MULTICOL_MIN": "2"}
    script = Path(ggml_cuda.__file__)
    subprocess.run([sys.executable, str(script), str(src), str(dst)], env=env, check=True,
                   cwd=script.parent)
    with np.load(dst) as out:
        return {key: out[key] for key in out.files}


@pytest.mark.parametrize("kind,k,rows", CASES, ids=[f"{'Q4_K' if c[0] == Q4_K else 'Q6_K'}-{c[1]}x{c[2]}" for c in CASES])
def test_cuda_multicol_matches_ggml_at_every_width_and_columns_agree_across_widths(tmp_path, kind, k, rows):
    rng = np.random.default_rng(kind * k + rows)
    weights = rng.normal(size=(rows, k)).astype(np.float32)
    acts = rng.normal(size=(COLS, k)).astype(np.float32) * rng.uniform(0.1, 3, size=(COLS, 1))
    stock = _run(tmp_path, kind, weights, acts, "0")
    assert stock["calls"] in (0, -1), "the kernels ran although switched off"
    kernels = _run(tmp_path, kind, weights, acts, "16")
    assert kernels["calls"] == COLS - 1, "the kernels did not take widths 2..16"
    unquantized = acts @ weights.T
    scale = float(np.abs(unquantized).max())
    widest = kernels[f"w{COLS}"]
    for n in range(1, COLS + 1):
        reference, got = stock[f"w{n}"], kernels[f"w{n}"]
        assert np.abs(reference - unquantized[:n]).max() <= QUANTIZATION_ERROR * scale
        err = float(np.abs(got - reference).max()) / scale
        bound = TOLERANCE if n <= 8 else TOLERANCE_MMQ
        assert err <= bound, f"{n} columns: {err:.2e} of the output's scale from ggml's"
        if n >= 2:   # one column keeps ggml's kernel
            assert np.array_equal(got, widest[:n]), f"a column's output changed at {n} columns"
