/* test_rng.c - Philox-4x32-10 against Random123's published known-answer
 * vectors, FNV-1a-64 against its published test values, and the properties
 * loom relies on: determinism, index independence (fill_normal equals
 * element-wise normal at the same global indices), independent streams per
 * name and seed, and the moments of the normal and uniform distributions. */
#include "check.h"
#include "loom/rng.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Random123 kat_vectors, "philox4x32 10" lines: counter, key, expected. */
static void test_philox_kat(void) {
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        loom_philox4x32(kat[v].key, kat[v].ctr, out);
        for (int i = 0; i < 4; i++)
            CHECK(out[i] == kat[v].want[i], "kat %d word %d: %08x, expected %08x", v, i, out[i],
                  kat[v].want[i]);
    }
}

/* FNV-1a-64 test values from the FNV reference test suite. */
static void test_hash(void) {
    CHECK(loom_rng_hash("") == 0xcbf29ce484222325ull, "fnv1a64(\"\")");
    CHECK(loom_rng_hash("a") == 0xaf63dc4c8601ec8cull, "fnv1a64(\"a\")");
    CHECK(loom_rng_hash("foobar") == 0x85944171f73967e8ull, "fnv1a64(\"foobar\")");
}

static void test_keys(void) {
    loom_rng_key a = loom_rng_key_make(1234, "h.0.attn.c_attn.weight");
    loom_rng_key a2 = loom_rng_key_make(1234, "h.0.attn.c_attn.weight");
    loom_rng_key b = loom_rng_key_make(1234, "h.0.attn.c_proj.weight");
    loom_rng_key c = loom_rng_key_make(1235, "h.0.attn.c_attn.weight");
    CHECK(a.k[0] == a2.k[0] && a.k[1] == a2.k[1], "key_make is deterministic");
    CHECK(a.k[0] != b.k[0] || a.k[1] != b.k[1], "different names give different keys");
    CHECK(a.k[0] != c.k[0] || a.k[1] != c.k[1], "different seeds give different keys");
}

/* The element functions use counter (index lo, index hi, 0, 0). */
static void test_counter_layout(void) {
    loom_rng_key key = loom_rng_key_make(7, "layout");
    const uint64_t idx[] = {0, 1, 0xffffffffull, 0x100000000ull, 0x123456789abcdefull};
    for (int i = 0; i < 5; i++) {
        uint32_t ctr[4] = {(uint32_t)idx[i], (uint32_t)(idx[i] >> 32), 0, 0}, r[4];
        loom_philox4x32(key.k, ctr, r);
        uint64_t want = (uint64_t)r[0] | (uint64_t)r[1] << 32;
        CHECK(loom_rng_u64(key, idx[i]) == want, "u64 at index %llx", (unsigned long long)idx[i]);
        float u = (float)(r[0] >> 8) / 16777216.0f;
        CHECK(loom_rng_uniform(key, idx[i]) == u, "uniform at index %llx", (unsigned long long)idx[i]);
        /* Box-Muller from the same block, recomputed here in double. */
        double u1 = (double)((((uint64_t)r[0] | (uint64_t)r[1] << 32) >> 11) + 1) / 9007199254740992.0;
        double u2 = (double)(((uint64_t)r[2] | (uint64_t)r[3] << 32) >> 11) / 9007199254740992.0;
        float z = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        CHECK(fabsf(loom_rng_normal(key, idx[i]) - z) <= 1e-6f * (1.0f + fabsf(z)),
              "normal at index %llx: %g vs %g", (unsigned long long)idx[i], loom_rng_normal(key, idx[i]), z);
    }
    CHECK(loom_rng_u64(key, 0xffffffffull) != loom_rng_u64(key, 0x100000000ull),
          "the index's high word reaches the counter");
}

/* fill_normal(first, n) is element-wise normal(first + i), whatever n. */
static void test_index_independence(void) {
    loom_rng_key key = loom_rng_key_make(42, "w");
    const uint64_t firsts[] = {0, 17, 0xfffffff0ull};
    float buf[100];
    for (int f = 0; f < 3; f++) {
        loom_rng_fill_normal(key, firsts[f], buf, 100, 1.0f);
        int bad = 0;
        for (int i = 0; i < 100; i++) bad += buf[i] != loom_rng_normal(key, firsts[f] + (uint64_t)i);
        CHECK(bad == 0, "first %llu: %d elements differ from normal(first+i)", (unsigned long long)firsts[f],
              bad);
    }
    /* A slice [30, 60) of a fill equals a fill of the slice: sharding works. */
    float whole[100], part[30];
    loom_rng_fill_normal(key, 0, whole, 100, 0.02f);
    loom_rng_fill_normal(key, 30, part, 30, 0.02f);
    int bad = 0;
    for (int i = 0; i < 30; i++) bad += part[i] != whole[30 + i];
    CHECK(bad == 0, "%d elements of a shard differ from the whole", bad);
    CHECK(whole[5] == 0.02f * loom_rng_normal(key, 5), "std scales the sample");
}

/* The vectorised fill (AVX2 Philox + libmvec, checked against float rounding
 * boundaries) gives exactly the scalar definition's floats: 2^22 elements
 * bit for bit, across the index's 32-bit carry. */
static void test_fill_bit_identical(void) {
    const size_t n = (size_t)1 << 22;
    float *x = malloc(n * sizeof *x);
    loom_rng_key key = loom_rng_key_make(1337, "h.0.mlp.c_fc.weight");
    const uint64_t first = 0xffffff00ull - 5;
    loom_rng_fill_normal(key, first, x, n, 0.02f);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0.02f * loom_rng_normal(key, first + i);
        bad += memcmp(&x[i], &want, sizeof want) != 0;
    }
    CHECK(bad == 0, "%zu of %zu filled elements differ from the scalar normal", bad, n);
    free(x);
}

static void test_normal_moments(void) {
    const size_t n = 1000000;
    float *x = malloc(n * sizeof *x);
    loom_rng_key key = loom_rng_key_make(2024, "moments");
    loom_rng_fill_normal(key, 0, x, n, 1.0f);
    double s1 = 0, s2 = 0, s4 = 0;
    size_t within1 = 0, nonfinite = 0, mismatched = 0;
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        s1 += v;
        s2 += v * v;
        s4 += v * v * v * v;
        within1 += fabs(v) < 1.0;
        nonfinite += !isfinite(x[i]);
        if (i % 997 == 0) mismatched += x[i] != loom_rng_normal(key, i); /* threaded fill */
    }
    double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
    CHECK(nonfinite == 0, "%zu non-finite samples", nonfinite);
    CHECK(mismatched == 0, "%zu threaded samples differ from normal(i)", mismatched);
    CHECK(fabs(mean) < 5e-3, "mean %g (5 sigma = 5e-3)", mean);
    CHECK(fabs(sqrt(var) - 1.0) < 4e-3, "std %g", sqrt(var));
    CHECK(fabs(kurt - 3.0) < 0.03, "kurtosis %g, expected 3", kurt);
    CHECK(fabs((double)within1 / n - 0.682689) < 3e-3, "P(|z|<1) = %g, expected 0.6827", (double)within1 / n);
    free(x);
}

static void test_uniform_and_streams(void) {
    const size_t n = 1000000;
    loom_rng_key key = loom_rng_key_make(9, "u");
    double s = 0;
    float lo = 1, hi = 0;
    for (size_t i = 0; i < n; i++) {
        float u = loom_rng_uniform(key, i);
        s += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    CHECK(lo >= 0.0f && hi < 1.0f, "uniform range [%g, %g]", lo, hi);
    CHECK(fabs(s / n - 0.5) < 2e-3, "uniform mean %g", s / n);

    loom_rng_key a = loom_rng_key_make(1, "a"), b = loom_rng_key_make(1, "b");
    int same = 0;
    double dot = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        float x = loom_rng_normal(a, i), y = loom_rng_normal(b, i);
        same += x == y;
        dot += (double)x * y;
    }
    CHECK(same == 0, "%d equal samples between streams a and b", same);
    CHECK(fabs(dot / 10000) < 0.05, "streams a and b correlate: %g", dot / 10000);
    CHECK(loom_rng_normal(a, 3) == loom_rng_normal(loom_rng_key_make(1, "a"), 3), "deterministic");
}

int main(void) {
    test_philox_kat();
    test_hash();
    test_keys();
    test_counter_layout();
    test_index_independence();
    test_fill_bit_identical();
    test_normal_moments();
    test_uniform_and_streams();
    return check_done();
}
