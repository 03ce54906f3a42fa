/* test_backend.c - the backend table and the routing through it.
 *
 * 1. The CPU table has every entry (checked field by field here, and by
 *    loom_backend_missing_entry, which must name each entry a table lacks).
 * 2. loom_backend_set refuses an incomplete table and keeps the current one;
 *    "cuda" in a build without the CUDA backend is LOOM_EUSAGE naming the
 *    build option; an unknown name is LOOM_EUSAGE.
 * 3. Routing: a table whose every entry counts its calls and forwards to the
 *    CPU backend is made current; a tiny GPT-2 is created, initialised, run
 *    forward and backward. Each kernel and tensor op must have been called
 *    exactly as often as the model's structure says (per block: 4 matmuls
 *    forward, 8 backward, ...), model memory must come from the table's
 *    allocator, and loss and gradients must be bit-identical to the same run
 *    on the CPU table (so nothing went around the table or was done twice).
 *    The counting table says its memory is not host memory, so parameter
 *    init takes the staged path (generate on the host, upload): the
 *    parameters must be bit-identical to the in-place init.
 *    The same for a tiny MoE: its routing and row ops (softmax_lse,
 *    topk_gate, gather, combine, scatter-add and their backward) go
 *    through the table once per block.
 * 4. Saving and loading parameters (safetensors) on that table goes through
 *    host copies (download, upload): the file must be byte for byte the one
 *    the CPU table writes, and loading it back must restore every parameter.
 * 5. Training refuses sharded checkpoints on a backend without host memory
 *    (and allows them on the CPU).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/backend.h"
#include "loom/model.h"
#include "loom/rng.h"
#include "loom/train.h"
#include "model/internal.h"
#include "train/internal.h"

enum {
    E_alloc,
    E_free,
    E_memcpy_h2d,
    E_memcpy_d2h,
    E_memcpy_d2d,
    E_memset,
    E_stream_create,
    E_stream_destroy,
    E_stream_sync,
    E_event_create,
    E_event_destroy,
    E_event_record,
    E_stream_wait_event,
    E_event_sync,
    E_set_precision,
    E_gemm_keep,
    E_gemm_unkeep,
    E_layernorm_fwd,
    E_layernorm_bwd,
    E_matmul_fwd,
    E_matmul_bwd,
    E_matmul_nt_fwd,
    E_matmul_nt_bwd,
    E_gelu_fwd,
    E_gelu_bwd,
    E_residual_fwd,
    E_residual_bwd,
    E_attention_fwd,
    E_attention_bwd,
    E_attention_part_fwd,
    E_attention_part_bwd,
    E_attention_merge,
    E_attention_kv_fwd,
    E_embed_fwd,
    E_embed_bwd,
    E_pos_fwd,
    E_pos_bwd,
    E_vxent_max,
    E_vxent_exp,
    E_vxent_finish,
    E_vxent_bwd,
    E_adamw_update,
    E_sumsq,
    E_scale,
    E_all_finite,
    E_round_bf16,
    E_add,
    E_add2,
    E_add_bias_residual,
    E_colsum_acc,
    E_sum_acc,
    E_softmax_lse,
    E_topk_gate,
    E_topk_gate_bwd,
    E_gather_rows,
    E_scatter_add_rows,
    E_combine_rows,
    E_combine_rows_bwd,
    E_fill,
    E_COUNT
};
static const char *const entry_name[E_COUNT] = {
    "alloc",
    "free",
    "memcpy_h2d",
    "memcpy_d2h",
    "memcpy_d2d",
    "memset",
    "stream_create",
    "stream_destroy",
    "stream_sync",
    "event_create",
    "event_destroy",
    "event_record",
    "stream_wait_event",
    "event_sync",
    "set_precision",
    "gemm_keep",
    "gemm_unkeep",
    "layernorm_fwd",
    "layernorm_bwd",
    "matmul_fwd",
    "matmul_bwd",
    "matmul_nt_fwd",
    "matmul_nt_bwd",
    "gelu_fwd",
    "gelu_bwd",
    "residual_fwd",
    "residual_bwd",
    "attention_fwd",
    "attention_bwd",
    "attention_part_fwd",
    "attention_part_bwd",
    "attention_merge",
    "attention_kv_fwd",
    "embed_fwd",
    "embed_bwd",
    "pos_fwd",
    "pos_bwd",
    "vxent_max",
    "vxent_exp",
    "vxent_finish",
    "vxent_bwd",
    "adamw_update",
    "sumsq",
    "scale",
    "all_finite",
    "round_bf16",
    "add",
    "add2",
    "add_bias_residual",
    "colsum_acc",
    "sum_acc",
    "softmax_lse",
    "topk_gate",
    "topk_gate_bwd",
    "gather_rows",
    "scatter_add_rows",
    "combine_rows",
    "combine_rows_bwd",
    "fill",
};
static const size_t entry_offset[E_COUNT] = {
    offsetof(loom_backend, alloc),
    offsetof(loom_backend, free),
    offsetof(loom_backend, memcpy_h2d),
    offsetof(loom_backend, memcpy_d2h),
    offsetof(loom_backend, memcpy_d2d),
    offsetof(loom_backend, memset),
    offsetof(loom_backend, stream_create),
    offsetof(loom_backend, stream_destroy),
    offsetof(loom_backend, stream_sync),
    offsetof(loom_backend, event_create),
    offsetof(loom_backend, event_destroy),
    offsetof(loom_backend, event_record),
    offsetof(loom_backend, stream_wait_event),
    offsetof(loom_backend, event_sync),
    offsetof(loom_backend, set_precision),
    offsetof(loom_backend, gemm_keep),
    offsetof(loom_backend, gemm_unkeep),
    offsetof(loom_backend, layernorm_fwd),
    offsetof(loom_backend, layernorm_bwd),
    offsetof(loom_backend, matmul_fwd),
    offsetof(loom_backend, matmul_bwd),
    offsetof(loom_backend, matmul_nt_fwd),
    offsetof(loom_backend, matmul_nt_bwd),
    offsetof(loom_backend, gelu_fwd),
    offsetof(loom_backend, gelu_bwd),
    offsetof(loom_backend, residual_fwd),
    offsetof(loom_backend, residual_bwd),
    offsetof(loom_backend, attention_fwd),
    offsetof(loom_backend, attention_bwd),
    offsetof(loom_backend, attention_part_fwd),
    offsetof(loom_backend, attention_part_bwd),
    offsetof(loom_backend, attention_merge),
    offsetof(loom_backend, attention_kv_fwd),
    offsetof(loom_backend, embed_fwd),
    offsetof(loom_backend, embed_bwd),
    offsetof(loom_backend, pos_fwd),
    offsetof(loom_backend, pos_bwd),
    offsetof(loom_backend, vxent_max),
    offsetof(loom_backend, vxent_exp),
    offsetof(loom_backend, vxent_finish),
    offsetof(loom_backend, vxent_bwd),
    offsetof(loom_backend, adamw_update),
    offsetof(loom_backend, sumsq),
    offsetof(loom_backend, scale),
    offsetof(loom_backend, all_finite),
    offsetof(loom_backend, round_bf16),
    offsetof(loom_backend, add),
    offsetof(loom_backend, add2),
    offsetof(loom_backend, add_bias_residual),
    offsetof(loom_backend, colsum_acc),
    offsetof(loom_backend, sum_acc),
    offsetof(loom_backend, softmax_lse),
    offsetof(loom_backend, topk_gate),
    offsetof(loom_backend, topk_gate_bwd),
    offsetof(loom_backend, gather_rows),
    offsetof(loom_backend, scatter_add_rows),
    offsetof(loom_backend, combine_rows),
    offsetof(loom_backend, combine_rows_bwd),
    offsetof(loom_backend, fill),
};
static long n_calls[E_COUNT];

static void *w_alloc(size_t bytes) {
    n_calls[E_alloc]++;
    return loom_backend_cpu.alloc(bytes);
}

static void w_free(void *p, size_t bytes) {
    n_calls[E_free]++;
    loom_backend_cpu.free(p, bytes);
}

static void w_memcpy_h2d(void *dst, const void *host_src, size_t bytes) {
    n_calls[E_memcpy_h2d]++;
    loom_backend_cpu.memcpy_h2d(dst, host_src, bytes);
}

static void w_memcpy_d2h(void *host_dst, const void *src, size_t bytes) {
    n_calls[E_memcpy_d2h]++;
    loom_backend_cpu.memcpy_d2h(host_dst, src, bytes);
}

static void w_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    n_calls[E_memcpy_d2d]++;
    loom_backend_cpu.memcpy_d2d(dst, src, bytes);
}

static void w_memset(void *dst, int byte, size_t bytes) {
    n_calls[E_memset]++;
    loom_backend_cpu.memset(dst, byte, bytes);
}

static loom_status w_stream_create(loom_stream **out) {
    n_calls[E_stream_create]++;
    return loom_backend_cpu.stream_create(out);
}

static void w_stream_destroy(loom_stream *s) {
    n_calls[E_stream_destroy]++;
    loom_backend_cpu.stream_destroy(s);
}

static void w_stream_sync(loom_stream *s) {
    n_calls[E_stream_sync]++;
    loom_backend_cpu.stream_sync(s);
}

static loom_status w_event_create(loom_event **out) {
    n_calls[E_event_create]++;
    return loom_backend_cpu.event_create(out);
}

static void w_event_destroy(loom_event *e) {
    n_calls[E_event_destroy]++;
    loom_backend_cpu.event_destroy(e);
}

static void w_event_record(loom_event *e, loom_stream *s) {
    n_calls[E_event_record]++;
    loom_backend_cpu.event_record(e, s);
}

static void w_stream_wait_event(loom_stream *s, loom_event *e) {
    n_calls[E_stream_wait_event]++;
    loom_backend_cpu.stream_wait_event(s, e);
}

static void w_event_sync(loom_event *e) {
    n_calls[E_event_sync]++;
    loom_backend_cpu.event_sync(e);
}

static void w_set_precision(int bf16) {
    n_calls[E_set_precision]++;
    loom_backend_cpu.set_precision(bf16);
}

static void w_gemm_keep(const float *p, size_t n) {
    n_calls[E_gemm_keep]++;
    loom_backend_cpu.gemm_keep(p, n);
}

static void w_gemm_unkeep(const float *p) {
    n_calls[E_gemm_unkeep]++;
    loom_backend_cpu.gemm_unkeep(p);
}

static void w_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C) {
    n_calls[E_layernorm_fwd]++;
    loom_backend_cpu.layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}

static void w_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
    n_calls[E_layernorm_bwd]++;
    loom_backend_cpu.layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static void w_matmul_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C,
                         int OC) {
    n_calls[E_matmul_fwd]++;
    loom_backend_cpu.matmul_fwd(out, inp, w, b, N, C, OC);
}

static void w_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC) {
    n_calls[E_matmul_bwd]++;
    loom_backend_cpu.matmul_bwd(dinp, dw, db, dout, inp, w, N, C, OC);
}

static void w_matmul_nt_fwd(float *out, const float *inp, const float *wte, int N, int C, int V) {
    n_calls[E_matmul_nt_fwd]++;
    loom_backend_cpu.matmul_nt_fwd(out, inp, wte, N, C, V);
}

static void w_matmul_nt_bwd(float *dinp, float *dwte, const float *dout, const float *inp,
                            const float *wte, int N, int C, int V) {
    n_calls[E_matmul_nt_bwd]++;
    loom_backend_cpu.matmul_nt_bwd(dinp, dwte, dout, inp, wte, N, C, V);
}

static void w_gelu_fwd(float *out, const float *inp, size_t n) {
    n_calls[E_gelu_fwd]++;
    loom_backend_cpu.gelu_fwd(out, inp, n);
}

static void w_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    n_calls[E_gelu_bwd]++;
    loom_backend_cpu.gelu_bwd(dinp, inp, dout, n);
}

static void w_residual_fwd(float *out, const float *a, const float *b, size_t n) {
    n_calls[E_residual_fwd]++;
    loom_backend_cpu.residual_fwd(out, a, b, n);
}

static void w_residual_bwd(float *da, float *db, const float *dout, size_t n) {
    n_calls[E_residual_bwd]++;
    loom_backend_cpu.residual_bwd(da, db, dout, n);
}

static void w_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    n_calls[E_attention_fwd]++;
    loom_backend_cpu.attention_fwd(out, lse, qkv, B, T, C, NH);
}

static void w_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH) {
    n_calls[E_attention_bwd]++;
    loom_backend_cpu.attention_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

static long w_attention_part_fwd(const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                                 float *lse, int accumulate) {
    n_calls[E_attention_part_fwd]++;
    return loom_backend_cpu.attention_part_fwd(v, out, o_bs, o_ld, lse, accumulate);
}

static long w_attention_part_bwd(const loom_att_view *v, float *dq, float *dk, float *dv,
                                 const float *dout, const float *out, size_t o_bs, int o_ld,
                                 const float *lse) {
    n_calls[E_attention_part_bwd]++;
    return loom_backend_cpu.attention_part_bwd(v, dq, dk, dv, dout, out, o_bs, o_ld, lse);
}

static void w_attention_merge(float *out, float *lse, const float *out2, const float *lse2,
                              size_t o_bs, int o_ld, int B, int Tq, int NH, int HS) {
    n_calls[E_attention_merge]++;
    loom_backend_cpu.attention_merge(out, lse, out2, lse2, o_bs, o_ld, B, Tq, NH, HS);
}

static void w_attention_kv_fwd(float *out, const float *q, int ldq, const float *kc,
                               const float *vc, int p0, int n, int C, int NH, float *scratch) {
    n_calls[E_attention_kv_fwd]++;
    loom_backend_cpu.attention_kv_fwd(out, q, ldq, kc, vc, p0, n, C, NH, scratch);
}

static void w_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                        int C) {
    n_calls[E_embed_fwd]++;
    loom_backend_cpu.embed_fwd(out, tok, wte_l, v0, V_l, N, C);
}

static void w_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l,
                        int N, int C) {
    n_calls[E_embed_bwd]++;
    loom_backend_cpu.embed_bwd(dwte_l, dout, tok, v0, V_l, N, C);
}

static void w_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C) {
    n_calls[E_pos_fwd]++;
    loom_backend_cpu.pos_fwd(out, wpe, row0, n, T, C);
}

static void w_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C) {
    n_calls[E_pos_bwd]++;
    loom_backend_cpu.pos_bwd(dwpe, dout, row0, n, T, C);
}

static void w_vxent_max(float *rowmax, const float *logits, int N, int V_l, int V_valid) {
    n_calls[E_vxent_max]++;
    loom_backend_cpu.vxent_max(rowmax, logits, N, V_l, V_valid);
}

static void w_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                        const int32_t *targets, int v0, int N, int V_l, int V_valid) {
    n_calls[E_vxent_exp]++;
    loom_backend_cpu.vxent_exp(logits, rowsum, tgt, gmax, targets, v0, N, V_l, V_valid);
}

static void w_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                           const int32_t *targets, int N, int V_l) {
    n_calls[E_vxent_finish]++;
    loom_backend_cpu.vxent_finish(losses, probs, gsum, gtgt, targets, N, V_l);
}

static void w_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                        int v0, int N, int V_l) {
    n_calls[E_vxent_bwd]++;
    loom_backend_cpu.vxent_bwd(dlogits, probs, targets, dloss, v0, N, V_l);
}

static void w_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                           float beta1, float beta2, float eps, float wd, int t, float gscale) {
    n_calls[E_adamw_update]++;
    loom_backend_cpu.adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale);
}

static double w_sumsq(const float *x, size_t n) {
    n_calls[E_sumsq]++;
    return loom_backend_cpu.sumsq(x, n);
}

static void w_scale(float *x, size_t n, float s) {
    n_calls[E_scale]++;
    loom_backend_cpu.scale(x, n, s);
}

static int w_all_finite(const float *x, size_t n) {
    n_calls[E_all_finite]++;
    return loom_backend_cpu.all_finite(x, n);
}

static void w_round_bf16(float *dst, const float *src, size_t n) {
    n_calls[E_round_bf16]++;
    loom_backend_cpu.round_bf16(dst, src, n);
}

static void w_add(float *y, const float *x, size_t n) {
    n_calls[E_add]++;
    loom_backend_cpu.add(y, x, n);
}

static void w_add2(float *a, float *b, size_t n) {
    n_calls[E_add2]++;
    loom_backend_cpu.add2(a, b, n);
}

static void w_add_bias_residual(float *out, const float *res, const float *bias, int n, int C) {
    n_calls[E_add_bias_residual]++;
    loom_backend_cpu.add_bias_residual(out, res, bias, n, C);
}

static void w_colsum_acc(float *y, const float *x, int N, int ld, int ncols) {
    n_calls[E_colsum_acc]++;
    loom_backend_cpu.colsum_acc(y, x, N, ld, ncols);
}

static void w_sum_acc(double *host_acc, const float *x, size_t n) {
    n_calls[E_sum_acc]++;
    loom_backend_cpu.sum_acc(host_acc, x, n);
}

static double w_softmax_lse(float *x, float *lse, int N, int n) {
    n_calls[E_softmax_lse]++;
    return loom_backend_cpu.softmax_lse(x, lse, N, n);
}

static void w_topk_gate(int32_t *sel, float *gate, const float *p, const float *bias, int N, int n,
                        int k, int norm) {
    n_calls[E_topk_gate]++;
    loom_backend_cpu.topk_gate(sel, gate, p, bias, N, n, k, norm);
}

static void w_topk_gate_bwd(float *dx, float *dp, const float *dgate, const int32_t *sel,
                            const float *gate, const float *p, const float *lse,
                            const int32_t *add_tab, const int32_t *add_row, float add_scale,
                            float z_scale, int N, int n, int k, int norm) {
    n_calls[E_topk_gate_bwd]++;
    loom_backend_cpu.topk_gate_bwd(dx, dp, dgate, sel, gate, p, lse, add_tab, add_row, add_scale,
                                   z_scale, N, n, k, norm);
}

static void w_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int C) {
    n_calls[E_gather_rows]++;
    loom_backend_cpu.gather_rows(dst, src, idx, n, C);
}

static void w_scatter_add_rows(float *dst, const float *src, const int32_t *idx, int n, int C) {
    n_calls[E_scatter_add_rows]++;
    loom_backend_cpu.scatter_add_rows(dst, src, idx, n, C);
}

static void w_combine_rows(float *out, const float *y, const int32_t *row, const float *w, int N,
                           int k, int C) {
    n_calls[E_combine_rows]++;
    loom_backend_cpu.combine_rows(out, y, row, w, N, k, C);
}

static void w_combine_rows_bwd(float *dy, float *dw, const float *dout, const float *y,
                               const int32_t *row, const float *w, int N, int k, int C) {
    n_calls[E_combine_rows_bwd]++;
    loom_backend_cpu.combine_rows_bwd(dy, dw, dout, y, row, w, N, k, C);
}

static void w_fill(float *x, size_t n, float v) {
    n_calls[E_fill]++;
    loom_backend_cpu.fill(x, n, v);
}

static const loom_backend counting = {
    .name = "counting",
    .host_memory = 0, /* parameter init stages and uploads */
    .alloc = w_alloc,
    .free = w_free,
    .memcpy_h2d = w_memcpy_h2d,
    .memcpy_d2h = w_memcpy_d2h,
    .memcpy_d2d = w_memcpy_d2d,
    .memset = w_memset,
    .stream_create = w_stream_create,
    .stream_destroy = w_stream_destroy,
    .stream_sync = w_stream_sync,
    .event_create = w_event_create,
    .event_destroy = w_event_destroy,
    .event_record = w_event_record,
    .stream_wait_event = w_stream_wait_event,
    .event_sync = w_event_sync,
    .set_precision = w_set_precision,
    .gemm_keep = w_gemm_keep,
    .gemm_unkeep = w_gemm_unkeep,
    LOOM_BACKEND_KERNELS(w_),
    .add = w_add,
    .add2 = w_add2,
    .add_bias_residual = w_add_bias_residual,
    .colsum_acc = w_colsum_acc,
    .sum_acc = w_sum_acc,
    .softmax_lse = w_softmax_lse,
    .topk_gate = w_topk_gate,
    .topk_gate_bwd = w_topk_gate_bwd,
    .gather_rows = w_gather_rows,
    .scatter_add_rows = w_scatter_add_rows,
    .combine_rows = w_combine_rows,
    .combine_rows_bwd = w_combine_rows_bwd,
    .fill = w_fill,
};

/* The entry at offset off of t, as the bytes of a function pointer. */
static int entry_is_null(const loom_backend *t, size_t off) {
    void (*f)(void);
    memcpy(&f, (const char *)t + off, sizeof f);
    return f == NULL;
}

static void check_tables(void) {
    for (int e = 0; e < E_COUNT; e++)
        CHECK(!entry_is_null(&loom_backend_cpu, entry_offset[e]), "cpu backend: %s is NULL",
              entry_name[e]);
    CHECK(loom_backend_cpu.name && strcmp(loom_backend_cpu.name, "cpu") == 0, "cpu backend name");
    CHECK(loom_backend_missing_entry(&loom_backend_cpu) == NULL,
          "cpu table reported incomplete: %s", loom_backend_missing_entry(&loom_backend_cpu));
    CHECK(loom_backend_current() == &loom_backend_cpu, "the CPU backend is current at start");
    /* every entry, left out, is named; the current backend stays */
    for (int e = 0; e < E_COUNT; e++) {
        loom_backend t = counting;
        memset((char *)&t + entry_offset[e], 0, sizeof(void (*)(void)));
        const char *miss = loom_backend_missing_entry(&t);
        CHECK(miss && strcmp(miss, entry_name[e]) == 0, "entry %s left out, reported %s",
              entry_name[e], miss ? miss : "(none)");
        loom_status st = loom_backend_set(&t);
        CHECK(st == LOOM_EINTERNAL && strstr(loom_errmsg(), entry_name[e]),
              "set with %s NULL: status %d, message %s", entry_name[e], (int)st, loom_errmsg());
        CHECK(loom_backend_current() == &loom_backend_cpu, "failed set changed the backend");
    }
    loom_status st = loom_backend_select("tpu");
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "tpu"), "select tpu: %d %s", (int)st,
          loom_errmsg());
    CHECK(loom_backend_current() == &loom_backend_cpu, "failed select changed the backend");
    /* cuda: selected when built with it and a GPU is there; else refused,
     * saying which of the two is missing */
    st = loom_backend_select("cuda");
    if (st == LOOM_OK) {
        CHECK(strcmp(loom_backend_current()->name, "cuda") == 0, "select cuda gave %s",
              loom_backend_current()->name);
        CHECK(loom_backend_missing_entry(loom_backend_current()) == NULL, "cuda table incomplete");
    } else {
        CHECK(st == LOOM_EUSAGE && (strstr(loom_errmsg(), "built without the CUDA backend "
                                                          "(configure with -DLOOM_CUDA=ON") ||
                                    strstr(loom_errmsg(), "no CUDA device is visible")),
              "select cuda: %d %s", (int)st, loom_errmsg());
        CHECK(loom_backend_current() == &loom_backend_cpu, "failed select changed the backend");
    }
    CHECK(loom_backend_select("cpu") == LOOM_OK, "select cpu");
    /* --precision reaches the CPU kernels and the current backend */
    CHECK(loom_backend_set(&counting) == LOOM_OK, "set counting");
    memset(n_calls, 0, sizeof n_calls);
    loom_backend_set_precision(1);
    CHECK(loom_kernels_get_precision() == 1 && n_calls[E_set_precision] == 1,
          "set_precision(1): cpu %d, backend called %ld times", loom_kernels_get_precision(),
          n_calls[E_set_precision]);
    loom_backend_set_precision(0);
    CHECK(loom_kernels_get_precision() == 0, "set_precision(0)");
    CHECK(loom_backend_select("cpu") == LOOM_OK, "select cpu");
}

typedef struct {
    double loss;
    float *params, *grads; /* malloc'd copies */
    size_t n;
} run_out;

/* Create, init, one forward + backward of a tiny model on the current
 * backend; expect: 1 promises the backward first (loom_gpt_expect_backward),
 * 2 promises it and then breaks the promise (another dloss). */
static int run_model_expect(const loom_model_config *cfg, int B, int T, run_out *o, int expect) {
    loom_gpt *m;
    loom_model_part part = loom_model_part_whole(cfg);
    loom_gpt_opts opts = {.B = B, .T = T, .n_slots = 1};
    if (loom_gpt_create(cfg, &part, &opts, &m) != LOOM_OK) {
        CHECK(0, "create: %s", loom_errmsg());
        return 0;
    }
    loom_gpt_init_params(m, 1234);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    loom_rng_key k = loom_rng_key_make(5, "tokens");
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(loom_rng_u64(k, 2 * (uint64_t)i) % (uint64_t)cfg->vocab_size);
        tg[i] = (int32_t)(loom_rng_u64(k, 2 * (uint64_t)i + 1) % (uint64_t)cfg->vocab_size);
    }
    o->n = m->num_params;
    o->params = malloc(o->n * sizeof(float));
    o->grads = malloc(o->n * sizeof(float));
    memcpy(o->params, m->param_mem, o->n * sizeof(float));
    o->loss = 0;
    loom_gpt_zero_grad(m);
    const float dloss = 1.0f / (float)(B * T);
    if (expect) loom_gpt_expect_backward(m, dloss);
    loom_gpt_forward(m, 0, in, tg, &o->loss);
    loom_status st = loom_gpt_backward(m, 0, NULL, expect == 2 ? 2 * dloss : dloss);
    if (expect == 2)
        CHECK(st == LOOM_EINTERNAL && strstr(loom_errmsg(), "loom_gpt_expect_backward"),
              "a broken expect_backward promise: status %d, '%s'", (int)st, loom_errmsg());
    else
        CHECK(st == LOOM_OK, "backward: %s", loom_errmsg());
    memcpy(o->grads, m->grad_mem, o->n * sizeof(float));
    loom_gpt_free(m);
    free(in);
    free(tg);
    return 1;
}

static int run_model(const loom_model_config *cfg, int B, int T, run_out *o) {
    return run_model_expect(cfg, B, T, o, 0);
}

static long calls(const char *name) {
    for (int e = 0; e < E_COUNT; e++)
        if (strcmp(entry_name[e], name) == 0)
            return n_calls[e];
    return -1;
}

static void check_routing(void) {
    loom_model_config cfg = {.name = "backend-test",
                             .n_layer = 3,
                             .n_head = 2,
                             .n_embd = 16,
                             .vocab_size = 53,
                             .n_positions = 16};
    const int B = 2, T = 8;
    const long L = cfg.n_layer;
    run_out ref, got;
    if (!run_model(&cfg, B, T, &ref))
        return;
    CHECK(loom_backend_set(&counting) == LOOM_OK, "set counting table: %s", loom_errmsg());
    memset(n_calls, 0, sizeof n_calls);
    if (!run_model(&cfg, B, T, &got))
        return;
    CHECK(loom_backend_select("cpu") == LOOM_OK, "back to cpu");
    struct {
        const char *name;
        long want;
    } expect[] = {
        /* memory: the three arenas (params, grads, activations), freed */
        {"alloc", 3},
        {"free", 3},
        /* staged init: one upload per 16384-float chunk; the token ids */
        {"memcpy_h2d", (long)((ref.n + 16383) / 16384) + 2},
        /* forward */
        {"embed_fwd", 1},
        {"pos_fwd", 1},
        {"layernorm_fwd", 2 * L + 1},
        {"matmul_fwd", 4 * L},
        {"attention_fwd", L},
        {"gelu_fwd", L},
        {"add_bias_residual", 2 * L},
        {"matmul_nt_fwd", 1},
        {"vxent_max", 1},
        {"vxent_exp", 1},
        {"vxent_finish", 1},
        {"sum_acc", 1},
        /* backward: the head, per block 4 matmuls for the input and 4 for the
         * weight half, two LayerNorms each half, the two qkv bias column sums */
        {"vxent_bwd", 1},
        {"matmul_nt_bwd", 2},
        {"layernorm_bwd", 4 * L + 2},
        {"matmul_bwd", 8 * L},
        {"gelu_bwd", L},
        {"attention_bwd", L},
        {"colsum_acc", 2 * L},
        {"embed_bwd", 1},
        {"pos_bwd", 1},
        /* zeroing: grads once, the head's two buffers, six per block */
        {"memset", 1 + 2 + 6 * L},
        /* copies of the TP/SP regions at degree 1 (the identity), per block 4,
         * the head's, the part's input gradient and the embedding's */
        {"memcpy_d2d", 4 * L + 3},
        /* not used by a dense single-device model */
        {"residual_fwd", 0},
        {"residual_bwd", 0},
        {"attention_part_fwd", 0},
        {"adamw_update", 0},
        {"memcpy_d2h", 0},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        CHECK(calls(expect[i].name) == expect[i].want, "%s called %ld times, want %ld",
              expect[i].name, calls(expect[i].name), expect[i].want);
    CHECK(got.loss == ref.loss, "loss %.9g through the counting table, %.9g on cpu", got.loss,
          ref.loss);
    CHECK(got.n == ref.n && memcmp(got.params, ref.params, ref.n * sizeof(float)) == 0,
          "staged parameter init differs from the in-place init");
    CHECK(got.n == ref.n && memcmp(got.grads, ref.grads, ref.n * sizeof(float)) == 0,
          "gradients through the counting table differ from the cpu run");
    CHECK(ref.loss > 0, "loss %g", ref.loss);
    /* the CPU table with the backward promised: the cross-entropy makes the
     * loss's gradient in its own pass (loom_vxent_local_grad), the same
     * loss and gradients; a broken promise is an error, not wrong numbers */
    run_out fused, broken;
    if (run_model_expect(&cfg, B, T, &fused, 1)) {
        CHECK(fused.loss == ref.loss, "expect_backward: loss %.9g, %.9g without", fused.loss, ref.loss);
        CHECK(memcmp(fused.grads, ref.grads, ref.n * sizeof(float)) == 0,
              "expect_backward: gradients differ from the run without it");
        free(fused.params), free(fused.grads);
    }
    if (run_model_expect(&cfg, B, T, &broken, 2)) free(broken.params), free(broken.grads);
    free(ref.params);
    free(ref.grads);
    free(got.params);
    free(got.grads);
}

/* A tiny MoE (every block, 4 experts, top 2, capacity 1 so some choices
 * drop, z-loss on) forward + backward through the counting table: the
 * routing and row ops are called once per MoE block each, the routing
 * bookkeeping crosses host and device only by the table's copies, and
 * loss and gradients are bit-identical to the CPU table's. */
static void check_moe_routing(void) {
    loom_model_config cfg = {.name = "backend-moe", .n_layer = 2, .n_head = 2, .n_embd = 16,
                             .vocab_size = 53, .n_positions = 16, .n_expert = 4, .top_k = 2,
                             .moe_every = 1, .expert_hidden = 32, .norm_topk = 1,
                             .aux_coef = 0.01f, .z_coef = 0.001f, .capacity_factor = 1.0f};
    const int B = 2, T = 8;
    const long L = cfg.n_layer;
    run_out ref, got;
    if (!run_model(&cfg, B, T, &ref)) return;
    CHECK(loom_backend_set(&counting) == LOOM_OK, "set counting table: %s", loom_errmsg());
    memset(n_calls, 0, sizeof n_calls);
    if (!run_model(&cfg, B, T, &got)) return;
    CHECK(loom_backend_select("cpu") == LOOM_OK, "back to cpu");
    struct {
        const char *name;
        long want;
    } expect[] = {
        /* per MoE block: route, dispatch, combine; and their backward */
        {"softmax_lse", L},
        {"topk_gate", L},
        {"gather_rows", L},
        {"combine_rows", L},
        {"combine_rows_bwd", L},
        {"scatter_add_rows", L},
        {"topk_gate_bwd", L},
        {"fill", 0},
        /* the three arenas and the MoE blocks' one device allocation */
        {"alloc", 4},
        {"free", 4},
        /* down per block: the choices, the probabilities (aux loss) */
        {"memcpy_d2h", 2 * L},
        /* up: staged init, token ids, the token groups once, per block the
         * dispatch layout (rows, tokens, counts per group) */
        {"memcpy_h2d", (long)((ref.n + 16383) / 16384) + 2 + 1 + 3 * L},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        CHECK(calls(expect[i].name) == expect[i].want, "moe: %s called %ld times, want %ld",
              expect[i].name, calls(expect[i].name), expect[i].want);
    CHECK(got.loss == ref.loss && ref.loss > 0, "moe: loss %.9g through the counting table, %.9g on cpu",
          got.loss, ref.loss);
    CHECK(got.n == ref.n && memcmp(got.grads, ref.grads, ref.n * sizeof(float)) == 0,
          "moe: gradients through the counting table differ from the cpu run");
    free(ref.params);
    free(ref.grads);
    free(got.params);
    free(got.grads);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = b && len > 0 ? fread(b, 1, (size_t)len, fp) : 0;
    fclose(fp);
    return b;
}

static void check_params_io(void) {
    loom_model_config cfg = {.name = "backend-io", .n_layer = 2, .n_head = 2, .n_embd = 16,
                             .vocab_size = 37, .n_positions = 8};
    loom_model_part part = loom_model_part_whole(&cfg);
    loom_gpt_opts opts = {.B = 1, .T = 4, .n_slots = 1};
    const char *dir = check_scratch_dir("backend");
    if (!dir) return;
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/cpu.safetensors", dir);
    snprintf(b, sizeof b, "%s/staged.safetensors", dir);
    loom_gpt *m, *m2;
    if (loom_gpt_create(&cfg, &part, &opts, &m) != LOOM_OK) {
        CHECK(0, "create: %s", loom_errmsg());
        return;
    }
    loom_gpt_init_params(m, 99);
    CHECK(loom_params_save(&m, 1, NULL, NULL, a) == LOOM_OK, "cpu save: %s", loom_errmsg());
    CHECK(loom_backend_set(&counting) == LOOM_OK, "set counting table");
    memset(n_calls, 0, sizeof n_calls);
    CHECK(loom_params_save(&m, 1, NULL, NULL, b) == LOOM_OK, "staged save: %s", loom_errmsg());
    CHECK(calls("memcpy_d2h") == 1, "staged save downloads the one run: %ld", calls("memcpy_d2h"));
    size_t na = 0, nb = 0;
    unsigned char *fa = slurp(a, &na), *fb = slurp(b, &nb);
    CHECK(fa && fb && na > 0 && na == nb && memcmp(fa, fb, na) == 0,
          "staged save wrote a different file (%zu vs %zu bytes)", nb, na);
    if (loom_gpt_create(&cfg, &part, &opts, &m2) == LOOM_OK) {
        memset(n_calls, 0, sizeof n_calls);
        CHECK(loom_params_load(&m2, 1, NULL, NULL, b) == LOOM_OK, "staged load: %s", loom_errmsg());
        CHECK(calls("memcpy_h2d") == 1 && calls("memcpy_d2h") == 1,
              "staged load: %ld uploads, %ld downloads", calls("memcpy_h2d"), calls("memcpy_d2h"));
        CHECK(memcmp(m2->param_mem, m->param_mem, m->num_params * sizeof(float)) == 0,
              "parameters loaded through host copies differ from the saved ones");
        loom_gpt_free(m2);
    }
    loom_train_config c;
    loom_train_config_default(&c);
    loom_layout_device dev = loom_train_device(&c);
    CHECK(loom_layout_check_device(&c.layout, &dev) == LOOM_OK, "no checkpoint flags: refused");
    snprintf(c.save_dir, sizeof c.save_dir, "ck");
    dev = loom_train_device(&c);
    loom_status st = loom_layout_check_device(&c.layout, &dev);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "--save-dir with --device counting"),
          "--save-dir without host memory: %d %s", (int)st, loom_errmsg());
    CHECK(loom_backend_select("cpu") == LOOM_OK, "back to cpu");
    dev = loom_train_device(&c);
    CHECK(loom_layout_check_device(&c.layout, &dev) == LOOM_OK, "--save-dir on cpu refused: %s", loom_errmsg());
    free(fa);
    free(fb);
    loom_gpt_free(m);
}

int main(void) {
    check_tables();
    check_routing();
    check_moe_routing();
    check_params_io();
    return check_done();
}
