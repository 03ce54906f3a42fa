/* kernels.h - compute kernels: forward/backward pairs, float32, each run on
 * the device it is given.
 *
 * Every kernel takes the device first (include/loom/device.h, made once from
 * --device) and dispatches through its backend table to that backend's body
 * with the backend's context (the CPU's: src/kernels/cpu, loom_cpu_*). Every
 * tensor pointer is that device's memory. The kernels are declared once, in
 * kernel_list.h, with each one's contract; the prototypes below are generated
 * from it: loom_<name>(loom_device *dev, <parameters>). The calibration and
 * size helpers at the end (no tensor work) are the CPU's own and are not
 * dispatched.
 *
 * Each kernel returns void and trusts its shapes: the model validates every
 * size once, up front. Backward kernels ACCUMULATE (+=) into parameter
 * gradients (dw, db, dwte, ...) so a tied or shared weight can collect from
 * several places, and also into activation gradients (dinp) unless the comment
 * says "writes". Pointers marked "may be NULL" skip that output.
 *
 * Weights of linear layers are stored [in, out] (C, OC), as Hugging Face's
 * GPT-2 Conv1D stores them; the tied LM head uses the embedding (V, C).
 * Shapes use B batch, T time, C channels, NH heads, HS = C/NH, V vocab,
 * N = B*T rows.
 *
 * On the CPU matmuls go to BLAS (OpenBLAS) and elementwise loops are written
 * to vectorize, over the device's threads. No kernel allocates memory per
 * call; scratch that must grow to the largest operand seen lives in the
 * device's context.
 */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct loom_device loom_device;

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
/* LOOM_KERNEL_RETURN_<ret> call; - what a generated function that forwards
 * to a kernel writes before the call: return its value, or (void) just run it. */
#define LOOM_KERNEL_RETURN_void
#define LOOM_KERNEL_RETURN_int return
#define LOOM_KERNEL_RETURN_long return
#define LOOM_KERNEL_RETURN_double return
#define LOOM_KERNEL_RETURN_loom_bf16_buf return
/* What loom_<name> returns: the kernel's value, or for an OPTIONAL kernel
 * whether it ran. */
#define LOOM_KERNEL_RET_REQUIRED(ret) ret
#define LOOM_KERNEL_RET_OPTIONAL(ret) int

/* ---- every kernel: loom_<name>(dev, ...), generated from kernel_list.h ---- */
#define LOOM_KERNEL(ret, name, params, args, need)                                                                     \
    LOOM_KERNEL_RET_##need(ret) loom_##name(loom_device *dev, LOOM_UNPACK params);
#include "loom/kernel_list.h"
#undef LOOM_KERNEL

/* 1 when kept operands are bf16 copies for a bf16 GEMM provider (bf16
 * precision, the provider ready): then keeping a large range costs 2 bytes
 * per float. */
int loom_gemm_keeps_bf16(loom_device *dev);

/* ---- the CPU's own, not dispatched ---------------------------------------- */

/* Measured single-precision GEMM throughput in FLOP/s on `threads` CPU
 * threads: after a warm-up, the best of `trials` sgemms of 1024^3, 2048^3
 * and 2048 x 2304 x 768, each shape tried while the one before took under
 * 0.1 s (512^3 alone on a CPU too slow for 1024^3 in 0.25 s), threaded as
 * the model's matmuls are. 0 without memory. */
double loom_kernels_calibrate_sgemm(int threads, int trials);
/* The bf16 GEMM provider's throughput the same way (the same shapes,
 * operands already bf16, best of `trials` each); 0 when there is no provider (loom/cpu.h). */
double loom_kernels_calibrate_bf16(int threads, int trials);
/* 1 when bf16 products run on a bf16 GEMM provider (oneDNN or oneMKL), 0
 * when they run as rounded floats on the fp32 kernels; decides it now. */
int loom_kernels_bf16_provider(void);
/* The tiles loom_attention_part_fwd / _bwd compute for view v. */
long loom_attention_tiles(const loom_att_view *v);
/* The scratch floats loom_attention_kv_fwd needs on dev for n new rows
 * against a cache of len rows (one (n, len) block per CPU thread). */
size_t loom_attention_kv_scratch_floats(const loom_device *dev, int n, int len);

#endif
