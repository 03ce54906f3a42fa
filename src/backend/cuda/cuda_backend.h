/* cuda_backend.h - the CUDA backend: device memory, streams and events, and
 * every kernel of loom/kernels.h on device pointers (library loom_cuda,
 * built when CMake finds nvcc: cmake/LoomCuda.cmake).
 *
 * Naming: loom_cuda_X is kernel X of include/loom/kernel_list.h, its
 * prototype generated from the list: the context first, then the list's
 * parameters with every float/int32 pointer a DEVICE pointer, and the same
 * contract: what it writes, what it accumulates into (+=), which outputs
 * may be NULL, eps, scaling. So the backend table (include/loom/backend.h)
 * holds loom_cuda_layernorm_fwd where the CPU table holds
 * loom_cpu_layernorm_fwd.
 *
 * Streams: kernels, cuBLAS calls, memset and d2d copies are enqueued on the
 * calling thread's current stream (loom_cuda_stream_set; default: the legacy
 * default stream) and return before the work is done. h2d and d2h copies
 * wait for the stream and for the copy (the host buffer is usable on return).
 * loom_cuda_sumsq and loom_cuda_all_finite return a host value, so they wait
 * too. A context's kernels run from one host thread at a time (they share
 * its cuBLAS handle and scratch buffers).
 *
 * Memory: kernels allocate nothing per call, except the context's scratch
 * that grows to the largest size seen (attention backward's per-row D, the
 * bf16 copies of GEMM operands, reduction partials): the first step
 * allocates, later steps reuse, as the CPU's context does.
 *
 * Errors: kernels return void, as on the CPU. A failed launch or cuBLAS call
 * is remembered (the first one, with the kernel's name); loom_cuda_status and
 * loom_cuda_sync turn it into LOOM_EUNAVAIL with the message "cuda: <kernel>:
 * <CUDA's reason>" via loom_fail. Memory and stream calls return a status
 * directly (LOOM_EOS when out of device memory).
 *
 * Numerics: see docs/backends.md "CUDA backend". fp32 GEMMs use no TF32
 * unless loom_cuda_set_precision(LOOM_CUDA_TF32); LOOM_CUDA_BF16 rounds both
 * GEMM operands to bf16 (nearest even, as the CPU's bf16 mode does) and
 * accumulates in fp32.
 */
#ifndef LOOM_CUDA_BACKEND_H
#define LOOM_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "loom/cpu.h"          /* loom_attention_tiles: the CPU's tile count, returned as is */
#include "loom/kernel_types.h" /* loom_att_view, LOOM_UNPACK */
#include "loom/status.h"

/* ---- device ------------------------------------------------------------ */

/* Devices visible to the CUDA runtime; 0 when there is none or no driver
 * (never fails). */
int loom_cuda_device_count(void);
/* Select device `dev` for this process. LOOM_EUNAVAIL naming the device
 * when it cannot. */
loom_status loom_cuda_init(int dev);
/* The first remembered kernel/cuBLAS failure (LOOM_EUNAVAIL) or LOOM_OK. */
loom_status loom_cuda_status(void);
/* Wait for the current stream; then as loom_cuda_status. */
loom_status loom_cuda_sync(void);

/* ---- the context --------------------------------------------------------
 * What a CUDA device (include/loom/device.h) owns besides its table, as
 * loom_cpu_ctx is the CPU's: the GEMM precision, the cuBLAS and cuBLASLt
 * handles, the kernels' device scratch and the table's host staging buffer.
 * Every kernel takes it first; one host thread at a time per context. */
typedef struct loom_cuda_ctx loom_cuda_ctx;

/* GEMM precision: fp32 (default, TF32 off), bf16 operands with fp32
 * accumulation, or TF32 tensor cores for fp32 operands. */
enum { LOOM_CUDA_FP32 = 0, LOOM_CUDA_BF16 = 1, LOOM_CUDA_TF32 = 2 };
/* A context on the device loom_cuda_init selected, its cuBLAS handle made;
 * LOOM_EUNAVAIL (message as loom_cuda_status) when cuBLAS cannot start,
 * LOOM_EOS without host memory. */
loom_status loom_cuda_ctx_create(int precision, loom_cuda_ctx **out);
/* Frees the handles and scratch (NULL: nothing). */
void loom_cuda_ctx_free(loom_cuda_ctx *c);
void loom_cuda_set_precision(loom_cuda_ctx *c, int mode);
int loom_cuda_get_precision(const loom_cuda_ctx *c);
/* Host memory for n floats, the context's, grown to the largest n asked
 * (the table's ops that stage through the host, cuda_table.c); aborts
 * without memory (kernels return void). */
float *loom_cuda_host_scratch(loom_cuda_ctx *c, size_t n);

/* Measured GEMM throughput in FLOP/s at c's precision: the best of
 * `trials` n x n x n products after a warm-up (n <= 0: 4096), timed with
 * CUDA events (the peak an MFU is reported against, as
 * loom_kernels_calibrate_sgemm on the CPU). 0 on failure. */
double loom_cuda_calibrate_gemm(loom_cuda_ctx *c, int n, int trials);

/* ---- memory ------------------------------------------------------------- */

/* NULL (message set, LOOM_EOS) when out of device memory; bytes 0 gives a
 * valid unique pointer. */
void *loom_cuda_alloc(size_t bytes);
void loom_cuda_free(void *p);
loom_status loom_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
loom_status loom_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
loom_status loom_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
/* every byte of dst = value (as memset) */
loom_status loom_cuda_memset(void *dst, int value, size_t bytes);

/* ---- streams and events (opaque: cudaStream_t / cudaEvent_t) ------------- */

typedef void *loom_cuda_stream;
typedef void *loom_cuda_event;

loom_status loom_cuda_stream_create(loom_cuda_stream *s); /* non-blocking stream */
void loom_cuda_stream_destroy(loom_cuda_stream s);
/* The stream this thread's kernels and copies go to (NULL: default stream). */
void loom_cuda_stream_set(loom_cuda_stream s);
loom_cuda_stream loom_cuda_stream_get(void);
loom_status loom_cuda_stream_sync(loom_cuda_stream s);
loom_status loom_cuda_event_create(loom_cuda_event *e); /* with timing */
void loom_cuda_event_destroy(loom_cuda_event e);
loom_status loom_cuda_event_record(loom_cuda_event e, loom_cuda_stream s);
/* Work later enqueued on s waits for e (no host wait). */
loom_status loom_cuda_stream_wait_event(loom_cuda_stream s, loom_cuda_event e);
loom_status loom_cuda_event_sync(loom_cuda_event e);
/* Milliseconds between two recorded, completed events. */
loom_status loom_cuda_event_elapsed(float *ms, loom_cuda_event start, loom_cuda_event end);

/* ---- kernels: include/loom/kernel_list.h on device pointers --------------
 * loom_cuda_X(ctx, ...) for every REQUIRED kernel X of the list, ctx the
 * loom_cuda_ctx (void * as the backend table passes it). Notes per kernel:
 * attention_part_fwd/_bwd take the view struct in host memory (its q, k, v
 * device pointers) and return loom_attention_tiles, the CPU's tile count,
 * so work accounting does not depend on the backend; attention_kv_fwd uses
 * no scratch (may be NULL) unless paged (n*NH floats); sumsq, all_finite and tensor_softmax_lse return
 * host values, so they wait for the stream. The tensor ops without a CUDA
 * kernel yet (tensor_add, _add2, _add_bias_residual, _colsum_acc, _sum_acc)
 * and the kept-operand entries (gemm_keep ...: nothing kept yet, operands
 * are converted at every product) are defined by the table,
 * src/backend/cuda_table.c, not by this library. */
#define LOOM_CUDA_KERNEL_REQUIRED(ret, name, params) ret loom_cuda_##name(void *ctx, LOOM_UNPACK params);
#define LOOM_CUDA_KERNEL_OPTIONAL(ret, name, params)
#define LOOM_KERNEL(ret, name, params, args, need) LOOM_CUDA_KERNEL_##need(ret, name, params)
#include "loom/kernel_list.h"
#undef LOOM_KERNEL

#ifdef __cplusplus
}
#endif

#endif
