/* gpt.c - forward and backward of one model part, llm.c style: GPT-2 and
 * the Llama family run the same block, its parts chosen by the config
 * (parts.c: the norm, the linear layers' layout, the MLP's activation,
 * rotary positions, grouped-query and sliding-window attention).
 *
 * The single-device model is the part with every block, both ends and tp=1:
 * the spec every layout is compared with (invariant 1) and what is checked
 * against PyTorch (invariant 2). Tensor parallelism cuts each block as
 * Megatron does; the collectives are the regions of tp.h, called at the
 * exact points the math needs them. The backward is the mirror of the
 * forward, in two halves: the input-gradient half (B) walks the blocks in
 * reverse and keeps each matmul's output gradient; the weight-gradient half
 * (W) turns those into parameter gradients. A full backward runs W for each
 * block right after its B; zero-bubble schedules run them apart.
 *
 * Collective over the TP group (forward, both backward halves, finish_grads).
 */
#include "loom/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/moe.h"
#include "model/internal.h"

float *loom_gpt_input(loom_gpt *m, int slot) { return m->slots[slot].x; }
float *loom_gpt_input_grad(loom_gpt *m, int slot) { return m->slots[slot].dx; }

/* Output of local block li (li = -1: the part's input). */
static const float *block_out(const loom_gpt_slot *s, int li) { return li >= 0 ? s->acts[li].res3 : s->x; }
const float *loom_gpt_output(const loom_gpt *m, int slot) { return block_out(&m->slots[slot], m->L_l - 1); }

static int has_outer(const loom_gpt *m) { return m->part.has_embed || m->part.has_head; }

#define HOOK(name, unit)                                                                                     \
    do {                                                                                                     \
        if (m->hooks.name) LOOM_TRY(m->hooks.name(m->hooks.ctx, m, unit));                                   \
    } while (0)

/* The rows one forward works on: a micro-batch of B sequences of T
 * (training; N = B T, Nx = N / tp under SP), or the new tokens of an
 * inference step (kv: their sequences' caches; B = 1, T = N = Nx). */
typedef struct {
    int B, T, N, Nx;
    const loom_gpt_kv *kv;
} rows_t;

/* The micro-batch the part was planned for. */
static rows_t planned(const loom_gpt *m) { return (rows_t){m->B, m->T, m->N, m->Nx, NULL}; }

/* ---- the TP regions around a block's two matmuls ------------------------ */

/* The (N,C) rows of a (Nx,C) shard x: with SP all-gathered into the shared
 * scratch m->dfull (valid until its next use), x itself without SP or when
 * x is not `sharded`. Backward's weight half calls it to gather again what
 * forward gathered - Megatron's trade of an all-gather for (N,C) memory. */
static loom_status sp_regather(loom_gpt *m, const float *x, int sharded, const float **xg) {
    *xg = x;
    if (!m->part.tp.sp || !sharded) return LOOM_OK;
    *xg = m->dfull;
    return loom_sp_gather_fwd(&m->part.tp, x, m->dfull, (size_t)m->Nx * m->C);
}
/* Into a column-parallel matmul: x (Nx,C) -> *xg, its (N,C) rows; under SP
 * only the shard x is kept for backward. */
static loom_status col_in_fwd(loom_gpt *m, const rows_t *r, float *x, const float **xg) {
    if (m->part.tp.sp) return sp_regather(m, x, 1, xg);
    *xg = x;
    return loom_tp_copy_fwd(&m->part.tp, x, (size_t)r->N * m->C);
}
/* Its conjugate: partial dxg (N,C) -> dx (Nx,C) summed over tp. */
static loom_status col_in_bwd(loom_gpt *m, float *dxg, float *dx) {
    if (m->part.tp.sp) return loom_sp_gather_bwd(&m->part.tp, dxg, dx, (size_t)m->Nx * m->C);
    LOOM_TRY(loom_tp_copy_bwd(&m->part.tp, dxg, (size_t)m->N * m->C));
    loom_tensor_copy(m->dev, dx, dxg, (size_t)m->N * m->C);
    return LOOM_OK;
}
/* Out of a row-parallel matmul: partial y (N,C) -> out (Nx,C) summed (y == out without SP). */
static loom_status row_out_fwd(loom_gpt *m, const rows_t *r, float *y, float *out) {
    if (m->part.tp.sp) return loom_sp_reduce_scatter_fwd(&m->part.tp, y, out, (size_t)r->Nx * m->C);
    return loom_tp_reduce_fwd(&m->part.tp, out, (size_t)r->N * m->C);
}
/* Its conjugate: dout (Nx,C) -> dy (N,C) as the matmul's output gradient. */
static loom_status row_out_bwd(loom_gpt *m, const float *dout, float *dy) {
    if (m->part.tp.sp) return loom_sp_reduce_scatter_bwd(&m->part.tp, dout, dy, (size_t)m->Nx * m->C);
    loom_tensor_copy(m->dev, dy, dout, (size_t)m->N * m->C);
    return loom_tp_reduce_bwd(&m->part.tp, dy, (size_t)m->N * m->C);
}

/* ---- forward ------------------------------------------------------------ */

static loom_status embed_fwd(loom_gpt *m, loom_gpt_slot *s) {
    const int sp = m->part.tp.sp;
    const rows_t r = planned(m);
    float *full = sp ? m->dfull : s->x; /* (N,C) partial over tp */
    loom_embed_fwd(m->dev, full, s->inputs, m->w.wte, m->vocab_start, m->V_l, m->N, m->C);
    LOOM_TRY(row_out_fwd(m, &r, full, s->x));
    if (m->cfg.rope) return LOOM_OK; /* rotary positions, in attention */
    if (m->part.cp.size > 1)
        loom_cp_pos_fwd(&m->part.cp, s->x, m->w.wpe, sp ? m->part.tp.rank * m->Nx : 0, m->Nx, m->T, m->C);
    else loom_pos_fwd(m->dev, s->x, m->w.wpe, sp ? m->part.tp.rank * m->Nx : 0, m->Nx, m->T, m->C);
    return LOOM_OK;
}

/* Inference attention: each sequence's new keys and values (from qkv
 * (N,QKV_l), rows [q | k | v]) appended to its cache of local block li,
 * then its new queries over the cached positions they see. */
static void attention_kv(loom_gpt *m, int li, const loom_gpt_kv *kv, float *atty, const float *qkv) {
    const int Cl = m->C_l, KV = m->KV_l, W = m->QKV_l;
    for (int j = 0, r0 = 0; j < kv->n; r0 += kv->n_new[j], j++) {
        const size_t at = ((size_t)li * kv->max_seqs + (size_t)kv->seq[j]) * (size_t)kv->max_len * KV;
        float *kc = kv->k + at, *vc = kv->v + at; /* (max_len, KV_l) */
        for (int i = 0; i < kv->n_new[j]; i++) {
            const float *row = qkv + (size_t)(r0 + i) * W;
            loom_tensor_copy(m->dev, kc + (size_t)(kv->pos[j] + i) * KV, row + Cl, (size_t)KV);
            loom_tensor_copy(m->dev, vc + (size_t)(kv->pos[j] + i) * KV, row + Cl + KV, (size_t)KV);
        }
        loom_attention_kv_fwd(m->dev, atty + (size_t)r0 * Cl, qkv + (size_t)r0 * W, W, kc, vc, kv->pos[j],
                              kv->n_new[j], Cl, m->NH_l, m->NKV_l, m->cfg.window, kv->scratch);
    }
}

/* atty (N,C_l) from qkv (N,QKV_l): causal over the micro-batch's sequences
 * (ring or Ulysses across the CP group), or over the caches (inference). */
static loom_status attention_fwd(loom_gpt *m, int li, const rows_t *r, loom_gpt_layer_acts *a) {
    if (r->kv) {
        attention_kv(m, li, r->kv, a->atty, a->qkv);
    } else if (m->part.cp.size > 1) {
        LOOM_TRY(loom_cp_attention_fwd(&m->part.cp, a->atty, a->lse, a->qkv, r->B, r->T, &m->heads));
    } else {
        loom_att_view v = loom_part_att_view(m, a->qkv, r->B, r->T);
        loom_attention_part_fwd(m->dev, &v, a->atty, (size_t)r->T * m->C_l, m->C_l, a->lse, 0);
    }
    return LOOM_OK;
}

/* One block, training and inference alike (r: which rows, and how attention
 * sees them); its output in s->acts[li].res3. */
static loom_status block_fwd(loom_gpt *m, loom_gpt_slot *s, int li, const rows_t *r) {
    const loom_gpt_layer_w *w = &m->w.h[li];
    loom_gpt_layer_acts *a = &s->acts[li];
    const int N = r->N, Nx = r->Nx, C = m->C, Cl = m->C_l, sp = m->part.tp.sp;
    const float *res = block_out(s, li - 1); /* (Nx,C) */
    /* attention: res2 = res + c_proj(attn(rope(c_attn(ln_1(res))))) */
    const float *xg; /* (N,C) the norm output's rows, gathered under SP */
    loom_part_norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1_w, w->ln1_b, Nx);
    LOOM_TRY(col_in_fwd(m, r, a->ln1, &xg));
    loom_part_linear_fwd(m, a->qkv, xg, w->qkv_w, w->qkv_b, N, C, m->QKV_l);
    loom_part_rope(m, a->qkv, N, 0);
    LOOM_TRY(attention_fwd(m, li, r, a));
    float *y = sp ? m->dfull : a->res2;
    loom_part_linear_fwd(m, y, a->atty, w->proj_w, NULL, N, Cl, C);
    LOOM_TRY(row_out_fwd(m, r, y, a->res2));
    loom_part_residual(m, a->res2, res, w->proj_b, Nx);
    /* MLP: res3 = res2 + c_proj(act(c_fc(ln_2(res2)))); res is not read
     * again, so res3 may be res itself (a forward-only part) */
    loom_part_norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b, Nx);
    LOOM_TRY(col_in_fwd(m, r, a->ln2, &xg));
    if (loom_moe_layer(&m->cfg, m->part.layer_begin + li)) { /* MoE MLP (moe.c) */
        y = sp ? m->dlnfull : a->res3; /* (N,C); dfull holds xg, dlnfull is free in forward */
        LOOM_TRY(loom_moe_fwd(m, s, li, N, xg, y));
        LOOM_TRY(row_out_fwd(m, r, y, a->res3)); /* experts' partial sums over tp */
        loom_residual_fwd(m->dev, a->res3, a->res3, a->res2, (size_t)Nx * C);
        return LOOM_OK;
    }
    loom_part_linear_fwd(m, a->fch, xg, w->fc_w, w->fc_b, N, C, m->FC_l);
    loom_part_act_fwd(m, a->fch_gelu, a->fch, N);
    y = sp ? m->dfull : a->res3;
    loom_part_linear_fwd(m, y, a->fch_gelu, w->fcp_w, NULL, N, m->H_l, C);
    LOOM_TRY(row_out_fwd(m, r, y, a->res3));
    loom_part_residual(m, a->res3, a->res2, w->fcp_b, Nx);
    return LOOM_OK;
}

/* ln_f, the tied LM head, and the vocab-parallel cross-entropy; grad: the
 * backward was promised (loom_gpt_expect_backward, with m->expect_dloss). */
static loom_status head_fwd(loom_gpt *m, loom_gpt_slot *s, int grad, double *loss_sum) {
    const int N = m->N, Nx = m->Nx, C = m->C, Vl = m->V_l;
    const loom_tp *tp = &m->part.tp;
    const rows_t r = planned(m);
    loom_part_norm_fwd(m, s->lnf, s->lnf_mean, s->lnf_rstd, block_out(s, m->L_l - 1), m->w.lnf_w, m->w.lnf_b,
                       Nx);
    const float *xg;
    LOOM_TRY(col_in_fwd(m, &r, s->lnf, &xg));
    loom_matmul_nt_fwd(m->dev, s->logits, xg, m->w.lm_head, N, C, Vl);
    /* one rank with the whole vocabulary: the fused kernel if the backend has
     * one, with the loss's gradient too if the backward follows */
    s->dlogits_kept = 0;
    if (!s->have_targets) return LOOM_OK;
    s->dlogits_kept =
        grad && tp->size == 1 &&
        loom_vxent_local_grad(m->dev, s->losses, s->logits, s->targets, N, Vl, m->V_valid_l, m->expect_dloss);
    if (s->dlogits_kept) s->dlogits_dloss = m->expect_dloss;
    else if (tp->size > 1 ||
             !loom_vxent_local(m->dev, s->losses, s->logits, s->targets, N, Vl, m->V_valid_l)) {
        loom_vxent_max(m->dev, m->xmax, s->logits, N, Vl, m->V_valid_l);
        LOOM_TRY(loom_tp_allreduce(tp, m->xmax, (size_t)N, LOOM_MAX));
        float *sum = m->xsum, *tgt = m->xsum + N;
        loom_vxent_exp(m->dev, s->logits, sum, tgt, m->xmax, s->targets, m->vocab_start, N, Vl, m->V_valid_l);
        LOOM_TRY(loom_tp_allreduce(tp, m->xsum, 2 * (size_t)N, LOOM_SUM));
        loom_vxent_finish(m->dev, s->losses, s->logits, sum, tgt, s->targets, N, Vl);
    }
    if (loss_sum) loom_tensor_sum_acc(m->dev, loss_sum, s->losses, (size_t)N);
    return LOOM_OK;
}

loom_status loom_gpt_forward(loom_gpt *m, int slot, const int32_t *inputs, const int32_t *targets,
                             double *loss_sum) {
    loom_gpt_slot *s = &m->slots[slot];
    const rows_t r = planned(m);
    const int expect = m->expect_backward; /* the promise holds for this forward only */
    m->expect_backward = 0;
    if (m->opts.forward_only)
        return loom_fail(LOOM_EINTERNAL, "loom_gpt_forward on a forward-only part (use loom_gpt_forward_kv)");
    s->have_targets = targets != NULL;
    if (targets) loom_tensor_upload_i32(m->dev, s->targets, targets, (size_t)m->N);
    if (has_outer(m)) HOOK(pre_forward, LOOM_UNIT_OUTER);
    if (m->part.has_embed) {
        loom_tensor_upload_i32(m->dev, s->inputs, inputs, (size_t)m->N);
        LOOM_TRY(embed_fwd(m, s));
    }
    for (int li = 0; li < m->L_l; li++) {
        HOOK(pre_forward, m->part.layer_begin + li);
        LOOM_TRY(block_fwd(m, s, li, &r));
        HOOK(post_forward, m->part.layer_begin + li);
    }
    if (m->part.has_head) LOOM_TRY(head_fwd(m, s, expect, loss_sum));
    if (loss_sum) *loss_sum += loom_moe_loss_sum(m, s); /* router losses, on every stage */
    if (has_outer(m)) HOOK(post_forward, LOOM_UNIT_OUTER);
    return LOOM_OK;
}

loom_status loom_gpt_forward_kv(loom_gpt *m, int R, const loom_gpt_kv *kv) {
    if (!m->opts.forward_only || R < 1 || R > m->N)
        return loom_fail(LOOM_EINTERNAL, "loom_gpt_forward_kv: %d rows on a part %s for %d", R,
                         m->opts.forward_only ? "planned" : "not forward-only,", m->N);
    const rows_t r = {1, R, R, R, kv};
    if (m->pos) { /* each new row's position in its sequence */
        for (int j = 0, i0 = 0; j < kv->n; i0 += kv->n_new[j], j++)
            for (int i = 0; i < kv->n_new[j]; i++) m->pos_host[i0 + i] = kv->pos[j] + i;
        loom_tensor_upload_i32(m->dev, m->pos, m->pos_host, (size_t)R);
    }
    for (int li = 0; li < m->L_l; li++) LOOM_TRY(block_fwd(m, &m->slots[0], li, &r));
    return LOOM_OK;
}

/* ---- backward, input half (B): the forward mirrored ---------------------- */

/* The head, from dlogits (in s->logits, kept for W): m->dres = d(last
 * block output); keeps d(ln_f out) in dlnf for W. */
static loom_status head_bwd_input(loom_gpt *m, loom_gpt_slot *s, float *dlnf) {
    const int N = m->N, Nx = m->Nx, C = m->C, Vl = m->V_l;
    loom_tensor_zero(m->dev, m->dlnfull, (size_t)N * C);
    loom_matmul_nt_bwd(m->dev, m->dlnfull, NULL, s->logits, NULL, m->w.lm_head, N, C, Vl);
    LOOM_TRY(col_in_bwd(m, m->dlnfull, dlnf));
    loom_tensor_zero(m->dev, m->dres, (size_t)Nx * C);
    loom_part_norm_bwd(m, m->dres, NULL, NULL, dlnf, block_out(s, m->L_l - 1), m->w.lnf_w, s->lnf_mean,
                       s->lnf_rstd, Nx);
    return LOOM_OK;
}

/* m->dres = d(block output) -> d(block input); keeps output gradients in d. */
static loom_status block_bwd_input(loom_gpt *m, loom_gpt_slot *s, int li, loom_gpt_dsave *d) {
    const loom_gpt_layer_w *w = &m->w.h[li];
    const loom_gpt_layer_acts *a = &s->acts[li];
    const int N = m->N, Nx = m->Nx, C = m->C, Cl = m->C_l;
    float *dres = m->dres;
    /* gathered output gradients of the row-parallel matmuls: in d, or in
     * m->dfull when d keeps only this rank's rows (a copy of dres) */
    float *dy = d->sharded ? m->dfull : d->dfcp; /* (N,C) */
    /* MLP branch; the residual passes dres through unchanged */
    if (loom_moe_layer(&m->cfg, m->part.layer_begin + li)) { /* MoE MLP (moe.c) */
        LOOM_TRY(row_out_bwd(m, dres, dy));
        LOOM_TRY(loom_moe_bwd_input(m, s, li, dy, m->dlnfull));
        LOOM_TRY(col_in_bwd(m, m->dlnfull, d->dln2));
    } else {
        if (d->sharded) loom_tensor_copy(m->dev, d->dfcp, dres, (size_t)Nx * C);
        LOOM_TRY(row_out_bwd(m, dres, dy));
        loom_tensor_zero(m->dev, m->d4c, (size_t)N * m->H_l);
        loom_part_linear_bwd(m, m->d4c, NULL, NULL, dy, a->fch_gelu, w->fcp_w, N, m->H_l, C);
        loom_part_act_bwd(m, d->dfch, a->fch, m->d4c, N);
        loom_tensor_zero(m->dev, m->dlnfull, (size_t)N * C);
        loom_part_linear_bwd(m, m->dlnfull, NULL, NULL, d->dfch, NULL, w->fc_w, N, C, m->FC_l);
        LOOM_TRY(col_in_bwd(m, m->dlnfull, d->dln2));
    }
    loom_part_norm_bwd(m, dres, NULL, NULL, d->dln2, a->res2, w->ln2_w, a->ln2_mean, a->ln2_rstd, Nx);
    /* attention branch */
    dy = d->sharded ? m->dfull : d->dproj;
    if (d->sharded) loom_tensor_copy(m->dev, d->dproj, dres, (size_t)Nx * C);
    LOOM_TRY(row_out_bwd(m, dres, dy));
    loom_tensor_zero(m->dev, m->datty, (size_t)N * Cl);
    loom_part_linear_bwd(m, m->datty, NULL, NULL, dy, a->atty, w->proj_w, N, Cl, C);
    loom_tensor_zero(m->dev, d->dqkv, (size_t)N * m->QKV_l);
    if (m->part.cp.size > 1) {
        LOOM_TRY(loom_cp_attention_bwd(&m->part.cp, d->dqkv, m->datty, a->qkv, a->atty, a->lse, m->B, m->T,
                                       &m->heads));
    } else {
        loom_att_view v = loom_part_att_view(m, a->qkv, m->B, m->T);
        loom_attention_part_bwd(m->dev, &v, d->dqkv, d->dqkv + Cl, d->dqkv + Cl + m->KV_l, m->datty, a->atty,
                                (size_t)m->T * Cl, Cl, a->lse);
    }
    loom_part_rope(m, d->dqkv, N, 1); /* back through the rotation: d(c_attn out) */
    loom_tensor_zero(m->dev, m->dlnfull, (size_t)N * C);
    loom_part_linear_bwd(m, m->dlnfull, NULL, NULL, d->dqkv, NULL, w->qkv_w, N, C, m->QKV_l);
    LOOM_TRY(col_in_bwd(m, m->dlnfull, d->dln1));
    loom_part_norm_bwd(m, dres, NULL, NULL, d->dln1, block_out(s, li - 1), w->ln1_w, a->ln1_mean, a->ln1_rstd,
                       Nx);
    return LOOM_OK;
}

/* ---- backward, weight half (W) ------------------------------------------ */

/* Under SP each (N,C) operand below is re-gathered from the kept shard into
 * m->dfull just before its one matmul: one full copy alive at a time. */
static loom_status block_bwd_weight(loom_gpt *m, loom_gpt_slot *s, int li, const loom_gpt_dsave *d) {
    const loom_gpt_layer_w *w = &m->w.h[li];
    loom_gpt_layer_w *g = &m->g.h[li];
    const loom_gpt_layer_acts *a = &s->acts[li];
    const int N = m->N, Nx = m->Nx, C = m->C, Cl = m->C_l;
    const float *full;                                       /* (N,C) */
    if (loom_moe_layer(&m->cfg, m->part.layer_begin + li)) { /* MoE MLP (moe.c) */
        LOOM_TRY(sp_regather(m, a->ln2, 1, &full));
        LOOM_TRY(loom_moe_bwd_weight(m, s, li, full));
    } else {
        LOOM_TRY(sp_regather(m, d->dfcp, d->sharded, &full));
        loom_part_linear_bwd(m, NULL, g->fcp_w, g->fcp_b, full, a->fch_gelu, w->fcp_w, N, m->H_l, C);
        LOOM_TRY(sp_regather(m, a->ln2, 1, &full));
        loom_part_linear_bwd(m, NULL, g->fc_w, g->fc_b, d->dfch, full, w->fc_w, N, C, m->FC_l);
    }
    loom_part_norm_bwd(m, NULL, g->ln2_w, g->ln2_b, d->dln2, a->res2, w->ln2_w, a->ln2_mean, a->ln2_rstd, Nx);
    LOOM_TRY(sp_regather(m, d->dproj, d->sharded, &full));
    loom_part_linear_bwd(m, NULL, g->proj_w, g->proj_b, full, a->atty, w->proj_w, N, Cl, C);
    LOOM_TRY(sp_regather(m, a->ln1, 1, &full));
    loom_part_linear_bwd(m, NULL, g->qkv_w, NULL, d->dqkv, full, w->qkv_w, N, C, m->QKV_l);
    loom_part_qkv_bias_grad(m, g->qkv_b, d->dqkv, N);
    loom_part_norm_bwd(m, NULL, g->ln1_w, g->ln1_b, d->dln1, block_out(s, li - 1), w->ln1_w, a->ln1_mean,
                       a->ln1_rstd, Nx);
    return LOOM_OK;
}

/* The head's share of the tied wte gradient: dlogits^T ln_f-out. */
static loom_status head_bwd_wte(loom_gpt *m, loom_gpt_slot *s) {
    const float *lnfg; /* (N,C) */
    LOOM_TRY(sp_regather(m, s->lnf, 1, &lnfg));
    loom_matmul_nt_bwd(m->dev, NULL, m->g.lm_head, s->logits, lnfg, m->w.lm_head, m->N, m->C, m->V_l);
    return LOOM_OK;
}

static void head_bwd_lnf(loom_gpt *m, loom_gpt_slot *s, const float *dlnf) {
    loom_part_norm_bwd(m, NULL, m->g.lnf_w, m->g.lnf_b, dlnf, block_out(s, m->L_l - 1), m->w.lnf_w,
                       s->lnf_mean, s->lnf_rstd, m->Nx);
}

/* From s->dx = d(embedding output). */
static loom_status embed_bwd_weight(loom_gpt *m, loom_gpt_slot *s) {
    const int sp = m->part.tp.sp;
    float *full = sp ? m->dfull : s->dx; /* (N,C) */
    LOOM_TRY(row_out_bwd(m, s->dx, full));
    int taken = 0; /* a DP engine may sum these rows over dp apart from the rest of wte */
    if (m->hooks.embed_rows) LOOM_TRY(m->hooks.embed_rows(m->hooks.ctx, m, s->inputs, full, &taken));
    if (!taken) loom_embed_bwd(m->dev, m->g.wte, full, s->inputs, m->vocab_start, m->V_l, m->N, m->C);
    if (m->cfg.rope) return LOOM_OK; /* rotary positions: no wpe */
    if (m->part.cp.size > 1)
        loom_cp_pos_bwd(&m->part.cp, m->g.wpe, s->dx, sp ? m->part.tp.rank * m->Nx : 0, m->Nx, m->T, m->C);
    else loom_pos_bwd(m->dev, m->g.wpe, s->dx, sp ? m->part.tp.rank * m->Nx : 0, m->Nx, m->T, m->C);
    return LOOM_OK;
}

/* ---- the two halves together or apart ------------------------------------ */

static loom_status backward(loom_gpt *m, int slot, const float *dy, float dloss, int split) {
    loom_gpt_slot *s = &m->slots[slot];
    const size_t nx = (size_t)m->Nx * m->C;
    loom_moe_set_dloss(m, dloss);
    if (has_outer(m)) HOOK(pre_backward, LOOM_UNIT_OUTER);
    if (m->part.has_head) {
        /* Unsplit, the head's wte gradient comes first: it is most of a
         * GPT-2 gradient, and a DP engine can reduce it (post_head_wte)
         * behind the rest of the backward. */
        float *dlnf = split ? s->dlnf : m->dlnf;
        if (s->dlogits_kept && (split || dloss != s->dlogits_dloss)) {
            loom_gemm_unkeep(m->dev, s->logits);
            s->dlogits_kept = 0;
            return loom_fail(LOOM_EINTERNAL,
                             "backward: the forward was promised (loom_gpt_expect_backward) an "
                             "unsplit backward with dloss %g, got %s with %g",
                             (double)s->dlogits_dloss, split ? "a split one" : "one", (double)dloss);
        }
        const int grad_kept = s->dlogits_kept;
        s->dlogits_kept = 0;
        if (!grad_kept)
            loom_vxent_bwd(m->dev, s->logits, s->logits, s->targets, dloss, m->vocab_start, m->N, m->V_l);
        if (!split) {
            /* dlogits feeds both head products: converted to bf16 once
             * (already, and kept, if the forward computed it) */
            if (!grad_kept) loom_gemm_keep(m->dev, s->logits, (size_t)m->N * m->V_l);
            loom_status st = head_bwd_wte(m, s);
            if (st == LOOM_OK && m->hooks.post_head_wte) st = m->hooks.post_head_wte(m->hooks.ctx, m);
            if (st == LOOM_OK) st = head_bwd_input(m, s, dlnf);
            loom_gemm_unkeep(m->dev, s->logits);
            LOOM_TRY(st);
            head_bwd_lnf(m, s, dlnf);
        } else {
            LOOM_TRY(head_bwd_input(m, s, dlnf));
        }
    } else {
        loom_tensor_copy(m->dev, m->dres, dy, nx);
    }
    for (int li = m->L_l - 1; li >= 0; li--) {
        int unit = m->part.layer_begin + li;
        loom_gpt_dsave *d = split ? &s->ds[li] : &m->scratch_ds;
        HOOK(pre_backward, unit);
        if (m->opts.recompute == LOOM_RECOMPUTE_FULL) { /* from its input */
            const rows_t r = planned(m);
            LOOM_TRY(block_fwd(m, s, li, &r));
        }
        LOOM_TRY(block_bwd_input(m, s, li, d));
        if (!split) {
            LOOM_TRY(block_bwd_weight(m, s, li, d));
            HOOK(post_backward, unit);
        } else {
            HOOK(post_input, unit);
        }
    }
    loom_tensor_copy(m->dev, s->dx, m->dres, nx);
    if (!split && m->part.has_embed) LOOM_TRY(embed_bwd_weight(m, s));
    if (!split && has_outer(m)) HOOK(post_backward, LOOM_UNIT_OUTER);
    if (split && has_outer(m)) HOOK(post_input, LOOM_UNIT_OUTER);
    return LOOM_OK;
}

loom_status loom_gpt_backward(loom_gpt *m, int slot, const float *dy, float dloss) {
    return backward(m, slot, dy, dloss, 0);
}

loom_status loom_gpt_backward_input(loom_gpt *m, int slot, const float *dy, float dloss) {
    if (!m->opts.split_backward)
        return loom_fail(LOOM_EINTERNAL, "backward_input needs a model created with split_backward");
    return backward(m, slot, dy, dloss, 1);
}

loom_status loom_gpt_backward_weight(loom_gpt *m, int slot) {
    loom_gpt_slot *s = &m->slots[slot];
    if (!m->opts.split_backward)
        return loom_fail(LOOM_EINTERNAL, "backward_weight needs a model created with split_backward");
    if (has_outer(m)) HOOK(pre_weight, LOOM_UNIT_OUTER);
    if (m->part.has_head) {
        LOOM_TRY(head_bwd_wte(m, s));
        head_bwd_lnf(m, s, s->dlnf);
    }
    for (int li = m->L_l - 1; li >= 0; li--) {
        if (m->opts.recompute == LOOM_RECOMPUTE_FULL) {
            /* B's recompute of this block is gone (the one work set went to
             * the blocks before it and to other micro-batches): once more
             * from its kept input, with its parameters as B had them */
            const rows_t r = planned(m);
            HOOK(pre_backward, m->part.layer_begin + li);
            LOOM_TRY(block_fwd(m, s, li, &r));
            HOOK(post_input, m->part.layer_begin + li);
        }
        HOOK(pre_weight, m->part.layer_begin + li);
        LOOM_TRY(block_bwd_weight(m, s, li, &s->ds[li]));
        HOOK(post_backward, m->part.layer_begin + li);
    }
    if (m->part.has_embed) LOOM_TRY(embed_bwd_weight(m, s));
    if (has_outer(m)) HOOK(post_backward, LOOM_UNIT_OUTER);
    return LOOM_OK;
}

loom_status loom_gpt_sum_sp_partials(loom_gpt *m, float *grads, size_t lo, size_t n) {
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *p = &m->params[i];
        if (p->offset < lo || p->offset >= lo + n) continue;
        if (p->split_rep > 1) { /* a key/value head's slice, replicated over split_rep tp ranks */
            LOOM_TRY(loom_tp_grad_replica_sum(&m->part.tp, grads + (p->offset - lo), m->rep_scratch, p->numel,
                                              p->split_rep));
            continue;
        }
        if (!p->sp_partial) continue;
        size_t count = p->numel;
        /* wpe rows past the sequence length get no gradient on any rank */
        if (strcmp(p->name, "wpe.weight") == 0) count = (size_t)m->T * m->part.cp.size * m->C;
        LOOM_TRY(loom_tp_grad_allreduce(&m->part.tp, grads + (p->offset - lo), count));
    }
    return LOOM_OK;
}

loom_status loom_gpt_finish_grads(loom_gpt *m) {
    return loom_gpt_sum_sp_partials(m, m->grad_mem, 0, m->num_params);
}
