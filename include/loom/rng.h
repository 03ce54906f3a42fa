/* rng.h - counter-based random numbers (Philox-4x32-10).
 *
 * Any random value loom uses is a pure function of (seed, stream name, index):
 * parameter element i of "h.3.mlp.c_fc.weight" is the same number whichever
 * rank owns it and however the tensor is sharded, and the data sampler's
 * choice for sample j of step s is the same at any data-parallel degree.
 * No state, no sequence: that is what makes layouts comparable (invariant 1).
 */
#ifndef LOOM_RNG_H
#define LOOM_RNG_H

#include <stddef.h>
#include <stdint.h>

/* The raw generator: 4 x 32 random bits for (key, counter). */
void loom_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

/* 64-bit FNV-1a of a string; names a stream. */
uint64_t loom_rng_hash(const char *name);

/* Stream key for (seed, name): the first two words of
 * philox(key = (seed lo, seed hi), ctr = (hash lo, hash hi, 0, 0x6c6f6f6d "loom")),
 * hash = loom_rng_hash(name). */
typedef struct {
    uint32_t k[2];
} loom_rng_key;
loom_rng_key loom_rng_key_make(uint64_t seed, const char *name);

/* Element `index` of a stream uses the block r = philox(key, ctr = (index lo,
 * index hi, 0, 0)). */
/* Uniform in [0, 1) with 24 random bits: (r0 >> 8) / 2^24. */
float loom_rng_uniform(loom_rng_key key, uint64_t index);
/* 64 random bits: r0 | r1 << 32. */
uint64_t loom_rng_u64(loom_rng_key key, uint64_t index);
/* Standard normal (Box-Muller on one Philox block, in double, rounded once):
 * u1 = (((r0|r1<<32) >> 11) + 1) / 2^53 in (0, 1], u2 = ((r2|r3<<32) >> 11) /
 * 2^53, z = sqrt(-2 ln u1) cos(2 pi u2). */
float loom_rng_normal(loom_rng_key key, uint64_t index);

/* Fill out[0..n) with normal(0, std) for global indices first..first+n:
 * out[i] = std * loom_rng_normal(key, first + i) exactly, so a shard of a
 * tensor fills the same numbers as the whole. Vectorised (AVX2 + glibc's
 * libmvec, bit-identical to the scalar definition), not threaded: callers
 * split the work. */
void loom_rng_fill_normal(loom_rng_key key, uint64_t first, float *out, size_t n, float std);

#endif
