/* cpu_kernels.h - the CPU backend's context and kernels (private to
 * src/kernels/cpu and src/backend).
 *
 * loom_cpu_ctx is what a CPU device (include/loom/device.h) owns besides
 * its table: the settings every kernel reads and the state that used to be
 * process-wide - the thread count, the GEMM precision, the kept bf16
 * operands and the scratch that grows to the largest operand seen (the
 * first step allocates it, later steps reuse it). Each device has its own,
 * so two devices (two thread counts, two precisions) run side by side.
 *
 * loom_cpu_X(ctx, ...) is kernel X of include/loom/kernel_list.h with its
 * contract; ctx is the loom_cpu_ctx (void * as the table passes it). The
 * prototypes are generated from that list.
 */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/kernel_types.h"
#include "loom/status.h"

/* A buffer that grows, never shrinks: cap bytes at p. */
typedef struct kern_buf {
    void *p;
    size_t cap;
} kern_buf;

/* A kept operand (loom_gemm_keep): [src, src + n) converted once into buf
 * (bf16 bits when is16, rounded floats otherwise) while ready. Fresh:
 * written by the caller (loom_gemm_keep_fill) from the floats it has just
 * stored at src, so the next keep of that range makes it ready without
 * converting (until then a GEMM converts as for any unready slot). A
 * training step keeps each part's parameters and the logits' gradient. */
#define KERN_KEEP 8
typedef struct kern_kept {
    const float *src;
    size_t n;
    int ready, is16, fresh;
    kern_buf buf;
} kern_kept;

typedef struct loom_cpu_ctx {
    int threads; /* kernel threads (OpenMP), >= 1 */
    int bf16;    /* GEMM precision: 1 operands rounded to bf16 (bf16.c) */
    kern_kept keep[KERN_KEEP];
    kern_buf round[2];       /* bf16-rounded float copies of a GEMM's A and B (bf16.c) */
    kern_buf bits[2];        /* their bf16 bits, for the bf16 GEMM provider */
    kern_buf k_parts;        /* partial products of a GEMM cut along K (gemm.c) */
    kern_buf xent_rows;      /* a row of exponentials per thread (vocab.c) */
    kern_buf head_b, head_a; /* the LM head kernel's packed operands, 64-byte aligned (gemm_head.c) */
} loom_cpu_ctx;

/* A context for `threads` (0: one per online CPU) and the precision;
 * NULL without memory. Sets the threading libraries as the count needs:
 * with OpenMP, OpenBLAS on one thread (the kernels split rows over the
 * OpenMP threads themselves, because two spinning pools slow each other
 * down) and OpenMP's default to the count; without OpenMP the count goes to
 * OpenBLAS. Library settings, not loom's: every kernel still passes its
 * context's count to each parallel loop. */
loom_cpu_ctx *loom_cpu_ctx_create(int threads, int bf16);
void loom_cpu_ctx_free(loom_cpu_ctx *c);

#define LOOM_KERNEL(ret, name, params, args, need) ret loom_cpu_##name(void *ctx, LOOM_UNPACK params);
#include "loom/kernel_list.h"
#undef LOOM_KERNEL

int loom_cpu_gemm_keeps_bf16(void *ctx);
void loom_cpu_zero(void *ctx, float *x, size_t n); /* x = 0 (n), over the threads */

#endif
