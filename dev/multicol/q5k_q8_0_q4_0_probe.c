// Probe: the Q8_0 (8 rows a call), Q4_0 8x8 and Q5_K kernels of packaging/patches' multicol-q8_0.h / multicol.h
// against ggml's vec_dot per column, one thread, on random data: the largest difference relative to
// the output's scale, whether a column's result changes with the batch width, and ms per width.
// Build against a patched sdist's ggml (S: its vendor/llama.cpp/ggml; L: the folder of the
// installed libggml*.so):
//   gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2 q5k_q8_0_q4_0_probe.c
//       -I$S/src/ggml-cpu -I$S/include -I$S/src -L$L -lggml -lggml-base -lggml-cpu -lm
//       -Wl,-rpath,$L -o probe && ./probe K ROWS      (e.g. 1536 2048, 8960 1536)
// (the AVX2 build of the kernels, Q4_0 8x8 and Q5_K: the same line without the -mavx512* flags)
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <immintrin.h>
#define GGML_CPU_FP16_TO_FP32(x) _cvtsh_ss(x)
#include "multicol-q8_0.h"
void ggml_cpu_init(void);
typedef void (*vec_dot_t)(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q8_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void quantize_row_q8_0(const float * x, void * y, int64_t k);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float rnd(){return ((rand()%20001)-10000)/10000.0f;}
enum { T_Q8_0, T_Q4_0X8, T_Q5_K };
static const char * names[] = { "q8_0 (8 rows a call)", "q4_0x8", "q5_K" };

// ggml's q4_0_8x8 repacking, as make_block_q4_0x8 lays it out (8-byte units, nibbles xor 8)
static void repack_q4_0x8(const block_q4_0 * in, uint8_t * out) {
  for (int r = 0; r < 8; r++) memcpy(out + 2 * r, &in[r].d, 2);
  for (int u = 0; u < 16; u++) {
    uint64_t e; memcpy(&e, in[u % 8].qs + 8 * (u / 8), 8); e ^= 0x8888888888888888ULL;
    memcpy(out + 16 + 8 * u, &e, 8);
  }
}

// rows [0, R) x columns [0, n): out[c * R + r]
static void run(int t, int K, int R, const char * w, size_t rs, const uint8_t * wx, const char * y, size_t ys,
                uint8_t * codes, float * d, int n, float * out) {
  float o[64];
  const int step = t == T_Q5_K ? LSP_MC_MAX_COLS : 8;   // multicol-q8_0.h's kernels take 8 a call
  for (int c0 = 0; c0 < n; c0 += step) {
    const int nc = n - c0 < step ? n - c0 : step;
    if (t == T_Q5_K) {
      for (int r = 0; r < R; r++) {
        lsp_mc_q5_K(K, (const block_q5_K *) (w + r * rs), y + c0 * ys, ys, nc, o);
        for (int c = 0; c < nc; c++) out[(c0 + c) * R + r] = o[c];
      }
      continue;
    }
#ifdef LSP_MC_Q4_0X8
    lsp_mc_q8_0_prepare(K, y + c0 * ys, ys, nc, codes, d);
    for (int g = 0; g < R / 8; g++) {
#ifdef LSP_MC_Q8_0
      if (t == T_Q8_0) lsp_mc_q8_0x8(K, (const block_q8_0 *) (w + 8 * g * rs), rs, codes, d, nc, o);
      else
#endif
      lsp_mc_q4_0x8(K, wx + (size_t) g * (K / 32) * 144, codes, d, nc, o);
      for (int c = 0; c < nc; c++) for (int r = 0; r < 8; r++) out[(c0 + c) * R + 8 * g + r] = o[8 * c + r];
    }
#endif
  }
}

int main(int argc, char ** argv) {
  ggml_cpu_init();
  int K = atoi(argv[1]), R = atoi(argv[2]);
  for (int t = 0; t < 3; t++) {
#ifndef LSP_MC_Q8_0
    if (t == T_Q8_0) continue;   // the AVX2 build has no Q8_0 rows' kernel
#endif
    enum ggml_type type = t == T_Q8_0 ? GGML_TYPE_Q8_0 : t == T_Q4_0X8 ? GGML_TYPE_Q4_0 : GGML_TYPE_Q5_K;
    enum ggml_type yt = t == T_Q5_K ? GGML_TYPE_Q8_K : GGML_TYPE_Q8_0;
    vec_dot_t vd = t == T_Q8_0 ? ggml_vec_dot_q8_0_q8_0 : t == T_Q4_0X8 ? ggml_vec_dot_q4_0_q8_0 : ggml_vec_dot_q5_K_q8_K;
    size_t rs = ggml_row_size(type, K), ys = ggml_row_size(yt, K);
    float * f = malloc(sizeof(float) * K * R); for (long i = 0; i < (long) K * R; i++) f[i] = rnd();
    char * w = malloc(rs * R); ggml_quantize_chunk(type, f, w, 0, R, K, NULL);
    uint8_t * wx = NULL;
    if (t == T_Q4_0X8) {
      int nb = K / 32; wx = malloc((size_t) (R / 8) * nb * 144);
      for (int g = 0; g < R / 8; g++) for (int b = 0; b < nb; b++) {
        block_q4_0 in[8]; for (int r = 0; r < 8; r++) in[r] = ((block_q4_0 *) (w + (8 * g + r) * rs))[b];
        repack_q4_0x8(in, wx + ((size_t) g * nb + b) * 144);
      }
    }
    char * y = malloc(ys * 16); float * a = malloc(sizeof(float) * K);
    for (int c = 0; c < 16; c++) {
      for (int i = 0; i < K; i++) a[i] = rnd() * (1 + c % 3);
      if (t == T_Q5_K) quantize_row_q8_K(a, y + c * ys, K); else quantize_row_q8_0(a, y + c * ys, K);
    }
    char * yp = malloc(ys * 16); memcpy(yp, y, ys * 16);
    if (t == T_Q5_K) for (int c = 0; c < 16; c++) lsp_mc_permute_q8_K((block_q8_K *) (yp + c * ys), K / 256);
    uint8_t * codes = malloc(8 * K); float * d = malloc(8 * 4 * (K / 32));
    float * ref = malloc(sizeof(float) * R * 16), * got = malloc(sizeof(float) * R * 16), * wide = malloc(sizeof(float) * R * 16);
    for (int r = 0; r < R; r++) for (int c = 0; c < 16; c++) vd(K, &ref[c * R + r], 0, w + r * rs, 0, y + c * ys, 0, 1);
    double scale = 0; for (int i = 0; i < R * 16; i++) if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    run(t, K, R, w, rs, wx, yp, ys, codes, d, 16, wide);
    double maxrel = 0; int mism = 0;
    for (int n = 1; n <= 16; n++) {
      run(t, K, R, w, rs, wx, yp, ys, codes, d, n, got);
      for (int i = 0; i < n * R; i++) {
        double e = fabs(got[i] - ref[i]) / scale; if (e > maxrel) maxrel = e;
        if (got[i] != wide[i]) mism++;
      }
    }
    printf("%s K=%d R=%d max err %.2e of the output's scale, results differing across widths: %d\n", names[t], K, R, maxrel, mism);
    for (int n = 1; n <= 16; n *= 2) {
      int reps = 20; double t0 = now();
      for (int rep = 0; rep < reps; rep++) for (int r = 0; r < R; r++) for (int c = 0; c < n; c++) vd(K, &ref[c], 0, w + r * rs, 0, y + c * ys, 0, 1);
      double tv = (now() - t0) / reps; t0 = now();
      for (int rep = 0; rep < reps; rep++) run(t, K, R, w, rs, wx, yp, ys, codes, d, n, got);
      double tm = (now() - t0) / reps;
      printf("  n=%2d vec_dot %.3f ms  multicol %.3f ms  (%.2fx faster)\n", n, tv * 1e3, tm * 1e3, tv / tm);
    }
  }
}
