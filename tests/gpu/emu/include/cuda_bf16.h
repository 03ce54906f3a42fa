/* cuda_bf16.h (emulation): bfloat16 storage and round-to-nearest-even. */
#ifndef LOOM_EMU_CUDA_BF16_H
#define LOOM_EMU_CUDA_BF16_H
#include "cuda_runtime.h"
struct __nv_bfloat16 {
    uint16_t bits;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) u = (u & 0x007fffffu) ? (u | 0x00400000u) : u; /* inf, quiet NaN */
    else u += 0x7fffu + ((u >> 16) & 1u);
    __nv_bfloat16 b;
    b.bits = (uint16_t)(u >> 16);
    return b;
}
static inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.bits << 16); }
#endif
