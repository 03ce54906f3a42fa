/* test_bf16.c - bf16 rounding and the bf16-mode GEMM.
 *
 * Rounding against hand-computed bit patterns (nearest, ties to even, the
 * overflow to inf, inf and NaN kept); loom_matmul_fwd in bf16 mode against
 * a double-precision product of the hand-rounded operands (within fp32
 * accumulation error), and against the fp32 product (it must differ: the
 * operands really are rounded).
 *
 * loom/bf16.h's scalars on random floats, and the one hop of a bf16
 * reduction (loom_bf16_sum, what the communicator's LOOM_BF16 sum applies),
 * against a second reference: the two bf16 neighbours of the exact value
 * (double) found by bit truncation, the nearer chosen, a tie to the even
 * mantissa; the host pack/unpack the gradient reductions use.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "loom/bf16.h"
#include "loom/kernels.h"
#include "loom/rng.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Reference: the bf16 neighbours of x by bit pattern; nearest, ties to even. */
static float ref_round(float x) {
    uint32_t u = to_bits(x), lo = u & 0xffff0000u, rest = u & 0xffffu;
    uint32_t up = lo + 0x10000u;
    if (rest > 0x8000u || (rest == 0x8000u && (lo & 0x10000u))) return from_bits(up);
    return from_bits(lo);
}

static void test_round(loom_device *dev) {
    const struct {
        uint32_t in, want;
    } cases[] = {
        {0x3f800000u, 0x3f800000u}, /* 1 */
        {0x3f808000u, 0x3f800000u}, /* 1 + 2^-8: tie, to even (down) */
        {0x3f818000u, 0x3f820000u}, /* 1 + 3 2^-8: tie, to even (up) */
        {0x3f808001u, 0x3f810000u}, /* just above the tie: up */
        {0xc0200000u, 0xc0200000u}, /* -2.5 exact */
        {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX rounds to inf */
        {0x7f800000u, 0x7f800000u}, /* inf */
        {0xff800000u, 0xff800000u}, /* -inf */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x = from_bits(cases[i].in), y;
        loom_round_bf16(dev, &y, &x, 1);
        CHECK(to_bits(y) == cases[i].want, "round 0x%08x -> 0x%08x, want 0x%08x", cases[i].in, to_bits(y),
              cases[i].want);
    }
    float nan = from_bits(0x7fc00001u), y;
    loom_round_bf16(dev, &y, &nan, 1);
    CHECK(isnan(y), "NaN stays NaN");
    /* many random values against the reference */
    const size_t n = 100000;
    float *x = malloc(n * sizeof *x), *r = malloc(n * sizeof *r);
    loom_rng_key k = loom_rng_key_make(9, "bf16");
    for (size_t i = 0; i < n; i++) x[i] = (float)(loom_rng_u64(k, i) >> 40) * 1e-3f - 8000.0f;
    loom_round_bf16(dev, r, x, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += to_bits(r[i]) != to_bits(ref_round(x[i]));
    CHECK(bad == 0, "%zu of %zu random values rounded differently", bad, n);
    free(x);
    free(r);
}

/* ---- loom/bf16.h against an exact reference; the bf16 sum's hop ---------- */

/* The bf16 (as its 16 bits) nearest to the exact value v, ties to even:
 * |v| truncated to bf16 and the next bf16 above it, compared in double (both
 * candidates and v are exact there). v past the largest bf16's rounding
 * boundary is infinity. */
static uint16_t ref_round_exact(double v) {
    if (isnan(v)) return 0x7fc0;
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double a = fabs(v);
    if (isinf(a)) return sign | 0x7f80;
    float af = (float)a; /* only to find the binade: lo must not exceed a */
    uint32_t lo = to_bits(af) & 0xffff0000u;
    if ((double)from_bits(lo) > a) lo -= 0x10000u;
    uint32_t hi = lo + 0x10000u;
    double dlo = a - (double)from_bits(lo);
    double dhi = (hi >= 0x7f800000u ? ldexp(1.0, 128) : (double)from_bits(hi)) - a; /* inf: 2^128 */
    uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (((lo >> 16) & 1u) ? hi : lo);
    return sign | (uint16_t)(pick >> 16);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* A finite bf16 with an exponent in [e0, e0 + span). */
static uint16_t random_bf16(int e0, int span) {
    uint32_t u = next32();
    uint32_t e = (uint32_t)(e0 + (int)(u % (uint32_t)span));
    return (uint16_t)(((u >> 8) & 0x8000u) | (e << 7) | ((u >> 12) & 0x7fu));
}

static int same(uint16_t a, uint16_t b) {
    int an = (a & 0x7f80) == 0x7f80 && (a & 0x7f), bn = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
    return an || bn ? an && bn : a == b; /* any NaN matches any NaN */
}

static void test_round_random(void) {
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = from_bits(next32() ^ (next32() << 16));
        if (isnan(x)) continue;
        uint16_t got = loom_bf16_from_f32(x), want = ref_round_exact(x);
        if (got != want && bad++ < 5) fprintf(stderr, "round %a: got 0x%04x want 0x%04x\n", x, got, want);
        CHECK(to_bits(loom_bf16_round(x)) == (uint32_t)got << 16, "loom_bf16_round(%a) is not the bf16 bits",
              x);
    }
    CHECK(bad == 0, "%d of 200000 roundings differ from the reference", bad);
    /* ties: exactly half a bf16 ulp above an even and an odd mantissa */
    CHECK(loom_bf16_from_f32(from_bits(0x3f808000u)) == 0x3f80, "tie to even (down)");
    CHECK(loom_bf16_from_f32(from_bits(0x3f818000u)) == 0x3f82, "tie to even (up)");
    CHECK(loom_bf16_from_f32(from_bits(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
    CHECK(loom_bf16_from_f32(-INFINITY) == 0xff80, "-inf");
    uint16_t q = loom_bf16_from_f32(from_bits(0x7f800001u)); /* a signalling NaN whose payload is low */
    CHECK((q & 0x7f80) == 0x7f80 && (q & 0x7f), "NaN stays NaN: 0x%04x", q);
    for (uint32_t h = 0; h < 0x10000u; h++) /* every bf16 converts to float and back exactly */
        if ((h & 0x7f80) != 0x7f80 || !(h & 0x7f))
            CHECK(loom_bf16_from_f32(loom_bf16_to_f32((uint16_t)h)) == h, "bf16 0x%04x round trip", h);
}

static void test_sum(void) {
    enum { N = 4096 };
    static uint16_t a[N], b[N], want[N];
    int bad = 0;
    for (int rep = 0; rep < 64; rep++) {
        for (int i = 0; i < N; i++) {
            /* exponents close (exact fp32 sums, carries, cancellation) and far
             * apart (the smaller operand below half an ulp), subnormals too */
            int e0 = rep % 4 == 0 ? 0 : rep % 4 == 1 ? 100 : 120, span = rep % 4 == 3 ? 40 : 8;
            a[i] = random_bf16(e0, span);
            b[i] = random_bf16(e0, span);
            want[i] = ref_round_exact((double)loom_bf16_to_f32(a[i]) + (double)loom_bf16_to_f32(b[i]));
        }
        loom_bf16_sum(a, b, N);
        for (int i = 0; i < N; i++)
            if (!same(a[i], want[i]) && bad++ < 5)
                fprintf(stderr, "sum: got 0x%04x want 0x%04x\n", a[i], want[i]);
    }
    CHECK(bad == 0, "%d bf16 sums differ from the correctly rounded reference", bad);
    /* specials: overflow, inf - inf, signed zeros, NaN */
    uint16_t x[5] = {0x7f7f, 0x7f80, 0x8000, 0x8000, 0x7fc0};
    uint16_t y[5] = {0x7f7f, 0xff80, 0x8000, 0x0000, 0x3f80};
    loom_bf16_sum(x, y, 5);
    CHECK(x[0] == 0x7f80, "max + max overflows to inf: 0x%04x", x[0]);
    CHECK((x[1] & 0x7f80) == 0x7f80 && (x[1] & 0x7f), "inf + -inf is NaN: 0x%04x", x[1]);
    CHECK(x[2] == 0x8000 && x[3] == 0x0000, "-0 + -0 = -0 (0x%04x), -0 + 0 = +0 (0x%04x)", x[2], x[3]);
    CHECK((x[4] & 0x7f80) == 0x7f80 && (x[4] & 0x7f), "NaN + 1 is NaN: 0x%04x", x[4]);
}

static void test_pack(loom_device *dev) {
    enum { N = 10007 }; /* not a multiple of the kernels' block */
    static float src[N], back[N];
    static uint16_t h[N];
    for (int i = 0; i < N; i++)
        src[i] = from_bits((next32() & 0x3fffffffu) | 0x30000000u) * (i % 2 ? 1.f : -1.f);
    loom_bf16_pack(dev, h, src, N);
    loom_bf16_unpack(dev, back, h, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += h[i] != ref_round_exact(src[i]) || to_bits(back[i]) != (uint32_t)h[i] << 16;
    CHECK(bad == 0, "pack/unpack: %d of %d values wrong", bad, N);

    /* the vector lanes against the scalar definition (loom/bf16.h) on every
     * kind of bit pattern: NaNs (quiet and signalling, both signs), infs,
     * subnormals, zeros, ties and near-ties around each exponent, FLT_MAX */
    enum { M = 4099 };
    static float sp[M], r[M];
    static uint16_t hp[M];
    static const uint32_t lows[] = {0x0u,    0x1u,      0x7fffu,   0x8000u,   0x8001u,   0x18000u,
                                    0xffffu, 0x7fffffu, 0x400000u, 0x3fffffu, 0x7f8000u, 0x7fffu | 0x10000u};
    for (int i = 0; i < M; i++) {
        uint32_t expo = (uint32_t)(i / 12 % 256), low = lows[i % 12], sign = (uint32_t)(i / 3072) << 31;
        sp[i] = from_bits(sign | expo << 23 | (low & 0x7fffffu));
    }
    loom_bf16_pack(dev, hp, sp, M);
    loom_round_bf16(dev, r, sp, M);
    int badv = 0;
    for (int i = 0; i < M; i++) {
        float want = loom_bf16_round(sp[i]);
        badv += hp[i] != loom_bf16_from_f32(sp[i]) || to_bits(r[i]) != to_bits(want);
    }
    CHECK(badv == 0, "vector pack/round vs scalar on special patterns: %d of %d differ", badv, M);
}

/* The same product on a bf16 device and on an fp32 one. */
static void test_gemm(loom_device *bf16, loom_device *fp32) {
    const int N = 37, C = 64, OC = 48;
    float *in = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * C * OC);
    float *out = malloc(sizeof(float) * N * OC), *out32 = malloc(sizeof(float) * N * OC);
    float *b = malloc(sizeof(float) * OC);
    loom_rng_fill_normal(loom_rng_key_make(1, "in"), 0, in, (size_t)N * C, 1.0f);
    loom_rng_fill_normal(loom_rng_key_make(1, "w"), 0, w, (size_t)C * OC, 0.1f);
    loom_rng_fill_normal(loom_rng_key_make(1, "b"), 0, b, (size_t)OC, 0.1f);
    loom_matmul_fwd(bf16, out, in, w, b, N, C, OC);
    loom_matmul_fwd(fp32, out32, in, w, b, N, C, OC);
    double worst = 0, worst32 = 0, scale = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            double s = b[j], s32 = b[j];
            for (int c = 0; c < C; c++) {
                s += (double)ref_round(in[i * C + c]) * ref_round(w[c * OC + j]);
                s32 += (double)in[i * C + c] * w[c * OC + j];
            }
            worst = fmax(worst, fabs(out[i * OC + j] - s));
            worst32 = fmax(worst32, fabs(out[i * OC + j] - s32));
            scale = fmax(scale, fabs(s));
        }
    CHECK(worst <= 1e-5 * scale, "bf16 GEMM vs rounded-operand reference: %.3g (scale %.3g)", worst, scale);
    CHECK(worst32 > 1e-4 * scale, "bf16 GEMM equals the fp32 product (%.3g): operands not rounded", worst32);
    free(in);
    free(w);
    free(out);
    free(out32);
    free(b);
}

int main(void) {
    loom_device *fp32 = test_cpu_device(1, 0), *bf16 = test_cpu_device(1, 1);
    test_round(fp32);
    test_round_random();
    test_sum();
    test_pack(fp32);
    test_gemm(bf16, fp32);
    loom_device_free(fp32);
    loom_device_free(bf16);
    return check_done();
}
