/* kernels.h - compute kernels: forward/backward pairs, float32, each run on
 * the device it is given.
 *
 * Every kernel takes the device first (include/loom/device.h, made once from
 * --device) and dispatches through its backend table to that backend's body
 * with the backend's context (the CPU's: src/kernels/cpu, loom_cpu_*). Every
 * tensor pointer is that device's memory. The kernels are declared once, in
 * kernel_list.h, with each one's contract; the prototypes below are generated
 * from it: loom_<name>(loom_device *dev, <parameters>), defined in
 * src/backend/backend.c. The CPU kernels' own helpers (calibration, tile
 * counts, scratch sizes: no tensor work, not dispatched) are in cpu.h; the
 * types the kernels are written in, in kernel_types.h.
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

#include "loom/kernel_types.h" /* loom_att_view, loom_bf16_buf, LOOM_UNPACK, ... */

typedef struct loom_device loom_device;

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
#define LOOM_KERNEL(ret, name, params, args, need)                                                           \
    LOOM_KERNEL_RET_##need(ret) loom_##name(loom_device *dev, LOOM_UNPACK params);
#include "loom/kernel_list.h"
#undef LOOM_KERNEL

/* 1 when kept operands are bf16 copies for a bf16 GEMM provider (bf16
 * precision, the provider ready): then keeping a large range costs 2 bytes
 * per float. */
int loom_gemm_keeps_bf16(loom_device *dev);

#endif
