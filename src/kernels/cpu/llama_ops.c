/* llama_ops.c - the Llama family's block parts on the CPU: RMSNorm,
 * SwiGLU and rotary positions, forward and backward.
 *
 * RMSNorm keeps KERN_LANES running sums of squares per row (the order of
 * the sum is fixed, so any thread count gives the same floats), saves
 * rstd = 1/sqrt(mean(x^2) + eps) and writes x * rstd * w; its backward is
 * dx = rstd (g - x rstd^2 mean(g x)), g = dout * w, and dw = sum over rows
 * of dout * x * rstd (threads split columns for it, as norm.c does).
 * SwiGLU multiplies silu(gate) by up with the exponential of kern_vec.h, so
 * gcc keeps the loops vectorised. RoPE computes each row's cos and sin once
 * for all its heads (cosf / sinf of a float angle, as Hugging Face takes
 * them in float32) and rotates the pairs (i, i + HS/2) in place.
 */
#include <math.h>

#include "kern_vec.h"

/* Columns per thread task for dw with several threads. */
#define RMS_COLS 64
/* The largest head size rope takes (its cos / sin live on the stack). */
#define ROPE_MAX_HS 1024

static float rms_sumsq(const float *x, int C) {
    float acc[KERN_LANES] = {0};
    int c = 0;
    for (; c + KERN_LANES <= C; c += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) acc[l] += x[c + l] * x[c + l];
    float s = 0.0f;
    for (; c < C; c++) s += x[c] * x[c];
    for (int l = 0; l < KERN_LANES; l++) s += acc[l];
    return s;
}

void loom_cpu_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps) {
    /* out (N,C), rstd (N), inp (N,C), w (C) */
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *o = out + (size_t)i * C;
        float r = 1.0f / sqrtf(rms_sumsq(x, C) / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
        rstd[i] = r;
    }
}

/* One row: dx (C) += r (g - x r^2 mean(g x)), g = dout * w. */
static void rms_bwd_row(float *dx, const float *dout, const float *x, const float *w, float r, int C) {
    float acc[KERN_LANES] = {0};
    int c = 0;
    for (; c + KERN_LANES <= C; c += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) acc[l] += dout[c + l] * w[c + l] * x[c + l];
    float s = 0.0f;
    for (; c < C; c++) s += dout[c] * w[c] * x[c];
    for (int l = 0; l < KERN_LANES; l++) s += acc[l];
    float k = r * r * (s / (float)C);
    for (c = 0; c < C; c++) dx[c] += r * (dout[c] * w[c] - x[c] * k);
}

void loom_cpu_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C) {
    /* dinp (N,C) +=, dw (C) +=; dout (N,C), inp (N,C), w (C), rstd (N) */
    int nth = kern_threads(ctx);
    if (dinp) {
        KERN_PARALLEL_FOR(nth)
        for (int i = 0; i < N; i++)
            rms_bwd_row(dinp + (size_t)i * C, dout + (size_t)i * C, inp + (size_t)i * C, w, rstd[i], C);
    }
    if (!dw) return;
    int cols = nth > 1 ? RMS_COLS : C;
    int ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols, nc = C - c0 < cols ? C - c0 : cols;
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * C + c0, *x = inp + (size_t)i * C + c0;
            float r = rstd[i];
            for (int c = 0; c < nc; c++) dw[c0 + c] += d[c] * (x[c] * r);
        }
    }
}

/* exp(-g), its argument capped at 80 (silu(g) is then g * 1e-35: 0 as it should be). */
static inline float silu_exp_neg(float g) {
    float z = -g;
    return kern_expf(z > 80.0f ? 80.0f : z);
}
static inline kvf silu_exp_neg_v(kvf g) {
    kvf z = -g;
    return kv_expf(kv_sel(z > kv_set1(80.0f), kv_set1(80.0f), z));
}

static void swiglu_fwd_row(float *out, const float *g, const float *u, int H) {
    int i = 0;
    for (; i + KV <= H; i += KV) {
        kvf x = kv_load(g + i);
        kv_store(out + i, x / (kv_set1(1.0f) + silu_exp_neg_v(x)) * kv_load(u + i));
    }
    for (; i < H; i++) out[i] = g[i] / (1.0f + silu_exp_neg(g[i])) * u[i];
}

/* s = sigmoid(g): d gate = dout u s (1 + g (1 - s)), d up = dout silu(g). */
static void swiglu_bwd_row(float *dg, float *du, const float *g, const float *u, const float *d, int H) {
    const kvf one = kv_set1(1.0f);
    int i = 0;
    for (; i + KV <= H; i += KV) {
        kvf x = kv_load(g + i), dd = kv_load(d + i);
        kvf s = one / (one + silu_exp_neg_v(x));
        kv_store(dg + i, dd * kv_load(u + i) * (s * (one + x * (one - s))));
        kv_store(du + i, dd * (x * s));
    }
    for (; i < H; i++) {
        float x = g[i], s = 1.0f / (1.0f + silu_exp_neg(x));
        dg[i] = d[i] * u[i] * (s * (1.0f + x * (1.0f - s)));
        du[i] = d[i] * (x * s);
    }
}

void loom_cpu_swiglu_fwd(void *ctx, float *out, const float *gu, int N, int H) {
    /* out (N,H), gu (N,2H) */
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int r = 0; r < N; r++) {
        const float *g = gu + (size_t)r * 2 * H;
        swiglu_fwd_row(out + (size_t)r * H, g, g + H, H);
    }
}

void loom_cpu_swiglu_bwd(void *ctx, float *dgu, const float *gu, const float *dout, int N, int H) {
    /* dgu (N,2H) writes; gu (N,2H), dout (N,H) */
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int r = 0; r < N; r++) {
        const float *g = gu + (size_t)r * 2 * H;
        float *dg = dgu + (size_t)r * 2 * H;
        swiglu_bwd_row(dg, dg + H, g, g + H, dout + (size_t)r * H, H);
    }
}

void loom_cpu_rope(void *ctx, float *x, int ld, const int32_t *pos, const float *inv_freq, int N, int nh,
                   int HS, int inverse) {
    /* x rows (N, ld): heads h < nh of HS floats rotated in place */
    const int half = HS / 2;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int r = 0; r < N; r++) {
        float cs[ROPE_MAX_HS / 2], sn[ROPE_MAX_HS / 2];
        for (int i = 0; i < half; i++) {
            float f = (float)pos[r] * inv_freq[i];
            cs[i] = cosf(f);
            sn[i] = inverse ? -sinf(f) : sinf(f);
        }
        for (int h = 0; h < nh; h++) {
            float *a = x + (size_t)r * ld + (size_t)h * HS, *b = a + half;
            for (int i = 0; i < half; i++) {
                float xa = a[i], xb = b[i];
                a[i] = xa * cs[i] - xb * sn[i];
                b[i] = xb * cs[i] + xa * sn[i];
            }
        }
    }
}
