/* cuda_backend.h - the CUDA backend: device memory, streams and events, and
 * every kernel of loom/kernels.h on device pointers (library loom_cuda,
 * built when CMake finds nvcc: cmake/LoomCuda.cmake).
 *
 * Naming: loom_cuda_X has exactly the argument list of loom_X in kernels.h,
 * with every float/int32 pointer a DEVICE pointer, and the same contract:
 * what it writes, what it accumulates into (+=), which outputs may be NULL,
 * eps, scaling. So the backend table (include/loom/backend.h) can hold
 * loom_cuda_layernorm_fwd where the CPU table holds loom_layernorm_fwd.
 *
 * Streams: kernels, cuBLAS calls, memset and d2d copies are enqueued on the
 * calling thread's current stream (loom_cuda_stream_set; default: the legacy
 * default stream) and return before the work is done. h2d and d2h copies
 * wait for the stream and for the copy (the host buffer is usable on return).
 * loom_cuda_sumsq and loom_cuda_all_finite return a host value, so they wait
 * too. Kernels run from one host thread at a time (they share one cuBLAS
 * handle and the scratch buffers below).
 *
 * Memory: kernels allocate nothing per call, except scratch that grows to the
 * largest size seen (attention backward's per-row D, the bf16 copies of GEMM
 * operands, reduction partials): the first step allocates, later steps reuse,
 * as the CPU's bf16 buffers do (src/kernels/cpu/bf16.c).
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

#include "loom/kernels.h" /* loom_att_view */
#include "loom/status.h"

/* ---- device ------------------------------------------------------------ */

/* Devices visible to the CUDA runtime; 0 when there is none or no driver
 * (never fails). */
int loom_cuda_device_count(void);
/* Select device `dev` for this process and create the cuBLAS handle.
 * LOOM_EUNAVAIL naming the device when it cannot. */
loom_status loom_cuda_init(int dev);
/* Free the handle, scratch buffers and the default precision setting. */
void loom_cuda_shutdown(void);
/* The first remembered kernel/cuBLAS failure (LOOM_EUNAVAIL) or LOOM_OK. */
loom_status loom_cuda_status(void);
/* Wait for the current stream; then as loom_cuda_status. */
loom_status loom_cuda_sync(void);

/* GEMM precision: fp32 (default, TF32 off), bf16 operands with fp32
 * accumulation, or TF32 tensor cores for fp32 operands. */
enum { LOOM_CUDA_FP32 = 0, LOOM_CUDA_BF16 = 1, LOOM_CUDA_TF32 = 2 };
void loom_cuda_set_precision(int mode);
int loom_cuda_get_precision(void);

/* Measured GEMM throughput in FLOP/s at the current precision: the best of
 * `trials` n x n x n products after a warm-up (n <= 0: 4096), timed with
 * CUDA events (the peak an MFU is reported against, as
 * loom_kernels_calibrate_sgemm on the CPU). 0 on failure. */
double loom_cuda_calibrate_gemm(int n, int trials);

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

/* ---- kernels: loom/kernels.h on device pointers ------------------------- */

void loom_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                             const float *b, int N, int C);
void loom_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);

void loom_cuda_matmul_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C,
                          int OC);
void loom_cuda_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, int N, int C, int OC);
void loom_cuda_matmul_nt_fwd(float *out, const float *inp, const float *wte, int N, int C, int V);
void loom_cuda_matmul_nt_bwd(float *dinp, float *dwte, const float *dout, const float *inp,
                             const float *wte, int N, int C, int V);

void loom_cuda_gelu_fwd(float *out, const float *inp, size_t n);
void loom_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
void loom_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n);
void loom_cuda_residual_bwd(float *da, float *db, const float *dout, size_t n);

void loom_cuda_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void loom_cuda_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int C, int NH);
/* The view's q, k, v are device pointers; the view struct itself is host
 * memory. Return values as on the CPU (loom_attention_tiles, the CPU's tile
 * count, so work accounting does not depend on the backend). */
long loom_cuda_attention_part_fwd(const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                                  float *lse, int accumulate);
long loom_cuda_attention_part_bwd(const loom_att_view *v, float *dq, float *dk, float *dv,
                                  const float *dout, const float *out, size_t o_bs, int o_ld,
                                  const float *lse);
void loom_cuda_attention_merge(float *out, float *lse, const float *out2, const float *lse2,
                               size_t o_bs, int o_ld, int B, int Tq, int NH, int HS);
/* scratch is not used on the GPU (may be NULL). */
void loom_cuda_attention_kv_fwd(float *out, const float *q, int ldq, const float *kc,
                                const float *vc, int p0, int n, int C, int NH, float *scratch);

void loom_cuda_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                         int C);
void loom_cuda_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l,
                         int N, int C);
void loom_cuda_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C);
void loom_cuda_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C);
void loom_cuda_vxent_max(float *rowmax, const float *logits, int N, int V_l, int V_valid);
void loom_cuda_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                         const int32_t *targets, int v0, int N, int V_l, int V_valid);
void loom_cuda_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                            const int32_t *targets, int N, int V_l);
void loom_cuda_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                         int v0, int N, int V_l);

void loom_cuda_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                            float beta1, float beta2, float eps, float wd, int t, float gscale);

/* Host results: these wait for the stream. */
double loom_cuda_sumsq(const float *x, size_t n);
int loom_cuda_all_finite(const float *x, size_t n);
void loom_cuda_scale(float *x, size_t n, float s);
void loom_cuda_round_bf16(float *dst, const float *src, size_t n);

/* Routing and row ops of the backend table (include/loom/backend.h has the
 * contracts; cuda_route.cu). softmax_lse waits for the stream (host result). */
double loom_cuda_softmax_lse(float *x, float *lse, int N, int n);
void loom_cuda_topk_gate(int32_t *sel, float *gate, const float *p, const float *bias, int N, int n,
                         int k, int norm);
void loom_cuda_topk_gate_bwd(float *dx, float *dp, const float *dgate, const int32_t *sel,
                             const float *gate, const float *p, const float *lse,
                             const int32_t *add_tab, const int32_t *add_row, float add_scale,
                             float z_scale, int N, int n, int k, int norm);
void loom_cuda_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int C);
void loom_cuda_scatter_add_rows(float *dst, const float *src, const int32_t *idx, int n, int C);
void loom_cuda_combine_rows(float *out, const float *y, const int32_t *row, const float *w, int N,
                            int k, int C);
void loom_cuda_combine_rows_bwd(float *dy, float *dw, const float *dout, const float *y,
                                const int32_t *row, const float *w, int N, int k, int C);
void loom_cuda_fill(float *x, size_t n, float v);

#ifdef __cplusplus
}
#endif

#endif
