/* test_kernels_vec.c - the explicitly vectorised elementwise paths
 * (src/kernels/cpu/kern_vec.h) give the same floats, bit for bit, as the
 * scalar definitions they replace.
 *
 * - kv_expf against kern_expf and kv_sqrtf against sqrtf on random values
 *   over the whole useful range and on the edges (underflow, overflow, the
 *   clamp points, 0, -0, inf, subnormals);
 * - GELU forward/backward and AdamW: a call over n = 16k + 5 elements (vector
 *   lanes plus a scalar tail at KV = 4, 8 or 16) against one call per
 *   element (n = 1: the scalar code only);
 * - AdamW's bf16 copy of the new parameters (non-temporal stores from the
 *   first 32-byte boundary with AVX-512) against the scalar
 *   loom_bf16_from_f32 of each new parameter (not loom_bf16_pack, whose
 *   vector lanes share the update's rounding), at every
 *   offset of the copy within a line, with NaN, infinities, subnormals and
 *   values that round up to infinity or at a tie;
 * - kv_exp_shift against kern_exp_shift.
 * A lane that differed would change training results, which loom keeps
 * bit-identical across this change.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kernels/cpu/kern_vec.h"
#include "loom/bf16.h"
#include "loom/kernels.h"

static loom_device *dev; /* the CPU, one thread: every kernel below runs on it */

#define N 40005 /* 16k + 5 */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd32() >> 8) / 16777216.0f; }

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* The first index where two arrays differ in their bits, or -1. */
static long first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!same_bits(a[i], b[i])) return (long)i;
    return -1;
}

static void fill_inputs(float *x, size_t n, float lo, float hi) {
    static const float edges[] = {0.0f,     -0.0f,     -87.33654f, -87.3366f, 88.0f,   88.72283f,
                                  88.7229f, -100.0f,   100.0f,     1e-40f,    -1e-40f, 0x1p-126f,
                                  INFINITY, -INFINITY, 80.0f,      -80.0f,    1e-3f,   -1e-3f};
    for (size_t i = 0; i < n; i++) x[i] = rndf(lo, hi);
    for (size_t i = 0; i < sizeof edges / sizeof *edges && i < n; i++) x[i * 97 % n] = edges[i];
}

static void test_exp_sqrt(void) {
    float *x = malloc(N * sizeof *x);
    fill_inputs(x, N, -95.0f, 95.0f);
    long bad = -1;
    for (size_t i = 0; i + KV <= N && bad < 0; i += KV) {
        kvf y = kv_expf(kv_load(x + i));
        for (int l = 0; l < KV; l++)
            if (!same_bits(y[l], kern_expf(x[i + l]))) bad = (long)(i + l);
    }
    CHECK(bad < 0, "kv_expf(%.9g) differs from kern_expf", bad < 0 ? 0.0 : (double)x[bad]);

    for (size_t i = 0; i < N; i++) x[i] = fabsf(x[i]) * (i % 3 ? 1.0f : 1e-30f);
    bad = -1;
    for (size_t i = 0; i + KV <= N && bad < 0; i += KV) {
        kvf y = kv_sqrtf(kv_load(x + i));
        for (int l = 0; l < KV; l++)
            if (!same_bits(y[l], sqrtf(x[i + l])) || !same_bits(y[l], kern_sqrtf(x[i + l])))
                bad = (long)(i + l);
    }
    CHECK(bad < 0, "kv_sqrtf(%.9g) differs from sqrtf", bad < 0 ? 0.0 : (double)x[bad]);

    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    fill_inputs(a, N, -30.0f, 5.0f);
    memcpy(b, a, N * sizeof *a);
    kv_exp_shift(a, N, 1.25f);
    kern_exp_shift(b, N, 1.25f);
    bad = first_diff(a, b, N);
    CHECK(bad < 0, "kv_exp_shift differs from kern_exp_shift at %ld", bad);
    free(a), free(b), free(x);
}

static void test_gelu(void) {
    float *x = malloc(N * sizeof *x), *dy = malloc(N * sizeof *dy);
    float *o1 = malloc(N * sizeof *o1), *o2 = malloc(N * sizeof *o2);
    float *d1 = malloc(N * sizeof *d1), *d2 = malloc(N * sizeof *d2);
    fill_inputs(x, N, -12.0f, 12.0f);
    for (size_t i = 0; i < N; i++) dy[i] = rndf(-1, 1), d1[i] = d2[i] = rndf(-1, 1);
    loom_gelu_fwd(dev, o1, x, N);
    loom_gelu_bwd(dev, d1, x, dy, N);
    for (size_t i = 0; i < N; i++) {
        loom_gelu_fwd(dev, o2 + i, x + i, 1);
        loom_gelu_bwd(dev, d2 + i, x + i, dy + i, 1);
    }
    long bad = first_diff(o1, o2, N);
    CHECK(bad < 0, "gelu fwd: vector and scalar differ at x = %.9g", bad < 0 ? 0.0 : (double)x[bad]);
    bad = first_diff(d1, d2, N);
    CHECK(bad < 0, "gelu bwd: vector and scalar differ at x = %.9g", bad < 0 ? 0.0 : (double)x[bad]);
    free(x), free(dy), free(o1), free(o2), free(d1), free(d2);
}

static void test_adamw(void) {
    float *p1 = malloc(N * sizeof(float)), *p2 = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    float *m1 = malloc(N * sizeof(float)), *m2 = malloc(N * sizeof(float));
    float *v1 = malloc(N * sizeof(float)), *v2 = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) {
        p1[i] = p2[i] = rndf(-1, 1);
        g[i] = rndf(-1, 1) * (i % 5 ? 1.0f : 1e-6f);
        m1[i] = m2[i] = rndf(-0.1f, 0.1f);
        v1[i] = v2[i] = i % 7 ? rndf(0, 0.01f) : 0.0f;
    }
    for (int t = 1; t <= 3; t++) {
        loom_adamw_update(dev, p1, g, m1, v1, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f);
        for (size_t i = 0; i < N; i++)
            loom_adamw_update(dev, p2 + i, g + i, m2 + i, v2 + i, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                              1.0f);
    }
    long bp = first_diff(p1, p2, N), bm = first_diff(m1, m2, N), bv = first_diff(v1, v2, N);
    CHECK(bp < 0 && bm < 0 && bv < 0, "adamw: vector and scalar differ (p at %ld, m at %ld, v at %ld)", bp,
          bm, bv);
    /* the clip factor inside the update = scaling g in place first (the
     * separate pass it replaces), bit for bit, on vector lanes and the tail;
     * and g is left unscaled */
    const float gs = 0.3721f;
    float *gc = malloc(N * sizeof(float));
    memcpy(gc, g, N * sizeof(float));
    for (int t = 4; t <= 5; t++) {
        loom_adamw_update(dev, p1, g, m1, v1, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, gs);
        float *gsc = malloc(N * sizeof(float));
        memcpy(gsc, g, N * sizeof(float));
        loom_scale(dev, gsc, N, gs);
        loom_adamw_update(dev, p2, gsc, m2, v2, N - 3, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f);
        for (size_t i = N - 3; i < N; i++)
            loom_adamw_update(dev, p2 + i, gsc + i, m2 + i, v2 + i, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                              1.0f);
        free(gsc);
    }
    bp = first_diff(p1, p2, N), bm = first_diff(m1, m2, N), bv = first_diff(v1, v2, N);
    CHECK(bp < 0 && bm < 0 && bv < 0,
          "adamw gscale: differs from scale-then-update (p at %ld, m at %ld, v at %ld)", bp, bm, bv);
    CHECK(first_diff(g, gc, N) < 0, "adamw gscale: the gradient was modified");
    /* the update that zeroes what it reads: the same p, m, v as the update
     * (vector lanes and the scalar tail: N is no multiple of KV), g all 0 */
    float *p3 = malloc(N * sizeof(float)), *m3 = malloc(N * sizeof(float)), *v3 = malloc(N * sizeof(float));
    memcpy(p3, p1, N * sizeof(float)), memcpy(m3, m1, N * sizeof(float)), memcpy(v3, v1, N * sizeof(float));
    loom_adamw_update(dev, p1, g, m1, v1, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 6, gs);
    uint16_t *h3 = malloc(N * sizeof *h3), *h1 = malloc(N * sizeof *h1);
    CHECK(loom_adamw_update_zero(dev, p3, gc, m3, v3, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 6, gs, h3) == 1,
          "adamw zero: the CPU backend has no adamw_update_zero");
    bp = first_diff(p1, p3, N), bm = first_diff(m1, m3, N), bv = first_diff(v1, v3, N);
    CHECK(bp < 0 && bm < 0 && bv < 0, "adamw zero: differs from the update (p at %ld, m at %ld, v at %ld)",
          bp, bm, bv);
    /* and the new parameters' bf16 bits: loom_bf16_pack's, lanes and tail */
    loom_bf16_pack(dev, h1, p1, N);
    long bh = -1;
    for (size_t i = 0; i < N && bh < 0; i++)
        if (h1[i] != h3[i]) bh = (long)i;
    CHECK(bh < 0, "adamw zero: bf16 copy of p differs from loom_bf16_pack at %ld", bh);
    free(h1), free(h3);
    long nz = -1;
    for (size_t i = 0; i < N && nz < 0; i++)
        if (gc[i] != 0.0f || signbit(gc[i])) nz = (long)i;
    CHECK(nz < 0, "adamw zero: gradient %ld left %g, not +0", nz, nz < 0 ? 0.0 : (double)gc[nz]);
    free(p3), free(m3), free(v3);
    free(gc);
    free(p1), free(p2), free(g), free(m1), free(m2), free(v1), free(v2);
}

/* The update's bf16 copy of p equals the scalar loom_bf16_from_f32 of the p
 * it leaves (loom_bf16_pack's lanes share the update's vector rounding, so
 * they could not catch a fault in it), for the copy at each of 16 element
 * offsets (the elements before a 32-byte boundary are written one at a
 * time, the rest as vectors), on specials. */
static void test_adamw_bf16_copy(void) {
    enum { NB = 333, OFFS = 16 };
    static const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa00000u,
                                       0x7f7fffffu, 0x7f7f8000u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                       0x3f818000u, 0x00000000u, 0x80000000u, 0x7fffffffu, 0xffffffffu};
    const size_t ns = sizeof special / sizeof special[0];
    float *p0 = malloc(NB * sizeof(float)), *g0 = malloc(NB * sizeof(float));
    float *p = malloc(NB * sizeof(float)), *g = malloc(NB * sizeof(float)), *m = malloc(NB * sizeof(float));
    float *v = malloc(NB * sizeof(float));
    uint16_t *buf = malloc((NB + OFFS) * sizeof *buf), *ref = malloc(NB * sizeof *ref);
    for (size_t i = 0; i < NB; i++) {
        p0[i] = rndf(-2, 2);
        g0[i] = rndf(-1, 1);
        if (i % 7 == 3) memcpy(&p0[i], &special[(i / 7) % ns], sizeof p0[i]);
    }
    long bad = -1, bad_off = -1;
    for (int off = 0; off < OFFS && bad < 0; off++) {
        memcpy(p, p0, NB * sizeof(float)), memcpy(g, g0, NB * sizeof(float));
        memset(m, 0, NB * sizeof(float)), memset(v, 0, NB * sizeof(float));
        /* wd 0 and a zero gradient where p is special: p stays what it was */
        for (size_t i = 0; i < NB; i++)
            if (i % 7 == 3) g[i] = 0.0f;
        uint16_t *h = buf + off;
        CHECK(loom_adamw_update_zero(dev, p, g, m, v, NB, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f, h) == 1,
              "adamw bf16 copy: the CPU backend has no adamw_update_zero");
        for (size_t i = 0; i < NB; i++) ref[i] = loom_bf16_from_f32(p[i]);
        for (size_t i = 0; i < NB && bad < 0; i++)
            if (h[i] != ref[i]) bad = (long)i, bad_off = off;
    }
    CHECK(bad < 0,
          "adamw bf16 copy: element %ld (copy at element offset %ld) is 0x%04x, loom_bf16_from_f32 0x%04x",
          bad, bad_off, bad < 0 ? 0u : (unsigned)buf[bad_off + bad], bad < 0 ? 0u : (unsigned)ref[bad]);
    /* the specials went through: p kept them, so the check saw them */
    int kept = 1;
    for (size_t i = 3; i < NB; i += 7) kept &= memcmp(&p[i], &p0[i], sizeof p[i]) == 0 || isnan(p0[i]);
    CHECK(kept, "adamw bf16 copy: a special parameter changed under a zero gradient");
    free(p0), free(g0), free(p), free(g), free(m), free(v), free(buf), free(ref);
}

int main(void) {
    dev = test_cpu_device(1, 0);
    test_exp_sqrt();
    test_gelu();
    test_adamw();
    test_adamw_bf16_copy();
    loom_device_free(dev);
    return check_done();
}
