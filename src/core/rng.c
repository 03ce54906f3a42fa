/* rng.c - counter-based random numbers: Philox-4x32-10 and what loom derives
 * from it.
 *
 * Implements include/loom/rng.h. Philox-4x32-10 is the block function of
 * Salmon, Moraes, Dror and Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3"
 * (SC11, 2011): ten rounds of two 32x32->64 multiplications (multipliers
 * 0xD2511F53 and 0xCD9E8D57) in a Feistel-like permutation of the 4-word
 * counter, with the 2-word key bumped by the Weyl constants 0x9E3779B9 and
 * 0xBB67AE85 between rounds. Every value derived here is a pure function of
 * (key, index): the index goes in counter words 0 and 1, words 2 and 3 are 0.
 * Nothing is collective and there is no state, so any rank can compute any
 * element of any stream.
 */
#include "loom/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10

#define FNV1A64_OFFSET 0xcbf29ce484222325ull
#define FNV1A64_PRIME 0x00000100000001b3ull

/* One Philox round: x <- (hi(M1*x2)^x1^k0, lo(M1*x2), hi(M0*x0)^x3^k1, lo(M0*x0)). */
static void philox_round(uint32_t x[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * x[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * x[2];
    uint32_t y0 = (uint32_t)(p1 >> 32) ^ x[1] ^ k[0];
    uint32_t y1 = (uint32_t)p1;
    uint32_t y2 = (uint32_t)(p0 >> 32) ^ x[3] ^ k[1];
    uint32_t y3 = (uint32_t)p0;
    x[0] = y0;
    x[1] = y1;
    x[2] = y2;
    x[3] = y3;
}

void loom_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
    uint32_t k[2] = {key[0], key[1]};
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(x, k);
    }
    for (int i = 0; i < 4; i++) out[i] = x[i];
}

uint64_t loom_rng_hash(const char *name) {
    uint64_t h = FNV1A64_OFFSET;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= FNV1A64_PRIME;
    }
    return h;
}

/* The Philox block for element `index` of a stream. */
static void rng_block(loom_rng_key key, uint64_t index, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0, 0};
    loom_philox4x32(key.k, ctr, out);
}

/* The key is one Philox block of the name's hash under the seed as key, so
 * nearby seeds and similar names still give unrelated keys. The constant in
 * counter word 3 keeps key derivation apart from the element blocks. */
loom_rng_key loom_rng_key_make(uint64_t seed, const char *name) {
    uint64_t h = loom_rng_hash(name);
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)h, (uint32_t)(h >> 32), 0, 0x6c6f6f6du /* "loom" */};
    uint32_t out[4];
    loom_philox4x32(key, ctr, out);
    loom_rng_key k = {{out[0], out[1]}};
    return k;
}

float loom_rng_uniform(loom_rng_key key, uint64_t index) {
    uint32_t r[4];
    rng_block(key, index, r);
    return (float)(r[0] >> 8) * (1.0f / 16777216.0f); /* 24 bits -> [0, 1) */
}

uint64_t loom_rng_u64(loom_rng_key key, uint64_t index) {
    uint32_t r[4];
    rng_block(key, index, r);
    return (uint64_t)r[0] | (uint64_t)r[1] << 32;
}

/* Box-Muller with 53-bit uniforms: u1 in (0, 1] from words 0-1 (so log(u1)
 * is finite), u2 in [0, 1) from words 2-3. Computed in double, rounded once. */
float loom_rng_normal(loom_rng_key key, uint64_t index) {
    uint32_t r[4];
    rng_block(key, index, r);
    uint64_t a = ((uint64_t)r[0] | (uint64_t)r[1] << 32) >> 11;
    uint64_t b = ((uint64_t)r[2] | (uint64_t)r[3] << 32) >> 11;
    const double two_m53 = 1.0 / 9007199254740992.0;
    double u1 = (double)(a + 1) * two_m53;
    double u2 = (double)b * two_m53;
    const double two_pi = 6.283185307179586476925286766559;
    return (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
}

/* ---- the fill, four elements at a time ---------------------------------
 *
 * With AVX2, four Philox blocks run side by side (32x32->64 products with
 * vpmuludq) and log/cos come from glibc's vector math library (libmvec,
 * at most 4 ulp in double). The scalar code above defines the numbers: a
 * lane is kept only when its double z' lies so far inside one float's
 * rounding interval that any value within a relative 2^-36 of it (thousands
 * of times the two libraries' combined error) rounds to the same float;
 * otherwise (about 1 lane in 2000, and z' = 0) that element is recomputed by
 * loom_rng_normal. So the floats are bit-identical to the scalar path. */
#if defined(__AVX2__) && defined(__x86_64__) && !defined(LOOM_NO_MVEC)
#include <immintrin.h>

__m256d _ZGVdN4v_log(__m256d x); /* libmvec (glibc) */
__m256d _ZGVdN4v_cos(__m256d x);

/* Exact double of 64-bit lanes below 2^53 + 1: two halves through the
 * 2^52 magic number. */
static inline __m256d rng_u64_to_pd(__m256i x) {
    const __m256i magic = _mm256_set1_epi64x(0x4330000000000000ll);
    const __m256d magic_d = _mm256_set1_pd(4503599627370496.0);
    __m256i hi = _mm256_srli_epi64(x, 32), lo = _mm256_and_si256(x, _mm256_set1_epi64x(0xffffffffll));
    __m256d dhi = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(hi, magic)), magic_d);
    __m256d dlo = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(lo, magic)), magic_d);
    return _mm256_add_pd(_mm256_mul_pd(dhi, _mm256_set1_pd(4294967296.0)), dlo);
}

/* Philox blocks for indices idx..idx+4*RNG_CHAINS-1: RNG_CHAINS independent
 * chains of four lanes interleaved, so that the multiplications' latency
 * overlaps (lanes hold 32-bit words in their low halves). */
#define RNG_CHAINS 4
static inline void rng_philox_lanes(loom_rng_key key, uint64_t idx, __m256i a[RNG_CHAINS],
                                    __m256i b[RNG_CHAINS]) {
    const __m256i lo32 = _mm256_set1_epi64x(0xffffffffll);
    const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
    __m256i x0[RNG_CHAINS], x1[RNG_CHAINS], x2[RNG_CHAINS], x3[RNG_CHAINS];
    for (int c = 0; c < RNG_CHAINS; c++) {
        __m256i ix = _mm256_add_epi64(_mm256_set1_epi64x((long long)(idx + 4 * (uint64_t)c)),
                                      _mm256_set_epi64x(3, 2, 1, 0));
        x0[c] = _mm256_and_si256(ix, lo32);
        x1[c] = _mm256_srli_epi64(ix, 32);
        x2[c] = x3[c] = _mm256_setzero_si256();
    }
    uint32_t k0 = key.k[0], k1 = key.k[1];
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const __m256i vk0 = _mm256_set1_epi64x(k0), vk1 = _mm256_set1_epi64x(k1);
        for (int c = 0; c < RNG_CHAINS; c++) {
            __m256i p0 = _mm256_mul_epu32(m0, x0[c]), p1 = _mm256_mul_epu32(m1, x2[c]);
            __m256i y0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), x1[c]), vk0);
            __m256i y2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), x3[c]), vk1);
            x1[c] = _mm256_and_si256(p1, lo32);
            x3[c] = _mm256_and_si256(p0, lo32);
            x0[c] = y0;
            x2[c] = y2;
        }
    }
    for (int c = 0; c < RNG_CHAINS; c++) {
        a[c] = _mm256_or_si256(_mm256_srli_epi64(x0[c], 11), _mm256_slli_epi64(x1[c], 21));
        b[c] = _mm256_or_si256(_mm256_srli_epi64(x2[c], 11), _mm256_slli_epi64(x3[c], 21));
    }
}

/* z' = sqrt(-2 log u1) cos(2 pi u2) for the 53-bit words a, b of four lanes. */
static inline __m256d rng_box_muller4(__m256i a, __m256i b) {
    const __m256d two_m53 = _mm256_set1_pd(1.0 / 9007199254740992.0);
    __m256d u1 = _mm256_mul_pd(rng_u64_to_pd(_mm256_add_epi64(a, _mm256_set1_epi64x(1))), two_m53);
    __m256d u2 = _mm256_mul_pd(rng_u64_to_pd(b), two_m53);
    __m256d l = _mm256_mul_pd(_mm256_set1_pd(-2.0), _ZGVdN4v_log(u1));
    __m256d c = _ZGVdN4v_cos(_mm256_mul_pd(_mm256_set1_pd(6.283185307179586476925286766559), u2));
    return _mm256_mul_pd(_mm256_sqrt_pd(l), c);
}

static size_t rng_fill_vec(loom_rng_key key, uint64_t first, float *out, size_t n, float std) {
    const __m256d dn = _mm256_set1_pd(1.0 - 1.0 / 68719476736.0),
                  up = _mm256_set1_pd(1.0 + 1.0 / 68719476736.0);
    const size_t W = 4 * RNG_CHAINS;
    size_t i = 0;
    for (; i + W <= n; i += W) {
        __m256i a[RNG_CHAINS], b[RNG_CHAINS];
        rng_philox_lanes(key, first + i, a, b);
        for (int c = 0; c < RNG_CHAINS; c++) {
            __m256d z = rng_box_muller4(a[c], b[c]);
            __m128 f = _mm256_cvtpd_ps(z);
            __m128 flo = _mm256_cvtpd_ps(_mm256_mul_pd(z, dn)), fhi = _mm256_cvtpd_ps(_mm256_mul_pd(z, up));
            __m128 ok = _mm_and_ps(_mm_cmpeq_ps(f, flo), _mm_cmpeq_ps(f, fhi));
            ok = _mm_and_ps(ok, _mm_cmpneq_ps(f, _mm_setzero_ps()));
            float *o = out + i + 4 * c;
            _mm_storeu_ps(o, _mm_mul_ps(_mm_set1_ps(std), f));
            int mask = _mm_movemask_ps(ok);
            if (mask != 0xf)
                for (int j = 0; j < 4; j++)
                    if (!(mask >> j & 1)) o[j] = std * loom_rng_normal(key, first + i + 4 * c + j);
        }
    }
    return i;
}
#else
static size_t rng_fill_vec(loom_rng_key key, uint64_t first, float *out, size_t n, float std) {
    (void)key, (void)first, (void)out, (void)n, (void)std;
    return 0;
}
#endif

void loom_rng_fill_normal(loom_rng_key key, uint64_t first, float *out, size_t n, float std) {
    size_t done = rng_fill_vec(key, first, out, n, std);
    for (size_t i = done; i < n; i++) out[i] = std * loom_rng_normal(key, first + i);
}
