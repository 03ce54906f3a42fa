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

void loom_rng_fill_normal(loom_rng_key key, uint64_t first, float *out, size_t n, float std) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (size_t i = 0; i < n; i++) out[i] = std * loom_rng_normal(key, first + i);
}
