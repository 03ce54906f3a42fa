/* parts.c - a block's parts as data: each function is one part of the
 * block (its norm, a linear layer, the MLP's activation, the residual
 * with the output bias), forward and backward, choosing the kernel the
 * model's config names. gpt.c's one block forward and backward call these,
 * so GPT-2 and the Llama family run the same block: LayerNorm or RMSNorm,
 * Conv1D [in, out] or nn.Linear [out, in] weights, GELU or SwiGLU, every
 * bias or only those the family has. Local; no collectives.
 */
#include "loom/device.h"
#include "loom/kernels.h"
#include "model/internal.h"

void loom_part_norm_fwd(const loom_gpt *m, float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, int N) {
    if (m->cfg.norm == LOOM_NORM_RMS) loom_rmsnorm_fwd(m->dev, out, rstd, x, w, N, m->C, m->cfg.norm_eps);
    else loom_layernorm_fwd(m->dev, out, mean, rstd, x, w, b, N, m->C);
}

void loom_part_norm_bwd(const loom_gpt *m, float *dx, float *dw, float *db, const float *dout, const float *x,
                        const float *w, const float *mean, const float *rstd, int N) {
    if (m->cfg.norm == LOOM_NORM_RMS) loom_rmsnorm_bwd(m->dev, dx, dw, dout, x, w, rstd, N, m->C);
    else loom_layernorm_bwd(m->dev, dx, dw, db, dout, x, w, mean, rstd, N, m->C);
}

void loom_part_linear_fwd(const loom_gpt *m, float *out, const float *x, const float *w, const float *b,
                          int N, int K, int OC) {
    if (m->cfg.family == LOOM_FAMILY_LLAMA) loom_linear_fwd(m->dev, out, x, w, b, N, K, OC);
    else loom_matmul_fwd(m->dev, out, x, w, b, N, K, OC);
}

void loom_part_linear_bwd(const loom_gpt *m, float *dx, float *dw, float *db, const float *dout,
                          const float *x, const float *w, int N, int K, int OC) {
    if (m->cfg.family == LOOM_FAMILY_LLAMA) loom_linear_bwd(m->dev, dx, dw, db, dout, x, w, N, K, OC);
    else loom_matmul_bwd(m->dev, dx, dw, db, dout, x, w, N, K, OC);
}

void loom_part_act_fwd(const loom_gpt *m, float *h, const float *fc, int N) {
    if (m->cfg.mlp == LOOM_MLP_SWIGLU) loom_swiglu_fwd(m->dev, h, fc, N, m->H_l);
    else loom_gelu_fwd(m->dev, h, fc, (size_t)N * m->H_l);
}

void loom_part_act_bwd(const loom_gpt *m, float *dfc, const float *fc, const float *dh, int N) {
    if (m->cfg.mlp == LOOM_MLP_SWIGLU) {
        loom_swiglu_bwd(m->dev, dfc, fc, dh, N, m->H_l);
        return;
    }
    loom_tensor_zero(m->dev, dfc, (size_t)N * m->H_l);
    loom_gelu_bwd(m->dev, dfc, fc, dh, (size_t)N * m->H_l);
}

void loom_part_residual(const loom_gpt *m, float *out, const float *res, const float *bias, int N) {
    if (bias) loom_tensor_add_bias_residual(m->dev, out, res, bias, N, m->C);
    else loom_residual_fwd(m->dev, out, out, res, (size_t)N * m->C);
}

void loom_part_rope(const loom_gpt *m, float *qkv, int N, int inverse) {
    if (m->pos) loom_rope(m->dev, qkv, m->QKV_l, m->pos, m->inv_freq, N, m->NH_l + m->NKV_l, m->HS, inverse);
}

void loom_part_qkv_bias_grad(const loom_gpt *m, float *db, const float *dqkv, int N) {
    if (!db) return;
    if (m->cfg.rope) { /* rotated keys: a key bias moves scores unevenly, so it has a gradient */
        loom_tensor_colsum_acc(m->dev, db, dqkv, N, m->QKV_l, m->QKV_l);
        return;
    }
    /* The key bias gets exactly zero: adding b to every key adds q.b to all
     * scores of a query, which the softmax cancels, so its true gradient is 0.
     * Summing dK would give rounding noise instead, and AdamW turns noise of
     * any size into steps of up to lr - a random walk that would differ
     * between layouts. Exact zeros keep the parameter where the math says
     * it stays. */
    loom_tensor_colsum_acc(m->dev, db, dqkv, N, m->QKV_l, m->C_l); /* query */
    loom_tensor_colsum_acc(m->dev, db + m->C_l + m->KV_l, dqkv + m->C_l + m->KV_l, N, m->QKV_l,
                           m->KV_l); /* value */
}

loom_att_view loom_part_att_view(const loom_gpt *m, const float *qkv, int B, int T) {
    return loom_att_packed(qkv, B, T, &m->heads);
}
