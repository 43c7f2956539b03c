// Probe (not in the patches yet): Q6_K rows repacked 8 at a time, the layout and kernel below, against
// the plain-layout Q6_K kernel of packaging/patches' multicol.h and ggml's vec_dot per column, one
// thread, random data: the largest difference to vec_dot relative to the output's scale, whether a
// column's result changes with the batch width, and ms per width 1..8 and 16. R past the caches
// (151936: the reference target's output matrix) shows the rows streamed from memory. The figures
// in docs/decisions/0022's last addendum came from this probe. Build as rows_probe.c, adding
// -DPREFETCH_FROM=N (default 6, from the runs below; 99: never):
//   gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2 q6k_x8_probe.c
//       -I$S/src/ggml-cpu -I$S/include -I$S/src -L$L -lggml -lggml-base -lggml-cpu -lm
//       -Wl,-rpath,$L -o probe && ./probe K ROWS      (e.g. 1536 2048, 8960 1536, 1536 151936)
// AVX-512 VNNI only.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml.h"
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>
#include <string.h>
#include <immintrin.h>
#define GGML_CPU_FP16_TO_FP32(x) _cvtsh_ss(x)
#include "multicol.h"
#ifndef PREFETCH_FROM
#define PREFETCH_FROM 6
#endif
// Q6_K repacked 8 rows at a time (probe version): d[8], scales [s][r][h], low nibbles [s/2][u][8r+4h+k]
// (odd s in the high nibble), high 2 bits [s/4][u][8r+4h+k] (bits 2(s%4)); code j = 32s+16h+4u+k
// slabs in the order the kernel first reads them (a monotonic stream for the prefetchers): the low
// nibbles of sub-blocks 0-1, the high bits of 0-3, the low nibbles of 2-3, of 4-5, the high bits of 4-7,
// the low nibbles of 6-7
typedef struct { uint16_t d[8]; int8_t scales[8][8][2]; uint8_t slab[6][4][64]; } block_q6_Kx8;
static const int q6x8_ql_slab[4] = {0, 2, 3, 5};
static const int q6x8_qh_slab[2] = {1, 4};
#define Q6X8_QL(b, i) ((b)->slab[q6x8_ql_slab[i]])
#define Q6X8_QH(b, i) ((b)->slab[q6x8_qh_slab[i]])

static inline int q6_code(const block_q6_K * b, int j) {
    const int n = j / 128, l = j % 128, t = l / 32, i = l % 32;
    const uint8_t * ql = b->ql + 64 * n; const uint8_t * qh = b->qh + 32 * n;
    const int low = t == 0 ? (ql[i] & 15) : t == 1 ? (ql[32 + i] & 15) : t == 2 ? (ql[i] >> 4) : (ql[32 + i] >> 4);
    return low | (((qh[i] >> (2 * t)) & 3) << 4);
}
static void make_q6_Kx8(const block_q6_K * in[8], block_q6_Kx8 * out) {
    memset(out, 0, sizeof(*out));
    for (int r = 0; r < 8; r++) {
        out->d[r] = in[r]->d;
        for (int s = 0; s < 8; s++) for (int h = 0; h < 2; h++) out->scales[s][r][h] = in[r]->scales[2 * s + h];
        for (int s = 0; s < 8; s++) for (int h = 0; h < 2; h++) for (int u = 0; u < 4; u++) for (int k = 0; k < 4; k++) {
            const int q = q6_code(in[r], 32 * s + 16 * h + 4 * u + k), at = 8 * r + 4 * h + k;
            Q6X8_QL(out, s / 2)[u][at] |= (uint8_t) ((q & 15) << (4 * (s % 2)));
            Q6X8_QH(out, s / 4)[u][at] |= (uint8_t) ((q >> 4) << (2 * (s % 4)));
        }
    }
}
// a q8_K column for the x8 Q6_K kernel, in place: per 32 codes [4u..4u+3, 16+4u..16+4u+3] for u = 0..3,
// and the 16 sums as [b0 b2 b1 b3, b4 b6 b5 b7, ...]
static inline void lsp_mc_permute_q8_K_x8(block_q8_K * y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        int8_t q[QK_K]; memcpy(q, y[b].qs, QK_K);
        for (int s = 0; s < 8; s++) for (int u = 0; u < 4; u++) for (int h = 0; h < 2; h++)
            memcpy(y[b].qs + 32 * s + 8 * u + 4 * h, q + 32 * s + 16 * h + 4 * u, 4);
        int16_t bs[16]; memcpy(bs, y[b].bsums, sizeof(bs));
        for (int p = 0; p < 4; p++) { y[b].bsums[4*p] = bs[4*p]; y[b].bsums[4*p+1] = bs[4*p+2]; y[b].bsums[4*p+2] = bs[4*p+1]; y[b].bsums[4*p+3] = bs[4*p+3]; }
    }
}
static inline __attribute__((always_inline)) void lsp_mc_q6_Kx8_n(
        int n, const uint8_t * x, const char * y, size_t y_stride, int ncols, float * out) {
    const int nb = n / QK_K;
    __m512 acc[LSP_MC_MAX_COLS];
    for (int c = 0; c < ncols; c++) acc[c] = _mm512_setzero_ps();
    int32_t dv[16];
    for (int j = 0; j < 16; j++) dv[j] = j / 2;
    const __m512i dup = _mm512_loadu_si512((const void *) dv);
    const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    for (int b = 0; b < nb; b++) {
        const block_q6_Kx8 * xb = (const block_q6_Kx8 *) (x + (size_t) b * sizeof(block_q6_Kx8));
        // from PREFETCH_FROM columns on, the block two ahead is asked into L2 while this one
        // computes: with that many columns the hardware's own prefetch left the stream's latency
        // exposed (this EPYC, rows from DRAM: 7-8 columns ran slower than the plain layout)
        if (ncols >= PREFETCH_FROM) {
            for (int l = 0; l < (int) sizeof(block_q6_Kx8); l += 64) {
                _mm_prefetch((const char *) xb + 2 * sizeof(block_q6_Kx8) + l, _MM_HINT_T1);
            }
        }
        const __m512 dw = _mm512_permutexvar_ps(dup, _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) xb->d))));
        __m512i sum[LSP_MC_MAX_COLS];
        for (int c = 0; c < ncols; c++) sum[c] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) xb->scales[s]));
            __m512i w[4];
            for (int u = 0; u < 4; u++) {
                const __m512i zl = _mm512_loadu_si512((const void *) Q6X8_QL(xb, s / 2)[u]);
                const __m512i zh = _mm512_loadu_si512((const void *) Q6X8_QH(xb, s / 4)[u]);
                const __m512i lo = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(zl, 4) : zl, low4);
                const __m512i hi = _mm512_and_si512(s % 4 ? _mm512_srli_epi16(zh, 2 * (s % 4)) : zh, low2);
                w[u] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
            }
            _Pragma("GCC unroll 8")
            for (int c = 0; c < ncols; c++) {
                const int8_t * a = ((const block_q8_K *) (y + c * y_stride) + b)->qs + 32 * s;
                __m512i p = _mm512_setzero_si512();
                _Pragma("GCC unroll 4")
                for (int u = 0; u < 4; u++) {
                    int64_t a8; memcpy(&a8, a + 8 * u, 8);
                    p = _mm512_dpbusd_epi32(p, w[u], _mm512_set1_epi64(a8));
                }
                sum[c] = _mm512_add_epi32(sum[c], _mm512_mullo_epi32(p, scale));
            }
        }
        // the codes are stored +32: lane 2r+h takes back 32 sum_s scale[s][r][h] * bsum[2s+h]
        __m512i pairs[4];
        for (int p = 0; p < 4; p++) {
            const __m512i a0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) xb->scales[2 * p]));
            const __m512i a1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) xb->scales[2 * p + 1]));
            pairs[p] = _mm512_slli_epi16(_mm512_mask_blend_epi16(0xAAAAAAAA, a0, _mm512_slli_epi32(a1, 16)), 5);
        }
        _Pragma("GCC unroll 8")
        for (int c = 0; c < ncols; c++) {
            const block_q8_K * yb = (const block_q8_K *) (y + c * y_stride) + b;
            __m512i corr = _mm512_setzero_si512();
            for (int p = 0; p < 4; p++) {
                int64_t b4; memcpy(&b4, yb->bsums + 4 * p, 8);
                corr = _mm512_dpwssd_epi32(corr, pairs[p], _mm512_set1_epi64(b4));
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum[c], corr)), _mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), acc[c]);
        }
    }
    for (int c = 0; c < ncols; c++) {
        float lanes[16]; _mm512_storeu_ps(lanes, acc[c]);
        for (int r = 0; r < 8; r++) out[8 * c + r] = lanes[2 * r] + lanes[2 * r + 1];
    }
}
LSP_MC_DISPATCH(lsp_mc_q6_Kx8, uint8_t)

void ggml_vec_dot_q6_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
void ggml_cpu_init(void);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float rnd(){return ((rand()%20001)-10000)/10000.0f;}
int main(int argc, char**argv){ ggml_cpu_init();
  int K = atoi(argv[1]), R = atoi(argv[2]), nb = K/256;
  size_t rs = ggml_row_size(GGML_TYPE_Q6_K, K), ys = ggml_row_size(GGML_TYPE_Q8_K, K);
  float *f = malloc(sizeof(float)*K*8);
  char *w = malloc(rs*(size_t)R);
  for (int r0 = 0; r0 < R; r0 += 8) { for (long i=0;i<(long)K*8;i++) f[i]=rnd(); ggml_quantize_chunk(GGML_TYPE_Q6_K, f, w + (size_t)r0*rs, 0, 8, K, NULL); }
  block_q6_Kx8 *wx = malloc(sizeof(block_q6_Kx8)*(size_t)(R/8)*nb);
  for (int g=0; g<R/8; g++) for (int b=0;b<nb;b++){ const block_q6_K *in[8]; for(int r=0;r<8;r++) in[r]=((const block_q6_K*)(w+(size_t)(8*g+r)*rs))+b; make_q6_Kx8(in, &wx[(size_t)g*nb+b]); }
  char *y = malloc(ys*16); float *a = malloc(sizeof(float)*K);
  for (int c=0;c<16;c++){ for(int i=0;i<K;i++) a[i]=rnd()*(1+c%3); quantize_row_q8_K(a, y+c*ys, K);}
  char *yp = malloc(ys*16); memcpy(yp, y, ys*16); for (int c=0;c<16;c++) lsp_mc_permute_q8_K((block_q8_K*)(yp+c*ys), nb);
  char *yx = malloc(ys*16); memcpy(yx, y, ys*16); for (int c=0;c<16;c++) lsp_mc_permute_q8_K_x8((block_q8_K*)(yx+c*ys), nb);
  int Rc = R < 4096 ? R : 4096;   // rows checked
  float *ref = malloc(sizeof(float)*Rc*16), *wide = malloc(sizeof(float)*Rc*16);
  for (int r=0;r<Rc;r++) for(int c=0;c<16;c++) ggml_vec_dot_q6_K_q8_K(K, &ref[c*Rc+r], 0, w+(size_t)r*rs, 0, y+c*ys, 0, 1);
  double maxrel=0; int mism=0; float o[64];
  for (int n=16;n>=1;n--){
    for (int g=0; g<Rc/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_MAX_COLS){ int nc=n-c0<LSP_MC_MAX_COLS?n-c0:LSP_MC_MAX_COLS;
      lsp_mc_q6_Kx8(K, (const uint8_t*)&wx[(size_t)g*nb], yx+c0*ys, ys, nc, o);
      for (int c=0;c<nc;c++) for(int r=0;r<8;r++) { float v = o[8*c+r]; int i = (c0+c)*Rc+8*g+r;
        double e=fabs(v-ref[i])/(fabs(ref[i])+1e-3*K); if(e>maxrel) maxrel=e;
        if (n==16) wide[i]=v; else if (v!=wide[i]) mism++; } } }
  printf("q6_Kx8 K=%d R=%d max rel err %.2e, differs across widths: %d\n", K, R, maxrel, mism);
  static const int widths[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
  for (int wi=0;wi<9;wi++){ const int n = widths[wi]; int reps = R > 100000 ? 3 : 20; double t0=now();
    for (int rep=0;rep<reps;rep++) for (int r=0;r<R;r++) for (int c=0;c<n;c++) ggml_vec_dot_q6_K_q8_K(K, &o[c], 0, w+(size_t)r*rs, 0, y+c*ys, 0, 1);
    double tv=(now()-t0)/reps; t0=now();
    for (int rep=0;rep<reps;rep++) for (int r=0;r<R;r++) for (int c0=0;c0<n;c0+=LSP_MC_MAX_COLS){ int nc=n-c0<LSP_MC_MAX_COLS?n-c0:LSP_MC_MAX_COLS; lsp_mc_q6_K(K,(const block_q6_K*)(w+(size_t)r*rs), yp+c0*ys, ys, nc, o);}
    double tp=(now()-t0)/reps; t0=now();
    for (int rep=0;rep<reps;rep++) for (int g=0; g<R/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_MAX_COLS){ int nc=n-c0<LSP_MC_MAX_COLS?n-c0:LSP_MC_MAX_COLS; lsp_mc_q6_Kx8(K, (const uint8_t*)&wx[(size_t)g*nb], yx+c0*ys, ys, nc, o);}
    double tx=(now()-t0)/reps;
    printf("  n=%2d vec_dot %.3f ms  plain kernel %.3f ms  x8 kernel %.3f ms  (x8 %.2fx the plain kernel's speed)\n", n, tv*1e3, tp*1e3, tx*1e3, tp/tx); }
}
