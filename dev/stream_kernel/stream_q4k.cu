// Streaming multi-column Q4_K and Q6_K kernels (issue 46, docs/decisions/0046) and their
// standalone harness.
//
// Build (one arch at a time when iterating):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o stream_q4k dev/stream_kernel/stream_q4k.cu
//   (-arch=sm_80 and -arch=sm_89 compile the same source; the kernel needs sm_80's cp.async and
//   int8 mma.sync.)
// Run: ./stream_q4k [--quick]   (prints the check, then one timing table per shape)
//      ./stream_q4k --emulate      (no GPU: the layouts and the mma fragment rules on the CPU)
// Q6_K (the other type of a Q4_K_M file) takes the same design in its own repacked tile
// (TILE6_U4): one m16n8k16 mma per 16-weight group under its int8 scale, the same activations.
//
// What it computes: dst[c][r] = sum_k W[r][k] * A[c][k] for a Q4_K (or Q6_K) matrix W (M rows of K
// weights, ggml's block_q4_K / block_q6_K exactly) and n = 1..16 activation columns quantized to q8_1 as ggml's
// quantize_q8_1 does (32 values a block, d = amax/127 stored as fp16, q = round(x/d)).
//
// Three kernels:
//  - ref_kernel: dequantizes W to fp32 as ggml's dequantize_row_q4_K (_q6_K) does and dots it with the
//    dequantized activations (fp16 d times q), accumulating in fp64. The check's reference.
//  - mmvq_like: ggml-cuda's mul_mat_vec_q pattern for Q4_K (and Q6_K: 32 threads a super-block,
//    vec_dot_q6_K_q8_1's arithmetic), rewritten here with the same
//    parameters ggml's generic (NVIDIA) table picks: 4 warps a block for 1-4 columns, 2 warps for
//    5-8; one row a block for 1 column, 2 rows for 2-8; 16 threads a 256-weight super-block, each
//    doing 2 ints of quants against 4 ints of q8_1 per column with dp4a; warps reduced through
//    shared memory. ggml uses it for 1..8 columns (mul_mat_q from 9), so the harness times it there.
//  - stream_q4k: the new kernel. Weights repacked once (repack_kernel, what a load would do) into
//    tiles of 16 rows x 256 weights laid out in the order the tensor cores' int8 mma
//    (m16n8k32, s8 x s8 -> s32) takes its A fragments, so each lane's loads are 16 bytes and a
//    warp's 512 contiguous bytes; streamed global -> shared through a multi-stage cp.async
//    pipeline; activations taken in a layout of the same kind (B fragments of 8 columns).
//    One mma = one Q4_K sub-block (32 weights, one 6-bit scale and min) times one q8_1 block
//    (32 values, one d), exactly the integer sum ggml's dp4a path forms; its scales are applied
//    in fp32 per sub-block, as ggml does. Columns are the mma's N: 1-8 columns one n-tile,
//    9-16 two, the weights read once for all of them. For Q4_K the same kernel also streams
//    ggml's own rows unchanged (NATIVE), gathering the fragments in shared memory instead.
//
// Rules the code keeps (and why):
//  - Activations are q8_1 (int8) and the weights' 4-bit values go into the mma as int8, not fp16:
//    the sums per sub-block are then the integers ggml's mat-vec forms (same numerics up to fp32
//    summation order), an activation costs 1 byte, and m16n8k32 exists on every sm_80+ card.
//  - The q8_1 "s" term: ggml's mat-vec recomputes sum(q8) with dp4a; here s = d*sum(q) is stored
//    in fp32 with the activation layout (exact: an fp16 d times an integer below 2^12).
//  - Weight bytes in flight: each stage holds one 256-weight super-block of every row the block
//    owns; STAGES-1 stages are in flight while one is consumed.
//  - Row padding: the repacked matrix has ceil(M/128)*128 rows, padding rows zero (d = 0);
//    the real Qwen2.5 shapes are multiples of 128, so padding costs nothing there.
//  - Split-K across blocks is reduced deterministically: every split writes its partial tile,
//    the last block to arrive (an atomic ticket) sums the partials in split order. The same
//    inputs give the same bits whatever the arrival order (greedy verify must match itself).
//  - L2 must not serve the weights in the timing: several copies of each matrix (at least three
//    times the card's L2 together) are used in rotation.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(x)                                                                                 \
    do {                                                                                         \
        cudaError_t err_ = (x);                                                                  \
        if (err_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

// ---------------------------------------------------------------- ggml's layouts (ggml-common.h)
#define QK_K 256
#define K_SCALE_SIZE 12
#define QK8_1 32

struct block_q4_K {   // 144 bytes, 256 weights: w = d*sc_j*q - dmin*m_j, j = sub-block of 32
    half d;           // super-block scale for the 6-bit scales
    half dmin;        // super-block scale for the 6-bit mins
    uint8_t scales[K_SCALE_SIZE];  // 8 scales and 8 mins, 6 bits each (get_scale_min_k4)
    uint8_t qs[QK_K / 2];          // bytes 32p..32p+31: sub 2p in the low nibbles, 2p+1 in the high
};
static_assert(sizeof(block_q4_K) == 144, "block_q4_K");

struct block_q8_1 {   // 36 bytes, 32 values: x ~ d*q; s = sum of x (ggml's quantize_q8_1)
    half d;
    half s;
    int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 36, "block_q8_1");

struct block_q6_K {   // 210 bytes, 256 weights in 16 groups of 16: w = d*sc_G*(q - 32), q 6 bits
    uint8_t ql[QK_K / 2];      // per half (128 weights): byte b low nibble = weight b, high = b+64
    uint8_t qh[QK_K / 4];      // per half: byte l, bits 2i..2i+1 = high bits of weight l + 32i
    int8_t scales[QK_K / 16];  // per group of 16
    half d;
};
static_assert(sizeof(block_q6_K) == 210, "block_q6_K");

// ggml's get_scale_min_k4
__host__ __device__ inline void scale_min_k4(int j, const uint8_t *q, uint8_t &d, uint8_t &m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

// weight i (0..255) of a super-block as ggml's dequantize_row_q4_K / _q6_K computes it in fp32
__host__ __device__ inline float deq_q4k(const block_q4_K &b, int i) {
    const int j = i / 32, l = i % 32;
    uint8_t sc, m;
    scale_min_k4(j, b.scales, sc, m);
    const float d1 = __half2float(b.d) * sc, m1 = __half2float(b.dmin) * m;
    const int q = (j & 1) ? (b.qs[32 * (j / 2) + l] >> 4) : (b.qs[32 * (j / 2) + l] & 0xF);
    return d1 * q - m1;
}
__host__ __device__ inline float deq_q6k(const block_q6_K &b, int i) {
    const int n = i / 128, w = i % 128, l = w % 32, quarter = w / 32;
    const uint8_t qlb = b.ql[64 * n + (quarter & 1) * 32 + l];
    const int lo = quarter >= 2 ? (qlb >> 4) : (qlb & 0xF);
    const int hi = (b.qh[32 * n + l] >> (2 * quarter)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    return __half2float(b.d) * (b.scales[8 * n + l / 16 + 2 * quarter] * q);
}

// ---------------------------------------------------------------- reference: fp32 dequant, fp64 sum
// One warp a row, every column (up to 16) at once; lanes split the super-blocks.
template <bool Q6>
__global__ void ref_kernel(const void *__restrict__ Wv, const block_q8_1 *__restrict__ A, float *dst, int M, int K) {
    constexpr int ncols = 16;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= M) return;
    const int KB = K / QK_K;
    double acc[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) acc[c] = 0.0;
    for (int kb = lane; kb < KB; kb += 32) {
        for (int i = 0; i < QK_K; ++i) {
            const float w = Q6 ? deq_q6k(((const block_q6_K *)Wv)[(size_t)row * KB + kb], i)
                               : deq_q4k(((const block_q4_K *)Wv)[(size_t)row * KB + kb], i);
            const int j = i / 32, l = i % 32;
#pragma unroll
            for (int c = 0; c < ncols; ++c) {
                const block_q8_1 &a = A[(size_t)c * (K / QK8_1) + kb * 8 + j];
                acc[c] += (double)w * (double)(__half2float(a.d) * a.qs[l]);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < ncols; ++c) {
        double v = acc[c];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) dst[(size_t)c * M + row] = (float)v;
    }
}

// ---------------------------------------------------------------- stock-like: ggml's mmvq for Q4_K
__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// vec_dot_q4_K_q8_1's arithmetic: iqs = 0,2,..,30 picks 2 ints of quants (sub-blocks 2p and 2p+1
// share them: low and high nibbles) and the matching 2 ints of each of two q8_1 blocks.
__device__ __forceinline__ float vdot_q4k(const block_q4_K *__restrict__ bx, const block_q8_1 *__restrict__ by,
                                          int iqs) {
    const int bq8_offset = 2 * ((iqs / 2) / 4);   // 0, 2, 4, 6: the first of the two sub-blocks
    const int *q4 = (const int *)(bx->qs + 16 * bq8_offset + 4 * ((iqs / 2) % 4));
    const int v0 = q4[0], v1 = q4[4];
    const uint16_t *scales = (const uint16_t *)bx->scales;
    const int j = bq8_offset / 2, jm = j & 1;
    const uint32_t s0 = scales[jm + 0], s2 = scales[jm + 2], s4 = scales[jm + 4];
    const uint32_t hi = (uint32_t) - (int32_t)(j >= 2);
    uint16_t aux[2];
    aux[0] = (uint16_t)(((s0 & 0x3f3f) & ~hi) | ((((s4 >> 0) & 0x0f0f) | ((s0 & 0xc0c0) >> 2)) & hi));
    aux[1] = (uint16_t)(((s2 & 0x3f3f) & ~hi) | ((((s4 >> 4) & 0x0f0f) | ((s2 & 0xc0c0) >> 2)) & hi));
    const uint8_t *sc = (const uint8_t *)aux;
    const uint8_t *m = sc + 2;
    float sumf_d = 0.0f, sumf_m = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const block_q8_1 *b8 = by + bq8_offset + i;
        const float d8 = __low2float(*(const half2 *)b8);
        const int *q8 = (const int *)b8->qs + ((iqs / 2) % 4);
        const int u0 = q8[0], u1 = q8[4];
        const int v0i = (v0 >> (4 * i)) & 0x0F0F0F0F, v1i = (v1 >> (4 * i)) & 0x0F0F0F0F;
        const int dot1 = dp4a(v1i, u1, dp4a(v0i, u0, 0));
        const int dot2 = dp4a(0x01010101, u1, dp4a(0x01010101, u0, 0));
        sumf_d += d8 * (dot1 * sc[i]);
        sumf_m += d8 * (dot2 * m[i]);
    }
    const float2 dm = __half22float2(*(const half2 *)bx);
    return dm.x * sumf_d - dm.y * sumf_m;
}

// vec_dot_q6_K_q8_1's arithmetic (vdr 1): iqs = 0..31 picks one int of ql and the matching
// 2-bit fields of qh, for two 16-weight groups 64 weights apart, against one int of each of two
// q8_1 blocks.
__device__ __forceinline__ int int_b2(const void *p, int i) {   // an int from 2-byte aligned bytes
    const uint16_t *x = (const uint16_t *)p;
    return (int)(x[2 * i] | ((uint32_t)x[2 * i + 1] << 16));
}
__device__ __forceinline__ float vdot_q6k(const block_q6_K *__restrict__ bx, const block_q8_1 *__restrict__ by,
                                          int iqs) {
    const int bq8_offset = 4 * (iqs / 16) + (iqs % 16) / 8;
    const int scale_offset = 8 * (iqs / 16) + (iqs % 16) / 4;
    const int vh_shift = 2 * ((iqs % 16) / 8);
    const int vl = int_b2(bx->ql, iqs);
    const int vh = int_b2(bx->qh, 8 * (iqs / 16) + iqs % 8) >> vh_shift;
    const int8_t *scales = bx->scales + scale_offset;
    float sumf = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const block_q8_1 *b8 = by + bq8_offset + 2 * i;
        const int u = ((const int *)b8->qs)[iqs % 8];
        const float d8 = __low2float(*(const half2 *)b8);
        const int sc = scales[4 * i];
        const int vil = (vl >> (4 * i)) & 0x0F0F0F0F;
        const int vih = ((vh >> (4 * i)) << 4) & 0x30303030;
        const int vi = __vsub4(vil | vih, 0x20202020);
        sumf += d8 * (dp4a(vi, u, 0) * sc);
    }
    return __half2float(bx->d) * sumf;
}

template <int NCOLS> struct mmvq_params {
    static constexpr int nwarps = NCOLS <= 4 ? 4 : 2;   // ggml's calc_nwarps, generic table
    static constexpr int rows = NCOLS == 1 ? 1 : 2;     // calc_rows_per_block
};

template <int NCOLS, bool Q6>
__global__ void __launch_bounds__(mmvq_params<NCOLS>::nwarps * 32, 1)
    mmvq_like(const void *__restrict__ W, const block_q8_1 *__restrict__ A, float *__restrict__ dst, int M, int K,
              int stride_col_y) {
    constexpr int NW = mmvq_params<NCOLS>::nwarps, RPB = mmvq_params<NCOLS>::rows;
    const int tid = 32 * threadIdx.y + threadIdx.x;
    const int row0 = RPB * blockIdx.x;
    const int bpr = K / QK_K;
    // vdr * nwarps * 32 / qi: Q4_K vdr 2, qi 32 (16 threads a super-block); Q6_K vdr 1, qi 32
    constexpr int tpb = Q6 ? 32 : 16;
    constexpr int blocks_per_iter = NW * 32 / tpb;
    float tmp[NCOLS][RPB] = {};
    for (int kbx = tid / tpb; kbx < bpr; kbx += blocks_per_iter) {
        const int kby = kbx * (QK_K / QK8_1);
        const int kqs = Q6 ? tid % 32 : 2 * (tid % 16);
#pragma unroll
        for (int j = 0; j < NCOLS; ++j)
#pragma unroll
            for (int i = 0; i < RPB; ++i) {
                const int r = min(row0 + i, M - 1);
                const block_q8_1 *y = A + (size_t)j * stride_col_y + kby;
                if (Q6)
                    tmp[j][i] += vdot_q6k((const block_q6_K *)W + (size_t)r * bpr + kbx, y, kqs);
                else
                    tmp[j][i] += vdot_q4k((const block_q4_K *)W + (size_t)r * bpr + kbx, y, kqs);
            }
    }
    __shared__ float tmp_shared[NW > 1 ? NW - 1 : 1][NCOLS][RPB][32];
    if (threadIdx.y > 0) {
#pragma unroll
        for (int j = 0; j < NCOLS; ++j)
#pragma unroll
            for (int i = 0; i < RPB; ++i) tmp_shared[threadIdx.y - 1][j][i][threadIdx.x] = tmp[j][i];
    }
    __syncthreads();
    if (threadIdx.y > 0) return;
#pragma unroll
    for (int j = 0; j < NCOLS; ++j)
#pragma unroll
        for (int i = 0; i < RPB; ++i) {
#pragma unroll
            for (int l = 0; l < NW - 1; ++l) tmp[j][i] += tmp_shared[l][j][i][threadIdx.x];
            float v = tmp[j][i];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (threadIdx.x == i && row0 + i < M) dst[(size_t)j * M + row0 + i] = v;
        }
}

// ---------------------------------------------------------------- the streaming kernel
// Repacked weight tile: 16 rows x one super-block = 2304 bytes = 144 uint4:
//   uint4 [p*32 + lane], p = 0..3, lane = 4g + t:
//     {row g:   qs int at 32p+4t,    row g+8: qs int at 32p+4t,
//      row g:   qs int at 32p+16+4t, row g+8: qs int at 32p+16+4t}
//     = the mma's A fragment {a0,a1,a2,a3} for sub-block 2p (low nibbles) and 2p+1 (high).
//   uint4 [128 + r], r = 0..15: row r's d, dmin and 12 scale bytes, as in block_q4_K.
// Tiles are stored [m-tile][super-block]: a warp's stream over K is contiguous.
constexpr int TILE_U4 = 144;
constexpr int ROW_PAD = 128;   // rows padded to 4 warps x 2 m-tiles x 16

// Activation tile: 8 columns x one super-block = 2560 bytes = 160 uint4:
//   uint4 [p*32 + lane]: {b0, b1 of sub 2p, b0, b1 of sub 2p+1} for column g (the B fragment:
//     b0 = q8 bytes k = 4t..4t+3 of that sub-block's q8_1 block, b1 = k = 16+4t..16+4t+3)
//   uint4 [128 + 4t + p]: fp32 d of {(2p, col 2t), (2p, 2t+1), (2p+1, 2t), (2p+1, 2t+1)}
//   uint4 [144 + 4t + p]: fp32 s = d*sum(q) of the same four
// Stored [super-block][n-tile]; n-tiles per super-block = act_nt (the buffer's, >= the kernel's).
constexpr int ACT_U4 = 160;

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void *sdst, const void *gsrc) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(sdst)), "l"(gsrc));
}
// zero-fills the 16 bytes where `valid` is false (rows past M in ggml's own layout)
__device__ __forceinline__ void cp_async16_zfill(void *sdst, const void *gsrc, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(sdst)), "l"(gsrc),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    const int z = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(z));
}

// m16n8k16: A 16x16 (a0 row g, a1 row g+8, k = 4t..4t+3), B 16x8 (b0: k = 4t..4t+3, column g)
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    const int z = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(z));
}

// int -> float, exact for |x| < 2^22 (a sub-block's sum is at most 32*15*127 = 60960): two
// full-rate ops instead of the quarter-rate I2F.
__device__ __forceinline__ float i2f_small(int x) { return __int_as_float(x + 0x4B400000) - 12582912.0f; }
__device__ __forceinline__ float u8f(uint32_t w, int byte) {
    return __uint_as_float(((w >> (8 * byte)) & 0xFFu) | 0x4B000000u) - 8388608.0f;
}
__device__ __forceinline__ float s8f(uint32_t w, int byte) {   // the byte as int8
    return __uint_as_float((((w >> (8 * byte)) & 0xFFu) ^ 0x80u) | 0x4B000000u) - 8388736.0f;
}

// Q6_K's repacked tile: 16 rows x one super-block = 3360 bytes = 210 uint4 (ggml's 16 blocks'
// size; ggml's own rows cannot be streamed: a 210-byte block is only 2-byte aligned):
//   uint4 [v*32 + lane], v = 2n + qq (n: half of the super-block, qq = 0, 1):
//     {row g: ql int at 64n + 32qq + 4t, row g+8: same, row g: ql int at 64n + 32qq + 16 + 4t,
//      row g+8: same}: the low nibbles of group-in-half Gl = 2qq (first pair) / 2qq+1, the
//      high nibbles of Gl + 4 (a group is 16 weights; ql byte b holds weights b and b + 64)
//   uint4 [128 + n*32 + lane]: {row g: qh int at 32n + 4t, row g+8: same, row g: qh int at
//     32n + 16 + 4t, row g+8: same}: 2-bit fields of groups Gl = 0,2,4,6 (first pair) / 1,3,5,7
//   uint4 [192 + r]: row r's 16 int8 scales;  uint4 [208], [209]: rows 0-7's and 8-15's fp16 d.
// The mma is m16n8k16, one a 16-weight group; its B fragment is b0 (group 2j) or b1 (group
// 2j+1) of q8_1 block j: the activation layout is Q4_K's.
constexpr int TILE6_U4 = 210;

template <int MT, int NT, int STAGES, bool Q6 = false> struct stream_cfg {
    static constexpr int WARPS = 4;
    static constexpr int TILE = Q6 ? TILE6_U4 : TILE_U4;
    static constexpr int W_U4 = WARPS * MT * TILE;      // a stage's weights (all warps)
    static constexpr int A_U4 = NT * ACT_U4;            // a stage's activations (shared by the warps)
    static constexpr int STAGE_U4 = W_U4 + A_U4;
    static constexpr int SMEM = STAGES * STAGE_U4 * 16;
    static constexpr int ROWS = WARPS * MT * 16;        // rows a block owns
};

// grid: (row blocks, splits); block: 128 threads (4 warps). Warp w owns m-tiles
// blockIdx.x*4*MT + w*MT + i, i < MT; the block walks super-blocks [k0, k1) of its split.
// NATIVE = false: Wr is the repacked layout above. NATIVE = true: Wr is ggml's own block_q4_K
// rows, unchanged; a stage then holds each of the tile's 16 rows' 144-byte super-block as it
// is (9 aligned 16-byte copies a row: the global side coalesces as well), and the A fragments
// are gathered from shared memory with 4-byte reads (rows 36 words apart: lanes (g, t) fall in
// banks 4g + t + const, no conflicts). No repack, so no load-time step and no second layout
// for ggml's other kernels (prefill's mul_mat_q, get_rows) to cope with.
// Q6 = true: Q6_K in its repacked tiles (TILE6_U4), NATIVE must be false.
template <int MT, int NT, int STAGES, bool NATIVE, bool Q6 = false>
__global__ void __launch_bounds__(128)
    stream_q4k(const uint4 *__restrict__ Wr, const uint4 *__restrict__ Ar, float *__restrict__ dst,
               float *__restrict__ ws, int *__restrict__ tickets, int M, int KB, int act_nt, int ncols) {
    static_assert(!(Q6 && NATIVE), "Q6_K streams its repacked tiles only");
    using C = stream_cfg<MT, NT, STAGES, Q6>;
    constexpr int TILE = C::TILE;
    extern __shared__ uint4 smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int splits = gridDim.y, split = blockIdx.y;
    const int k0 = (int)((long)KB * split / splits), k1 = (int)((long)KB * (split + 1) / splits);
    const int nk = k1 - k0;
    const int mtile0 = blockIdx.x * 4 * MT + warp * MT;

    // this warp's weight stream: m-tile (mtile0+i), super-block kb at Wr[((mtile0+i)*KB + kb)*144]
    auto load_stage = [&](int slot, int kb) {
        uint4 *st = smem + slot * C::STAGE_U4;
        uint4 *sw = st + warp * MT * TILE;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            if (NATIVE) {
#pragma unroll
                for (int u = lane; u < TILE; u += 32) {
                    const int r = (mtile0 + i) * 16 + u / 9;
                    const bool ok = r < M;
                    const uint4 *src = Wr + ((size_t)(ok ? r : 0) * KB + kb) * 9 + u % 9;
                    cp_async16_zfill(sw + i * TILE + u, src, ok);
                }
            } else {
                const uint4 *src = Wr + ((size_t)(mtile0 + i) * KB + kb) * TILE;
#pragma unroll
                for (int u = lane; u < TILE; u += 32) cp_async16(sw + i * TILE + u, src + u);
            }
        }
        const uint4 *asrc = Ar + (size_t)kb * act_nt * ACT_U4;
        uint4 *sa = st + C::W_U4;
        for (int u = threadIdx.x; u < C::A_U4; u += 128) cp_async16(sa + u, asrc + u);
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][n][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, k0 + s);
        cp_async_commit();   // an empty group where nothing was issued keeps the count uniform
    }

    for (int it = 0; it < nk; ++it) {
        cp_async_wait<STAGES - 2>();   // this thread's copies of stage `it` have landed
        __syncthreads();               // everyone's have; and everyone is done with stage it-1's slot
        {
            const int nxt = it + STAGES - 1;
            if (nxt < nk) load_stage(nxt % STAGES, k0 + nxt);
            cp_async_commit();
        }
        const uint4 *st = smem + (it % STAGES) * C::STAGE_U4;
        const uint4 *sw = st + warp * MT * TILE;
        const uint4 *sa = st + C::W_U4;

        if constexpr (!Q6) {
            // scales of rows g and g+8 of each m-tile: 6-bit values unpacked 4 to a word
            // (get_scale_min_k4: scales 0-3 and mins 0-3 are bytes 0-7's low 6 bits; 4-7 take the
            // low / high nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 / 4-7)
            float dd[MT][2], dmn[MT][2];
            uint32_t sclo[MT][2], schi[MT][2], mlo[MT][2], mhi[MT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint4 s = NATIVE ? sw[i * TILE + 9 * (g + 8 * h)] : sw[i * TILE + 128 + g + 8 * h];
                    const float2 dm = __half22float2(*(const half2 *)&s.x);
                    dd[i][h] = dm.x;
                    dmn[i][h] = dm.y;
                    sclo[i][h] = s.y & 0x3f3f3f3fu;
                    mlo[i][h] = s.z & 0x3f3f3f3fu;
                    schi[i][h] = (s.w & 0x0f0f0f0fu) | ((s.y >> 2) & 0x30303030u);
                    mhi[i][h] = ((s.w >> 4) & 0x0f0f0f0fu) | ((s.z >> 2) & 0x30303030u);
                }

#pragma unroll
            for (int p = 0; p < 4; ++p) {
                uint4 bq[NT];
                float4 d8[NT], s8[NT];
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    bq[n] = sa[n * ACT_U4 + p * 32 + lane];
                    const uint4 dv = sa[n * ACT_U4 + 128 + 4 * t + p];
                    const uint4 sv = sa[n * ACT_U4 + 144 + 4 * t + p];
                    d8[n] = make_float4(__uint_as_float(dv.x), __uint_as_float(dv.y), __uint_as_float(dv.z),
                                        __uint_as_float(dv.w));
                    s8[n] = make_float4(__uint_as_float(sv.x), __uint_as_float(sv.y), __uint_as_float(sv.z),
                                        __uint_as_float(sv.w));
                }
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    uint4 aq;
                    if (NATIVE) {   // words of row r's qs: 36r + 4 + byte/4
                        const uint32_t *w32 = (const uint32_t *)(sw + i * TILE);
                        aq.x = w32[36 * g + 4 + 8 * p + t];
                        aq.y = w32[36 * (g + 8) + 4 + 8 * p + t];
                        aq.z = w32[36 * g + 4 + 8 * p + 4 + t];
                        aq.w = w32[36 * (g + 8) + 4 + 8 * p + 4 + t];
                    } else {
                        aq = sw[i * TILE + p * 32 + lane];
                    }
#pragma unroll
                    for (int hs = 0; hs < 2; ++hs) {   // sub-block j = 2p + hs
                        const int sh = 4 * hs;
                        const uint32_t a0 = (aq.x >> sh) & 0x0F0F0F0Fu, a1 = (aq.y >> sh) & 0x0F0F0F0Fu;
                        const uint32_t a2 = (aq.z >> sh) & 0x0F0F0F0Fu, a3 = (aq.w >> sh) & 0x0F0F0F0Fu;
                        const int j = 2 * p + hs, byte = j & 3;
                        float dsc[2], dmm[2];
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            dsc[h] = dd[i][h] * u8f(j < 4 ? sclo[i][h] : schi[i][h], byte);
                            dmm[h] = dmn[i][h] * u8f(j < 4 ? mlo[i][h] : mhi[i][h], byte);
                        }
#pragma unroll
                        for (int n = 0; n < NT; ++n) {
                            const uint32_t b0 = hs ? bq[n].z : bq[n].x, b1 = hs ? bq[n].w : bq[n].y;
                            int c[4];
                            mma_s8(c, a0, a1, a2, a3, b0, b1);
                            const float dc0 = hs ? d8[n].z : d8[n].x, dc1 = hs ? d8[n].w : d8[n].y;
                            const float sc0 = hs ? s8[n].z : s8[n].x, sc1 = hs ? s8[n].w : s8[n].y;
                            // c0: (row g, col 2t), c1: (g, 2t+1), c2: (g+8, 2t), c3: (g+8, 2t+1)
                            acc[i][n][0] = fmaf(i2f_small(c[0]), dsc[0] * dc0, acc[i][n][0]) - dmm[0] * sc0;
                            acc[i][n][1] = fmaf(i2f_small(c[1]), dsc[0] * dc1, acc[i][n][1]) - dmm[0] * sc1;
                            acc[i][n][2] = fmaf(i2f_small(c[2]), dsc[1] * dc0, acc[i][n][2]) - dmm[1] * sc0;
                            acc[i][n][3] = fmaf(i2f_small(c[3]), dsc[1] * dc1, acc[i][n][3]) - dmm[1] * sc1;
                        }
                    }
                }
            }
        } else {
            // Q6_K: per m-tile, rows g and g+8: fp16 d and the 16 int8 scales of each
            float dq[MT][2];
            uint4 scw[MT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const half *dh = (const half *)(sw + i * TILE + 208);
                    dq[i][h] = __half2float(dh[g + 8 * h]);
                    scw[i][h] = sw[i * TILE + 192 + g + 8 * h];
                }
#pragma unroll
            for (int n2 = 0; n2 < 2; ++n2) {   // half of the super-block: q8_1 blocks 4*n2 .. 4*n2+3
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    const int j = 4 * n2 + jj, p = j / 2, hs = j % 2;
                    uint4 bq[NT];
                    float4 d8[NT];
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        bq[n] = sa[n * ACT_U4 + p * 32 + lane];
                        const uint4 dv = sa[n * ACT_U4 + 128 + 4 * t + p];
                        d8[n] = make_float4(__uint_as_float(dv.x), __uint_as_float(dv.y), __uint_as_float(dv.z),
                                            __uint_as_float(dv.w));
                    }
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        const uint4 lq = sw[i * TILE + (2 * n2 + (jj & 1)) * 32 + lane];
                        const uint4 hq = sw[i * TILE + 128 + n2 * 32 + lane];
#pragma unroll
                        for (int e = 0; e < 2; ++e) {   // group G = 2j + e; in its half Gl = 2jj + e
                            const int Gl = 2 * jj + e, G = 8 * n2 + Gl;
                            const int nib = 4 * (Gl / 4), hsh = 2 * (Gl / 2);
                            // ql int: first pair (x, y) holds Gl % 4 = 2qq, second (z, w) 2qq+1
                            const uint32_t l0 = (Gl & 1) ? lq.z : lq.x, l1 = (Gl & 1) ? lq.w : lq.y;
                            const uint32_t h0 = (Gl & 1) ? hq.z : hq.x, h1 = (Gl & 1) ? hq.w : hq.y;
                            const uint32_t a0 = __vsub4(((l0 >> nib) & 0x0F0F0F0Fu) | (((h0 >> hsh) & 0x03030303u) << 4),
                                                        0x20202020u);
                            const uint32_t a1 = __vsub4(((l1 >> nib) & 0x0F0F0F0Fu) | (((h1 >> hsh) & 0x03030303u) << 4),
                                                        0x20202020u);
                            const uint32_t sw0 = G < 4 ? scw[i][0].x : G < 8 ? scw[i][0].y : G < 12 ? scw[i][0].z : scw[i][0].w;
                            const uint32_t sw1 = G < 4 ? scw[i][1].x : G < 8 ? scw[i][1].y : G < 12 ? scw[i][1].z : scw[i][1].w;
                            const float ds0 = dq[i][0] * s8f(sw0, G & 3), ds1 = dq[i][1] * s8f(sw1, G & 3);
#pragma unroll
                            for (int n = 0; n < NT; ++n) {
                                const uint32_t b0 = e ? (hs ? bq[n].w : bq[n].y) : (hs ? bq[n].z : bq[n].x);
                                int c[4];
                                mma_s8_k16(c, a0, a1, b0);
                                const float dc0 = hs ? d8[n].z : d8[n].x, dc1 = hs ? d8[n].w : d8[n].y;
                                acc[i][n][0] = fmaf(i2f_small(c[0]), ds0 * dc0, acc[i][n][0]);
                                acc[i][n][1] = fmaf(i2f_small(c[1]), ds0 * dc1, acc[i][n][1]);
                                acc[i][n][2] = fmaf(i2f_small(c[2]), ds1 * dc0, acc[i][n][2]);
                                acc[i][n][3] = fmaf(i2f_small(c[3]), ds1 * dc1, acc[i][n][3]);
                            }
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    // epilogue: element e of m-tile i, n-tile n is (row, col) below
    auto row_of = [&](int i, int e) { return (mtile0 + i) * 16 + g + 8 * (e >> 1); };
    auto col_of = [&](int n, int e) { return n * 8 + 2 * t + (e & 1); };
    if (splits == 1) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = row_of(i, e), c = col_of(n, e);
                    if (r < M && c < ncols) dst[(size_t)c * M + r] = acc[i][n][e];
                }
        return;
    }
    // split-K: partials to ws[split][c][row within the padded matrix], then the last block sums
    // them in split order (deterministic whatever the arrival order)
    const int Mp = gridDim.x * C::ROWS;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = row_of(i, e), c = col_of(n, e);
                if (c < ncols) ws[((size_t)split * ncols + c) * Mp + r] = acc[i][n][e];
            }
    __threadfence();
    __syncthreads();
    __shared__ int ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(&tickets[blockIdx.x], 1);
    __syncthreads();
    if (ticket != splits - 1) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = row_of(i, e), c = col_of(n, e);
                if (c >= ncols) continue;
                float v = 0.0f;
                for (int s = 0; s < splits; ++s) v += __ldcg(&ws[((size_t)s * ncols + c) * Mp + r]);
                if (r < M) dst[(size_t)c * M + r] = v;
            }
    if (threadIdx.x == 0) tickets[blockIdx.x] = 0;   // ready for the next launch (graph replays)
}

// Repack (what a load would do once): element u of tile (mtile, kb) of the repacked layout.
__host__ __device__ inline uint4 repack_elem(const block_q4_K *W, int M, int KB, int mtile, int kb, int u) {
    uint4 out = make_uint4(0, 0, 0, 0);
    if (u < 128) {
        const int p = u / 32, lane = u % 32, g = lane >> 2, t = lane & 3;
        const int r0 = mtile * 16 + g, r1 = r0 + 8;
        auto qint = [&](int r, int off) -> uint32_t {
            if (r >= M) return 0u;
            uint32_t v;
            memcpy(&v, W[(size_t)r * KB + kb].qs + off, 4);
            return v;
        };
        out.x = qint(r0, 32 * p + 4 * t);
        out.y = qint(r1, 32 * p + 4 * t);
        out.z = qint(r0, 32 * p + 16 + 4 * t);
        out.w = qint(r1, 32 * p + 16 + 4 * t);
    } else {
        const int r = mtile * 16 + (u - 128);
        if (r < M) memcpy(&out, &W[(size_t)r * KB + kb], 16);   // d, dmin, scales[12]: 16 bytes
    }
    return out;
}

// Q6_K's tile (TILE6_U4 above): element u of tile (mtile, kb)
__host__ __device__ inline uint4 repack6_elem(const block_q6_K *W, int M, int KB, int mtile, int kb, int u) {
    uint4 out = make_uint4(0, 0, 0, 0);
    if (u < 192) {
        const bool high = u >= 128;
        const int v = (high ? u - 128 : u) / 32, lane = u % 32, g = lane >> 2, t = lane & 3;
        const int r0 = mtile * 16 + g, r1 = r0 + 8;
        auto qint = [&](int r, int off) -> uint32_t {
            if (r >= M) return 0u;
            const block_q6_K &b = W[(size_t)r * KB + kb];
            uint32_t x;
            memcpy(&x, (high ? b.qh : b.ql) + off, 4);
            return x;
        };
        // ql: v = 2n + qq, offsets 64n + 32qq (+16); qh: v = n, offsets 32n (+16)
        const int base = high ? 32 * v : 64 * (v / 2) + 32 * (v % 2);
        out.x = qint(r0, base + 4 * t);
        out.y = qint(r1, base + 4 * t);
        out.z = qint(r0, base + 16 + 4 * t);
        out.w = qint(r1, base + 16 + 4 * t);
    } else if (u < 208) {
        const int r = mtile * 16 + (u - 192);
        if (r < M) memcpy(&out, W[(size_t)r * KB + kb].scales, 16);
    } else {
        uint16_t dh[8] = {};
        for (int k = 0; k < 8; ++k) {
            const int r = mtile * 16 + 8 * (u - 208) + k;
            if (r < M) memcpy(&dh[k], &W[(size_t)r * KB + kb].d, 2);
        }
        memcpy(&out, dh, 16);
    }
    return out;
}

// one thread a uint4 of the output
template <bool Q6>
__global__ void repack_kernel(const void *__restrict__ W, uint4 *__restrict__ Wr, int M, int KB, int Mpad) {
    constexpr int TU = Q6 ? TILE6_U4 : TILE_U4;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t total = (size_t)(Mpad / 16) * KB * TU;
    if (idx >= total) return;
    const int u = (int)(idx % TU);
    const size_t tile = idx / TU;
    Wr[idx] = Q6 ? repack6_elem((const block_q6_K *)W, M, KB, (int)(tile / KB), (int)(tile % KB), u)
                 : repack_elem((const block_q4_K *)W, M, KB, (int)(tile / KB), (int)(tile % KB), u);
}

// ---------------------------------------------------------------- host side
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t rnd() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static inline float rndu() { return (rnd() >> 40) * (1.0f / 16777216.0f); }
static inline float rndn() {
    const float u1 = std::max(rndu(), 1e-7f), u2 = rndu();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

// Q6_K: random 6-bit values, int8 scales of either sign, d small and finite
static void make_weights6(std::vector<block_q6_K> &W, int M, int K) {
    W.resize((size_t)M * (K / QK_K));
    for (auto &b : W) {
        for (int i = 0; i < QK_K / 2; i += 8) {
            const uint64_t v = rnd();
            memcpy(b.ql + i, &v, 8);
        }
        for (int i = 0; i < QK_K / 4; i += 8) {
            const uint64_t v = rnd();
            memcpy(b.qh + i, &v, 8);
        }
        for (int i = 0; i < QK_K / 16; ++i) b.scales[i] = (int8_t)rnd();
        b.d = __float2half(0.00005f + 0.0002f * rndu());
    }
}

static void make_weights(std::vector<block_q4_K> &W, int M, int K) {
    W.resize((size_t)M * (K / QK_K));
    for (auto &b : W) {
        b.d = __float2half(0.0005f + 0.002f * rndu());
        b.dmin = __float2half(0.0005f + 0.002f * rndu());
        for (int i = 0; i < K_SCALE_SIZE; ++i) b.scales[i] = (uint8_t)rnd();
        for (int i = 0; i < QK_K / 2; i += 8) {
            const uint64_t v = rnd();
            memcpy(b.qs + i, &v, 8);
        }
    }
}

// 16 columns of N(0,1) values quantized as ggml's quantize_q8_1, in both layouts.
static void make_acts(int K, std::vector<block_q8_1> &A, std::vector<uint4> &Ar) {
    const int NC = 16, KB = K / QK_K, nb = K / QK8_1;
    A.resize((size_t)NC * nb);
    std::vector<float> dq((size_t)NC * nb), sq((size_t)NC * nb);
    for (int c = 0; c < NC; ++c)
        for (int ib = 0; ib < nb; ++ib) {
            float x[32], amax = 0.0f, sum = 0.0f;
            for (int l = 0; l < 32; ++l) {
                x[l] = rndn();
                amax = std::max(amax, fabsf(x[l]));
                sum += x[l];
            }
            const float d = amax / 127.0f;
            block_q8_1 &b = A[(size_t)c * nb + ib];
            int qsum = 0;
            for (int l = 0; l < 32; ++l) {
                b.qs[l] = (int8_t)(amax == 0.0f ? 0 : roundf(x[l] / d));
                qsum += b.qs[l];
            }
            b.d = __float2half(d);
            b.s = __float2half(sum);
            dq[(size_t)c * nb + ib] = __half2float(b.d);
            sq[(size_t)c * nb + ib] = __half2float(b.d) * (float)qsum;   // exact
        }
    Ar.assign((size_t)KB * 2 * ACT_U4, make_uint4(0, 0, 0, 0));
    for (int kb = 0; kb < KB; ++kb)
        for (int n = 0; n < 2; ++n) {
            uint4 *tile = Ar.data() + ((size_t)kb * 2 + n) * ACT_U4;
            for (int p = 0; p < 4; ++p)
                for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane >> 2, t = lane & 3, c = n * 8 + g;
                    uint32_t v[4];
                    for (int hs = 0; hs < 2; ++hs) {
                        const block_q8_1 &b = A[(size_t)c * nb + kb * 8 + 2 * p + hs];
                        memcpy(&v[2 * hs + 0], b.qs + 4 * t, 4);
                        memcpy(&v[2 * hs + 1], b.qs + 16 + 4 * t, 4);
                    }
                    tile[p * 32 + lane] = make_uint4(v[0], v[1], v[2], v[3]);
                }
            for (int t = 0; t < 4; ++t)
                for (int p = 0; p < 4; ++p) {
                    float dv[4], sv[4];
                    for (int e = 0; e < 4; ++e) {
                        const int j = 2 * p + (e >> 1), c = n * 8 + 2 * t + (e & 1);
                        dv[e] = dq[(size_t)c * nb + kb * 8 + j];
                        sv[e] = sq[(size_t)c * nb + kb * 8 + j];
                    }
                    memcpy(&tile[128 + 4 * t + p], dv, 16);
                    memcpy(&tile[144 + 4 * t + p], sv, 16);
                }
        }
}

struct Shape {
    const char *name;
    int M, K;
    bool q6;   // Q6_K (else Q4_K)
};

struct Cfg {
    int mt, nt, stages, splits;
    bool native;
};

typedef void (*stream_fn)(const uint4 *, const uint4 *, float *, float *, int *, int, int, int, int);

static stream_fn pick(int mt, int nt, int stages, int *smem, bool native = false, bool q6 = false) {
#define PICK(A, B, S)                                                                                 \
    if (mt == A && nt == B && stages == S) {                                                          \
        *smem = q6 ? stream_cfg<A, B, S, true>::SMEM : stream_cfg<A, B, S>::SMEM;                     \
        return q6 ? stream_q4k<A, B, S, false, true>                                                  \
                  : (native ? stream_q4k<A, B, S, true> : stream_q4k<A, B, S, false>);                \
    }
    PICK(1, 1, 4) PICK(1, 2, 4) PICK(2, 1, 4) PICK(2, 2, 4)
    PICK(1, 1, 3) PICK(1, 2, 3) PICK(2, 1, 3) PICK(2, 2, 3)
    PICK(1, 1, 6) PICK(1, 2, 6) PICK(2, 1, 6) PICK(2, 2, 6)
#undef PICK
    fprintf(stderr, "no instance mt=%d nt=%d stages=%d\n", mt, nt, stages);
    exit(1);
}

struct Dev {
    bool q6;
    int M, K, KB, Mpad, copies;
    size_t wbytes;                  // one copy, ggml's layout (= repacked size for Mpad == M)
    std::vector<uint8_t *> W;       // copies, ggml's layout
    std::vector<uint4 *> Wr;        // copies, repacked
    block_q8_1 *A;
    uint4 *Ar;
    float *dst, *ref, *ws;
    int *tickets;
};

static void launch_stream(const Dev &d, int c, const Cfg &cfg, int ncols, cudaStream_t s) {
    int smem;
    stream_fn fn = pick(cfg.mt, cfg.nt, cfg.stages, &smem, cfg.native, d.q6);
    const int rows = 64 * cfg.mt;
    dim3 grid(cfg.native ? (d.M + rows - 1) / rows : d.Mpad / rows, cfg.splits);
    fn<<<grid, 128, smem, s>>>(cfg.native ? (const uint4 *)d.W[c] : d.Wr[c], d.Ar, d.dst, d.ws, d.tickets, d.M,
                               d.KB, 2, ncols);
}

static void launch_mmvq(const Dev &d, int c, int ncols, cudaStream_t s) {
    const int syc = d.K / QK8_1;
#define L(N)                                                                                        \
    case N: {                                                                                       \
        dim3 blk(32, mmvq_params<N>::nwarps);                                                       \
        dim3 grid((d.M + mmvq_params<N>::rows - 1) / mmvq_params<N>::rows);                         \
        if (d.q6)                                                                                   \
            mmvq_like<N, true><<<grid, blk, 0, s>>>(d.W[c], d.A, d.dst, d.M, d.K, syc);             \
        else                                                                                        \
            mmvq_like<N, false><<<grid, blk, 0, s>>>(d.W[c], d.A, d.dst, d.M, d.K, syc);            \
    } break;
    switch (ncols) { L(1) L(2) L(3) L(4) L(5) L(6) L(7) L(8) default: exit(2); }
#undef L
}

static const int MAXSPLIT = 16;

static Dev setup(int M, int K, size_t l2, bool timing, bool q6 = false) {
    Dev d;
    d.q6 = q6;
    d.M = M;
    d.K = K;
    d.KB = K / QK_K;
    d.Mpad = (M + ROW_PAD - 1) / ROW_PAD * ROW_PAD;
    const int TU = q6 ? TILE6_U4 : TILE_U4;
    d.wbytes = (size_t)M * d.KB * (q6 ? sizeof(block_q6_K) : sizeof(block_q4_K));
    const size_t rbytes = (size_t)d.Mpad / 16 * d.KB * TU * 16;
    d.copies = timing ? (int)std::max<size_t>(2, (3 * l2 + d.wbytes - 1) / d.wbytes) : 1;
    std::vector<block_q4_K> hW4;
    std::vector<block_q6_K> hW6;
    if (q6)
        make_weights6(hW6, M, K);
    else
        make_weights(hW4, M, K);
    const void *hW = q6 ? (const void *)hW6.data() : (const void *)hW4.data();
    std::vector<block_q8_1> hA;
    std::vector<uint4> hAr;
    make_acts(K, hA, hAr);
    d.W.resize(d.copies);
    d.Wr.resize(d.copies);
    for (int c = 0; c < d.copies; ++c) {
        CHECK(cudaMalloc(&d.W[c], d.wbytes));
        CHECK(cudaMalloc(&d.Wr[c], rbytes));
        if (c == 0)
            CHECK(cudaMemcpy(d.W[0], hW, d.wbytes, cudaMemcpyHostToDevice));
        else
            CHECK(cudaMemcpy(d.W[c], d.W[0], d.wbytes, cudaMemcpyDeviceToDevice));
    }
    CHECK(cudaMalloc(&d.A, hA.size() * sizeof(block_q8_1)));
    CHECK(cudaMemcpy(d.A, hA.data(), hA.size() * sizeof(block_q8_1), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&d.Ar, hAr.size() * sizeof(uint4)));
    CHECK(cudaMemcpy(d.Ar, hAr.data(), hAr.size() * sizeof(uint4), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&d.dst, (size_t)16 * M * sizeof(float)));
    CHECK(cudaMalloc(&d.ref, (size_t)16 * M * sizeof(float)));
    CHECK(cudaMalloc(&d.ws, (size_t)MAXSPLIT * 16 * d.Mpad * sizeof(float)));
    CHECK(cudaMalloc(&d.tickets, (size_t)d.Mpad / 64 * sizeof(int)));
    CHECK(cudaMemset(d.tickets, 0, (size_t)d.Mpad / 64 * sizeof(int)));
    // repack every copy, timing the first (the load-time cost of the layout)
    const size_t total = (size_t)d.Mpad / 16 * d.KB * TU;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int c = 0; c < d.copies; ++c) {
        if (c == 0) CHECK(cudaEventRecord(e0));
        if (q6)
            repack_kernel<true><<<(unsigned)((total + 255) / 256), 256>>>(d.W[c], d.Wr[c], M, d.KB, d.Mpad);
        else
            repack_kernel<false><<<(unsigned)((total + 255) / 256), 256>>>(d.W[c], d.Wr[c], M, d.KB, d.Mpad);
        CHECK(cudaGetLastError());
        if (c == 0) CHECK(cudaEventRecord(e1));
    }
    CHECK(cudaDeviceSynchronize());
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (timing)
        printf("  repack %s %dx%d: %.3f ms (%.1f MB, %d copies in rotation, %.0f MB)\n", q6 ? "Q6_K" : "Q4_K", M, K,
               ms, d.wbytes / 1e6,
               d.copies, d.copies * d.wbytes / 1e6);
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    if (!timing) {
        CHECK(cudaMemset(d.ref, 0xFF, (size_t)16 * M * sizeof(float)));
        if (q6)
            ref_kernel<true><<<(M + 7) / 8, 256>>>(d.W[0], d.A, d.ref, M, K);
        else
            ref_kernel<false><<<(M + 7) / 8, 256>>>(d.W[0], d.A, d.ref, M, K);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    return d;
}

static void release(Dev &d) {
    for (int c = 0; c < d.copies; ++c) {
        CHECK(cudaFree(d.W[c]));
        CHECK(cudaFree(d.Wr[c]));
    }
    CHECK(cudaFree(d.A));
    CHECK(cudaFree(d.Ar));
    CHECK(cudaFree(d.dst));
    CHECK(cudaFree(d.ref));
    CHECK(cudaFree(d.ws));
    CHECK(cudaFree(d.tickets));
}

// error of dst's first ncols columns against the reference: max |out - ref| over the rms of ref;
// -1 if an output is not finite (unwritten: the output is poisoned with NaN before the launch)
static double check_err(const Dev &d, int ncols) {
    std::vector<float> o((size_t)ncols * d.M), r((size_t)ncols * d.M);
    CHECK(cudaMemcpy(o.data(), d.dst, o.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(r.data(), d.ref, r.size() * 4, cudaMemcpyDeviceToHost));
    double ss = 0.0, mx = 0.0;
    for (size_t i = 0; i < o.size(); ++i) {
        if (!std::isfinite(o[i]) || !std::isfinite(r[i])) return -1.0;
        ss += (double)r[i] * r[i];
        mx = std::max(mx, (double)fabs(o[i] - r[i]));
    }
    return mx / std::sqrt(ss / o.size());
}

static const double TOL = 1e-4;   // fp32 sums of exact integer sub-block sums; seen ~1e-6

// median time of one launch, in microseconds: `launch(copy)` captured into a CUDA graph
// `per_graph` times (copies in rotation), the graph replayed `reps` times
template <class F> static double time_us(const Dev &d, F launch, cudaStream_t s, int reps = 7) {
    int per_graph = d.copies;
    while (per_graph < 48) per_graph += d.copies;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per_graph; ++i) launch(i % d.copies);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));   // warm-up
    CHECK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        CHECK(cudaEventRecord(e0, s));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.0 / per_graph);
    }
    CHECK(cudaGetLastError());
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// ---------------------------------------------------------------- host emulation (no GPU needed)
// The kernel's index arithmetic and the mma's fragment rules (PTX ISA, mma.m16n8k32 .s8) run on
// the CPU against a double reference: checks the two layouts before any device time is spent.
static int emulate(int M, int K, int ncols) {
    const int KB = K / QK_K, nb = K / QK8_1, Mpad = (M + ROW_PAD - 1) / ROW_PAD * ROW_PAD;
    std::vector<block_q4_K> W;
    make_weights(W, M, K);
    std::vector<block_q8_1> A;
    std::vector<uint4> Ar;
    make_acts(K, A, Ar);
    std::vector<float> out((size_t)ncols * M, NAN);
    const int NT = ncols <= 8 ? 1 : 2;
    for (int mtile = 0; mtile < Mpad / 16; ++mtile) {
        float acc[32][2][4] = {};
        for (int kb = 0; kb < KB; ++kb) {
            uint4 tile[TILE_U4];
            for (int u = 0; u < TILE_U4; ++u) tile[u] = repack_elem(W.data(), M, KB, mtile, kb, u);
            // the native kernel's stage (ggml's rows as they are, zero past M) must yield the same
            // fragments and scales as the repacked tile, by the kernel's own index arithmetic
            {
                uint4 nat[TILE_U4];
                for (int u = 0; u < TILE_U4; ++u) {
                    const int r = mtile * 16 + u / 9;
                    nat[u] = make_uint4(0, 0, 0, 0);
                    if (r < M) memcpy(&nat[u], (const uint4 *)W.data() + ((size_t)r * KB + kb) * 9 + u % 9, 16);
                }
                const uint32_t *w32 = (const uint32_t *)nat;
                for (int L = 0; L < 32; ++L) {
                    const int g = L >> 2, t = L & 3;
                    for (int p = 0; p < 4; ++p) {
                        const uint4 a = tile[p * 32 + L];
                        if (a.x != w32[36 * g + 4 + 8 * p + t] || a.y != w32[36 * (g + 8) + 4 + 8 * p + t] ||
                            a.z != w32[36 * g + 4 + 8 * p + 4 + t] || a.w != w32[36 * (g + 8) + 4 + 8 * p + 4 + t]) {
                            printf("emulate: native fragment differs (tile %d kb %d lane %d p %d)\n", mtile, kb, L, p);
                            return 1;
                        }
                    }
                    for (int h = 0; h < 2; ++h)
                        if (memcmp(&tile[128 + g + 8 * h], &nat[9 * (g + 8 * h)], 16)) {
                            printf("emulate: native scales differ\n");
                            return 1;
                        }
                }
            }
            const uint4 *sa = Ar.data() + (size_t)kb * 2 * ACT_U4;
            for (int p = 0; p < 4; ++p)
                for (int hs = 0; hs < 2; ++hs)
                    for (int n = 0; n < NT; ++n) {
                        // fragments of all 32 lanes, as the kernel forms them
                        uint32_t a[32][4], b[32][2];
                        for (int L = 0; L < 32; ++L) {
                            const uint4 aq = tile[p * 32 + L];
                            const int sh = 4 * hs;
                            a[L][0] = (aq.x >> sh) & 0x0F0F0F0Fu;
                            a[L][1] = (aq.y >> sh) & 0x0F0F0F0Fu;
                            a[L][2] = (aq.z >> sh) & 0x0F0F0F0Fu;
                            a[L][3] = (aq.w >> sh) & 0x0F0F0F0Fu;
                            const uint4 bq = sa[n * ACT_U4 + p * 32 + L];
                            b[L][0] = hs ? bq.z : bq.x;
                            b[L][1] = hs ? bq.w : bq.y;
                        }
                        auto Aval = [&](int row, int k) -> int {
                            const int L = 4 * (row % 8) + (k % 16) / 4;
                            const int reg = (k < 16 ? 0 : 2) + (row < 8 ? 0 : 1);
                            return (int8_t)(a[L][reg] >> (8 * (k % 4)));
                        };
                        auto Bval = [&](int k, int col) -> int {
                            const int L = 4 * col + (k % 16) / 4;
                            return (int8_t)(b[L][k < 16 ? 0 : 1] >> (8 * (k % 4)));
                        };
                        for (int L = 0; L < 32; ++L) {
                            const int g = L >> 2, t = L & 3, j = 2 * p + hs, byte = j & 3;
                            int c[4];
                            for (int e = 0; e < 4; ++e) {
                                const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
                                c[e] = 0;
                                for (int k = 0; k < 32; ++k) c[e] += Aval(row, k) * Bval(k, col);
                            }
                            float dsc[2], dmm[2];
                            for (int h = 0; h < 2; ++h) {
                                const uint4 sv = tile[128 + g + 8 * h];
                                const float2 dm = __half22float2(*(const half2 *)&sv.x);
                                const uint32_t sclo = sv.y & 0x3f3f3f3fu, mlo = sv.z & 0x3f3f3f3fu;
                                const uint32_t schi = (sv.w & 0x0f0f0f0fu) | ((sv.y >> 2) & 0x30303030u);
                                const uint32_t mhi = ((sv.w >> 4) & 0x0f0f0f0fu) | ((sv.z >> 2) & 0x30303030u);
                                dsc[h] = dm.x * (float)(((j < 4 ? sclo : schi) >> (8 * byte)) & 0xFF);
                                dmm[h] = dm.y * (float)(((j < 4 ? mlo : mhi) >> (8 * byte)) & 0xFF);
                            }
                            float dv[4], sv4[4];
                            memcpy(dv, &sa[n * ACT_U4 + 128 + 4 * t + p], 16);
                            memcpy(sv4, &sa[n * ACT_U4 + 144 + 4 * t + p], 16);
                            const float dc0 = dv[2 * hs], dc1 = dv[2 * hs + 1];
                            const float sc0 = sv4[2 * hs], sc1 = sv4[2 * hs + 1];
                            float *ac = acc[L][n];
                            ac[0] = fmaf((float)c[0], dsc[0] * dc0, ac[0]) - dmm[0] * sc0;
                            ac[1] = fmaf((float)c[1], dsc[0] * dc1, ac[1]) - dmm[0] * sc1;
                            ac[2] = fmaf((float)c[2], dsc[1] * dc0, ac[2]) - dmm[1] * sc0;
                            ac[3] = fmaf((float)c[3], dsc[1] * dc1, ac[3]) - dmm[1] * sc1;
                        }
                    }
        }
        for (int L = 0; L < 32; ++L)
            for (int n = 0; n < NT; ++n)
                for (int e = 0; e < 4; ++e) {
                    const int r = mtile * 16 + (L >> 2) + 8 * (e >> 1), c = n * 8 + 2 * (L & 3) + (e & 1);
                    if (r < M && c < ncols) out[(size_t)c * M + r] = acc[L][n][e];
                }
    }
    // double reference from ggml's dequantization
    double ss = 0.0, mx = 0.0;
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < ncols; ++c) {
            double v = 0.0;
            for (int kb = 0; kb < KB; ++kb) {
                const block_q4_K &b = W[(size_t)r * KB + kb];
                for (int j = 0; j < 8; ++j) {
                    uint8_t sc, m;
                    scale_min_k4(j, b.scales, sc, m);
                    const float d1 = __half2float(b.d) * sc, m1 = __half2float(b.dmin) * m;
                    const block_q8_1 &a = A[(size_t)c * nb + kb * 8 + j];
                    for (int l = 0; l < 32; ++l) {
                        const int q = (j & 1) ? (b.qs[32 * (j / 2) + l] >> 4) : (b.qs[32 * (j / 2) + l] & 0xF);
                        v += (double)(d1 * q - m1) * (double)(__half2float(a.d) * a.qs[l]);
                    }
                }
            }
            const float o = out[(size_t)c * M + r];
            if (!std::isfinite(o)) {
                printf("emulate: row %d col %d unwritten\n", r, c);
                return 1;
            }
            ss += v * v;
            mx = std::max(mx, fabs(o - v));
        }
    const double err = mx / std::sqrt(ss / ((double)M * ncols));
    printf("emulate %dx%d, %d cols: max|out-ref|/rms(ref) %.3g %s\n", M, K, ncols, err, err < TOL ? "ok" : "FAIL");
    return err < TOL ? 0 : 1;
}

// Q6_K: the kernel's index arithmetic on the repacked tile, the m16n8k16 fragment rules, against
// a double reference from ggml's dequantization
static uint32_t vsub4_host(uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= (uint32_t)(uint8_t)(((a >> 8 * k) & 0xFF) - ((b >> 8 * k) & 0xFF)) << 8 * k;
    return r;
}
static int emulate6(int M, int K, int ncols) {
    const int KB = K / QK_K, nb = K / QK8_1, Mpad = (M + ROW_PAD - 1) / ROW_PAD * ROW_PAD;
    std::vector<block_q6_K> W;
    make_weights6(W, M, K);
    std::vector<block_q8_1> A;
    std::vector<uint4> Ar;
    make_acts(K, A, Ar);
    std::vector<float> out((size_t)ncols * M, NAN);
    const int NT = ncols <= 8 ? 1 : 2;
    for (int mtile = 0; mtile < Mpad / 16; ++mtile) {
        float acc[32][2][4] = {};
        for (int kb = 0; kb < KB; ++kb) {
            uint4 tile[TILE6_U4];
            for (int u = 0; u < TILE6_U4; ++u) tile[u] = repack6_elem(W.data(), M, KB, mtile, kb, u);
            const uint4 *sa = Ar.data() + (size_t)kb * 2 * ACT_U4;
            for (int n2 = 0; n2 < 2; ++n2)
                for (int jj = 0; jj < 4; ++jj) {
                    const int j = 4 * n2 + jj, p = j / 2, hs = j % 2;
                    for (int e = 0; e < 2; ++e) {
                        const int Gl = 2 * jj + e, G = 8 * n2 + Gl, nib = 4 * (Gl / 4), hsh = 2 * (Gl / 2);
                        for (int n = 0; n < NT; ++n) {
                            uint32_t a[32][2], b[32];
                            for (int L = 0; L < 32; ++L) {
                                const uint4 lq = tile[(2 * n2 + (jj & 1)) * 32 + L];
                                const uint4 hq = tile[128 + n2 * 32 + L];
                                const uint32_t l0 = (Gl & 1) ? lq.z : lq.x, l1 = (Gl & 1) ? lq.w : lq.y;
                                const uint32_t h0 = (Gl & 1) ? hq.z : hq.x, h1 = (Gl & 1) ? hq.w : hq.y;
                                a[L][0] = vsub4_host(((l0 >> nib) & 0x0F0F0F0Fu) | (((h0 >> hsh) & 0x03030303u) << 4),
                                                     0x20202020u);
                                a[L][1] = vsub4_host(((l1 >> nib) & 0x0F0F0F0Fu) | (((h1 >> hsh) & 0x03030303u) << 4),
                                                     0x20202020u);
                                const uint4 bq = sa[n * ACT_U4 + p * 32 + L];
                                b[L] = e ? (hs ? bq.w : bq.y) : (hs ? bq.z : bq.x);
                            }
                            for (int L = 0; L < 32; ++L) {
                                const int g = L >> 2, t = L & 3;
                                int c[4];
                                for (int q = 0; q < 4; ++q) {
                                    const int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
                                    c[q] = 0;
                                    for (int k = 0; k < 16; ++k) {
                                        const int LA = 4 * (row % 8) + k / 4, LB = 4 * col + k / 4;
                                        const int av = (int8_t)(a[LA][row < 8 ? 0 : 1] >> (8 * (k % 4)));
                                        const int bv = (int8_t)(b[LB] >> (8 * (k % 4)));
                                        c[q] += av * bv;
                                    }
                                }
                                float ds[2];
                                for (int h = 0; h < 2; ++h) {
                                    const half *dh = (const half *)&tile[208];
                                    const uint4 sw = tile[192 + g + 8 * h];
                                    const uint32_t w = G < 4 ? sw.x : G < 8 ? sw.y : G < 12 ? sw.z : sw.w;
                                    ds[h] = __half2float(dh[g + 8 * h]) * (float)(int8_t)(w >> (8 * (G & 3)));
                                }
                                float dv[4];
                                memcpy(dv, &sa[n * ACT_U4 + 128 + 4 * t + p], 16);
                                const float dc0 = hs ? dv[2] : dv[0], dc1 = hs ? dv[3] : dv[1];
                                float *ac = acc[L][n];
                                ac[0] = fmaf((float)c[0], ds[0] * dc0, ac[0]);
                                ac[1] = fmaf((float)c[1], ds[0] * dc1, ac[1]);
                                ac[2] = fmaf((float)c[2], ds[1] * dc0, ac[2]);
                                ac[3] = fmaf((float)c[3], ds[1] * dc1, ac[3]);
                            }
                        }
                    }
                }
        }
        for (int L = 0; L < 32; ++L)
            for (int n = 0; n < NT; ++n)
                for (int e = 0; e < 4; ++e) {
                    const int r = mtile * 16 + (L >> 2) + 8 * (e >> 1), c = n * 8 + 2 * (L & 3) + (e & 1);
                    if (r < M && c < ncols) out[(size_t)c * M + r] = acc[L][n][e];
                }
    }
    double ss = 0.0, mx = 0.0;
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < ncols; ++c) {
            double v = 0.0;
            for (int kb = 0; kb < KB; ++kb)
                for (int i = 0; i < QK_K; ++i) {
                    const block_q8_1 &a = A[(size_t)c * nb + kb * 8 + i / 32];
                    v += (double)deq_q6k(W[(size_t)r * KB + kb], i) * (double)(__half2float(a.d) * a.qs[i % 32]);
                }
            const float o = out[(size_t)c * M + r];
            if (!std::isfinite(o)) {
                printf("emulate6: row %d col %d unwritten\n", r, c);
                return 1;
            }
            ss += v * v;
            mx = std::max(mx, fabs(o - v));
        }
    const double err = mx / std::sqrt(ss / ((double)M * ncols));
    printf("emulate Q6_K %dx%d, %d cols: max|out-ref|/rms(ref) %.3g %s\n", M, K, ncols, err, err < TOL ? "ok" : "FAIL");
    return err < TOL ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--emulate")) {
        int f = 0;
        f |= emulate(40, 512, 3);
        f |= emulate(72, 768, 16);
        f |= emulate(130, 256, 9);
        f |= emulate6(40, 512, 3);
        f |= emulate6(72, 768, 16);
        f |= emulate6(130, 256, 9);
        return f;
    }
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    // every config's time goes to $CFG_LOG (the printed table keeps the best)
    FILE *cfglog = fopen(getenv("CFG_LOG") ? getenv("CFG_LOG") : "/dev/null", "w");
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int clk_khz = 0, bus_bits = 0, mem_khz = 0;
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
    const double spec_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8) / 1e9;   // DDR: 2 transfers a clock
    printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MB, smem/SM %zu KB, smem/block opt-in %zu KB, "
           "bandwidth from clocks %.0f GB/s\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1e6,
           prop.sharedMemPerMultiprocessor / 1024, prop.sharedMemPerBlockOptin / 1024, spec_gbs);

    // every instance may take more than 48 KB of dynamic shared memory
    for (int mt = 1; mt <= 2; ++mt)
        for (int nt = 1; nt <= 2; ++nt)
            for (int st : {3, 4, 6}) {
                int smem;
                stream_fn fn = pick(mt, nt, st, &smem);
                if ((size_t)smem > prop.sharedMemPerBlockOptin) continue;
                CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                CHECK(cudaFuncSetAttribute(pick(mt, nt, st, &smem, true), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem));
                int smem6;
                stream_fn fn6 = pick(mt, nt, st, &smem6, false, true);
                if ((size_t)smem6 <= prop.sharedMemPerBlockOptin)
                    CHECK(cudaFuncSetAttribute(fn6, cudaFuncAttributeMaxDynamicSharedMemorySize, smem6));
                int blocks = 0;
                CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 128, smem));
                printf("  config mt=%d nt=%d stages=%d: smem %d B a block, %d blocks/SM here\n", mt, nt, st, smem,
                       blocks);
            }

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // measured copy ceiling: a 1 GiB device-to-device copy, bytes read + written
    {
        const size_t n = (size_t)1 << 30;
        void *a, *b;
        CHECK(cudaMalloc(&a, n));
        CHECK(cudaMalloc(&b, n));
        CHECK(cudaMemset(a, 1, n));
        cudaEvent_t e0, e1;
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
        CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
        std::vector<double> t;
        for (int r = 0; r < 5; ++r) {
            CHECK(cudaEventRecord(e0, s));
            CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
            CHECK(cudaEventRecord(e1, s));
            CHECK(cudaEventSynchronize(e1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(2.0 * n / (ms * 1e-3) / 1e9);
        }
        std::sort(t.begin(), t.end());
        printf("measured copy ceiling: %.0f GB/s (1 GiB device-to-device, read + write, median of 5)\n", t[2]);
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
    }

    // ---- correctness: every width, configs, shapes incl. rows not a multiple of the tile
    {
        const Shape cs[] = {{"odd 1000x3584", 1000, 3584, false},
                            {"odd 72x512", 72, 512, false},
                            {"7b kv 512x3584", 512, 3584, false},
                            {"32b ffn_down 5120x27648", 5120, 27648, false},
                            {"Q6_K odd 1000x3584", 1000, 3584, true},
                            {"Q6_K odd 72x512", 72, 512, true},
                            {"Q6_K 32b ffn_down 5120x27648", 5120, 27648, true}};
        const Cfg cfgs[] = {{1, 0, 4, 1, false}, {2, 0, 4, 1, false}, {1, 0, 3, 3, false}, {2, 0, 6, 4, false},
                            {1, 0, 4, 16, false}, {1, 0, 4, 1, true},  {2, 0, 4, 1, true},  {1, 0, 3, 3, true},
                            {2, 0, 6, 4, true},   {1, 0, 4, 16, true}};
        double worst_new = 0.0, worst_stock = 0.0;
        int fails = 0;
        for (const Shape &sh : cs) {
            Dev d = setup(sh.M, sh.K, prop.l2CacheSize, false, sh.q6);
            for (int n = 1; n <= 16; ++n) {
                for (Cfg cfg : cfgs) {
                    cfg.nt = n <= 8 ? 1 : 2;
                    if (cfg.splits > d.KB || (sh.q6 && cfg.native)) continue;
                    int smem;
                    pick(cfg.mt, cfg.nt, cfg.stages, &smem, cfg.native, sh.q6);
                    if ((size_t)smem > prop.sharedMemPerBlockOptin) continue;
                    CHECK(cudaMemset(d.dst, 0xFF, (size_t)16 * sh.M * 4));
                    launch_stream(d, 0, cfg, n, s);
                    CHECK(cudaGetLastError());
                    CHECK(cudaStreamSynchronize(s));
                    const double e = check_err(d, n);
                    worst_new = std::max(worst_new, e < 0 ? 1e9 : e);
                    if (e < 0 || e > TOL) {
                        ++fails;
                        printf("FAIL new %s n=%d mt=%d stages=%d splits=%d native=%d: err %.3g\n", sh.name, n, cfg.mt,
                               cfg.stages, cfg.splits, (int)cfg.native, e);
                    }
                }
                if (n <= 8) {
                    CHECK(cudaMemset(d.dst, 0xFF, (size_t)16 * sh.M * 4));
                    launch_mmvq(d, 0, n, s);
                    CHECK(cudaGetLastError());
                    CHECK(cudaStreamSynchronize(s));
                    const double e = check_err(d, n);
                    worst_stock = std::max(worst_stock, e < 0 ? 1e9 : e);
                    if (e < 0 || e > TOL) {
                        ++fails;
                        printf("FAIL stock-like %s n=%d: err %.3g\n", sh.name, n, e);
                    }
                }
            }
            release(d);
        }
        printf("check: %s; worst max|out-ref|/rms(ref): new %.2g, stock-like %.2g (tolerance %.0e)\n",
               fails ? "FAILED" : "all passed", worst_new, worst_stock, TOL);
        if (fails) return 1;
    }
    // the same inputs give the same bits with split-K (deterministic reduction): one repeat
    {
        Dev d = setup(5120, 5120, prop.l2CacheSize, false);
        std::vector<float> a((size_t)16 * 5120), b(a.size());
        Cfg cfg{1, 2, 4, 8, false};
        launch_stream(d, 0, cfg, 16, s);
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(a.data(), d.dst, a.size() * 4, cudaMemcpyDeviceToHost));
        for (int r = 0; r < 20; ++r) launch_stream(d, 0, cfg, 16, s);
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(b.data(), d.dst, b.size() * 4, cudaMemcpyDeviceToHost));
        printf("split-K repeat: %s\n", memcmp(a.data(), b.data(), a.size() * 4) ? "BITS DIFFER" : "same bits");
        release(d);
    }

    // ---- timing
    const Shape shapes[] = {
        {"7b attn_q/o 3584x3584", 3584, 3584},    {"7b attn_k/v 512x3584", 512, 3584},
        {"7b ffn_gate/up 18944x3584", 18944, 3584}, {"7b ffn_down 3584x18944", 3584, 18944},
        {"32b attn_q/o 5120x5120", 5120, 5120},   {"32b attn_k/v 1024x5120", 1024, 5120},
        {"32b ffn_gate/up 27648x5120", 27648, 5120}, {"32b ffn_down 5120x27648", 5120, 27648},
        // Q6_K: a Q4_K_M file's output and, in half the layers, ffn_down and attn_v
        {"Q6_K 7b attn_v 512x3584", 512, 3584, true}, {"Q6_K 7b ffn_down 3584x18944", 3584, 18944, true},
        {"Q6_K 32b attn_v 1024x5120", 1024, 5120, true}, {"Q6_K 32b ffn_down 5120x27648", 5120, 27648, true},
        {"Q6_K 7b output 152064x3584", 152064, 3584, true}, {"Q6_K 32b output 152064x5120", 152064, 5120, true},
    };
    const int nshapes = quick ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    // per layer: q, k, v, o, gate, up, down (as if all Q4_K): shape index and count
    double layer_stock[2][17] = {}, layer_new[2][17] = {}, layer_nat[2][17] = {};
    const int layer_mult[8] = {2, 2, 2, 1, 2, 2, 2, 1};
    for (int si = 0; si < nshapes; ++si) {
        const Shape &sh = shapes[si];
        printf("\n%s (%.1f MB of %s)\n", sh.name, (double)sh.M * sh.K / 256 * (sh.q6 ? 210 : 144) / 1e6,
               sh.q6 ? "Q6_K" : "Q4_K");
        Dev d = setup(sh.M, sh.K, prop.l2CacheSize, true, sh.q6);
        const double bytes = (double)d.wbytes;
        printf("%4s %8s %5s %5s | %8s %5s %5s | %8s %5s %5s | %5s | best: mt/stages/splits repacked, native\n",
               "cols", "stock us", "%bw", "x1col", "repk us", "%bw", "x1col", "natv us", "%bw", "x1col", "speed");
        fprintf(cfglog, "\n%s: cols, layout, then mt/stages/splits:us for every config timed\n", sh.name);
        double stock1 = 0.0, new1[2] = {0.0, 0.0};
        for (int n = 1; n <= 16; ++n) {
            double ts = 0.0;
            if (n <= 8) ts = time_us(d, [&](int c) { launch_mmvq(d, c, n, s); }, s);
            const int nt = n <= 8 ? 1 : 2;
            double best[2] = {1e30, 1e30};
            Cfg bc[2] = {};
            for (int nat = 0; nat < (sh.q6 ? 1 : 2); ++nat) {
                std::string others;
                auto try_cfg = [&](const Cfg &cfg) {
                    int smem;
                    pick(cfg.mt, cfg.nt, cfg.stages, &smem, cfg.native, sh.q6);
                    if ((size_t)smem > prop.sharedMemPerBlockOptin) return;
                    const double t = time_us(d, [&](int c) { launch_stream(d, c, cfg, n, s); }, s);
                    char buf[64];
                    snprintf(buf, sizeof buf, " %d/%d/%d:%.2f", cfg.mt, cfg.stages, cfg.splits, t);
                    others += buf;
                    if (t < best[nat]) {
                        best[nat] = t;
                        bc[nat] = cfg;
                    }
                };
                for (int mt = 1; mt <= 2; ++mt) {
                    const int rb = d.Mpad / (64 * mt);
                    for (int sp : {1, 2, 4, 8}) {
                        if (sp > d.KB || (sp > 1 && rb * sp > 8 * prop.multiProcessorCount)) continue;
                        try_cfg(Cfg{mt, nt, 4, sp, nat == 1});
                    }
                }
                // pipeline depth at the best rows/splits: 3 and 6 stages against 4, at 1, 8, 16 columns
                if (n == 1 || n == 8 || n == 16) {
                    const Cfg b = bc[nat];
                    for (int st : {3, 6}) try_cfg(Cfg{b.mt, nt, st, b.splits, nat == 1});
                }
                fprintf(cfglog, "%d %s%s\n", n, nat ? "native" : "repacked", others.c_str());
            }
            if (n == 1) {
                stock1 = ts;
                new1[0] = best[0];
                new1[1] = best[1];
            }
            auto pbw = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / spec_gbs; };
            char stock_s[64];
            if (n <= 8)
                snprintf(stock_s, sizeof stock_s, "%8.2f %4.0f%% %5.2f", ts, pbw(ts), ts / stock1);
            else
                snprintf(stock_s, sizeof stock_s, "%8s %5s %5s", "-", "-", "-");
            char speed_s[16];
            if (n <= 8)
                snprintf(speed_s, sizeof speed_s, "%4.2fx", ts / std::min(best[0], best[1]));
            else
                snprintf(speed_s, sizeof speed_s, "%5s", "-");
            char nat_s[64];   // Q6_K has no native path
            if (sh.q6)
                snprintf(nat_s, sizeof nat_s, "%8s %5s %5s", "-", "-", "-");
            else
                snprintf(nat_s, sizeof nat_s, "%8.2f %4.0f%% %5.2f", best[1], pbw(best[1]), best[1] / new1[1]);
            printf("%4d %s | %8.2f %4.0f%% %5.2f | %s | %s | %d/%d/%d %d/%d/%d\n", n, stock_s, best[0], pbw(best[0]),
                   best[0] / new1[0], nat_s, speed_s, bc[0].mt, bc[0].stages, bc[0].splits, bc[1].mt, bc[1].stages,
                   bc[1].splits);
            if (si >= 8) continue;   // the layer sums: the Q4_K shapes
            const int model = si / 4;
            layer_new[model][n] += layer_mult[si] * best[0];
            layer_nat[model][n] += layer_mult[si] * best[1];
            if (n <= 8) layer_stock[model][n] += layer_mult[si] * ts;
        }
        release(d);
    }
    if (!quick) {
        for (int model = 0; model < 2; ++model) {
            printf("\n%s layer, its 7 matmuls as Q4_K (q,k,v,o,gate,up,down), us (cost / its 1-col cost):\n",
                   model ? "32B" : "7B");
            for (int n = 1; n <= 16; ++n)
                printf("  cols %2d: stock-like %7.1f (%.2f)  repacked %7.1f (%.2f)  native %7.1f (%.2f)\n", n,
                       n <= 8 ? layer_stock[model][n] : 0.0, layer_stock[model][n] / layer_stock[model][1],
                       layer_new[model][n], layer_new[model][n] / layer_new[model][1], layer_nat[model][n],
                       layer_nat[model][n] / layer_nat[model][1]);
        }
    }
    CHECK(cudaStreamDestroy(s));
    fclose(cfglog);
    return 0;
}
