// Probe: the repacked Q4_K kernel (repack.cpp's q4_K_8x8 path; the repacking is redone here as ggml's make_block_q4_Kx8 does it) of packaging/patches' multicol.h against
// ggml's vec_dot per column, one thread, on random data: the largest difference relative to the
// output's scale, whether a column's result changes with the batch width, and ms per width.
// The figures in docs/decisions/0022 came from this probe. Build against a patched sdist's ggml
// (S: its vendor/llama.cpp/ggml; L: the folder of the installed libggml*.so):
//   gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2 repacked_probe.c \
//       -I$S/src/ggml-cpu -I$S/include -I$S/src -L$L -lggml -lggml-base -lggml-cpu -lm \
//       -Wl,-rpath,$L -o probe && ./probe K ROWS      (e.g. 1536 2048, 8960 1536)
// (the AVX2 build of the kernels: the same line without the -mavx512* flags, against an AVX2 build)
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
#include "multicol.h"
void ggml_cpu_init(void);
void ggml_vec_dot_q4_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float rnd(){return ((rand()%20001)-10000)/10000.0f;}
typedef struct { uint16_t d[8], dmin[8]; uint8_t scales[96]; uint8_t qs[1024]; } x8_t;
static x8_t make_x8(const block_q4_K *in) {
  x8_t out; for (int i=0;i<8;i++){ out.d[i]=in[i].d; out.dmin[i]=in[i].dmin; }
  for (int i=0;i<128;i++){ int src=i%8, so=(i/8)*8; memcpy(&out.qs[i*8], &in[src].qs[so], 8); }
  uint8_t s[8], m[8];
  for (int i=0;i<4;i++){ for(int j=0;j<8;j++){ s[j]=in[j].scales[i]&63; m[j]=in[j].scales[i+4]&63; }
    for(int k=0;k<4;k++){ out.scales[i*12+k]=(s[k]&63)+((s[k+4]&48)<<2); out.scales[i*12+4+k]=(m[k]&63)+((m[k+4]&48)<<2); out.scales[i*12+8+k]=(s[k+4]&15)+((m[k+4]&15)<<4);} }
  for (int i=0;i<4;i++){ for(int j=0;j<8;j++){ s[j]=((in[j].scales[i]&192)>>2)|(in[j].scales[i+8]&15); m[j]=((in[j].scales[i+4]&192)>>2)|((in[j].scales[i+8]&240)>>4); }
    for(int k=0;k<4;k++){ out.scales[i*12+48+k]=(s[k]&63)+((s[k+4]&48)<<2); out.scales[i*12+52+k]=(m[k]&63)+((m[k+4]&48)<<2); out.scales[i*12+56+k]=(s[k+4]&15)+((m[k+4]&15)<<4);} }
  return out;
}
int main(int argc, char**argv){ ggml_cpu_init();
  int K = atoi(argv[1]), R = atoi(argv[2]); int nb = K/256;
  size_t rs = ggml_row_size(GGML_TYPE_Q4_K, K), ys = ggml_row_size(GGML_TYPE_Q8_K, K);
  float *f = malloc(sizeof(float)*K*R); for (long i=0;i<(long)K*R;i++) f[i]=rnd();
  char *w = malloc(rs*R); ggml_quantize_chunk(GGML_TYPE_Q4_K, f, w, 0, R, K, NULL);
  x8_t *wx = malloc(sizeof(x8_t)*(R/8)*nb);
  for (int g=0; g<R/8; g++) for (int b=0;b<nb;b++){ block_q4_K in[8]; for(int r=0;r<8;r++) in[r]=((block_q4_K*)(w+(8*g+r)*rs))[b]; wx[g*nb+b]=make_x8(in); }
  char *y = malloc(ys*16); float *a = malloc(sizeof(float)*K);
  for (int c=0;c<16;c++){ for(int i=0;i<K;i++) a[i]=rnd()*(1+c%3); quantize_row_q8_K(a, y+c*ys, K);}
  float *ref = malloc(sizeof(float)*R*16), *got = malloc(sizeof(float)*R*16), *wide = malloc(sizeof(float)*R*16);
  for (int r=0;r<R;r++) for(int c=0;c<16;c++) ggml_vec_dot_q4_K_q8_K(K, &ref[c*R+r], 0, w+r*rs, 0, y+c*ys, 0, 1);
  double maxrel=0; int mism=0; float o[64];
  for (int n=1;n<=16;n++){
    for (int g=0; g<R/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_X8_COLS){ int nc=n-c0<LSP_MC_X8_COLS?n-c0:LSP_MC_X8_COLS;
      lsp_mc_q4_Kx8(K, (const uint8_t*)&wx[g*nb], y+c0*ys, ys, nc, o);
      for (int c=0;c<nc;c++) for(int r=0;r<8;r++) got[(c0+c)*R+8*g+r]=o[8*c+r]; }
    for (int c=0;c<n;c++) for(int r=0;r<R;r++){ double e=fabs(got[c*R+r]-ref[c*R+r])/(fabs(ref[c*R+r])+1e-3*K); if(e>maxrel) maxrel=e;
      if (n==16) wide[c*R+r]=got[c*R+r]; }
    if (n==16) {} 
  }
  for (int n=2;n<=16;n++){ for (int g=0; g<R/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_X8_COLS){ int nc=n-c0<LSP_MC_X8_COLS?n-c0:LSP_MC_X8_COLS;
      lsp_mc_q4_Kx8(K, (const uint8_t*)&wx[g*nb], y+c0*ys, ys, nc, o);
      for (int c=0;c<nc;c++) for(int r=0;r<8;r++) if (o[8*c+r]!=wide[(c0+c)*R+8*g+r]) mism++; } }
  printf("q4_Kx8 K=%d R=%d max rel err %.2e, differs across widths: %d\n", K, R, maxrel, mism);
  for (int n=1;n<=16;n*=2){ int reps=20; double t0=now();
    for (int rep=0;rep<reps;rep++) for (int r=0;r<R;r++) for (int c=0;c<n;c++) ggml_vec_dot_q4_K_q8_K(K, &ref[c], 0, w+r*rs, 0, y+c*ys, 0, 1);
    double tv=(now()-t0)/reps; t0=now();
    for (int rep=0;rep<reps;rep++) for (int g=0; g<R/8; g++) for (int c0=0;c0<n;c0+=LSP_MC_X8_COLS){ int nc=n-c0<LSP_MC_X8_COLS?n-c0:LSP_MC_X8_COLS; lsp_mc_q4_Kx8(K, (const uint8_t*)&wx[g*nb], y+c0*ys, ys, nc, o);}
    double tm=(now()-t0)/reps;
    printf("  n=%2d vec_dot %.3f ms  x8 kernel %.3f ms  (%.2fx faster)\n", n, tv*1e3, tm*1e3, tv/tm); }
}
