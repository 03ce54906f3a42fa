/* encoder.c - token + position embedding, forward and backward.
 *
 * Forward gathers one row of wte per token and adds the row of wpe for its
 * position. Backward scatters dout back into the same rows; since two tokens
 * may share a row of wte, threads split the work by channel slices (every
 * thread walks all tokens but owns a disjoint set of columns), so no two
 * threads ever add into the same float.
 */
#include "kern_internal.h"

/* Columns per thread task in the backward scatter (with several threads). */
#define ENC_COLS 64

void loom_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe,
                      int B, int T, int C) {
    /* out (B,T,C), inp (B,T), wte (V,C), wpe (maxT,C) */
    int N = B * T;
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * C;                /* (C) */
        const float *e = wte + (size_t)inp[i] * C;     /* (C) */
        const float *p = wpe + (size_t)(i % T) * C;    /* (C) */
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void loom_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                      int B, int T, int C) {
    /* dwte (V,C) +=, dwpe (maxT,C) +=, dout (B,T,C), inp (B,T) */
    int N = B * T;
    int nth = loom_kernels_get_threads();
    int cols = nth > 1 ? ENC_COLS : C;
    int ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols;
        int nc = C - c0 < cols ? C - c0 : cols;
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * C + c0; /* (nc) */
            kern_add_row(dwte + (size_t)inp[i] * C + c0, d, nc);
            kern_add_row(dwpe + (size_t)(i % T) * C + c0, d, nc);
        }
    }
}
