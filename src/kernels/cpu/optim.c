/* optim.c - the AdamW update, following torch.optim.AdamW (torch 1.13,
 * single-tensor path) operation by operation:
 *   g *= gscale   (the clip factor, 1 without clipping; g itself is left as it is)
 *   p *= 1 - lr*wd
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * The per-step scalars are computed in double, as Python computes them, and
 * rounded to float once. The loop is elementwise and shared out over threads
 * in blocks; every rank calls it on its own shard, nothing is collective.
 */
#include "kern_vec.h"
#include "loom/bf16.h"

/* Per-step constants of the update, already rounded to float. */
typedef struct {
    float decay;     /* 1 - lr*wd */
    float b1, c1;    /* beta1, 1 - beta1 */
    float b2, c2;    /* beta2, 1 - beta2 */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
    float step_size; /* lr / (1 - beta1^t) */
    float eps;
    float gscale; /* gradient clip factor: g * gscale, as a separate scale pass would store it */
} adamw_consts;

/* The update of element i, as torch does it (adamw_span's scalar part). */
static inline void adamw_one(float *p, const float *g, float *m, float *v, size_t i, const adamw_consts *k,
                             float *gz, uint16_t *p16) {
    float gi = g[i] * k->gscale;
    if (gz) gz[i] = 0.0f;
    float mi = m[i] * k->b1 + k->c1 * gi;
    float vi = v[i] * k->b2 + k->c2 * gi * gi;
    float denom = kern_sqrtf(vi) / k->bc2_sqrt + k->eps;
    p[i] = p[i] * k->decay + -k->step_size * (mi / denom);
    if (p16) p16[i] = loom_bf16_from_f32(p[i]);
    m[i] = mi;
    v[i] = vi;
}

/* The update of one block: KV lanes at a time (kern_vec.h), the same
 * operations as the scalar elements, so the same floats. With AVX-512 the
 * bf16 bits go out with non-temporal stores from the first element at a
 * 32-byte boundary of the copy (the elements before it one at a time):
 * nothing reads them before the next step's GEMMs, and a plain store first
 * reads each line it writes - 0.4-0.7 ms of a 16.3M-parameter update. */
static void adamw_span(float *p, const float *g, float *m, float *v, size_t n, const adamw_consts *k,
                       float *gz, uint16_t *p16) {
    const kvf vdecay = kv_set1(k->decay), vb1 = kv_set1(k->b1), vc1 = kv_set1(k->c1), vb2 = kv_set1(k->b2);
    const kvf vc2 = kv_set1(k->c2), vbc2s = kv_set1(k->bc2_sqrt), vneg = kv_set1(-k->step_size);
    const kvf veps = kv_set1(k->eps), vgs = kv_set1(k->gscale);
    size_t i = 0;
#if defined(KV_STREAM_BF16)
    if (p16) {
        size_t peel = ((KV_STREAM_ALIGN - (uintptr_t)p16 % KV_STREAM_ALIGN) % KV_STREAM_ALIGN) / sizeof *p16;
        for (; i < n && i < peel; i++) adamw_one(p, g, m, v, i, k, gz, p16);
    }
#endif
    for (; i + KV <= n; i += KV) {
        kvf gi = kv_load(g + i) * vgs;
        if (gz) kv_store(gz + i, kv_set1(0.0f));
        kvf mi = kv_load(m + i) * vb1 + vc1 * gi;
        kvf vi = kv_load(v + i) * vb2 + vc2 * gi * gi;
        kvf denom = kv_sqrtf(vi) / vbc2s + veps;
        kvf pi = kv_load(p + i) * vdecay + vneg * (mi / denom);
        kv_store(p + i, pi);
#if defined(KV_STREAM_BF16)
        if (p16) kv_stream_bf16(p16 + i, pi);
#else
        if (p16) kv_store_bf16(p16 + i, pi);
#endif
        kv_store(m + i, mi);
        kv_store(v + i, vi);
    }
    for (; i < n; i++) adamw_one(p, g, m, v, i, k, gz, p16);
#if defined(KV_STREAM_BF16)
    if (p16) kv_stream_fence();
#endif
}

/* The update over n elements in blocks over the kernels' threads; gz: NULL,
 * or g itself to zero each gradient once it has been read; p16: NULL, or
 * where the new parameters' bf16 bits go (loom_cpu_bf16_pack's). */
static void adamw_run(int nth, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float wd, int t, float gscale, float *gz, uint16_t *p16) {
    adamw_consts k = {
        .decay = (float)(1.0 - (double)lr * (double)wd),
        .b1 = beta1,
        .c1 = (float)(1.0 - (double)beta1),
        .b2 = beta2,
        .c2 = (float)(1.0 - (double)beta2),
        .bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t)),
        .step_size = (float)((double)lr / (1.0 - pow((double)beta1, (double)t))),
        .eps = eps,
        .gscale = gscale,
    };
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    KERN_PARALLEL_FOR(nth)
    for (size_t b = 0; b < nblk; b++) {
        size_t lo = b * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        adamw_span(p + lo, g + lo, m + lo, v + lo, len, &k, gz ? gz + lo : NULL, p16 ? p16 + lo : NULL);
    }
}

void loom_cpu_adamw_update(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                           float beta1, float beta2, float eps, float wd, int t, float gscale) {
    /* p (n), g (n), m (n), v (n); g read only */
    adamw_run(kern_threads(ctx), p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, NULL, NULL);
}

void loom_cpu_adamw_update_zero(void *ctx, float *p, float *g, float *m, float *v, size_t n, float lr,
                                float beta1, float beta2, float eps, float wd, int t, float gscale,
                                uint16_t *p16) {
    /* as loom_cpu_adamw_update, and g (n) = 0 afterwards: the next step's
     * gradient zeroing done while each gradient is in a register; p16 (n,
     * unless NULL) = the bf16 bits of the new p */
    adamw_run(kern_threads(ctx), p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, g, p16);
}
