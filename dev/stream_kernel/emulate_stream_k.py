"""CPU emulation of packaging/patches' streaming kernel for Q4_K, Q5_K and Q8_0 (ggml-cuda's
mmvq-stream.cu, lsp_stream_k): ggml's rows copied one step (256 weights: a super-block, or eight
Q8_0 blocks) at a time into shared memory as load_stage lays them out, the A fragments gathered
with the kernel's word offsets (Q5_K's fifth bits from its qh words; Q8_0's codes through
lsp_word_b2, 2 bytes off a word for even blocks), the B fragments from lsp_stream_quantize's
activation layout, and the m16n8k32 int8 mma by the PTX fragment rules (a0 row g, a1 row g+8,
k = 4t..4t+3; a2, a3 the same rows, k = 16+4t..; b0 k = 4t..4t+3 and b1 k = 16+4t.. of column g;
c rows g, g+8 and columns 2t, 2t+1), against ggml's dequantize_row_q4_K / q5_K / q8_0. No GPU
needed: it checks the index arithmetic before device time is spent.
Run: python3 dev/stream_kernel/emulate_stream_k.py (prints each type's error; "ok" below 1e-4;
--break moves the Q8_0 codes' offset 2 bytes back and the Q5_K fifth bit by one sub-block, to see
the check fail)."""
from __future__ import annotations

import sys

import numpy as np
from emulated import ACT_U4, activation_layout, int8s, quantized_columns, word, word_b2

M, STEPS, NC = 16, 3, 8       # one m-tile, three steps of 256 weights, 8 columns (one n-tile)
K = 256 * STEPS
ROW_U4 = {"Q4_K": 9, "Q5_K": 11, "Q8_0": 17}
BREAK = "--break" in sys.argv


def half(b: bytes, off: int) -> float:
    return float(np.frombuffer(b[off:off + 2], np.float16)[0])


def make_rows(rng, kind: str) -> list[bytes]:
    """M rows of random blocks of the type, STEPS steps of 256 weights a row."""
    rows = []
    for _ in range(M):
        row = b""
        for _ in range(STEPS):
            if kind == "Q8_0":
                for _ in range(8):
                    row += np.float16(rng.uniform(0.001, 0.01)).tobytes()
                    row += rng.integers(-128, 128, 32).astype(np.int8).tobytes()
            else:
                row += np.float16(rng.uniform(0.001, 0.01)).tobytes() + np.float16(rng.uniform(0.001, 0.01)).tobytes()
                row += rng.integers(0, 256, 12, dtype=np.uint8).tobytes()
                if kind == "Q5_K":
                    row += rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
                row += rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
        assert len(row) == 16 * ROW_U4[kind] * STEPS
        rows.append(row)
    return rows


def scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    """ggml's get_scale_min_k4."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def dequantized_row(row: bytes, kind: str) -> np.ndarray:
    """The row as ggml's dequantize_row_q4_K / q5_K / q8_0 gives it."""
    out = np.zeros(K)
    step = 16 * ROW_U4[kind]
    for s in range(STEPS):
        b = row[step * s:step * (s + 1)]
        if kind == "Q8_0":
            for j in range(8):
                blk = b[34 * j:34 * j + 34]
                out[256 * s + 32 * j:256 * s + 32 * j + 32] = half(blk, 0) * np.frombuffer(blk[2:], np.int8)
            continue
        d, dmin, scales = half(b, 0), half(b, 2), b[4:16]
        qh = b[16:48] if kind == "Q5_K" else None
        qs = b[48:] if kind == "Q5_K" else b[16:]
        for j in range(8):
            sc, m = scale_min_k4(j, scales)
            for code in range(32):
                byte = qs[32 * (j // 2) + code]
                q = (byte >> 4) if j % 2 else (byte & 0xF)
                if qh is not None:
                    q += 16 * ((qh[code] >> j) & 1)
                out[256 * s + 32 * j + code] = d * sc * q - dmin * m
    return out


def u8(w: int, byte: int) -> int:
    return (w >> 8 * byte) & 0xFF


def mma(frags: dict[int, tuple[list[int], tuple[int, int]]]) -> dict[int, list[int]]:
    """m16n8k32 s8: each lane's (a0..a3, (b0, b1)) in, each lane's c0..c3 out."""
    def a_val(row, k):
        reg = (row // 8) + 2 * (k // 16)
        return int8s(frags[4 * (row % 8) + (k % 16) // 4][0][reg])[k % 4]

    def b_val(k, col):
        return int8s(frags[4 * col + (k % 16) // 4][1][k // 16])[k % 4]

    out = {}
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[lane] = [sum(a_val(g + 8 * (e >> 1), k) * b_val(k, 2 * t + (e & 1)) for k in range(32)) for e in range(4)]
    return out


def kernel(rows: list[bytes], act: np.ndarray, kind: str) -> np.ndarray:
    """lsp_stream_k's arithmetic, lane by lane: NC x M outputs."""
    row_u4 = ROW_U4[kind]
    rw = 4 * row_u4
    acc = np.zeros((32, 4))

    def act_u4(kb, u):
        return [int(v) for v in act[4 * (kb * ACT_U4 + u):4 * (kb * ACT_U4 + u) + 4]]

    def act_f(kb, u):
        return act[4 * (kb * ACT_U4 + u):4 * (kb * ACT_U4 + u) + 4].view(np.float32)

    for kb in range(STEPS):
        # load_stage: piece u of the m-tile is row u // ROW_U4's piece u % ROW_U4 of step kb
        stage = b"".join(rows[u // row_u4][16 * (kb * row_u4 + u % row_u4):16 * (kb * row_u4 + u % row_u4) + 16]
                         for u in range(16 * row_u4))
        if kind == "Q8_0":
            for j in range(8):
                p, hs = j // 2, j % 2
                frags, scales = {}, {}
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    r0, r1 = 4 * rw * g + 34 * j, 4 * rw * (g + 8) + 34 * j
                    o = 0 if BREAK else 2
                    a = [word_b2(stage, r0 + o + 4 * t), word_b2(stage, r1 + o + 4 * t),
                         word_b2(stage, r0 + o + 16 + 4 * t), word_b2(stage, r1 + o + 16 + 4 * t)]
                    bq = act_u4(kb, p * 32 + lane)
                    frags[lane] = (a, (bq[2], bq[3]) if hs else (bq[0], bq[1]))
                    dv = act_f(kb, 128 + 4 * t + p)
                    scales[lane] = (half(stage, r0), half(stage, r1), float(dv[2 * hs]), float(dv[2 * hs + 1]))
                for lane, c in mma(frags).items():
                    dw0, dw1, dc0, dc1 = scales[lane]
                    acc[lane] += [c[0] * dw0 * dc0, c[1] * dw0 * dc1, c[2] * dw1 * dc0, c[3] * dw1 * dc1]
            continue
        qs_w = 12 if kind == "Q5_K" else 4
        for p in range(4):
            for hs in range(2):
                j, sh = 2 * p + hs, 4 * hs
                jb = j + (1 if BREAK and kind == "Q5_K" else 0)
                frags, scales = {}, {}
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    qw = [word(stage, rw * g + qs_w + 8 * p + t), word(stage, rw * (g + 8) + qs_w + 8 * p + t),
                          word(stage, rw * g + qs_w + 8 * p + 4 + t), word(stage, rw * (g + 8) + qs_w + 8 * p + 4 + t)]
                    a = [(q >> sh) & 0x0F0F0F0F for q in qw]
                    if kind == "Q5_K":
                        qh = [word(stage, rw * g + 4 + t), word(stage, rw * (g + 8) + 4 + t),
                              word(stage, rw * g + 8 + t), word(stage, rw * (g + 8) + 8 + t)]
                        a = [x | (((h >> jb) & 0x01010101) << 4) for x, h in zip(a, qh)]
                    bq = act_u4(kb, p * 32 + lane)
                    frags[lane] = (a, (bq[2], bq[3]) if hs else (bq[0], bq[1]))
                    dsc, dmm = [], []
                    for h in range(2):
                        s = [word(stage, rw * (g + 8 * h) + x) for x in range(4)]
                        d, dmin = half(stage, 4 * rw * (g + 8 * h)), half(stage, 4 * rw * (g + 8 * h) + 2)
                        sclo, mlo = s[1] & 0x3F3F3F3F, s[2] & 0x3F3F3F3F
                        schi = (s[3] & 0x0F0F0F0F) | ((s[1] >> 2) & 0x30303030)
                        mhi = ((s[3] >> 4) & 0x0F0F0F0F) | ((s[2] >> 2) & 0x30303030)
                        dsc.append(d * u8(sclo if j < 4 else schi, j & 3))
                        dmm.append(dmin * u8(mlo if j < 4 else mhi, j & 3))
                    dv, sv = act_f(kb, 128 + 4 * t + p), act_f(kb, 144 + 4 * t + p)
                    scales[lane] = (dsc, dmm, (float(dv[2 * hs]), float(dv[2 * hs + 1])), (float(sv[2 * hs]), float(sv[2 * hs + 1])))
                for lane, c in mma(frags).items():
                    dsc, dmm, dc, sc = scales[lane]
                    for e in range(4):
                        acc[lane, e] += c[e] * dsc[e >> 1] * dc[e & 1] - dmm[e >> 1] * sc[e & 1]
    out = np.zeros((NC, M))
    for lane in range(32):
        for e in range(4):
            out[2 * (lane & 3) + (e & 1), (lane >> 2) + 8 * (e >> 1)] = acc[lane, e]
    return out


def main() -> int:
    rng = np.random.default_rng(1)
    codes, d8 = quantized_columns(rng, NC, K)
    act = activation_layout(codes, d8)
    a_deq = codes.astype(np.float64) * np.repeat(d8.astype(np.float64), 32, axis=1)
    failed = 0
    for kind in ROW_U4:
        rows = make_rows(rng, kind)
        ref = a_deq @ np.stack([dequantized_row(r, kind) for r in rows]).T
        err = np.abs(kernel(rows, act, kind) - ref).max() / np.sqrt((ref ** 2).mean())
        ok = err < 1e-4
        failed += not ok
        print(f"{kind}, {M}x{K}, {NC} columns: max|out-ref|/rms(ref) = {err:.3g}", "ok" if ok else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
