"""native.to_half: ggml's vectorised float-to-half conversion, which a draft head's corpus runs on
every hidden state the target hands back, gives numpy's cast bit for bit."""
from __future__ import annotations

from localspec.engine import native  # llama.cpp's libraries before numpy (native.py)

import numpy as np  # noqa: E402


def test_to_half_rounds_as_numpys_cast_bit_for_bit():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(100_003).astype(np.float32) * 40,        # an odd count: the tail loop
        rng.standard_normal(1000).astype(np.float32) * 1e-6,         # subnormal halves
        np.float32([65504, 65519.99, 65520, 1e9, -1e9, np.inf, -np.inf, 0.0, -0.0,
                    2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -24, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11]),
    ]).astype(np.float32)                                            # ties to even at the end
    with np.errstate(over="ignore"):
        expect = x.astype(np.float16)
    got = np.empty_like(expect)
    native.to_half(x, got)
    assert native._fp32_to_fp16() is not None, "no library exports ggml_cpu_fp32_to_fp16"
    np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))


def test_to_half_falls_back_to_numpy_where_the_arrays_are_strided():
    x = np.arange(64, dtype=np.float32).reshape(8, 8) / 3
    out = np.zeros((8, 4), np.float16)
    native.to_half(x[:, ::2], out)                                   # a strided source
    np.testing.assert_array_equal(out, x[:, ::2].astype(np.float16))
