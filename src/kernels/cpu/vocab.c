/* vocab.c - vocabulary-parallel token embedding and softmax cross-entropy.
 *
 * Each rank holds a contiguous slice [v0, v0 + V_l) of the vocabulary. The
 * embedding looks up only its own tokens (zeros for the others, summed over
 * the TP group by the caller). The cross-entropy never gathers the logits:
 * the caller all-reduces the row maxima (MAX), then the sums of exponentials
 * and the target logits (SUM) between the three phases here, as Megatron's
 * vocab-parallel cross-entropy does. Padding columns beyond V_valid never
 * enter a max or a sum, so padding cannot change the loss.
 */
#include <math.h>
#include <stdlib.h>

#include "kern_vec.h"
#include "loom/bf16.h"

#define EMB_COLS 64

/* One row of the cross-entropy's gradient: d = (p - onehot(target - v0)) *
 * dloss as p * dloss, then dloss off the target; 0 for target < 0. d may
 * be p. */
static inline void xent_grad_row(float *d, const float *p, int32_t target, int v0, float dloss, int V_l) {
    if (target < 0) {
        memset(d, 0, (size_t)V_l * sizeof(float));
        return;
    }
    for (int j = 0; j < V_l; j++) d[j] = p[j] * dloss;
    int t = target - v0;
    if (t >= 0 && t < V_l) d[t] -= dloss;
}

/* kern_max's float (the same KERN_LANES running maxima, then the tail, then
 * the lanes in order), the lanes as vectors: gcc leaves kern_max scalar. */
static inline float kv_max_row(const float *x, int n) {
    enum { NV = KERN_LANES / KV };
    kvf acc[NV];
    for (int v = 0; v < NV; v++) acc[v] = kv_set1(-INFINITY);
    int i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES)
        for (int v = 0; v < NV; v++) {
            kvf y = kv_load(x + i + v * KV);
#if defined(KV_ZMM)
            acc[v] = (kvf)_mm512_max_ps((__m512)y, (__m512)acc[v]); /* y > acc ? y : acc, NaN: acc */
#elif defined(__AVX__)
            acc[v] = (kvf)_mm256_max_ps((__m256)y, (__m256)acc[v]); /* y > acc ? y : acc, NaN: acc */
#else
            acc[v] = kv_sel(y > acc[v], y, acc[v]);
#endif
        }
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int v = 0; v < NV; v++)
        for (int l = 0; l < KV; l++) m = acc[v][l] > m ? acc[v][l] : m;
    return m;
}

/* e[i] = exp(z[i] - m) over [0..n) (kv_exp_shift's floats; e may be z)
 * and their kern_sum (the same lanes, tail and order), in one pass; next
 * (NULL or n floats) is brought into cache meanwhile: the next row, whose
 * maximum then reads it from cache instead of memory. */
static inline float kv_exp_sum(float *e, const float *z, int n, float m, const float *next) {
    enum { NV = KERN_LANES / KV };
    const kvf mv = kv_set1(m);
    kvf acc[NV];
    for (int v = 0; v < NV; v++) acc[v] = kv_set1(0.0f);
    int i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES) {
        if (next) __builtin_prefetch(next + i, 0, 3); /* KERN_LANES floats: one 64-byte line */
        for (int v = 0; v < NV; v++) {
            kvf y = kv_expf(kv_load(z + i + v * KV) - mv);
            kv_store(e + i + v * KV, y);
            acc[v] += y;
        }
    }
    const int tail = i;
    for (; i + KV <= n; i += KV) kv_store(e + i, kv_expf(kv_load(z + i) - mv));
    for (; i < n; i++) e[i] = kern_expf(z[i] - m);
    float s = 0.0f;
    for (i = tail; i < n; i++) s += e[i];
    for (int v = 0; v < NV; v++)
        for (int l = 0; l < KV; l++) s += acc[v][l];
    return s;
}

void loom_cpu_embed_fwd(void *ctx, float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                        int C) {
    /* out (N,C), tok (N), wte_l (V_l,C) */
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * C;
        int r = tok[i] - v0;
        if (r >= 0 && r < V_l) memcpy(o, wte_l + (size_t)r * C, (size_t)C * sizeof(float));
        else memset(o, 0, (size_t)C * sizeof(float));
    }
}

void loom_cpu_embed_bwd(void *ctx, float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l,
                        int N, int C) {
    /* threads own disjoint column slices: two tokens may share a row */
    int nth = kern_threads(ctx);
    int cols = nth > 1 ? EMB_COLS : C, ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols, nc = C - c0 < cols ? C - c0 : cols;
        for (int i = 0; i < N; i++) {
            int r = tok[i] - v0;
            if (r >= 0 && r < V_l) kern_add_row(dwte_l + (size_t)r * C + c0, dout + (size_t)i * C + c0, nc);
        }
    }
}

void loom_cpu_pos_fwd(void *ctx, float *out, const float *wpe, int row0, int n, int T, int C) {
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < n; i++) kern_add_row(out + (size_t)i * C, wpe + (size_t)((row0 + i) % T) * C, C);
}

void loom_cpu_pos_bwd(void *ctx, float *dwpe, const float *dout, int row0, int n, int T, int C) {
    int nth = kern_threads(ctx);
    int cols = nth > 1 ? EMB_COLS : C, ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols, nc = C - c0 < cols ? C - c0 : cols;
        for (int i = 0; i < n; i++)
            kern_add_row(dwpe + (size_t)((row0 + i) % T) * C + c0, dout + (size_t)i * C + c0, nc);
    }
}

void loom_cpu_vxent_max(void *ctx, float *rowmax, const float *logits, int N, int V_l, int V_valid) {
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++)
        rowmax[i] = V_valid > 0 ? kern_max(logits + (size_t)i * V_l, V_valid) : -INFINITY;
}

void loom_cpu_vxent_exp(void *ctx, float *logits, float *rowsum, float *tgt, const float *gmax,
                        const int32_t *targets, int v0, int N, int V_l, int V_valid) {
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * V_l; /* (V_l) */
        int t = targets[i] - v0;
        tgt[i] = targets[i] >= 0 && t >= 0 && t < V_valid ? z[t] - gmax[i] : 0.0f;
        kv_exp_shift(z, V_valid, gmax[i]);
        for (int j = V_valid; j < V_l; j++) z[j] = 0.0f;
        rowsum[i] = kern_sum(z, V_valid);
    }
}

/* One row of the one-rank cross-entropy up to the scaling: e (V_l) WRITES
 * exp(z - max) (padding 0; e may be z), *loss the row's loss; returns the
 * sum of the exponentials. vxent_max's, vxent_exp's and vxent_finish's
 * floats. next: the row after (prefetched), or NULL. */
static inline float xent_row(float *e, const float *z, int32_t t, int V_l, int V_valid, float *loss,
                             const float *next) {
    float mx = V_valid > 0 ? kv_max_row(z, V_valid) : -INFINITY;
    float tgt = t >= 0 && t < V_valid ? z[t] - mx : 0.0f;
    float sum = kv_exp_sum(e, z, V_valid, mx, next);
    for (int j = V_valid; j < V_l; j++) e[j] = 0.0f;
    *loss = t >= 0 ? logf(sum) - tgt : 0.0f;
    return sum;
}

/* max, exp and finish for one rank holding the whole vocabulary, a row at a
 * time: the row (V_l floats, 196 KiB for GPT-2) comes from memory once for
 * its maximum and stays in cache for the exponentials, their sum and the
 * scaling, where the three phases stream all the logits three times. The
 * same operations in the same order as those phases with v0 = 0, so the
 * same floats (kernels_vocab checks it bit for bit). */
void loom_cpu_vxent_local(void *ctx, float *losses, float *logits, const int32_t *targets, int N, int V_l,
                          int V_valid) {
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * V_l;
        const float *next = i + 1 < N ? z + V_l : NULL;
        kern_scale_row(z, V_l, 1.0f / xent_row(z, z, targets[i], V_l, V_valid, &losses[i], next));
    }
}

/* vxent_local and vxent_bwd (v0 = 0) in the same pass over each row, for a
 * backward that follows with this dloss: after the max, the exponentials,
 * their sum, the loss and the scaling, the row becomes its gradient while
 * it is still in cache - the same operations in the same order, so the same
 * floats. With the bf16 GEMM provider the exponentials go to a scratch row
 * instead of back to the logits, and the gradient's bf16 bits go straight
 * into the logits' kept copy (kern_bf16_keep_filled), which the head's two
 * backward products read: the logits are read once and never written, where
 * the three kernels wrote them twice and read them three times. */
void loom_cpu_vxent_local_grad(void *ctx, float *losses, float *logits, const int32_t *targets, int N,
                               int V_l, int V_valid, float dloss) {
    const size_t n = (size_t)N * V_l;
    int nth = kern_threads(ctx);
    loom_cpu_ctx *c = ctx;
    uint16_t *d16 = kern_bf16_keep_filled(c, logits, n);
    /* the exponentials: a row per thread, the context's scratch */
    float *scratch = d16 ? kern_buf_grow(&c->xent_rows, (size_t)nth * V_l * sizeof(float)) : NULL;
    if (d16 && !scratch) {
        loom_cpu_gemm_unkeep(ctx, logits);
        d16 = NULL;
    }
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * V_l;
        float *e = d16 ? scratch + (size_t)kern_thread_id() * V_l : z;
        const int t = targets[i];
        const float sum = xent_row(e, z, t, V_l, V_valid, &losses[i], i + 1 < N ? z + V_l : NULL);
        /* probability p = e * (1/sum), then p * dloss, less dloss at the
         * target: kern_scale_row and xent_grad_row's roundings, one pass */
        const float inv = 1.0f / sum;
        const kvf iv = kv_set1(inv), dv = kv_set1(dloss);
        if (!d16) {
            if (t < 0) {
                memset(z, 0, (size_t)V_l * sizeof *z);
                continue;
            }
            int j = 0;
            for (; j + KV <= V_l; j += KV) kv_store(z + j, (kv_load(z + j) * iv) * dv);
            for (; j < V_l; j++) z[j] = (z[j] * inv) * dloss;
            if (t < V_l) z[t] -= dloss;
            continue;
        }
        uint16_t *d = d16 + (size_t)i * V_l;
        if (t < 0) {
            memset(d, 0, (size_t)V_l * sizeof *d);
            continue;
        }
        int j = 0;
        for (; j + KV <= V_l; j += KV) kv_store_bf16(d + j, (kv_load(e + j) * iv) * dv);
        for (; j < V_l; j++) d[j] = loom_bf16_from_f32((e[j] * inv) * dloss);
        if (t < V_l) {
            float g = (e[t] * inv) * dloss;
            d[t] = loom_bf16_from_f32(g - dloss);
        }
    }
    if (!d16) loom_cpu_gemm_keep(ctx, logits, n);
}

void loom_cpu_vxent_finish(void *ctx, float *losses, float *probs, const float *gsum, const float *gtgt,
                           const int32_t *targets, int N, int V_l) {
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        losses[i] = targets[i] >= 0 ? logf(gsum[i]) - gtgt[i] : 0.0f;
        kern_scale_row(probs + (size_t)i * V_l, V_l, 1.0f / gsum[i]);
    }
}

void loom_cpu_vxent_bwd(void *ctx, float *dlogits, const float *probs, const int32_t *targets, float dloss,
                        int v0, int N, int V_l) {
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++)
        xent_grad_row(dlogits + (size_t)i * V_l, probs + (size_t)i * V_l, targets[i], v0, dloss, V_l);
}
