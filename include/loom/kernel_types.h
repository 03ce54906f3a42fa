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
 * its position is <= the query's (causal) and, with window > 0, at most
 * window positions before it (Mistral's sliding window as Hugging Face
 * masks it: window + 1 keys). Grouped-query attention: with NKV > 0 key/value
 * heads, query head h reads key/value head h / (NH / NKV) (NKV divides NH);
 * NKV = 0 means NKV = NH. */
typedef struct {
    const float *q, *k, *v;
    size_t q_bs, kv_bs; /* batch strides (floats) */
    int q_ld, kv_ld;    /* row strides (floats) */
    int B, Tq, Tk, NH, HS;
    long q_pos0, k_pos0;
    int NKV;    /* key/value heads; 0: NH */
    int window; /* 0: causal only */
} loom_att_view;

/* The attention heads of a model part: each row of its qkv is
 * [q (NH*HS) | k (NKV*HS) | v (NKV*HS)] (NKV = NH without grouped-query
 * attention); window as loom_att_view's. */
typedef struct {
    int NH, NKV, HS, window;
} loom_att_heads;

/* Key/value heads of a view, and the key/value head query head h reads. */
static inline int loom_att_nkv(const loom_att_view *v) { return v->NKV > 0 ? v->NKV : v->NH; }
static inline int loom_att_kv_head(const loom_att_view *v, int h) { return h / (v->NH / loom_att_nkv(v)); }

/* The causal view of whole sequences of packed rows qkv (B,T,W) of heads h,
 * W = (NH + 2 NKV) HS. */
static inline loom_att_view loom_att_packed(const float *qkv, int B, int T, const loom_att_heads *h) {
    const int C = h->NH * h->HS, K = h->NKV * h->HS, W = C + 2 * K;
    loom_att_view v = {qkv,   qkv + C, qkv + C + K, (size_t)T * W, (size_t)T * W, W, W, B, T, T, h->NH,
                       h->HS, 0,       0,           h->NKV,        h->window};
    return v;
}

/* The widest row topk_gate takes (MoE: num_local_experts, which the config check bounds). */
#define LOOM_TOPK_MAX_N 1024

/* bf16 bits (as uint16) of a buffer the kept-operand kernels hand out. */
typedef uint16_t *loom_bf16_buf;

/* A parenthesised list without its parentheses (kernel_list.h's columns). */
#define LOOM_UNPACK(...) __VA_ARGS__

#endif
