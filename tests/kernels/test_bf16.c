/* test_bf16.c - bf16 rounding and the bf16-mode GEMM.
 *
 * Rounding against hand-computed bit patterns (nearest, ties to even, the
 * overflow to inf, inf and NaN kept); loom_matmul_fwd in bf16 mode against
 * a double-precision product of the hand-rounded operands (within fp32
 * accumulation error), and against the fp32 product (it must differ: the
 * operands really are rounded).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
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

static void test_round(void) {
    const struct { uint32_t in, want; } cases[] = {
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
        loom_round_bf16(&y, &x, 1);
        CHECK(to_bits(y) == cases[i].want, "round 0x%08x -> 0x%08x, want 0x%08x", cases[i].in, to_bits(y),
              cases[i].want);
    }
    float nan = from_bits(0x7fc00001u), y;
    loom_round_bf16(&y, &nan, 1);
    CHECK(isnan(y), "NaN stays NaN");
    /* many random values against the reference */
    const size_t n = 100000;
    float *x = malloc(n * sizeof *x), *r = malloc(n * sizeof *r);
    loom_rng_key k = loom_rng_key_make(9, "bf16");
    for (size_t i = 0; i < n; i++) x[i] = (float)(loom_rng_u64(k, i) >> 40) * 1e-3f - 8000.0f;
    loom_round_bf16(r, x, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += to_bits(r[i]) != to_bits(ref_round(x[i]));
    CHECK(bad == 0, "%zu of %zu random values rounded differently", bad, n);
    free(x);
    free(r);
}

static void test_gemm(void) {
    const int N = 37, C = 64, OC = 48;
    float *in = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * C * OC);
    float *out = malloc(sizeof(float) * N * OC), *out32 = malloc(sizeof(float) * N * OC);
    float *b = malloc(sizeof(float) * OC);
    loom_rng_fill_normal(loom_rng_key_make(1, "in"), 0, in, (size_t)N * C, 1.0f);
    loom_rng_fill_normal(loom_rng_key_make(1, "w"), 0, w, (size_t)C * OC, 0.1f);
    loom_rng_fill_normal(loom_rng_key_make(1, "b"), 0, b, (size_t)OC, 0.1f);
    loom_kernels_set_precision(1);
    loom_matmul_fwd(out, in, w, b, N, C, OC);
    loom_kernels_set_precision(0);
    loom_matmul_fwd(out32, in, w, b, N, C, OC);
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
    test_round();
    test_gemm();
    return check_done();
}
