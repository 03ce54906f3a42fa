/* kernel_types.h - the types and macros kernel_list.h's declarations are
 * written in, for everything that declares or defines kernels: the
 * dispatchers (kernels.h, src/backend/backend.c), the backend table
 * (backend.h) and each backend's bodies (src/kernels/cpu,
 * src/backend/cuda). Declares no function, so the kernels' bodies depend
 * on nothing above them. No mesh axis; nothing here runs.
 */
#ifndef LOOM_KERNEL_TYPES_H
#define LOOM_KERNEL_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* Partial attention, for context parallelism: queries of one sequence slice
 * attend to keys/values of another. Element (b, t, d) of head h of q sits at
 * q[b*q_bs + t*q_ld + h*HS + d], likewise k and v with kv_bs, kv_ld. Query t
 * has global position q_pos0 + t, key t has k_pos0 + t; a key is visible when
 * its position is <= the query's (causal). */
typedef struct {
    const float *q, *k, *v;
    size_t q_bs, kv_bs; /* batch strides (floats) */
    int q_ld, kv_ld;    /* row strides (floats) */
    int B, Tq, Tk, NH, HS;
    long q_pos0, k_pos0;
} loom_att_view;

/* The widest row topk_gate takes (MoE: num_local_experts, which the config check bounds). */
#define LOOM_TOPK_MAX_N 1024

/* bf16 bits (as uint16) of a buffer the kept-operand kernels hand out. */
typedef uint16_t *loom_bf16_buf;

/* A parenthesised list without its parentheses (kernel_list.h's columns). */
#define LOOM_UNPACK(...) __VA_ARGS__

#endif
