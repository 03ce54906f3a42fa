/* cpu_kernels.h - the CPU backend's kernels (private to src/kernels/cpu and
 * src/backend): loom_cpu_X has exactly the arguments and contract of loom_X
 * in include/loom/kernels.h, which dispatches to the current backend's X.
 * The small tensor ops of the backend table are at the end (tensor_ops.c).
 */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/kernels.h"

void loom_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C);
void loom_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C);
void loom_cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C,
                         int OC);
void loom_cpu_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC);
void loom_cpu_matmul_nt_fwd(float *out, const float *inp, const float *wte, int N, int C, int V);
void loom_cpu_matmul_nt_bwd(float *dinp, float *dwte, const float *dout, const float *inp,
                            const float *wte, int N, int C, int V);
void loom_cpu_gelu_fwd(float *out, const float *inp, size_t n);
void loom_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
void loom_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n);
void loom_cpu_residual_bwd(float *da, float *db, const float *dout, size_t n);
void loom_cpu_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void loom_cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH);
long loom_cpu_attention_part_fwd(const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                                 float *lse, int accumulate);
long loom_cpu_attention_part_bwd(const loom_att_view *v, float *dq, float *dk, float *dv,
                                 const float *dout, const float *out, size_t o_bs, int o_ld,
                                 const float *lse);
void loom_cpu_attention_merge(float *out, float *lse, const float *out2, const float *lse2,
                              size_t o_bs, int o_ld, int B, int Tq, int NH, int HS);
void loom_cpu_attention_kv_fwd(float *out, const float *q, int ldq, const float *kc,
                               const float *vc, int p0, int n, int C, int NH, float *scratch);
void loom_cpu_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                        int C);
void loom_cpu_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l,
                        int N, int C);
void loom_cpu_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C);
void loom_cpu_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C);
void loom_cpu_vxent_max(float *rowmax, const float *logits, int N, int V_l, int V_valid);
void loom_cpu_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                        const int32_t *targets, int v0, int N, int V_l, int V_valid);
void loom_cpu_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                           const int32_t *targets, int N, int V_l);
void loom_cpu_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                        int v0, int N, int V_l);
void loom_cpu_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                           float beta1, float beta2, float eps, float wd, int t, float gscale);
void loom_cpu_adamw_update_zero(float *p, float *g, float *m, float *v, size_t n, float lr, float beta1,
                                float beta2, float eps, float wd, int t, float gscale, uint16_t *p16);
double loom_cpu_sumsq(const float *x, size_t n);
void loom_cpu_scale(float *x, size_t n, float s);
int loom_cpu_all_finite(const float *x, size_t n);
void loom_cpu_zero(float *x, size_t n); /* x = 0 (n), over the threads */
void loom_cpu_round_bf16(float *dst, const float *src, size_t n);
void loom_cpu_vxent_local_grad(float *losses, float *logits, const int32_t *targets, int N, int V_l,
                               int V_valid, float dloss);
void loom_cpu_vxent_local(float *losses, float *logits, const int32_t *targets, int N, int V_l,
                          int V_valid);
void loom_cpu_gemm_keep(const float *p, size_t n);
int loom_cpu_gemm_keeps_bf16(void);
uint16_t *loom_cpu_gemm_keep_fill(const float *src, size_t n);
void loom_cpu_gemm_keep_filled(const float *src, int ok);
void loom_cpu_gemm_unkeep(const float *p);

/* Tensor ops of the backend table (include/loom/backend.h says what each does). */
void loom_cpu_add(float *y, const float *x, size_t n);
void loom_cpu_add2(float *a, float *b, size_t n);
void loom_cpu_add_bias_residual(float *out, const float *res, const float *bias, int n, int C);
void loom_cpu_colsum_acc(float *y, const float *x, int N, int ld, int ncols);
void loom_cpu_sum_acc(double *host_acc, const float *x, size_t n);
/* Routing and row ops of the backend table (route_ops.c). */
double loom_cpu_softmax_lse(float *x, float *lse, int N, int n);
void loom_cpu_topk_gate(int32_t *sel, float *gate, const float *p, const float *bias, int N, int n,
                        int k, int norm);
void loom_cpu_topk_gate_bwd(float *dx, float *dp, const float *dgate, const int32_t *sel,
                            const float *gate, const float *p, const float *lse,
                            const int32_t *add_tab, const int32_t *add_row, float add_scale,
                            float z_scale, int N, int n, int k, int norm);
void loom_cpu_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int C);
void loom_cpu_scatter_add_rows(float *dst, const float *src, const int32_t *idx, int n, int C);
void loom_cpu_combine_rows(float *out, const float *y, const int32_t *row, const float *w, int N,
                           int k, int C);
void loom_cpu_combine_rows_bwd(float *dy, float *dw, const float *dout, const float *y,
                               const int32_t *row, const float *w, int N, int k, int C);
void loom_cpu_fill(float *x, size_t n, float v);

#endif
