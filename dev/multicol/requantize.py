"""Requantize a GGUF to another weight type with llama.cpp's own quantizer (libllama's
llama_model_quantize, no llama-quantize binary needed), to time the multi-column kernels on a
whole model of that type (dev/multicol/model_steps.py). Requantizing from Q4_K_M loses quality;
for timing only.

    .venv/bin/python dev/multicol/requantize.py IN.gguf OUT.gguf {Q8_0,Q4_0,Q5_K_S}
"""
from __future__ import annotations

import ctypes
import sys

import llama_cpp

FTYPES = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
          "Q5_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S}


def main() -> None:
    src, dst, kind = sys.argv[1:4]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")


if __name__ == "__main__":
    main()
