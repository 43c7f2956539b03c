// Probe: Q6_K rows repacked 8 at a time (multicol.h's lsp_block_q6_Kx8 and lsp_mc_q6_Kx8, packaging/
// patches/ggml-cpu-multicol-q6k-x8.patch) against the plain-layout Q6_K kernel of the same header and
// ggml's vec_dot per column, one thread, random data: the largest difference to vec_dot relative to
// the output's scale, whether a column's result changes with the batch width, and ms per width 1..8
// and 16. R past the caches (151936: the reference target's output matrix) shows the rows streamed
// from memory. docs/decisions/0039's kernel figures came from this probe (AVX-512), when it carried its own
// copy of the layout with the prefetch threshold as a switch (git history: d9448b3). Build as
// rows_probe.c, against a tree with all of packaging/patches:
//   gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2 q6k_x8_probe.c
//       -I$S/src/ggml-cpu -I$S/include -I$S/src -L$L -lggml -lggml-base -lggml-cpu -lm
//       -Wl,-rpath,$L -o probe && ./probe K ROWS      (e.g. 1536 2048, 8960 1536, 1536 151936)
// (the AVX2 kernel: the same line without the -mavx512* flags, against an AVX2 build of ggml; 0040's
// figures came from that)
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
  lsp_block_q6_Kx8 *wx = malloc(sizeof(lsp_block_q6_Kx8)*(size_t)(R/8)*nb);
  for (int g=0; g<R/8; g++) for (int b=0;b<nb;b++) lsp_mc_make_q6_Kx8((const block_q6_K*)(w+(size_t)8*g*rs)+b, nb, &wx[(size_t)g*nb+b]);
  char *y = malloc(ys*16); float *a = malloc(sizeof(float)*K);
  for (int c=0;c<16;c++){ for(int i=0;i<K;i++) a[i]=rnd()*(1+c%3); quantize_row_q8_K(a, y+c*ys, K);}
  char *yp = malloc(ys*16); memcpy(yp, y, ys*16); for (int c=0;c<16;c++) lsp_mc_permute_q8_K((block_q8_K*)(yp+c*ys), nb);
  char *yx = malloc(ys*16); memcpy(yx, y, ys*16); for (int c=0;c<16;c++) lsp_mc_permute_q8_K_x8((block_q8_K*)(yx+c*ys), nb);
  int Rc = R < 4096 ? R : 4096;   // rows checked
  float *ref = malloc(sizeof(float)*Rc*16), *wide = malloc(sizeof(float)*Rc*16);
  for (int r=0;r<Rc;r++) for(int c=0;c<16;c++) ggml_vec_dot_q6_K_q8_K(K, &ref[c*Rc+r], 0, w+(size_t)r*rs, 0, y+c*ys, 0, 1);
  double maxrel=0; int mism=0; float o[64];
  for (int n=16;n>=1;n--){
    for (int g=0; g<Rc/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_X8_COLS){ int nc=n-c0<LSP_MC_X8_COLS?n-c0:LSP_MC_X8_COLS;
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
    for (int rep=0;rep<reps;rep++) for (int g=0; g<R/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_X8_COLS){ int nc=n-c0<LSP_MC_X8_COLS?n-c0:LSP_MC_X8_COLS; lsp_mc_q6_Kx8(K, (const uint8_t*)&wx[(size_t)g*nb], yx+c0*ys, ys, nc, o);}
    double tx=(now()-t0)/reps;
    printf("  n=%2d vec_dot %.3f ms  plain kernel %.3f ms  x8 kernel %.3f ms  (x8 %.2fx the plain kernel's speed)\n", n, tv*1e3, tp*1e3, tx*1e3, tp/tx); }
}
