/* kern_vec.h - explicit 8-lane float vectors for the elementwise kernels
 * (private to src/kernels/cpu).
 *
 * gcc 12 does not vectorize loops around kern_expf / kern_sqrtf: it turns
 * their selects into branches ("control flow in loop") and such loops ran
 * one float at a time - AdamW alone was 25-30 % of a one-thread GPT-2 step.
 * So the hot loops use GCC/clang vector extensions (kv8 = 8 floats: one AVX2
 * register, two SSE registers without AVX) with the SAME operations in the
 * same order as the scalar definitions in kern_internal.h. The build is
 * -std=c11, under which gcc does not contract a*b+c into an FMA
 * (-ffp-contract=off) in scalar and vector code alike, so every lane gives
 * exactly the float the scalar code gives; tails shorter than KV lanes run
 * the scalar code. kernels_vec checks the bit-equality.
 */
#ifndef LOOM_KERN_VEC_H
#define LOOM_KERN_VEC_H

#include "kern_internal.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

typedef float kv8 __attribute__((vector_size(32)));
typedef int32_t kv8i __attribute__((vector_size(32)));
typedef uint32_t kv8u __attribute__((vector_size(32)));

#define KV 8 /* lanes */

static inline kv8 kv_load(const float *p) {
    kv8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void kv_store(float *p, kv8 v) { memcpy(p, &v, sizeof v); }

static inline kv8 kv_set1(float x) { return (kv8){x, x, x, x, x, x, x, x}; }

/* m ? a : b per lane; m from a vector comparison (all ones or all zeros). */
static inline kv8 kv_sel(kv8i m, kv8 a, kv8 b) {
    return (kv8)((m & (kv8i)a) | (~m & (kv8i)b));
}

/* kern_expf on 8 lanes, operation for operation. */
static inline kv8 kv_expf(kv8 a) {
    const kv8 lo = kv_set1(-87.33654f), hi = kv_set1(88.0f);
    const kv8 magic = kv_set1(12582912.0f);
    kv8 x = kv_sel(a < lo, lo, kv_sel(a > hi, hi, a));
    kv8 t = x * kv_set1(1.44269504088896341f) + magic;
    kv8 kf = t - magic;
    kv8 r = x - kf * kv_set1(0.693145751953125f);
    r = r - kf * kv_set1(1.428606820309417232e-6f);
    kv8 p = kv_set1(1.0f / 5040.0f);
    p = p * r + kv_set1(1.0f / 720.0f);
    p = p * r + kv_set1(1.0f / 120.0f);
    p = p * r + kv_set1(1.0f / 24.0f);
    p = p * r + kv_set1(1.0f / 6.0f);
    p = p * r + kv_set1(0.5f);
    p = p * r + kv_set1(1.0f);
    p = p * r + kv_set1(1.0f);
    kv8u sb = ((kv8u)t - 0x4B400000u + 127u) << 23; /* bits of 2^k */
    kv8 y = p * (kv8)sb;
    y = kv_sel(a < lo, kv_set1(0.0f), y);
    y = kv_sel(a > kv_set1(88.72283f), kv_set1(INFINITY), y);
    return y;
}

/* sqrt per lane, correctly rounded (so equal to kern_sqrtf and sqrtf). */
static inline kv8 kv_sqrtf(kv8 x) {
#if defined(__AVX__)
    return (kv8)_mm256_sqrt_ps((__m256)x);
#else
    for (int l = 0; l < KV; l++) x[l] = kern_sqrtf(x[l]);
    return x;
#endif
}

/* x[i] = exp(x[i] - m) over [0..n): kern_exp_shift, vectorised. */
static inline void kv_exp_shift(float *x, int n, float m) {
    const kv8 mv = kv_set1(m);
    int i = 0;
    for (; i + KV <= n; i += KV) kv_store(x + i, kv_expf(kv_load(x + i) - mv));
    for (; i < n; i++) x[i] = kern_expf(x[i] - m);
}

#endif
