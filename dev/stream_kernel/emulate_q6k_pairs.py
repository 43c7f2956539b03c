"""CPU emulation of packaging/patches' streaming Q6_K kernel (ggml-cuda's mmvq-stream.cu,
lsp_stream_q6_K): ggml's Q6_K rows copied a pair of super-blocks at a time into shared memory as
the kernel lays them out, the A fragments gathered with its byte offsets (lsp_word_b2 for the
pair's second block, 2 bytes off a word), the B fragments from lsp_stream_quantize's activation
layout, and the m16n8k16 int8 mma by the PTX fragment rules (a0 row g, a1 row g+8, k = 4t..4t+3;
b0 k = 4t..4t+3 of column g; c rows g, g+8 and columns 2t, 2t+1), against ggml's
dequantize_row_q6_K. No GPU needed: it checks the index arithmetic before device time is spent.
Run: python3 dev/stream_kernel/emulate_q6k_pairs.py (prints the error; "ok" below 1e-4)."""
from __future__ import annotations

import numpy as np
from emulated import ACT_U4, activation_layout, int8s, quantized_columns, word_b2

M, KB, NC = 16, 4, 8          # one m-tile, two pairs of super-blocks, 8 columns (one n-tile)
K = 256 * KB


def make_rows(rng) -> list[bytes]:
    """M rows of KB random block_q6_K: ql[128], qh[64], int8 scales[16], fp16 d."""
    rows = []
    for _ in range(M):
        row = b""
        for _ in range(KB):
            row += rng.integers(0, 256, 192, dtype=np.uint8).tobytes()
            row += rng.integers(-128, 128, 16).astype(np.int8).tobytes()
            row += np.float16(rng.uniform(0.001, 0.01)).tobytes()
        rows.append(row)
    return rows


def dequantized(row: bytes, i: int) -> float:
    """Weight i of a row as dequantize_row_q6_K gives it."""
    kb, i = divmod(i, 256)
    b = row[210 * kb:210 * kb + 210]
    half, w = divmod(i, 128)
    code, quarter = w % 32, w // 32
    low = b[64 * half + (quarter & 1) * 32 + code]
    low = (low >> 4) if quarter >= 2 else (low & 0xF)
    high = (b[128 + 32 * half + code] >> (2 * quarter)) & 3
    q = (low | (high << 4)) - 32
    d = float(np.frombuffer(b[208:210], np.float16)[0])
    scale = int(np.frombuffer(b[192:208], np.int8)[code // 16 + 2 * quarter + 8 * half])
    return d * scale * q


def vsub4(a: int, b: int) -> int:
    return sum(((((a >> 8 * k) & 0xFF) - ((b >> 8 * k) & 0xFF)) & 0xFF) << 8 * k for k in range(4))


def kernel(rows: list[bytes], act: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic, lane by lane: NC x M outputs."""
    acc = np.zeros((32, 4))
    for kp in range(KB // 2):
        stage = b"".join(rows[r][420 * kp:420 * kp + 420] for r in range(16))   # 16 rows x 420 bytes
        for kb2 in range(2):
            base_act = (2 * kp + kb2) * ACT_U4
            for n2 in range(2):
                for jj in range(4):
                    j = 4 * n2 + jj
                    p, hs = j // 2, j % 2
                    for e in range(2):
                        frag = {}
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            bq = act[4 * (base_act + p * 32 + lane):4 * (base_act + p * 32 + lane) + 4]
                            dv = act[4 * (base_act + 128 + 4 * t + p):4 * (base_act + 128 + 4 * t + p) + 4].view(np.float32)
                            group_in_half = 2 * jj + e
                            group = 8 * n2 + group_in_half
                            nib, hsh = 4 * (group_in_half // 4), 2 * (group_in_half // 2)
                            r0, r1 = 420 * g + 210 * kb2, 420 * (g + 8) + 210 * kb2
                            qlo = 64 * n2 + 32 * (jj & 1) + 16 * e + 4 * t
                            qho = 128 + 32 * n2 + 16 * e + 4 * t
                            a = []
                            for r in (r0, r1):
                                low, high = word_b2(stage, r + qlo), word_b2(stage, r + qho)
                                a.append(vsub4(((low >> nib) & 0x0F0F0F0F) | (((high >> hsh) & 0x03030303) << 4), 0x20202020))
                            b0 = int(bq[3] if hs else bq[1]) if e else int(bq[2] if hs else bq[0])
                            ds = [float(np.frombuffer(stage[r + 208:r + 210], np.float16)[0])
                                  * int8s(word_b2(stage, r + 192 + 4 * (group // 4)))[group & 3] for r in (r0, r1)]
                            frag[lane] = (a, b0, ds, (float(dv[2 * hs]), float(dv[2 * hs + 1])))

                        def a_val(row, k):
                            return int8s(frag[4 * (row % 8) + k // 4][0][row // 8])[k % 4]

                        def b_val(k, col):
                            return int8s(frag[4 * col + k // 4][1])[k % 4]

                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            _, _, ds, dc = frag[lane]
                            for el in range(4):
                                row, col = g + 8 * (el >> 1), 2 * t + (el & 1)
                                total = sum(a_val(row, k) * b_val(k, col) for k in range(16))
                                acc[lane, el] += total * ds[el >> 1] * dc[el & 1]
    out = np.zeros((NC, M))
    for lane in range(32):
        for el in range(4):
            out[2 * (lane & 3) + (el & 1), (lane >> 2) + 8 * (el >> 1)] = acc[lane, el]
    return out


def main() -> int:
    rng = np.random.default_rng(1)
    rows = make_rows(rng)
    codes, d8 = quantized_columns(rng, NC, K)
    out = kernel(rows, activation_layout(codes, d8))
    ref = np.array([[sum(dequantized(rows[r], i) * float(d8[c, i // 32]) * int(codes[c, i]) for i in range(K))
                     for r in range(M)] for c in range(NC)])
    err = np.abs(out - ref).max() / np.sqrt((ref ** 2).mean())
    print(f"Q6_K pairs, {M}x{K}, {NC} columns: max|out-ref|/rms(ref) = {err:.3g}", "ok" if err < 1e-4 else "FAIL")
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
