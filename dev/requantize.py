"""Requantize a GGUF to another weight type with llama.cpp's own quantizer (allow_requantize), for
timing the kernels of types the reference target does not hold (Q8_0, Q4_0, Q5_K_M).

    python dev/requantize.py IN.gguf OUT.gguf {q8_0,q4_0,q5_k_m}

Requantizing a 4-bit file loses more than quantizing from f16 would; the timing does not care.
"""
from __future__ import annotations

import ctypes
import sys

import llama_cpp as lc

FTYPES = {"q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0,
          "q5_k_m": lc.LLAMA_FTYPE_MOSTLY_Q5_K_M}


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[3] not in FTYPES:
        sys.exit(f"usage: python dev/requantize.py IN.gguf OUT.gguf {{{','.join(FTYPES)}}}")
    params = lc.llama_model_quantize_default_params()
    params.ftype = FTYPES[sys.argv[3]]
    params.allow_requantize = True
    rc = lc.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")


if __name__ == "__main__":
    main()
