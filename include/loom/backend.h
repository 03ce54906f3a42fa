/* backend.h - the compute backend table: device memory, streams and events,
 * and every kernel, behind one table of function pointers per backend.
 *
 * Model, parallel, pipeline and train code never touch tensor memory with raw
 * loops, memcpy or memset: they call the kernels of kernels.h (thin
 * dispatchers to the current backend, src/backend/backend.c) and the tensor
 * ops below through loom_backend_current(). So the same code runs on any
 * backend; the single-device CPU run stays the reference.
 *
 * A backend fills one `loom_backend` with designated initializers (the CPU
 * table is src/backend/cpu_backend.c, the kernels it points to are the
 * loom_cpu_* functions of src/kernels/cpu). Every entry is required (none may
 * be NULL). Kernel entries take exactly the arguments of the kernels.h
 * function of the same name; every tensor pointer is a device pointer of that
 * backend, host pointers are named so (`host`). Kernels and tensor ops return
 * void and trust their shapes, as kernels.h says; they are ordered on the
 * backend's default stream (the CPU backend runs them synchronously).
 *
 * Which backend runs is chosen once at start (`loom train --device cpu|cuda`)
 * with loom_backend_select, before any model memory is allocated: memory from
 * one backend must never be handed to another. See docs/backends.md.
 */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "loom/arena.h"
#include "loom/kernels.h"
#include "loom/status.h"

/* Opaque per-backend handles (the CPU backend's are dummies). */
typedef struct loom_stream loom_stream;
typedef struct loom_event loom_event;

typedef struct loom_backend {
    const char *name; /* "cpu", "cuda", ... as --device spells it */
    /* 1 when device memory is host memory (the CPU): host code may then fill
     * it in place (parameter init) instead of staging and uploading. */
    int host_memory;

    /* ---- device memory ---- */
    /* bytes of ZEROED device memory, aligned to at least 64 bytes; NULL when
     * it cannot be had. free takes the same size back (p may be NULL). */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p, size_t bytes);
    void (*memcpy_h2d)(void *dst, const void *host_src, size_t bytes);
    void (*memcpy_d2h)(void *host_dst, const void *src, size_t bytes);
    /* dst == src (a no-op) or regions that do not overlap */
    void (*memcpy_d2d)(void *dst, const void *src, size_t bytes);
    void (*memset)(void *dst, int byte, size_t bytes);

    /* ---- streams and events (CPU: synchronous, so these keep order trivially) ---- */
    loom_status (*stream_create)(loom_stream **out);
    void (*stream_destroy)(loom_stream *s);
    void (*stream_sync)(loom_stream *s); /* NULL: the default stream */
    loom_status (*event_create)(loom_event **out);
    void (*event_destroy)(loom_event *e);
    void (*event_record)(loom_event *e, loom_stream *s);
    void (*stream_wait_event)(loom_stream *s, loom_event *e); /* s waits, the host does not */
    void (*event_sync)(loom_event *e);                        /* the host waits */

    /* GEMM precision of the backend's matmuls: 0 fp32, 1 bf16 operands with
     * fp32 accumulation (loom_kernels_set_precision's meaning). */
    void (*set_precision)(int bf16);
    /* loom_gemm_keep / loom_gemm_unkeep (kernels.h): GEMM operands the
     * caller promises not to change in between; a backend may ignore both. */
    void (*gemm_keep)(const float *p, size_t n);
    void (*gemm_unkeep)(const float *p);

    /* ---- kernels: exactly the argument lists of kernels.h ---- */
    void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C);
    void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N, int C);
    void (*matmul_fwd)(float *out, const float *inp, const float *w, const float *b, int N, int C,
                       int OC);
    void (*matmul_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                       const float *w, int N, int C, int OC);
    void (*matmul_nt_fwd)(float *out, const float *inp, const float *wte, int N, int C, int V);
    void (*matmul_nt_bwd)(float *dinp, float *dwte, const float *dout, const float *inp,
                          const float *wte, int N, int C, int V);
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    void (*residual_fwd)(float *out, const float *a, const float *b, size_t n);
    void (*residual_bwd)(float *da, float *db, const float *dout, size_t n);
    void (*attention_fwd)(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
    void (*attention_bwd)(float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int C, int NH);
    long (*attention_part_fwd)(const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                               float *lse, int accumulate);
    long (*attention_part_bwd)(const loom_att_view *v, float *dq, float *dk, float *dv,
                               const float *dout, const float *out, size_t o_bs, int o_ld,
                               const float *lse);
    void (*attention_merge)(float *out, float *lse, const float *out2, const float *lse2,
                            size_t o_bs, int o_ld, int B, int Tq, int NH, int HS);
    void (*attention_kv_fwd)(float *out, const float *q, int ldq, const float *kc, const float *vc,
                             int p0, int n, int C, int NH, float *scratch);
    void (*embed_fwd)(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                      int C);
    void (*embed_bwd)(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l, int N,
                      int C);
    void (*pos_fwd)(float *out, const float *wpe, int row0, int n, int T, int C);
    void (*pos_bwd)(float *dwpe, const float *dout, int row0, int n, int T, int C);
    void (*vxent_max)(float *rowmax, const float *logits, int N, int V_l, int V_valid);
    void (*vxent_exp)(float *logits, float *rowsum, float *tgt, const float *gmax,
                      const int32_t *targets, int v0, int N, int V_l, int V_valid);
    void (*vxent_finish)(float *losses, float *probs, const float *gsum, const float *gtgt,
                         const int32_t *targets, int N, int V_l);
    void (*vxent_bwd)(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                      int v0, int N, int V_l);
    void (*adamw_update)(float *p, const float *g, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float wd, int t, float gscale);
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, size_t n, float s);
    int (*all_finite)(const float *x, size_t n);
    void (*round_bf16)(float *dst, const float *src, size_t n);

    /* ---- small tensor ops (names generic; see loom_backend_* below) ---- */
    void (*add)(float *y, const float *x, size_t n);              /* y[i] += x[i] */
    void (*add2)(float *a, float *b, size_t n);                   /* a[i] = b[i] = a[i] + b[i] */
    /* out (n,C) += res (n,C) + bias (C), summed as o + (r + b) */
    void (*add_bias_residual)(float *out, const float *res, const float *bias, int n, int C);
    /* y (ncols) += column sums of the (N, ncols) block of x with row stride ld,
     * rows added in order 0..N-1 */
    void (*colsum_acc)(float *y, const float *x, int N, int ld, int ncols);
    /* *host_acc += x[i] for i = 0..n-1 in order, in double */
    void (*sum_acc)(double *host_acc, const float *x, size_t n);

    /* ---- routing and row ops (MoE routing, dispatch and combine; CP row
     * permutations). Index lists (int32) are device memory too. ---- */
    /* each row of x (N,n) replaced by its softmax (shifted by the row max; the
     * exponentials and their sum in double), lse[i] = max + log(sum); returns
     * the sum over rows, in order, of lse[i]^2 in double (host value) */
    double (*softmax_lse)(float *x, float *lse, int N, int n);
    /* per row i of p (N,n), n <= LOOM_TOPK_MAX_N: sel (N,k) the k columns with
     * the largest p + bias (bias: n), best first, ties to the lower column;
     * gate (N,k) = p at them, divided by their sum (in choice order) if norm */
    void (*topk_gate)(int32_t *sel, float *gate, const float *p, const float *bias, int N, int n,
                      int k, int norm);
    /* WRITES dx (N,n), the gradient of the logits of p = softmax: from dgate
     * (N,k) through topk_gate's gates (norm as there) into dp (N,n scratch),
     * plus add_scale * add_tab[add_row[i]] (add_tab: int32 rows of n, a
     * per-row table such as token counts), then through the softmax, plus
     * z_scale * lse[i] / N * p (a z-loss term) */
    void (*topk_gate_bwd)(float *dx, float *dp, const float *dgate, const int32_t *sel,
                          const float *gate, const float *p, const float *lse,
                          const int32_t *add_tab, const int32_t *add_row, float add_scale,
                          float z_scale, int N, int n, int k, int norm);
    /* dst row r = src row idx[r], r < n (rows of C floats; dst and src apart) */
    void (*gather_rows)(float *dst, const float *src, const int32_t *idx, int n, int C);
    /* dst row idx[r] += src row r, for r = 0..n-1 in order (repeated idx add up) */
    void (*scatter_add_rows)(float *dst, const float *src, const int32_t *idx, int n, int C);
    /* WRITES out (N,C): row i = sum over j < k in order, from 0, of
     * w[i k + j] * y row row[i k + j], skipping row < 0 */
    void (*combine_rows)(float *out, const float *y, const int32_t *row, const float *w, int N,
                         int k, int C);
    /* combine_rows' backward: for row[i k + j] = r >= 0, dy row r = w[i k + j] *
     * dout row i and dw[i k + j] = dout row i . y row r (in column order);
     * dw = 0 where r < 0; dy rows no r names are left as they are */
    void (*combine_rows_bwd)(float *dy, float *dw, const float *dout, const float *y,
                             const int32_t *row, const float *w, int N, int k, int C);
    /* x[i] = v */
    void (*fill)(float *x, size_t n, float v);

    /* ---- optional fused kernels: NULL = the unfused kernels above ---- */
    void (*vxent_local)(float *losses, float *logits, const int32_t *targets, int N, int V_l,
                        int V_valid);
    /* needs gemm_keep to honour what it says (kernels.h) */
    void (*vxent_local_grad)(float *losses, float *logits, const int32_t *targets, int N, int V_l,
                             int V_valid, float dloss);
    /* adamw_update, then g = 0, and the new p's bf16 bits to p16 (unless NULL) */
    void (*adamw_update_zero)(float *p, float *g, float *m, float *v, size_t n, float lr, float beta1,
                              float beta2, float eps, float wd, int t, float gscale, uint16_t *p16);
    /* kept operands written by the caller (kernels.h: loom_gemm_keep_fill) */
    int (*gemm_keeps_bf16)(void);
    uint16_t *(*gemm_keep_fill)(const float *src, size_t n);
    void (*gemm_keep_filled)(const float *src, int ok);
} loom_backend;

/* The widest row topk_gate takes (MoE: num_local_experts, which the config check bounds). */
#define LOOM_TOPK_MAX_N 1024

/* Designated initializers of every kernel entry from functions named
 * <prefix><kernel> (loom_cpu_, loom_cuda_, ...): a backend whose kernels
 * follow the naming fills them with LOOM_BACKEND_KERNELS(loom_cpu_). */
#define LOOM_BACKEND_KERNELS(prefix)                                                               \
    .layernorm_fwd = prefix##layernorm_fwd,                                                        \
    .layernorm_bwd = prefix##layernorm_bwd,                                                        \
    .matmul_fwd = prefix##matmul_fwd,                                                              \
    .matmul_bwd = prefix##matmul_bwd,                                                              \
    .matmul_nt_fwd = prefix##matmul_nt_fwd,                                                        \
    .matmul_nt_bwd = prefix##matmul_nt_bwd,                                                        \
    .gelu_fwd = prefix##gelu_fwd,                                                                  \
    .gelu_bwd = prefix##gelu_bwd,                                                                  \
    .residual_fwd = prefix##residual_fwd,                                                          \
    .residual_bwd = prefix##residual_bwd,                                                          \
    .attention_fwd = prefix##attention_fwd,                                                        \
    .attention_bwd = prefix##attention_bwd,                                                        \
    .attention_part_fwd = prefix##attention_part_fwd,                                              \
    .attention_part_bwd = prefix##attention_part_bwd,                                              \
    .attention_merge = prefix##attention_merge,                                                    \
    .attention_kv_fwd = prefix##attention_kv_fwd,                                                  \
    .embed_fwd = prefix##embed_fwd,                                                                \
    .embed_bwd = prefix##embed_bwd,                                                                \
    .pos_fwd = prefix##pos_fwd,                                                                    \
    .pos_bwd = prefix##pos_bwd,                                                                    \
    .vxent_max = prefix##vxent_max,                                                                \
    .vxent_exp = prefix##vxent_exp,                                                                \
    .vxent_finish = prefix##vxent_finish,                                                          \
    .vxent_bwd = prefix##vxent_bwd,                                                                \
    .adamw_update = prefix##adamw_update,                                                          \
    .sumsq = prefix##sumsq,                                                                        \
    .scale = prefix##scale,                                                                        \
    .all_finite = prefix##all_finite,                                                              \
    .round_bf16 = prefix##round_bf16

/* The CPU backend (always built). */
extern const loom_backend loom_backend_cpu;

/* Chooses the backend by name ("cpu", "cuda"); call once at start, before
 * any model memory. LOOM_EUSAGE (exit 64) for a name no build knows, and for
 * a backend this build left out (the message names what is missing: "cuda"
 * without -DLOOM_CUDA=ON), and for "cuda" with no CUDA device visible. The
 * current backend is unchanged on failure. */
loom_status loom_backend_select(const char *name);
/* Makes `be` (every entry non-NULL) the current backend: the hook for
 * out-of-tree backends and for tests that wrap one. LOOM_EINTERNAL if an entry
 * is NULL (message names it), and the current backend stays. */
loom_status loom_backend_set(const loom_backend *be);
/* The current backend; the CPU backend until one is selected. */
const loom_backend *loom_backend_current(void);
/* The name of the first NULL entry of be, NULL when the table is complete. */
const char *loom_backend_missing_entry(const loom_backend *be);

/* --precision: sets the CPU kernels' GEMM precision (loom_kernels_set_precision,
 * which loom_kernels_get_precision reports) and the current backend's. */
void loom_backend_set_precision(int bf16);

/* An arena (arena.h) whose memory is the current backend's device memory:
 * for tensors (params, grads, optimizer state, activations). */
void loom_backend_arena_init(loom_arena *a, const char *name);

/* ---- tensor ops on the current backend (tensor pointers are device memory) ---- */
static inline void loom_tensor_copy(float *dst, const float *src, size_t n) {
    loom_backend_current()->memcpy_d2d(dst, src, n * sizeof(float));
}
static inline void loom_tensor_zero(float *x, size_t n) {
    loom_backend_current()->memset(x, 0, n * sizeof(float));
}
static inline void loom_tensor_add(float *y, const float *x, size_t n) {
    loom_backend_current()->add(y, x, n);
}
/* a[i] = b[i] = a[i] + b[i]: two copies of one tied tensor summed in both. */
static inline void loom_tensor_add2(float *a, float *b, size_t n) {
    loom_backend_current()->add2(a, b, n);
}
static inline void loom_tensor_add_bias_residual(float *out, const float *res, const float *bias,
                                                 int n, int C) {
    loom_backend_current()->add_bias_residual(out, res, bias, n, C);
}
static inline void loom_tensor_colsum_acc(float *y, const float *x, int N, int ld, int ncols) {
    loom_backend_current()->colsum_acc(y, x, N, ld, ncols);
}
/* *host_acc += each x[i] in order, in double (a loss sum). */
static inline void loom_tensor_sum_acc(double *host_acc, const float *x, size_t n) {
    loom_backend_current()->sum_acc(host_acc, x, n);
}
/* Token ids (int32) from device to device, and to the device. */
static inline void loom_tensor_copy_i32(int32_t *dst, const int32_t *src, size_t n) {
    loom_backend_current()->memcpy_d2d(dst, src, n * sizeof(int32_t));
}
static inline void loom_tensor_upload_i32(int32_t *dst, const int32_t *host, size_t n) {
    loom_backend_current()->memcpy_h2d(dst, host, n * sizeof(int32_t));
}
static inline void loom_tensor_fill(float *x, size_t n, float v) {
    loom_backend_current()->fill(x, n, v);
}
static inline void loom_tensor_gather_rows(float *dst, const float *src, const int32_t *idx, int n,
                                           int C) {
    loom_backend_current()->gather_rows(dst, src, idx, n, C);
}
static inline void loom_tensor_scatter_add_rows(float *dst, const float *src, const int32_t *idx,
                                                int n, int C) {
    loom_backend_current()->scatter_add_rows(dst, src, idx, n, C);
}
static inline void loom_tensor_combine_rows(float *out, const float *y, const int32_t *row,
                                            const float *w, int N, int k, int C) {
    loom_backend_current()->combine_rows(out, y, row, w, N, k, C);
}
static inline void loom_tensor_combine_rows_bwd(float *dy, float *dw, const float *dout,
                                                const float *y, const int32_t *row, const float *w,
                                                int N, int k, int C) {
    loom_backend_current()->combine_rows_bwd(dy, dw, dout, y, row, w, N, k, C);
}
static inline double loom_tensor_softmax_lse(float *x, float *lse, int N, int n) {
    return loom_backend_current()->softmax_lse(x, lse, N, n);
}
static inline void loom_tensor_topk_gate(int32_t *sel, float *gate, const float *p,
                                         const float *bias, int N, int n, int k, int norm) {
    loom_backend_current()->topk_gate(sel, gate, p, bias, N, n, k, norm);
}
static inline void loom_tensor_topk_gate_bwd(float *dx, float *dp, const float *dgate,
                                             const int32_t *sel, const float *gate, const float *p,
                                             const float *lse, const int32_t *add_tab,
                                             const int32_t *add_row, float add_scale,
                                             float z_scale, int N, int n, int k, int norm) {
    loom_backend_current()->topk_gate_bwd(dx, dp, dgate, sel, gate, p, lse, add_tab, add_row,
                                          add_scale, z_scale, N, n, k, norm);
}
/* Index lists (int32) between host and device. */
static inline void loom_tensor_download_i32(int32_t *host, const int32_t *src, size_t n) {
    loom_backend_current()->memcpy_d2h(host, src, n * sizeof(int32_t));
}
static inline void loom_tensor_upload(float *dst, const float *host, size_t n) {
    loom_backend_current()->memcpy_h2d(dst, host, n * sizeof(float));
}
static inline void loom_tensor_download(float *host, const float *src, size_t n) {
    loom_backend_current()->memcpy_d2h(host, src, n * sizeof(float));
}

#endif
