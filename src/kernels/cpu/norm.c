/* norm.c - LayerNorm over the last axis, forward and backward.
 *
 * Forward takes each contiguous row in two passes, mean then biased variance
 * of (x - mean) (more accurate than E[x^2] - mean^2), then writes the
 * normalized, scaled and shifted row; eps is 1e-5 as in GPT-2. Backward uses
 * the saved mean and rstd. Rows are independent, so threads split rows; the
 * weight and bias gradients sum over rows, so they come from a second loop
 * that threads split by column slices (on one thread this also measured
 * faster than folding them into the row loop).
 */
#include "kern_internal.h"

#define LN_EPS 1e-5f

/* Columns per thread task for dw, db with several threads. */
#define LN_COLS 64

/* One row: out (C), returns mean and rstd. */
static void ln_fwd_row(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       int C) {
    float m = kern_sum(x, C) / (float)C;
    float acc[KERN_LANES] = {0};
    int c = 0;
    for (; c + KERN_LANES <= C; c += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) {
            float d = x[c + l] - m;
            acc[l] += d * d;
        }
    float var = 0.0f;
    for (; c < C; c++) var += (x[c] - m) * (x[c] - m);
    for (int l = 0; l < KERN_LANES; l++) var += acc[l];
    float s = 1.0f / sqrtf(var / (float)C + LN_EPS);
    for (c = 0; c < C; c++) out[c] = (x[c] - m) * s * w[c] + b[c];
    *mean = m;
    *rstd = s;
}

void loom_cpu_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C) {
    /* out (N,C), mean (N), rstd (N), inp (N,C), w (C), b (C) */
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++)
        ln_fwd_row(out + (size_t)i * C, mean + i, rstd + i, inp + (size_t)i * C, w, b, C);
}

/* mean over the row of g = dout * w and of g * xhat, xhat = (x - mean) rstd. */
static void ln_bwd_row_means(float *mg, float *mgx, const float *dout, const float *x, const float *w,
                             float mean, float rstd, int C) {
    float sg[KERN_LANES] = {0}, sgx[KERN_LANES] = {0};
    int c = 0;
    for (; c + KERN_LANES <= C; c += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) {
            float g = dout[c + l] * w[c + l];
            sg[l] += g;
            sgx[l] += g * ((x[c + l] - mean) * rstd);
        }
    float a = 0.0f, b = 0.0f;
    for (; c < C; c++) {
        float g = dout[c] * w[c];
        a += g;
        b += g * ((x[c] - mean) * rstd);
    }
    for (int l = 0; l < KERN_LANES; l++) a += sg[l], b += sgx[l];
    *mg = a / (float)C;
    *mgx = b / (float)C;
}

/* One row: dx (C) += rstd (g - mean(g) - xhat mean(g xhat)). */
static void ln_bwd_row(float *dx, const float *dout, const float *x, const float *w, float mean, float rstd,
                       int C) {
    float mg, mgx;
    ln_bwd_row_means(&mg, &mgx, dout, x, w, mean, rstd, C);
    for (int c = 0; c < C; c++) {
        float xhat = (x[c] - mean) * rstd;
        dx[c] += rstd * (dout[c] * w[c] - mg - xhat * mgx);
    }
}

/* dw (nc) += sum_i dout[i] * xhat[i], db (nc) += sum_i dout[i] over all N
 * rows, for the column slice starting at c0 (row stride C). */
static void ln_bwd_params(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                          const float *rstd, int N, int C, int c0, int nc) {
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C + c0; /* (nc) */
        const float *x = inp + (size_t)i * C + c0;  /* (nc) */
        float m = mean[i], s = rstd[i];
        if (dw)
            for (int c = 0; c < nc; c++) dw[c] += d[c] * ((x[c] - m) * s);
        if (db) kern_add_row(db, d, nc);
    }
}

/* Rows go to threads for dinp; then column slices (all of C on one thread)
 * for dw and db. Every output may be NULL. */
void loom_cpu_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
    /* dinp (N,C) +=, dw (C) +=, db (C) +=; dout (N,C), inp (N,C), w (C), mean (N), rstd (N) */
    int nth = kern_threads(ctx);
    if (dinp) {
        KERN_PARALLEL_FOR(nth)
        for (int i = 0; i < N; i++)
            ln_bwd_row(dinp + (size_t)i * C, dout + (size_t)i * C, inp + (size_t)i * C, w, mean[i], rstd[i],
                       C);
    }
    if (!dw && !db) return;
    int cols = nth > 1 ? LN_COLS : C;
    int ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols;
        int nc = C - c0 < cols ? C - c0 : cols;
        ln_bwd_params(dw ? dw + c0 : NULL, db ? db + c0 : NULL, dout, inp, mean, rstd, N, C, c0, nc);
    }
}
