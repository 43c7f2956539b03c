"""What the CPU emulations of packaging/patches' streaming kernels share (emulate_q6k_pairs.py,
emulate_stream_k.py): the columns quantized as ggml's quantize_q8_1 does, lsp_stream_quantize's
activation layout built from them, and the kernels' 4-byte reads of a shared-memory stage."""
from __future__ import annotations

import struct

import numpy as np

ACT_U4 = 160                  # one n-tile's activations for one super-block, in 16-byte units


def quantized_columns(rng, nc: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """nc columns of k values quantized as ggml's quantize_q8_1: codes, and each block's d as fp16
    holds it."""
    x = rng.normal(size=(nc, k)).astype(np.float32)
    codes, d8 = np.zeros((nc, k), np.int8), np.zeros((nc, k // 32), np.float32)
    for c in range(nc):
        for j in range(k // 32):
            block = x[c, 32 * j:32 * j + 32]
            d = np.abs(block).max() / 127
            codes[c, 32 * j:32 * j + 32] = np.round(block / d).astype(np.int8)
            d8[c, j] = np.float32(np.float16(d))
    return codes, d8


def activation_layout(codes: np.ndarray, d8: np.ndarray) -> np.ndarray:
    """lsp_stream_quantize's output for one n-tile (8 columns) as 32-bit words, by its byte
    addresses: codes, d, and d times the sum of the block's codes (the min term's factor)."""
    nc, k = codes.shape
    steps = k // 256
    act = bytearray(steps * ACT_U4 * 16)
    for kb in range(steps):
        for g in range(nc):
            for jj in range(8):
                p, hs = jj // 2, jj % 2
                block = codes[g, kb * 256 + jj * 32:kb * 256 + jj * 32 + 32]
                for code in range(32):
                    off = (kb * ACT_U4 + p * 32 + 4 * g + (code % 16) // 4) * 16 + 4 * (2 * hs + code // 16) + code % 4
                    act[off] = int(block[code]) & 0xFF
                d = d8[g, kb * 8 + jj]
                for base, value in ((128, d), (144, np.float32(d * int(block.astype(np.int64).sum())))):
                    off = (kb * ACT_U4 + base + 4 * (g // 2) + p) * 16 + 4 * (2 * hs + g % 2)
                    act[off:off + 4] = struct.pack("<f", value)
    return np.frombuffer(bytes(act), np.uint32)


def word(stage: bytes, w: int) -> int:
    return struct.unpack_from("<I", stage, 4 * w)[0]


def word_b2(stage: bytes, off: int) -> int:
    """lsp_word_b2: the 4 bytes at an even offset, from two aligned words where it is not aligned."""
    if off & 3 == 0:
        return word(stage, off >> 2)
    lo, hi = word(stage, off >> 2), word(stage, (off >> 2) + 1)
    return ((hi << 32 | lo) >> 16) & 0xFFFFFFFF


def int8s(w: int) -> list[int]:
    return [((w >> 8 * k) & 0xFF) - (256 if (w >> 8 * k) & 0x80 else 0) for k in range(4)]
