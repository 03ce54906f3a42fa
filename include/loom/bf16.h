/* bf16.h - bfloat16 scalars: the one rounding every bf16 path of loom uses.
 *
 * A bfloat16 is the high 16 bits of an IEEE float (sign, 8 exponent bits, 7
 * mantissa bits). loom_bf16_round rounds a float to the nearest bf16, ties to
 * even - what PyTorch's .to(torch.bfloat16) and AVX512-BF16's VCVTNEPS2BF16
 * do; an infinity stays infinite, a NaN stays a (quiet) NaN, and a finite
 * value past the largest bf16 rounds to infinity.
 *
 * Users: the mixed-precision GEMM operands (src/kernels/cpu/bf16.c) and bf16
 * communication (--comm-precision bf16: the communicator's wire format packs
 * with loom_bf16_pack, comm_wire.c, and MPI sums with loom_bf16_sum,
 * comm_mpi.c).
 */
#ifndef LOOM_BF16_H
#define LOOM_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* x rounded to bf16, kept as a float (its low 16 bits zero). */
static inline float loom_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) { /* inf stays, NaN stays NaN (quiet) */
        if (u & 0x007fffffu) u = (u & 0xffff0000u) | 0x00400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
    }
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The bf16 bits of x rounded (loom_bf16_round). */
static inline uint16_t loom_bf16_from_f32(float x) {
    float r = loom_bf16_round(x);
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    return (uint16_t)(u >> 16);
}

/* The float a bf16 stands for (exact). */
static inline float loom_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* inout[i] = bf16(inout[i] + in[i]): both added in fp32 (the sum of two
 * bf16 values is exact in fp32 unless their exponents are more than 16
 * apart, where fp32 rounds first), the sum rounded to bf16. This is one hop
 * of a bf16 reduction: a sum over n ranks rounds each of its n - 1 partial
 * sums, so its error grows with the group size (docs/performance.md). */
static inline void loom_bf16_sum(uint16_t *inout, const uint16_t *in, size_t n) {
    for (size_t i = 0; i < n; i++)
        inout[i] = loom_bf16_from_f32(loom_bf16_to_f32(inout[i]) + loom_bf16_to_f32(in[i]));
}

#endif
