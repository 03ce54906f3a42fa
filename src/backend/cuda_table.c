/* cuda_table.c - the CUDA backend's table: the registration of
 * src/backend/cuda (library loom_cuda, functions loom_cuda_*) behind
 * include/loom/backend.h. Compiled only when the build defines
 * LOOM_HAVE_CUDA for loomlib (and links loom_cuda); empty otherwise.
 *
 * The context is a loom_cuda_ctx on the rank's device. The kernel entries
 * are generated from include/loom/kernel_list.h: every REQUIRED kernel is
 * loom_cuda_<name> (the OPTIONAL fused ones are left NULL: the callers run
 * the unfused kernels). The rest adapts: alloc zeroes (the table's
 * contract), free ignores the size, copies and stream calls drop their
 * status (a failure is reported by the CUDA library's loom_cuda_status /
 * loom_cuda_sync). Defined here, not in the library: tensor ops that are
 * sums of two tensors use the residual kernel (a + b, the CPU's rounding);
 * the bias + residual add, the strided column sums and the loss sum have no
 * CUDA kernel yet and go through host copies in the context's host scratch
 * - correct, slow, and to be replaced by kernels; kept GEMM operands are
 * not kept (cuda_gemm.cu converts bf16 operands at every product). NOTHING
 * HERE HAS RUN ON A GPU. Local to the calling rank.
 */
#ifdef LOOM_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "loom/device.h"

/* The rank's device: its node-local rank (Open MPI, MPICH, Slurm) modulo the
 * devices visible; device 0 for a plain process. */
static int local_device(int count) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v) % count;
    }
    return 0;
}

static loom_status cu_ctx_create(loom_device *dev) {
    int count = loom_cuda_device_count();
    if (count < 1)
        return loom_fail(LOOM_EUSAGE, "--device cuda: no CUDA device is visible to this process "
                                      "(driver, CUDA_VISIBLE_DEVICES)");
    LOOM_TRY(loom_cuda_init(local_device(count)));
    loom_cuda_ctx *c = NULL;
    LOOM_TRY(loom_cuda_ctx_create(dev->bf16 ? LOOM_CUDA_BF16 : LOOM_CUDA_FP32, &c));
    dev->ctx = c;
    return LOOM_OK;
}
static void cu_ctx_free(void *ctx) { loom_cuda_ctx_free(ctx); }

static void cu_d2d(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes && dst != src) (void)loom_cuda_memcpy_d2d(dst, src, bytes);
}
static void *cu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = loom_cuda_alloc(bytes);
    if (p && loom_cuda_memset(p, 0, bytes) != LOOM_OK) {
        loom_cuda_free(p);
        return NULL;
    }
    return p;
}
static void cu_free(void *ctx, void *p, size_t bytes) {
    (void)ctx, (void)bytes;
    if (p) loom_cuda_free(p);
}
static void cu_h2d(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes) (void)loom_cuda_memcpy_h2d(dst, src, bytes);
}
static void cu_d2h(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes) (void)loom_cuda_memcpy_d2h(dst, src, bytes);
}
static void cu_memset(void *ctx, void *dst, int byte, size_t bytes) {
    (void)ctx;
    if (bytes) (void)loom_cuda_memset(dst, byte, bytes);
}

static loom_status cu_stream_create(void *ctx, loom_stream **out) {
    (void)ctx;
    loom_cuda_stream s = NULL;
    loom_status st = loom_cuda_stream_create(&s);
    *out = (loom_stream *)s;
    return st;
}
static void cu_stream_destroy(void *ctx, loom_stream *s) {
    (void)ctx;
    loom_cuda_stream_destroy((loom_cuda_stream)s);
}
static void cu_stream_sync(void *ctx, loom_stream *s) {
    (void)ctx;
    (void)loom_cuda_stream_sync((loom_cuda_stream)s);
}
static loom_status cu_event_create(void *ctx, loom_event **out) {
    (void)ctx;
    loom_cuda_event e = NULL;
    loom_status st = loom_cuda_event_create(&e);
    *out = (loom_event *)e;
    return st;
}
static void cu_event_destroy(void *ctx, loom_event *e) {
    (void)ctx;
    loom_cuda_event_destroy((loom_cuda_event)e);
}
static void cu_event_record(void *ctx, loom_event *e, loom_stream *s) {
    (void)ctx;
    (void)loom_cuda_event_record((loom_cuda_event)e, (loom_cuda_stream)s);
}
static void cu_stream_wait_event(void *ctx, loom_stream *s, loom_event *e) {
    (void)ctx;
    (void)loom_cuda_stream_wait_event((loom_cuda_stream)s, (loom_cuda_event)e);
}
static void cu_event_sync(void *ctx, loom_event *e) {
    (void)ctx;
    (void)loom_cuda_event_sync((loom_cuda_event)e);
}

/* ---- kept operands: none kept (every product converts its operands) ---- */
static int cu_gemm_keeps_bf16(void *ctx) {
    (void)ctx;
    return 0;
}
void loom_cuda_gemm_keep(void *ctx, const float *p, size_t n) { (void)ctx, (void)p, (void)n; }
void loom_cuda_gemm_unkeep(void *ctx, const float *p) { (void)ctx, (void)p; }
uint16_t *loom_cuda_gemm_keep_fill(void *ctx, const float *src, size_t n) {
    (void)ctx, (void)src, (void)n;
    return NULL;
}
void loom_cuda_gemm_keep_filled(void *ctx, const float *src, int ok) { (void)ctx, (void)src, (void)ok; }

/* ---- tensor ops: sums through the residual kernel, the rest through the host ---- */
void loom_cuda_tensor_add(void *ctx, float *y, const float *x, size_t n) {
    loom_cuda_residual_fwd(ctx, y, y, x, n);
}
void loom_cuda_tensor_add2(void *ctx, float *a, float *b, size_t n) {
    loom_cuda_residual_fwd(ctx, a, a, b, n);
    cu_d2d(ctx, b, a, n * sizeof(float));
}

void loom_cuda_tensor_add_bias_residual(void *ctx, float *out, const float *res, const float *bias, int n,
                                        int C) {
    const size_t nc = (size_t)n * C;
    float *h = loom_cuda_host_scratch(ctx, 2 * nc + (size_t)C), *r = h + nc, *b = r + nc;
    cu_d2h(ctx, h, out, nc * sizeof(float));
    cu_d2h(ctx, r, res, nc * sizeof(float));
    cu_d2h(ctx, b, bias, (size_t)C * sizeof(float));
    for (size_t i = 0; i < (size_t)n; i++)
        for (int c = 0; c < C; c++) h[i * C + c] += r[i * C + c] + b[c];
    cu_h2d(ctx, out, h, nc * sizeof(float));
}

void loom_cuda_tensor_colsum_acc(void *ctx, float *y, const float *x, int N, int ld, int ncols) {
    const size_t nx = (size_t)N * ld;
    float *h = loom_cuda_host_scratch(ctx, nx + (size_t)ncols), *hy = h + nx;
    cu_d2h(ctx, h, x, nx * sizeof(float));
    cu_d2h(ctx, hy, y, (size_t)ncols * sizeof(float));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < ncols; j++) hy[j] += h[(size_t)i * ld + j];
    cu_h2d(ctx, y, hy, (size_t)ncols * sizeof(float));
}

void loom_cuda_tensor_sum_acc(void *ctx, double *host_acc, const float *x, size_t n) {
    float *h = loom_cuda_host_scratch(ctx, n);
    cu_d2h(ctx, h, x, n * sizeof(float));
    for (size_t i = 0; i < n; i++) *host_acc += h[i];
}

/* NCCL groups (src/comm/comm_nccl.c, in loom_cuda) on the calling thread's
 * current stream, where this thread's kernels run (the default stream unless
 * one was set). LOOM_CUDA_NO_NCCL: a build of this table without NCCL (the
 * CPU emulation of tests/backend/test_model_emu.sh), whose devices then
 * make host-staged groups only. */
#ifndef LOOM_CUDA_NO_NCCL
static loom_status cu_comm_nccl(void *ctx, loom_comm *host_group, const loom_comm_mem *mem, loom_comm **out) {
    (void)ctx;
    return loom_comm_wrap_nccl(host_group, mem, (void *)loom_cuda_stream_get(), out);
}
#define CU_COMM_NATIVE cu_comm_nccl
#else
#define CU_COMM_NATIVE NULL
#endif

#define LOOM_CUDA_ENTRY_REQUIRED(name) .name = loom_cuda_##name,
#define LOOM_CUDA_ENTRY_OPTIONAL(name)

const loom_backend loom_backend_cuda = {
    .name = "cuda",
    .host_memory = 0,
    .ctx_create = cu_ctx_create,
    .ctx_free = cu_ctx_free,
    .alloc = cu_alloc,
    .free = cu_free,
    .memcpy_h2d = cu_h2d,
    .memcpy_d2h = cu_d2h,
    .memcpy_d2d = cu_d2d,
    .memset = cu_memset,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_sync = cu_stream_sync,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .event_sync = cu_event_sync,
    .gemm_keeps_bf16 = cu_gemm_keeps_bf16,
    .comm_native = CU_COMM_NATIVE,
#define LOOM_KERNEL(ret, name, params, args, need) LOOM_CUDA_ENTRY_##need(name)
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
};

#endif /* LOOM_HAVE_CUDA */
