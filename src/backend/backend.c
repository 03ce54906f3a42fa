/* backend.c - the current compute backend, its selection, and the kernels of
 * include/loom/kernels.h as thin dispatchers to it.
 *
 * Implements include/loom/backend.h. One process-wide pointer names the
 * backend every kernel call and tensor op goes to: the CPU table until
 * loom_backend_select / loom_backend_set change it, once, at start. A kernel
 * call costs one indirect call; nothing here runs per element. Local to the
 * calling rank; nothing is collective.
 */
#include "loom/backend.h"

#include <stddef.h>
#include <string.h>

#include "loom/status.h"

/* Registration hook of the CUDA backend (src/backend/cuda, loom_cuda_*). Its
 * table, src/backend/cuda_table.c, is linked only into `loom-cuda`, the
 * binary a build with -DLOOM_CUDA=ON adds: the plain `loom` never loads the
 * CUDA libraries (hundreds of MB mapped at start, counted in every memory
 * measurement, and absent on a CPU-only machine). So these references are
 * weak: NULL in `loom`, the table in `loom-cuda`. */
extern const loom_backend loom_backend_cuda __attribute__((weak));
loom_status loom_backend_cuda_start(void) __attribute__((weak)); /* picks and initialises the device */

static const loom_backend *be = &loom_backend_cpu;

const loom_backend *loom_backend_current(void) { return be; }

void loom_backend_set_precision(int bf16) {
    loom_kernels_set_precision(bf16);
    if (be->set_precision != loom_kernels_set_precision) be->set_precision(bf16);
}

void loom_backend_arena_init(loom_arena *a, const char *name) {
    loom_arena_init(a, name);
    a->mem_alloc = be->alloc;
    a->mem_free = be->free;
}

/* Every entry of the table, by name, to check that none is NULL. */
#define BE_ENTRIES(X)                                                                            \
    X(alloc) X(free) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d) X(memset) X(stream_create)        \
    X(stream_destroy) X(stream_sync) X(event_create) X(event_destroy) X(event_record)            \
    X(stream_wait_event) X(event_sync) X(set_precision) X(gemm_keep) X(gemm_unkeep)              \
    X(layernorm_fwd) X(layernorm_bwd)                                                            \
    X(matmul_fwd) X(matmul_bwd) X(matmul_nt_fwd) X(matmul_nt_bwd) X(gelu_fwd) X(gelu_bwd)        \
    X(residual_fwd) X(residual_bwd) X(attention_fwd) X(attention_bwd) X(attention_part_fwd)      \
    X(attention_part_bwd) X(attention_merge) X(attention_kv_fwd) X(embed_fwd) X(embed_bwd)       \
    X(pos_fwd) X(pos_bwd) X(vxent_max) X(vxent_exp) X(vxent_finish) X(vxent_bwd)                 \
    X(adamw_update) X(sumsq) X(scale) X(all_finite) X(round_bf16) X(add) X(add2)                 \
    X(add_bias_residual) X(colsum_acc) X(sum_acc) X(softmax_lse) X(topk_gate) X(topk_gate_bwd)  \
    X(gather_rows) X(scatter_add_rows) X(combine_rows) X(combine_rows_bwd) X(fill)

const char *loom_backend_missing_entry(const loom_backend *t) {
    if (!t->name) return "name";
#define BE_CHECK(e)                                                                                \
    if (!t->e) return #e;
    BE_ENTRIES(BE_CHECK)
#undef BE_CHECK
    return NULL;
}

loom_status loom_backend_set(const loom_backend *t) {
    const char *miss = loom_backend_missing_entry(t);
    if (miss)
        return loom_fail(LOOM_EINTERNAL, "backend %s: table entry %s is NULL",
                         t->name ? t->name : "(unnamed)", miss);
    be = t;
    return LOOM_OK;
}

loom_status loom_backend_select(const char *name) {
    if (strcmp(name, "cpu") == 0) return loom_backend_set(&loom_backend_cpu);
    if (strcmp(name, "cuda") == 0) {
        if (&loom_backend_cuda != NULL && loom_backend_cuda_start != NULL) {
            LOOM_TRY(loom_backend_cuda_start());
            return loom_backend_set(&loom_backend_cuda);
        }
        return loom_fail(LOOM_EUSAGE,
                         "--device cuda: this loom was built without the CUDA backend "
                         "(configure with -DLOOM_CUDA=ON and run loom-cuda, the binary with it; "
                         "it needs nvcc, cuBLAS and NCCL)");
    }
    return loom_fail(LOOM_EUSAGE, "--device %s: unknown backend (known: cpu, cuda)", name);
}

/* ---- kernels.h: each kernel is the current backend's ---------------------- */

void loom_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                        const float *b, int N, int C) {
    be->layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}

void loom_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C) {
    be->layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void loom_matmul_fwd(float *out, const float *inp, const float *w, const float *b,
                     int N, int C, int OC) {
    be->matmul_fwd(out, inp, w, b, N, C, OC);
}

void loom_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC) {
    be->matmul_bwd(dinp, dw, db, dout, inp, w, N, C, OC);
}

void loom_matmul_nt_fwd(float *out, const float *inp, const float *wte, int N, int C, int V) {
    be->matmul_nt_fwd(out, inp, wte, N, C, V);
}

void loom_matmul_nt_bwd(float *dinp, float *dwte, const float *dout, const float *inp,
                        const float *wte, int N, int C, int V) {
    be->matmul_nt_bwd(dinp, dwte, dout, inp, wte, N, C, V);
}

void loom_gelu_fwd(float *out, const float *inp, size_t n) {
    be->gelu_fwd(out, inp, n);
}

void loom_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    be->gelu_bwd(dinp, inp, dout, n);
}

void loom_residual_fwd(float *out, const float *a, const float *b, size_t n) {
    be->residual_fwd(out, a, b, n);
}

void loom_residual_bwd(float *da, float *db, const float *dout, size_t n) {
    be->residual_bwd(da, db, dout, n);
}

void loom_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    be->attention_fwd(out, lse, qkv, B, T, C, NH);
}

void loom_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                        const float *lse, int B, int T, int C, int NH) {
    be->attention_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

long loom_attention_part_fwd(const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                             float *lse, int accumulate) {
    return be->attention_part_fwd(v, out, o_bs, o_ld, lse, accumulate);
}

long loom_attention_part_bwd(const loom_att_view *v, float *dq, float *dk, float *dv,
                             const float *dout, const float *out, size_t o_bs, int o_ld,
                             const float *lse) {
    return be->attention_part_bwd(v, dq, dk, dv, dout, out, o_bs, o_ld, lse);
}

void loom_attention_merge(float *out, float *lse, const float *out2, const float *lse2,
                          size_t o_bs, int o_ld, int B, int Tq, int NH, int HS) {
    be->attention_merge(out, lse, out2, lse2, o_bs, o_ld, B, Tq, NH, HS);
}

void loom_attention_kv_fwd(float *out, const float *q, int ldq, const float *kc, const float *vc,
                           int p0, int n, int C, int NH, float *scratch) {
    be->attention_kv_fwd(out, q, ldq, kc, vc, p0, n, C, NH, scratch);
}

void loom_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                    int C) {
    be->embed_fwd(out, tok, wte_l, v0, V_l, N, C);
}

void loom_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l, int N,
                    int C) {
    be->embed_bwd(dwte_l, dout, tok, v0, V_l, N, C);
}

void loom_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C) {
    be->pos_fwd(out, wpe, row0, n, T, C);
}

void loom_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C) {
    be->pos_bwd(dwpe, dout, row0, n, T, C);
}

void loom_vxent_max(float *rowmax, const float *logits, int N, int V_l, int V_valid) {
    be->vxent_max(rowmax, logits, N, V_l, V_valid);
}

void loom_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                    const int32_t *targets, int v0, int N, int V_l, int V_valid) {
    be->vxent_exp(logits, rowsum, tgt, gmax, targets, v0, N, V_l, V_valid);
}

void loom_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                       const int32_t *targets, int N, int V_l) {
    be->vxent_finish(losses, probs, gsum, gtgt, targets, N, V_l);
}

void loom_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss, int v0,
                    int N, int V_l) {
    be->vxent_bwd(dlogits, probs, targets, dloss, v0, N, V_l);
}

int loom_vxent_local(float *losses, float *logits, const int32_t *targets, int N, int V_l, int V_valid) {
    if (!be->vxent_local) return 0;
    be->vxent_local(losses, logits, targets, N, V_l, V_valid);
    return 1;
}

int loom_vxent_local_grad(float *losses, float *logits, const int32_t *targets, int N, int V_l, int V_valid,
                          float dloss) {
    if (!be->vxent_local_grad) return 0;
    be->vxent_local_grad(losses, logits, targets, N, V_l, V_valid, dloss);
    return 1;
}

void loom_gemm_keep(const float *p, size_t n) { be->gemm_keep(p, n); }
void loom_gemm_unkeep(const float *p) { be->gemm_unkeep(p); }

void loom_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, int t, float gscale) {
    be->adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale);
}

int loom_adamw_update_zero(float *p, float *g, float *m, float *v, size_t n, float lr, float beta1,
                           float beta2, float eps, float wd, int t, float gscale, uint16_t *p16) {
    if (!be->adamw_update_zero) return 0;
    be->adamw_update_zero(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, p16);
    return 1;
}

int loom_gemm_keeps_bf16(void) { return be->gemm_keeps_bf16 ? be->gemm_keeps_bf16() : 0; }
uint16_t *loom_gemm_keep_fill(const float *src, size_t n) {
    return be->gemm_keep_fill ? be->gemm_keep_fill(src, n) : NULL;
}
void loom_gemm_keep_filled(const float *src, int ok) {
    if (be->gemm_keep_filled) be->gemm_keep_filled(src, ok);
}

double loom_sumsq(const float *x, size_t n) {
    return be->sumsq(x, n);
}

void loom_scale(float *x, size_t n, float s) {
    be->scale(x, n, s);
}

int loom_all_finite(const float *x, size_t n) {
    return be->all_finite(x, n);
}

void loom_round_bf16(float *dst, const float *src, size_t n) {
    be->round_bf16(dst, src, n);
}
