/* activations.c - GELU (tanh approximation), forward and backward.
 *
 * gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as GPT-2
 * and torch's approximate='tanh'. Since 0.5 (1 + tanh(u)) = sigmoid(2u), we
 * evaluate gelu(x) = x / (1 + exp(-2u)) with the inline kern_expf: no libm
 * call in the loop, so gcc vectorizes it, and no cancellation for large |u|.
 * The derivative is s + 2 x u' s (1 - s) with s = sigmoid(2u) and
 * 1 - s = exp(-2u) s. Loops are split into blocks shared out over threads.
 */
#include "kern_vec.h"

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* exp(-2u) with its argument capped at 80 so that exp(-2u) * s stays finite
 * (1 - s is then ~1e-35, which is what it should be). */
static inline float gelu_exp_m2u(float x) {
    float z = -2.0f * GELU_K0 * (x + GELU_K1 * x * x * x);
    z = z > 80.0f ? 80.0f : z;
    return kern_expf(z);
}

/* gelu_exp_m2u on KV lanes, operation for operation. */
static inline kvf gelu_exp_m2u_v(kvf x) {
    kvf z = kv_set1(-2.0f * GELU_K0) * (x + kv_set1(GELU_K1) * x * x * x);
    z = kv_sel(z > kv_set1(80.0f), kv_set1(80.0f), z);
    return kv_expf(z);
}

static void gelu_fwd_span(float *out, const float *inp, size_t n) {
    size_t i = 0;
    for (; i + KV <= n; i += KV) {
        kvf x = kv_load(inp + i);
        kv_store(out + i, x / (kv_set1(1.0f) + gelu_exp_m2u_v(x)));
    }
    for (; i < n; i++) {
        float x = inp[i];
        out[i] = x / (1.0f + gelu_exp_m2u(x));
    }
}

static void gelu_bwd_span(float *dinp, const float *inp, const float *dout, size_t n) {
    const kvf one = kv_set1(1.0f);
    size_t i = 0;
    for (; i + KV <= n; i += KV) {
        kvf x = kv_load(inp + i);
        kvf e = gelu_exp_m2u_v(x);
        kvf s = one / (one + e);
        kvf du = kv_set1(GELU_K0) * (one + kv_set1(3.0f * GELU_K1) * x * x);
        kvf grad = s + kv_set1(2.0f) * x * s * (du * (e * s));
        kv_store(dinp + i, kv_load(dinp + i) + grad * kv_load(dout + i));
    }
    for (; i < n; i++) {
        float x = inp[i];
        float e = gelu_exp_m2u(x);
        float s = 1.0f / (1.0f + e);
        float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
        float grad = s + 2.0f * x * s * (du * (e * s)); /* du * 0 before x * du can overflow */
        dinp[i] += grad * dout[i];
    }
}

void loom_cpu_gelu_fwd(void *ctx, float *out, const float *inp, size_t n) {
    /* out (n), inp (n) */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        gelu_fwd_span(out + lo, inp + lo, len);
    }
}

void loom_cpu_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n) {
    /* dinp (n) +=, inp (n), dout (n) */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        gelu_bwd_span(dinp + lo, inp + lo, dout + lo, len);
    }
}
