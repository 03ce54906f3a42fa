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
 * kernels; so do the routing and row ops (MoE routing, dispatch and combine,
 * the CP permutations). NOTHING HERE HAS RUN ON A GPU. Local to the calling rank.
 */
#ifdef LOOM_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "kernels/cpu/cpu_kernels.h"
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

/* The routing and row ops have no CUDA kernels yet either: each runs the
 * CPU kernel (src/kernels/cpu/route_ops.c) on host copies of its operands
 * and uploads what it writes. Correct and slow; the arrays are small (MoE
 * routing: N x E; CP permutations: the Ulysses buffers). */
static void *down(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (!h) abort(); /* as host_scratch */
    cu_d2h(h, d, bytes);
    return h;
}
static void up_free(void *d, void *h, size_t bytes) {
    cu_h2d(d, h, bytes);
    free(h);
}
/* The number of rows an index list names (its largest entry + 1), from a host copy. */
static int idx_rows(const int32_t *h, int n) {
    int rows = 0;
    for (int r = 0; r < n; r++) rows = h[r] + 1 > rows ? h[r] + 1 : rows;
    return rows;
}
static double cu_softmax_lse(float *x, float *lse, int N, int n) {
    const size_t xb = (size_t)N * n * sizeof(float), lb = (size_t)N * sizeof(float);
    float *hx = down(x, xb), *hl = down(lse, lb);
    double z = loom_cpu_softmax_lse(hx, hl, N, n);
    up_free(x, hx, xb);
    up_free(lse, hl, lb);
    return z;
}
static void cu_topk_gate(int32_t *sel, float *gate, const float *p, const float *bias, int N, int n,
                         int k, int norm) {
    const size_t kb = (size_t)N * k * 4;
    float *hp = down(p, (size_t)N * n * 4), *hb = down(bias, (size_t)n * 4);
    int32_t *hs = down(sel, kb);
    float *hg = down(gate, kb);
    loom_cpu_topk_gate(hs, hg, hp, hb, N, n, k, norm);
    up_free(sel, hs, kb);
    up_free(gate, hg, kb);
    free(hp);
    free(hb);
}
static void cu_topk_gate_bwd(float *dx, float *dp, const float *dgate, const int32_t *sel,
                             const float *gate, const float *p, const float *lse,
                             const int32_t *add_tab, const int32_t *add_row, float add_scale,
                             float z_scale, int N, int n, int k, int norm) {
    const size_t nb = (size_t)N * n * 4, kb = (size_t)N * k * 4;
    float *hdx = down(dx, nb), *hdp = down(dp, nb), *hdg = down(dgate, kb), *hg = down(gate, kb);
    float *hp = down(p, nb), *hl = down(lse, (size_t)N * 4);
    int32_t *hs = down(sel, kb), *hr = down(add_row, (size_t)N * 4);
    int32_t *ht = down(add_tab, (size_t)idx_rows(hr, N) * n * 4);
    loom_cpu_topk_gate_bwd(hdx, hdp, hdg, hs, hg, hp, hl, ht, hr, add_scale, z_scale, N, n, k, norm);
    up_free(dx, hdx, nb);
    up_free(dp, hdp, nb);
    free(hdg), free(hg), free(hp), free(hl), free(hs), free(hr), free(ht);
}
/* gather (dst[r] = src[idx[r]]) or scatter-add (dst[idx[r]] += src[r]) on host copies */
static void rows_by_index(float *dst, const float *src, const int32_t *idx, int n, int C, int gather) {
    int32_t *hi = down(idx, (size_t)n * 4);
    const size_t ib = (size_t)idx_rows(hi, n) * C * 4, nb = (size_t)n * C * 4;
    float *hs = down(src, gather ? ib : nb), *hd = down(dst, gather ? nb : ib);
    if (gather) loom_cpu_gather_rows(hd, hs, hi, n, C);
    else loom_cpu_scatter_add_rows(hd, hs, hi, n, C);
    up_free(dst, hd, gather ? nb : ib);
    free(hs), free(hi);
}
static void cu_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int C) {
    rows_by_index(dst, src, idx, n, C, 1);
}
static void cu_scatter_add_rows(float *dst, const float *src, const int32_t *idx, int n, int C) {
    rows_by_index(dst, src, idx, n, C, 0);
}
static void cu_combine_rows(float *out, const float *y, const int32_t *row, const float *w, int N,
                            int k, int C) {
    const size_t kb = (size_t)N * k * 4, ob = (size_t)N * C * 4;
    int32_t *hr = down(row, kb);
    float *hw = down(w, kb), *hy = down(y, (size_t)idx_rows(hr, N * k) * C * 4), *ho = down(out, ob);
    loom_cpu_combine_rows(ho, hy, hr, hw, N, k, C);
    up_free(out, ho, ob);
    free(hr), free(hw), free(hy);
}
static void cu_combine_rows_bwd(float *dy, float *dw, const float *dout, const float *y,
                                const int32_t *row, const float *w, int N, int k, int C) {
    const size_t kb = (size_t)N * k * 4;
    int32_t *hr = down(row, kb);
    const size_t yb = (size_t)idx_rows(hr, N * k) * C * 4;
    float *hw = down(w, kb), *hy = down(y, yb), *hdy = down(dy, yb), *hdw = down(dw, kb);
    float *hd = down(dout, (size_t)N * C * 4);
    loom_cpu_combine_rows_bwd(hdy, hdw, hd, hy, hr, hw, N, k, C);
    up_free(dy, hdy, yb);
    up_free(dw, hdw, kb);
    free(hr), free(hw), free(hy), free(hd);
}
static void cu_fill(float *x, size_t n, float v) {
    float *h = host_scratch(n);
    for (size_t i = 0; i < n; i++) h[i] = v;
    cu_h2d(x, h, n * sizeof(float));
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
    LOOM_BACKEND_KERNELS(loom_cuda_),
    .add = cu_add,
    .add2 = cu_add2,
    .add_bias_residual = cu_add_bias_residual,
    .colsum_acc = cu_colsum_acc,
    .sum_acc = cu_sum_acc,
    .softmax_lse = cu_softmax_lse,
    .topk_gate = cu_topk_gate,
    .topk_gate_bwd = cu_topk_gate_bwd,
    .gather_rows = cu_gather_rows,
    .scatter_add_rows = cu_scatter_add_rows,
    .combine_rows = cu_combine_rows,
    .combine_rows_bwd = cu_combine_rows_bwd,
    .fill = cu_fill,
};

#endif /* LOOM_HAVE_CUDA */
