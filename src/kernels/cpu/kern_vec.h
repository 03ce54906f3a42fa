/* kern_vec.h - explicit float vectors of KV lanes for the elementwise
 * kernels (private to src/kernels/cpu).
 *
 * gcc 12 does not vectorize loops around kern_expf / kern_sqrtf: it turns
 * their selects into branches ("control flow in loop") and such loops ran
 * one float at a time - AdamW alone was 25-30 % of a one-thread GPT-2 step.
 * So the hot loops use GCC/clang vector extensions (kvf = KV floats: one
 * zmm register with AVX-512, one ymm with AVX2, two SSE registers without
 * AVX) with the SAME operations in the same order as the scalar definitions
 * in kern_internal.h. The build passes -ffp-contract=off (gcc's default
 * under -std=c11; clang's is to contract), so no compiler fuses a*b+c into
 * an FMA in scalar or vector code, and every lane gives exactly the float
 * the scalar code gives, at any KV; tails shorter than KV lanes run the
 * scalar code. Reductions keep KERN_LANES running sums whatever KV is.
 * kernels_vec checks the bit-equality.
 */
#ifndef LOOM_KERN_VEC_H
#define LOOM_KERN_VEC_H

#include "kern_internal.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

/* KV lanes: 16 (one zmm register) with AVX-512, 8 (one ymm register) with
 * AVX, else 4 (one xmm register), so that no vector wider than the ISA's
 * registers crosses a function call. On a Zen 4, which runs a zmm
 * operation as two ymm halves, 16 lanes still took 22 % off the
 * exponential (0.40 to 0.31 ns per float) and 20-27 % off AdamW on one
 * thread: fewer instructions, and the divider and square root take zmm
 * operands at a better rate per float. */
#if defined(__AVX512F__)
#define KV 16
#define KV_ZMM 1
#elif defined(__AVX__)
#define KV 8
#else
#define KV 4
#endif
typedef float kvf __attribute__((vector_size(4 * KV)));
typedef int32_t kvi __attribute__((vector_size(4 * KV)));
typedef uint32_t kvu __attribute__((vector_size(4 * KV)));

static inline kvf kv_load(const float *p) {
    kvf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void kv_store(float *p, kvf v) { memcpy(p, &v, sizeof v); }

static inline kvf kv_set1(float x) {
    kvf v;
    for (int l = 0; l < KV; l++) v[l] = x;
    return v;
}

/* m ? a : b per lane; m from a vector comparison (all ones or all zeros).
 * With AVX one blend (it reads the mask's sign bits) instead of three logic
 * operations; with AVX-512 a lane mask from the vector, then a blend. */
static inline kvf kv_sel(kvi m, kvf a, kvf b) {
#if defined(KV_ZMM)
    return (kvf)_mm512_mask_blend_ps(_mm512_test_epi32_mask((__m512i)m, (__m512i)m), (__m512)b, (__m512)a);
#elif defined(__AVX__)
    return (kvf)_mm256_blendv_ps((__m256)b, (__m256)a, (__m256)m);
#else
    return (kvf)((m & (kvi)a) | (~m & (kvi)b));
#endif
}

/* kern_fma per lane: fused exactly where kern_fma is (__FMA__; AVX-512
 * alone, e.g. -mavx512f, does not imply it). */
static inline kvf kv_fma(kvf a, kvf b, kvf c) {
#if defined(__FMA__) && KV == 16
    return (kvf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) && KV == 8
    return (kvf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__FMA__)
    return (kvf)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
#else
    return a * b + c;
#endif
}

/* kern_expf on KV lanes, operation for operation. With AVX the clamp is
 * max then min, the same floats as the scalar selects, NaN included:
 * VMAXPS(lo, a) returns a unless lo > a, VMINPS(hi, x) x unless hi < x;
 * and the two final selects are a mask and a blend (19 % faster per
 * element than selects made of logic operations, timed alone). */
static inline kvf kv_expf(kvf a) {
    const kvf lo = kv_set1(-87.33654f), hi = kv_set1(88.0f);
    const kvf magic = kv_set1(12582912.0f);
#if defined(KV_ZMM)
    kvf x = (kvf)_mm512_min_ps((__m512)hi, _mm512_max_ps((__m512)lo, (__m512)a));
#elif defined(__AVX__)
    kvf x = (kvf)_mm256_min_ps((__m256)hi, _mm256_max_ps((__m256)lo, (__m256)a));
#else
    kvf x = kv_sel(a < lo, lo, kv_sel(a > hi, hi, a));
#endif
    kvf t = kv_fma(x, kv_set1(1.44269504088896341f), magic);
    kvf kf = t - magic;
    kvf r = kv_fma(kf, kv_set1(-0.693145751953125f), x);
    r = kv_fma(kf, kv_set1(-1.428606820309417232e-6f), r);
    kvf p = kv_set1(1.0f / 5040.0f);
    p = kv_fma(p, r, kv_set1(1.0f / 720.0f));
    p = kv_fma(p, r, kv_set1(1.0f / 120.0f));
    p = kv_fma(p, r, kv_set1(1.0f / 24.0f));
    p = kv_fma(p, r, kv_set1(1.0f / 6.0f));
    p = kv_fma(p, r, kv_set1(0.5f));
    p = kv_fma(p, r, kv_set1(1.0f));
    p = kv_fma(p, r, kv_set1(1.0f));
    kvu sb = ((kvu)t - 0x4B400000u + 127u) << 23; /* bits of 2^k */
    kvf y = p * (kvf)sb;
#if defined(KV_ZMM)
    __m512 yv = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask((__m512)a, (__m512)lo, _CMP_LT_OQ), (__m512)y);
    yv = _mm512_mask_mov_ps(yv, _mm512_cmp_ps_mask((__m512)a, _mm512_set1_ps(88.72283f), _CMP_GT_OQ),
                            _mm512_set1_ps(INFINITY));
    return (kvf)yv;
#elif defined(__AVX__)
    __m256 yv = _mm256_andnot_ps(_mm256_cmp_ps((__m256)a, (__m256)lo, _CMP_LT_OQ), (__m256)y);
    yv = _mm256_blendv_ps(yv, _mm256_set1_ps(INFINITY),
                          _mm256_cmp_ps((__m256)a, _mm256_set1_ps(88.72283f), _CMP_GT_OQ));
    return (kvf)yv;
#else
    y = kv_sel(a < lo, kv_set1(0.0f), y);
    y = kv_sel(a > kv_set1(88.72283f), kv_set1(INFINITY), y);
    return y;
#endif
}

/* sqrt per lane, correctly rounded (so equal to kern_sqrtf and sqrtf). */
static inline kvf kv_sqrtf(kvf x) {
#if defined(KV_ZMM)
    return (kvf)_mm512_sqrt_ps((__m512)x);
#elif defined(__AVX__)
    return (kvf)_mm256_sqrt_ps((__m256)x);
#else
    for (int l = 0; l < KV; l++) x[l] = kern_sqrtf(x[l]);
    return x;
#endif
}

/* loom_bf16_round's bits on KV lanes, operation for operation and without
 * branches (gcc left the scalar loop one element at a time): inf and NaN
 * keep their upper half (NaN made quiet), everything else rounds to
 * nearest, ties to even. Not VCVTNEPS2BF16, which flushes subnormals to
 * zero. kernels_bf16 checks the lanes against the scalar rounding. */
static inline kvu bf16_round_bits(kvu u) {
    const kvu hi = (kvu){0} + 0xffff0000u;
#if defined(KV_ZMM)
    /* with lane masks: an infinity rounds to itself (its low half is 0),
     * so only NaN lanes need their own value */
    const __m512i x = (__m512i)u;
    const kvu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & hi;
    const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(x), _mm512_castsi512_ps(x), _CMP_UNORD_Q);
    return (kvu)_mm512_mask_mov_epi32((__m512i)rounded, nan, (__m512i)((u & hi) | 0x00400000u));
#else
    const kvu expo = (kvu){0} + 0x7f800000u, mant = (kvu){0} + 0x007fffffu;
    kvu special = (kvu)((u & expo) == expo);
    kvu nan = special & (kvu)((u & mant) != 0);
    kvu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & hi;
    kvu kept = (nan & ((u & hi) | 0x00400000u)) | (~nan & u);
    return (special & kept) | (~special & rounded);
#endif
}

typedef uint16_t kvh __attribute__((vector_size(2 * KV)));

/* The bf16 bits of KV floats (loom_bf16_from_f32 per lane): the upper
 * halves of bf16_round_bits, narrowed (VPMOVDW with AVX-512). */
static inline kvh kv_bf16_bits(kvf v) {
    kvu u;
    memcpy(&u, &v, sizeof u);
#if defined(KV_ZMM)
    return (kvh)_mm512_cvtepi32_epi16((__m512i)(bf16_round_bits(u) >> 16));
#else
    return __builtin_convertvector(bf16_round_bits(u) >> 16, kvh);
#endif
}

/* kv_bf16_bits stored at p. */
static inline void kv_store_bf16(uint16_t *p, kvf v) {
    kvh h = kv_bf16_bits(v);
    memcpy(p, &h, sizeof h);
}

#if defined(KV_ZMM)
/* kv_store_bf16 with a non-temporal store (to memory, not cache): p must
 * be 32-byte aligned, and kv_stream_fence() orders the stores before
 * anything another thread does after. */
#define KV_STREAM_BF16 1
#define KV_STREAM_ALIGN 32
static inline void kv_stream_bf16(uint16_t *p, kvf v) {
    _mm256_stream_si256((__m256i *)(void *)p, (__m256i)kv_bf16_bits(v));
}
static inline void kv_stream_fence(void) { _mm_sfence(); }
#endif

/* x[i] = exp(x[i] - m) over [0..n): kern_exp_shift, vectorised. */
static inline void kv_exp_shift(float *x, int n, float m) {
    const kvf mv = kv_set1(m);
    int i = 0;
    for (; i + KV <= n; i += KV) kv_store(x + i, kv_expf(kv_load(x + i) - mv));
    for (; i < n; i++) x[i] = kern_expf(x[i] - m);
}

#endif
