// Probe: the plain-row Q4_K and Q6_K kernels (ggml-cpu.c's path) of packaging/patches' multicol.h against
// ggml's vec_dot per column, one thread, on random data: the largest difference relative to the
// output's scale, whether a column's result changes with the batch width, and ms per width.
// The figures in docs/decisions/0022 came from this probe. Build against a patched sdist's ggml
// (S: its vendor/llama.cpp/ggml; L: the folder of the installed libggml*.so):
//   gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2 rows_probe.c \
//       -I$S/src/ggml-cpu -I$S/include -I$S/src -L$L -lggml -lggml-base -lggml-cpu -lm \
//       -Wl,-rpath,$L -o probe && ./probe K ROWS      (e.g. 1536 2048, 8960 1536)
// (the AVX2 build of the kernels: the same line without the -mavx512* flags, against an AVX2 build)
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
void ggml_vec_dot_q4_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q6_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float rnd(){return ((rand()%20001)-10000)/10000.0f;}
void ggml_cpu_init(void);
int main(int argc, char**argv){ ggml_cpu_init();
  int K = atoi(argv[1]), R = atoi(argv[2]);
  for (int t = 0; t < 2; t++) {
    enum ggml_type type = t==0 ? GGML_TYPE_Q4_K : GGML_TYPE_Q6_K;
    size_t rs = ggml_row_size(type, K), ys = ggml_row_size(GGML_TYPE_Q8_K, K);
    float *f = malloc(sizeof(float)*K*R); for (long i=0;i<(long)K*R;i++) f[i]=rnd();
    char *w = malloc(rs*R); ggml_quantize_chunk(type, f, w, 0, R, K, NULL);
    char *y = malloc(ys*16); float *a = malloc(sizeof(float)*K);
    for (int c=0;c<16;c++){ for(int i=0;i<K;i++) a[i]=rnd()*(1+c%3); quantize_row_q8_K(a, y+c*ys, K);}
    char *yp = malloc(ys*16); memcpy(yp, y, ys*16); for (int c=0;c<16;c++) lsp_mc_permute_q8_K((block_q8_K*)(yp+c*ys), K/256);
    float *ref = malloc(sizeof(float)*R*16), *got = malloc(sizeof(float)*R*16), *one = malloc(sizeof(float)*R*16);
    for (int r=0;r<R;r++) for(int c=0;c<16;c++) {
      if (t==0) ggml_vec_dot_q4_K_q8_K(K, &ref[r*16+c], 0, w+r*rs, 0, y+c*ys, 0, 1);
      else ggml_vec_dot_q6_K_q8_K(K, &ref[r*16+c], 0, w+r*rs, 0, y+c*ys, 0, 1);
    }
    double maxrel = 0; int mism = 0;
    for (int n=1;n<=16;n++){
      for (int r=0;r<R;r++) for (int c0=0;c0<n;c0+=LSP_MC_MAX_COLS){ int nc = n-c0<LSP_MC_MAX_COLS?n-c0:LSP_MC_MAX_COLS;
        if (t==0) lsp_mc_q4_K(K,(const block_q4_K*)(w+r*rs), yp+c0*ys, ys, nc, &got[r*16+c0]);
        else lsp_mc_q6_K(K,(const block_q6_K*)(w+r*rs), yp+c0*ys, ys, nc, &got[r*16+c0]); }
      for (int r=0;r<R;r++) for(int c=0;c<n;c++){
        double e = fabs(got[r*16+c]-ref[r*16+c])/(fabs(ref[r*16+c])+1e-3*K); if(e>maxrel) maxrel=e;
        if (n==1 && c==0) one[r]=got[r*16];
        if (c==0 && got[r*16]!=one[r]) mism++; }
    }
    printf("%s K=%d R=%d max rel err %.2e, col0 differs across widths: %d\n", t?"q6_K":"q4_K", K, R, maxrel, mism);
    for (int n=1;n<=16;n*=2){
      int reps = 20; double t0=now();
      for (int rep=0;rep<reps;rep++) for (int r=0;r<R;r++) for (int c=0;c<n;c++){
        if (t==0) ggml_vec_dot_q4_K_q8_K(K, &ref[c], 0, w+r*rs, 0, y+c*ys, 0, 1);
        else ggml_vec_dot_q6_K_q8_K(K, &ref[c], 0, w+r*rs, 0, y+c*ys, 0, 1);}
      double tv=(now()-t0)/reps; t0=now();
      for (int rep=0;rep<reps;rep++) for (int r=0;r<R;r++) for (int c0=0;c0<n;c0+=LSP_MC_MAX_COLS){ int nc=n-c0<LSP_MC_MAX_COLS?n-c0:LSP_MC_MAX_COLS;
        if (t==0) lsp_mc_q4_K(K,(const block_q4_K*)(w+r*rs), yp+c0*ys, ys, nc, &got[c0]);
        else lsp_mc_q6_K(K,(const block_q6_K*)(w+r*rs), yp+c0*ys, ys, nc, &got[c0]); }
      double tm=(now()-t0)/reps;
      printf("  n=%2d vec_dot %.3f ms  multicol %.3f ms  (%.2fx faster)\n", n, tv*1e3, tm*1e3, tv/tm);
    }
  }
}
