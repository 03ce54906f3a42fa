/* cuda_table.c - the CUDA backend's table: the registration of
 * src/backend/cuda (library loom_cuda, functions loom_cuda_*) behind
 * include/loom/backend.h. Compiled only when the build defines
 * LOOM_HAVE_CUDA for loomlib (and links loom_cuda); empty otherwise.
 *
 * The kernels are loom_cuda_* as they are (same argument lists). The rest
 * adapts: alloc zeroes (the table's contract), free ignores the size, copies
 * and stream calls drop their status (a failure is reported by the CUDA
 * library's loom_cuda_status / loom_cuda_sync). Tensor ops that are sums of
 * two tensors use the residual kernel (a + b, the CPU's rounding); the bias +
 * residual add, the strided column sums and the loss sum have no CUDA kernel
 * yet and go through host copies - correct, slow, and to be replaced by
 * kernels. The routing and row ops (MoE routing, dispatch and combine, the
 * CP fill and permutations) are loom_cuda_* kernels (cuda_route.cu). NOTHING
 * HERE HAS RUN ON A GPU. Local to the calling rank.
 */
#ifdef LOOM_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "loom/backend.h"

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

loom_status loom_backend_cuda_start(void) {
    int count = loom_cuda_device_count();
    if (count < 1)
        return loom_fail(LOOM_EUSAGE, "--device cuda: no CUDA device is visible to this process "
                                      "(driver, CUDA_VISIBLE_DEVICES)");
    return loom_cuda_init(local_device(count));
}

static void *cu_alloc(size_t bytes) {
    void *p = loom_cuda_alloc(bytes);
    if (p && loom_cuda_memset(p, 0, bytes) != LOOM_OK) {
        loom_cuda_free(p);
        return NULL;
    }
    return p;
}
static void cu_free(void *p, size_t bytes) {
    (void)bytes;
    if (p) loom_cuda_free(p);
}
static void cu_h2d(void *dst, const void *src, size_t bytes) {
    if (bytes) (void)loom_cuda_memcpy_h2d(dst, src, bytes);
}
static void cu_d2h(void *dst, const void *src, size_t bytes) {
    if (bytes) (void)loom_cuda_memcpy_d2h(dst, src, bytes);
}
static void cu_d2d(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) (void)loom_cuda_memcpy_d2d(dst, src, bytes);
}
static void cu_memset(void *dst, int byte, size_t bytes) {
    if (bytes) (void)loom_cuda_memset(dst, byte, bytes);
}

static loom_status cu_stream_create(loom_stream **out) {
    loom_cuda_stream s = NULL;
    loom_status st = loom_cuda_stream_create(&s);
    *out = (loom_stream *)s;
    return st;
}
static void cu_stream_destroy(loom_stream *s) { loom_cuda_stream_destroy((loom_cuda_stream)s); }
static void cu_stream_sync(loom_stream *s) { (void)loom_cuda_stream_sync((loom_cuda_stream)s); }
static loom_status cu_event_create(loom_event **out) {
    loom_cuda_event e = NULL;
    loom_status st = loom_cuda_event_create(&e);
    *out = (loom_event *)e;
    return st;
}
static void cu_event_destroy(loom_event *e) { loom_cuda_event_destroy((loom_cuda_event)e); }
static void cu_event_record(loom_event *e, loom_stream *s) {
    (void)loom_cuda_event_record((loom_cuda_event)e, (loom_cuda_stream)s);
}
static void cu_stream_wait_event(loom_stream *s, loom_event *e) {
    (void)loom_cuda_stream_wait_event((loom_cuda_stream)s, (loom_cuda_event)e);
}
static void cu_event_sync(loom_event *e) { (void)loom_cuda_event_sync((loom_cuda_event)e); }

/* cuda_gemm.cu converts bf16 operands at every product; nothing kept yet. */
static void cu_gemm_keep(const float *p, size_t n) { (void)p, (void)n; }
static void cu_gemm_unkeep(const float *p) { (void)p; }

static void cu_set_precision(int bf16) {
    loom_cuda_set_precision(bf16 ? LOOM_CUDA_BF16 : LOOM_CUDA_FP32);
}

static void cu_add(float *y, const float *x, size_t n) { loom_cuda_residual_fwd(y, y, x, n); }
static void cu_add2(float *a, float *b, size_t n) {
    loom_cuda_residual_fwd(a, a, b, n);
    cu_d2d(b, a, n * sizeof(float));
}

/* Host scratch for the ops without a kernel: grows, never shrinks. */
static float *cu_host;
static size_t cu_host_n;
static float *host_scratch(size_t n) {
    if (n > cu_host_n) {
        float *p = realloc(cu_host, n * sizeof(float));
        if (!p) abort(); /* kernels return void; out of host memory mid-step */
        cu_host = p;
        cu_host_n = n;
    }
    return cu_host;
}

static void cu_add_bias_residual(float *out, const float *res, const float *bias, int n, int C) {
    const size_t nc = (size_t)n * C;
    float *h = host_scratch(2 * nc + (size_t)C), *r = h + nc, *b = r + nc;
    cu_d2h(h, out, nc * sizeof(float));
    cu_d2h(r, res, nc * sizeof(float));
    cu_d2h(b, bias, (size_t)C * sizeof(float));
    for (size_t i = 0; i < (size_t)n; i++)
        for (int c = 0; c < C; c++) h[i * C + c] += r[i * C + c] + b[c];
    cu_h2d(out, h, nc * sizeof(float));
}

static void cu_colsum_acc(float *y, const float *x, int N, int ld, int ncols) {
    const size_t nx = (size_t)N * ld;
    float *h = host_scratch(nx + (size_t)ncols), *hy = h + nx;
    cu_d2h(h, x, nx * sizeof(float));
    cu_d2h(hy, y, (size_t)ncols * sizeof(float));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < ncols; j++) hy[j] += h[(size_t)i * ld + j];
    cu_h2d(y, hy, (size_t)ncols * sizeof(float));
}

static void cu_sum_acc(double *host_acc, const float *x, size_t n) {
    float *h = host_scratch(n);
    cu_d2h(h, x, n * sizeof(float));
    for (size_t i = 0; i < n; i++) *host_acc += h[i];
}

const loom_backend loom_backend_cuda = {
    .name = "cuda",
    .host_memory = 0,
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
    .set_precision = cu_set_precision,
    .gemm_keep = cu_gemm_keep,
    .gemm_unkeep = cu_gemm_unkeep,
    LOOM_BACKEND_KERNELS(loom_cuda_),
    .add = cu_add,
    .add2 = cu_add2,
    .add_bias_residual = cu_add_bias_residual,
    .colsum_acc = cu_colsum_acc,
    .sum_acc = cu_sum_acc,
    .softmax_lse = loom_cuda_softmax_lse,
    .topk_gate = loom_cuda_topk_gate,
    .topk_gate_bwd = loom_cuda_topk_gate_bwd,
    .gather_rows = loom_cuda_gather_rows,
    .scatter_add_rows = loom_cuda_scatter_add_rows,
    .combine_rows = loom_cuda_combine_rows,
    .combine_rows_bwd = loom_cuda_combine_rows_bwd,
    .fill = loom_cuda_fill,
};

#endif /* LOOM_HAVE_CUDA */
