/* gpt.c - GPT-2 forward and backward of one model part, llm.c style.
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

loom_model_part loom_model_part_whole(loom_device *dev, const loom_model_config *cfg) {
    loom_model_part p;
    memset(&p, 0, sizeof p);
    p.dev = p.tp.dev = p.cp.dev = dev;
    p.tp.size = 1;
    p.cp.size = 1;
    p.layer_begin = 0;
    p.layer_end = cfg->n_layer;
    p.has_embed = p.has_head = 1;
    return p;
}

/* ---- memory planning ---------------------------------------------------- */

/* Planning arenas count, committed ones hand out memory: the same walk does both. */
static void *take(loom_arena *a, size_t bytes) {
    if (!a->base) {
        loom_arena_reserve(a, bytes);
        return NULL;
    }
    return loom_arena_alloc(a, bytes);
}

#define F(n) ((size_t)(n) * sizeof(float))

/* sharded: a slot's own dsave under SP keeps the row-parallel output
 * gradients as this rank's (Nx,C) rows and W re-gathers them; the shared
 * scratch_ds (full backward) keeps them gathered, as W runs right after B. */
static void layout_dsave(loom_gpt *m, loom_arena *a, loom_gpt_dsave *d, int sharded) {
    const size_t N = (size_t)m->N, Nx = (size_t)m->Nx, C = (size_t)m->C, Cl = (size_t)m->C_l;
    const size_t Nr = sharded ? Nx : N;
    d->sharded = sharded;
    d->dfcp = take(a, F(Nr * C));
    d->dfch = take(a, F(N * 4 * Cl));
    d->dln2 = take(a, F(Nx * C));
    d->dproj = take(a, F(Nr * C));
    d->dqkv = take(a, F(N * 3 * Cl));
    d->dln1 = take(a, F(Nx * C));
}

/* One block's activations but its output res3. */
static void layout_block(loom_gpt *m, loom_arena *a, loom_gpt_layer_acts *x) {
    const size_t B = (size_t)m->B, T = (size_t)m->T, N = (size_t)m->N, Nx = (size_t)m->Nx;
    const size_t C = (size_t)m->C, Cl = (size_t)m->C_l, NHl = (size_t)m->NH_l;
    x->ln1 = take(a, F(Nx * C));
    x->ln1_mean = take(a, F(Nx));
    x->ln1_rstd = take(a, F(Nx));
    x->qkv = take(a, F(N * 3 * Cl));
    x->atty = take(a, F(N * Cl));
    x->lse = take(a, F(B * NHl * T));
    x->res2 = take(a, F(Nx * C));
    x->ln2 = take(a, F(Nx * C));
    x->ln2_mean = take(a, F(Nx));
    x->ln2_rstd = take(a, F(Nx));
    x->fch = take(a, F(N * 4 * Cl));
    x->fch_gelu = take(a, F(N * 4 * Cl));
}

static void layout_slot(loom_gpt *m, loom_arena *a, loom_gpt_slot *s) {
    const size_t N = (size_t)m->N, Nx = (size_t)m->Nx, C = (size_t)m->C;
    const int fwd_only = m->opts.forward_only;
    s->inputs = take(a, N * sizeof(int32_t));
    s->targets = take(a, N * sizeof(int32_t));
    s->x = take(a, F(Nx * C));
    s->dx = fwd_only ? NULL : take(a, F(Nx * C));
    for (int l = 0; l < m->L_l; l++) {
        loom_gpt_layer_acts *x = &s->acts[l];
        if (fwd_only) { /* one set, its output too: each block overwrites its input */
            *x = m->work;
            continue;
        }
        if (m->opts.recompute == LOOM_RECOMPUTE_FULL) *x = m->work; /* only the output is kept */
        else layout_block(m, a, x);
        x->res3 = take(a, F(Nx * C));
        if (s->ds) layout_dsave(m, a, &s->ds[l], m->part.tp.sp);
    }
    if (m->part.has_head && !fwd_only) {
        s->lnf = take(a, F(Nx * C));
        s->lnf_mean = take(a, F(Nx));
        s->lnf_rstd = take(a, F(Nx));
        s->logits = take(a, F(N * (size_t)m->V_l));
        s->losses = take(a, F(N));
        if (s->ds) s->dlnf = take(a, F(Nx * C));
    }
}

/* The one set of recomputed activations (see loom_gpt.work). */
static void layout_work(loom_gpt *m, loom_arena *a) {
    memset(&m->work, 0, sizeof m->work);
    if (m->opts.recompute == LOOM_RECOMPUTE_FULL || m->opts.forward_only) layout_block(m, a, &m->work);
    if (m->opts.forward_only) m->work.res3 = take(a, F((size_t)m->Nx * m->C));
}

static void layout_acts(loom_gpt *m, loom_arena *a) {
    const size_t N = (size_t)m->N, Nx = (size_t)m->Nx, C = (size_t)m->C, Cl = (size_t)m->C_l;
    layout_work(m, a);
    for (int s = 0; s < m->opts.n_slots; s++) layout_slot(m, a, &m->slots[s]);
    if (m->opts.forward_only) return; /* no backward, no head */
    m->dres = take(a, F(Nx * C));
    m->dfull = m->part.tp.sp ? take(a, F(N * C)) : NULL; /* SP's gathered rows, one at a time */
    m->d4c = take(a, F(N * 4 * Cl));
    m->datty = take(a, F(N * Cl));
    m->dlnfull = take(a, F(N * C));
    m->dlnf = take(a, F(Nx * C));
    m->xmax = take(a, F(N));
    m->xsum = take(a, F(2 * N));
    layout_dsave(m, a, &m->scratch_ds, 0);
}

static loom_status alloc_tables(loom_gpt *m) {
    int L_l = m->L_l, S = m->opts.n_slots;
    m->params = calloc((size_t)loom_gpt_max_params(&m->cfg, &m->part), sizeof *m->params);
    m->w.h = calloc((size_t)(L_l ? L_l : 1), sizeof *m->w.h);
    m->g.h = calloc((size_t)(L_l ? L_l : 1), sizeof *m->g.h);
    m->slots = calloc((size_t)S, sizeof *m->slots);
    if (!m->params || !m->w.h || !m->g.h || !m->slots)
        return loom_fail(LOOM_EOS, "out of memory creating the model");
    for (int s = 0; s < S; s++) {
        m->slots[s].acts = calloc((size_t)(L_l ? L_l : 1), sizeof *m->slots[s].acts);
        if (!m->slots[s].acts) return loom_fail(LOOM_EOS, "out of memory creating the model");
        if (m->opts.split_backward) {
            m->slots[s].ds = calloc((size_t)(L_l ? L_l : 1), sizeof *m->slots[s].ds);
            if (!m->slots[s].ds) return loom_fail(LOOM_EOS, "out of memory creating the model");
        }
    }
    return LOOM_OK;
}

static loom_status check_part(const loom_model_config *cfg, const loom_model_part *p,
                              const loom_gpt_opts *o) {
    LOOM_TRY(loom_model_config_check(cfg));
    const loom_layout_model shape = loom_model_shape(cfg);
    LOOM_TRY(loom_layout_check_tp(&shape, p->tp.size, p->tp.sp, o->T));
    if (o->B < 1 || o->T < 1)
        return loom_fail(LOOM_EUSAGE, "batch %d x sequence %d: both must be >= 1", o->B, o->T);
    if (o->forward_only && (p->tp.sp || p->cp.size > 1 || o->recompute || o->split_backward))
        return loom_fail(LOOM_EINTERNAL, "a forward-only part runs without SP, CP, recompute and a "
                                         "split backward");
    if (o->T > cfg->n_positions && !o->forward_only)
        return loom_fail(LOOM_EUSAGE, "--seq %d exceeds the model's n_positions=%d", o->T, cfg->n_positions);
    if (o->recompute < LOOM_RECOMPUTE_NONE || o->recompute > LOOM_RECOMPUTE_FULL)
        return loom_fail(LOOM_EINTERNAL, "recompute mode %d", o->recompute);
    if (p->layer_begin < 0 || p->layer_end > cfg->n_layer || p->layer_begin > p->layer_end)
        return loom_fail(LOOM_EINTERNAL, "model part: blocks [%d, %d) of %d", p->layer_begin, p->layer_end,
                         cfg->n_layer);
    return LOOM_OK;
}

loom_status loom_gpt_create(const loom_model_config *cfg, const loom_model_part *part,
                            const loom_gpt_opts *opts, loom_gpt **out) {
    *out = NULL;
    if (!part->dev || part->tp.dev != part->dev || part->cp.dev != part->dev)
        return loom_fail(LOOM_EINTERNAL, "model part: no device, or its TP / CP region on another");
    LOOM_TRY(check_part(cfg, part, opts));
    loom_gpt *m = calloc(1, sizeof *m);
    if (!m) return loom_fail(LOOM_EOS, "out of memory creating the model");
    m->cfg = *cfg;
    m->part = *part;
    m->dev = part->dev;
    m->opts = *opts;
    if (m->opts.n_slots < 1) m->opts.n_slots = 1;
    if (m->opts.forward_only) m->opts.external_grads = 1; /* no gradients */
    const int tp = part->tp.size;
    m->B = opts->B;
    m->T = opts->T;
    m->N = m->B * m->T;
    m->Nx = part->tp.sp ? m->N / tp : m->N;
    m->C = cfg->n_embd;
    m->C_l = cfg->n_embd / tp;
    m->NH_l = cfg->n_head / tp;
    m->V_l = (cfg->vocab_size + tp - 1) / tp;
    m->vocab_start = part->tp.rank * m->V_l;
    int valid = cfg->vocab_size - m->vocab_start;
    m->V_valid_l = valid < 0 ? 0 : valid > m->V_l ? m->V_l : valid;
    m->L_l = part->layer_end - part->layer_begin;
    loom_status st = alloc_tables(m);
    if (st == LOOM_OK) {
        m->num_params = loom_gpt_build_table(m);
        st = loom_moe_create(m);
    }
    if (st == LOOM_OK) {
        loom_device_arena_init(m->dev, &m->a_params, "params");
        loom_device_arena_init(m->dev, &m->a_grads, "grads");
        loom_device_arena_init(m->dev, &m->a_acts, "activations");
        if (!opts->external_params) loom_arena_reserve(&m->a_params, F(m->num_params));
        if (!m->opts.external_grads) loom_arena_reserve(&m->a_grads, F(m->num_params));
        layout_acts(m, &m->a_acts); /* plan */
        st = loom_arena_commit(&m->a_params);
    }
    if (st == LOOM_OK) st = loom_cp_alloc(&m->part.cp, m->B, m->T, m->C_l);
    if (st == LOOM_OK) st = loom_tp_reserve(&m->part.tp, (size_t)m->N * m->C); /* its largest region */
    if (st == LOOM_OK) st = loom_arena_commit(&m->a_grads);
    if (st == LOOM_OK) st = loom_arena_commit(&m->a_acts);
    if (st != LOOM_OK) {
        loom_gpt_free(m);
        return st;
    }
    if (!opts->external_params) m->param_mem = loom_arena_alloc(&m->a_params, F(m->num_params));
    if (!m->opts.external_grads) m->grad_mem = loom_arena_alloc(&m->a_grads, F(m->num_params));
    layout_acts(m, &m->a_acts); /* hand out */
    loom_gpt_bind_all(m);
    *out = m;
    return LOOM_OK;
}

void loom_gpt_free(loom_gpt *m) {
    if (!m) return;
    loom_cp_release(&m->part.cp);
    loom_arena_free(&m->a_params);
    loom_arena_free(&m->a_grads);
    loom_arena_free(&m->a_acts);
    for (int s = 0; m->slots && s < m->opts.n_slots; s++) {
        free(m->slots[s].acts);
        free(m->slots[s].ds);
    }
    free(m->slots);
    loom_moe_free(m->moe);
    free(m->params);
    free(m->w.h);
    free(m->g.h);
    free(m);
}

size_t loom_gpt_activation_bytes(const loom_gpt *m) { return m->a_acts.cap; }

void loom_gpt_zero_grad(loom_gpt *m) {
    if (m->grad_mem) loom_tensor_zero(m->dev, m->grad_mem, m->num_params); /* threaded on the CPU */
}

void loom_gpt_expect_backward(loom_gpt *m, float dloss) {
    m->expect_backward = 1;
    m->expect_dloss = dloss;
}

void loom_gpt_hold_weights(loom_gpt *m, int on) {
    /* with bf16 copies: all the part's parameters, each weight converted
     * once a step (or written by the update: loom_dp_step) instead of at
     * every use; else the tied wte, for its two uses in the head */
    if (m->param_mem && loom_gemm_keeps_bf16(m->dev)) {
        if (on) loom_gemm_keep(m->dev, m->param_mem, m->num_params);
        else loom_gemm_unkeep(m->dev, m->param_mem);
        return;
    }
    if (!m->part.has_head) return;
    if (on) loom_gemm_keep(m->dev, m->w.wte, (size_t)m->V_l * m->C);
    else loom_gemm_unkeep(m->dev, m->w.wte);
}

double loom_gpt_flops_per_token(const loom_model_config *c, int T) {
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    double matmul_params = L * 12.0 * C * C + V * C + loom_moe_active_params_delta(c);
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

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
    if (m->part.cp.size > 1)
        loom_cp_pos_fwd(&m->part.cp, s->x, m->w.wpe, sp ? m->part.tp.rank * m->Nx : 0, m->Nx, m->T, m->C);
    else loom_pos_fwd(m->dev, s->x, m->w.wpe, sp ? m->part.tp.rank * m->Nx : 0, m->Nx, m->T, m->C);
    return LOOM_OK;
}

/* Inference attention: each sequence's new keys and values (from qkv
 * (N,3C_l), rows [q | k | v]) appended to its cache of local block li, then
 * its new queries over every cached position up to their own. */
static void attention_kv(loom_gpt *m, int li, const loom_gpt_kv *kv, float *atty, const float *qkv) {
    const int Cl = m->C_l;
    for (int j = 0, r0 = 0; j < kv->n; r0 += kv->n_new[j], j++) {
        const size_t at = ((size_t)li * kv->max_seqs + (size_t)kv->seq[j]) * (size_t)kv->max_len * Cl;
        float *kc = kv->k + at, *vc = kv->v + at; /* (max_len, C_l) */
        for (int i = 0; i < kv->n_new[j]; i++) {
            const float *row = qkv + (size_t)(r0 + i) * 3 * Cl;
            loom_tensor_copy(m->dev, kc + (size_t)(kv->pos[j] + i) * Cl, row + Cl, (size_t)Cl);
            loom_tensor_copy(m->dev, vc + (size_t)(kv->pos[j] + i) * Cl, row + 2 * Cl, (size_t)Cl);
        }
        loom_attention_kv_fwd(m->dev, atty + (size_t)r0 * Cl, qkv + (size_t)r0 * 3 * Cl, 3 * Cl, kc, vc,
                              kv->pos[j], kv->n_new[j], Cl, m->NH_l, kv->scratch);
    }
}

/* atty (N,C_l) from qkv (N,3C_l): causal over the micro-batch's sequences
 * (ring or Ulysses across the CP group), or over the caches (inference). */
static loom_status attention_fwd(loom_gpt *m, int li, const rows_t *r, loom_gpt_layer_acts *a) {
    if (r->kv) attention_kv(m, li, r->kv, a->atty, a->qkv);
    else if (m->part.cp.size > 1)
        LOOM_TRY(loom_cp_attention_fwd(&m->part.cp, a->atty, a->lse, a->qkv, r->B, r->T, m->C_l, m->NH_l));
    else loom_attention_fwd(m->dev, a->atty, a->lse, a->qkv, r->B, r->T, m->C_l, m->NH_l);
    return LOOM_OK;
}

/* One block, training and inference alike (r: which rows, and how attention
 * sees them); its output in s->acts[li].res3. */
static loom_status block_fwd(loom_gpt *m, loom_gpt_slot *s, int li, const rows_t *r) {
    const loom_gpt_layer_w *w = &m->w.h[li];
    loom_gpt_layer_acts *a = &s->acts[li];
    const int N = r->N, Nx = r->Nx, C = m->C, Cl = m->C_l, sp = m->part.tp.sp;
    const float *res = block_out(s, li - 1); /* (Nx,C) */
    /* attention: res2 = res + c_proj(attn(c_attn(ln_1(res)))) */
    const float *xg; /* (N,C) the LayerNorm output's rows, gathered under SP */
    loom_layernorm_fwd(m->dev, a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1_w, w->ln1_b, Nx, C);
    LOOM_TRY(col_in_fwd(m, r, a->ln1, &xg));
    loom_matmul_fwd(m->dev, a->qkv, xg, w->qkv_w, w->qkv_b, N, C, 3 * Cl);
    LOOM_TRY(attention_fwd(m, li, r, a));
    float *y = sp ? m->dfull : a->res2;
    loom_matmul_fwd(m->dev, y, a->atty, w->proj_w, NULL, N, Cl, C);
    LOOM_TRY(row_out_fwd(m, r, y, a->res2));
    loom_tensor_add_bias_residual(m->dev, a->res2, res, w->proj_b, Nx, C);
    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); res is not read
     * again, so res3 may be res itself (a forward-only part) */
    loom_layernorm_fwd(m->dev, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b, Nx, C);
    LOOM_TRY(col_in_fwd(m, r, a->ln2, &xg));
    if (loom_moe_layer(&m->cfg, m->part.layer_begin + li)) { /* MoE MLP (moe.c) */
        y = sp ? m->dlnfull : a->res3; /* (N,C); dfull holds xg, dlnfull is free in forward */
        LOOM_TRY(loom_moe_fwd(m, s, li, N, xg, y));
        LOOM_TRY(row_out_fwd(m, r, y, a->res3)); /* experts' partial sums over tp */
        loom_residual_fwd(m->dev, a->res3, a->res3, a->res2, (size_t)Nx * C);
        return LOOM_OK;
    }
    loom_matmul_fwd(m->dev, a->fch, xg, w->fc_w, w->fc_b, N, C, 4 * Cl);
    loom_gelu_fwd(m->dev, a->fch_gelu, a->fch, (size_t)N * 4 * Cl);
    y = sp ? m->dfull : a->res3;
    loom_matmul_fwd(m->dev, y, a->fch_gelu, w->fcp_w, NULL, N, 4 * Cl, C);
    LOOM_TRY(row_out_fwd(m, r, y, a->res3));
    loom_tensor_add_bias_residual(m->dev, a->res3, a->res2, w->fcp_b, Nx, C);
    return LOOM_OK;
}

/* ln_f, the tied LM head, and the vocab-parallel cross-entropy; grad: the
 * backward was promised (loom_gpt_expect_backward, with m->expect_dloss). */
static loom_status head_fwd(loom_gpt *m, loom_gpt_slot *s, int grad, double *loss_sum) {
    const int N = m->N, Nx = m->Nx, C = m->C, Vl = m->V_l;
    const loom_tp *tp = &m->part.tp;
    const rows_t r = planned(m);
    loom_layernorm_fwd(m->dev, s->lnf, s->lnf_mean, s->lnf_rstd, block_out(s, m->L_l - 1), m->w.lnf_w,
                       m->w.lnf_b, Nx, C);
    const float *xg;
    LOOM_TRY(col_in_fwd(m, &r, s->lnf, &xg));
    loom_matmul_nt_fwd(m->dev, s->logits, xg, m->w.wte, N, C, Vl);
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
    for (int li = 0; li < m->L_l; li++) LOOM_TRY(block_fwd(m, &m->slots[0], li, &r));
    return LOOM_OK;
}

/* ---- backward, input half (B): the forward mirrored ---------------------- */

/* The head, from dlogits (in s->logits, kept for W): m->dres = d(last
 * block output); keeps d(ln_f out) in dlnf for W. */
static loom_status head_bwd_input(loom_gpt *m, loom_gpt_slot *s, float *dlnf) {
    const int N = m->N, Nx = m->Nx, C = m->C, Vl = m->V_l;
    loom_tensor_zero(m->dev, m->dlnfull, (size_t)N * C);
    loom_matmul_nt_bwd(m->dev, m->dlnfull, NULL, s->logits, NULL, m->w.wte, N, C, Vl);
    LOOM_TRY(col_in_bwd(m, m->dlnfull, dlnf));
    loom_tensor_zero(m->dev, m->dres, (size_t)Nx * C);
    loom_layernorm_bwd(m->dev, m->dres, NULL, NULL, dlnf, block_out(s, m->L_l - 1), m->w.lnf_w, s->lnf_mean,
                       s->lnf_rstd, Nx, C);
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
        loom_tensor_zero(m->dev, m->d4c, (size_t)N * 4 * Cl);
        loom_matmul_bwd(m->dev, m->d4c, NULL, NULL, dy, a->fch_gelu, w->fcp_w, N, 4 * Cl, C);
        loom_tensor_zero(m->dev, d->dfch, (size_t)N * 4 * Cl);
        loom_gelu_bwd(m->dev, d->dfch, a->fch, m->d4c, (size_t)N * 4 * Cl);
        loom_tensor_zero(m->dev, m->dlnfull, (size_t)N * C);
        loom_matmul_bwd(m->dev, m->dlnfull, NULL, NULL, d->dfch, NULL, w->fc_w, N, C, 4 * Cl);
        LOOM_TRY(col_in_bwd(m, m->dlnfull, d->dln2));
    }
    loom_layernorm_bwd(m->dev, dres, NULL, NULL, d->dln2, a->res2, w->ln2_w, a->ln2_mean, a->ln2_rstd, Nx, C);
    /* attention branch */
    dy = d->sharded ? m->dfull : d->dproj;
    if (d->sharded) loom_tensor_copy(m->dev, d->dproj, dres, (size_t)Nx * C);
    LOOM_TRY(row_out_bwd(m, dres, dy));
    loom_tensor_zero(m->dev, m->datty, (size_t)N * Cl);
    loom_matmul_bwd(m->dev, m->datty, NULL, NULL, dy, a->atty, w->proj_w, N, Cl, C);
    loom_tensor_zero(m->dev, d->dqkv, (size_t)N * 3 * Cl);
    if (m->part.cp.size > 1)
        LOOM_TRY(loom_cp_attention_bwd(&m->part.cp, d->dqkv, m->datty, a->qkv, a->atty, a->lse, m->B, m->T,
                                       Cl, m->NH_l));
    else loom_attention_bwd(m->dev, d->dqkv, m->datty, a->qkv, a->atty, a->lse, m->B, m->T, Cl, m->NH_l);
    loom_tensor_zero(m->dev, m->dlnfull, (size_t)N * C);
    loom_matmul_bwd(m->dev, m->dlnfull, NULL, NULL, d->dqkv, NULL, w->qkv_w, N, C, 3 * Cl);
    LOOM_TRY(col_in_bwd(m, m->dlnfull, d->dln1));
    loom_layernorm_bwd(m->dev, dres, NULL, NULL, d->dln1, block_out(s, li - 1), w->ln1_w, a->ln1_mean,
                       a->ln1_rstd, Nx, C);
    return LOOM_OK;
}

/* ---- backward, weight half (W) ------------------------------------------ */

/* dqkv_b (3C_l) += column sums of dqkv (N,3C_l) for the query and value parts.
 * The key bias gets exactly zero: adding b to every key adds q.b to all
 * scores of a query, which the softmax cancels, so its true gradient is 0.
 * Summing dK would give rounding noise instead, and AdamW turns noise of any
 * size into steps of up to lr - a random walk that would differ between
 * layouts. Exact zeros keep the parameter where the math says it stays. */
static void qkv_bias_grad(loom_device *dev, float *db, const float *dqkv, int N, int Cl) {
    loom_tensor_colsum_acc(dev, db, dqkv, N, 3 * Cl, Cl);                   /* query */
    loom_tensor_colsum_acc(dev, db + 2 * Cl, dqkv + 2 * Cl, N, 3 * Cl, Cl); /* value */
}

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
        loom_matmul_bwd(m->dev, NULL, g->fcp_w, g->fcp_b, full, a->fch_gelu, w->fcp_w, N, 4 * Cl, C);
        LOOM_TRY(sp_regather(m, a->ln2, 1, &full));
        loom_matmul_bwd(m->dev, NULL, g->fc_w, g->fc_b, d->dfch, full, w->fc_w, N, C, 4 * Cl);
    }
    loom_layernorm_bwd(m->dev, NULL, g->ln2_w, g->ln2_b, d->dln2, a->res2, w->ln2_w, a->ln2_mean, a->ln2_rstd,
                       Nx, C);
    LOOM_TRY(sp_regather(m, d->dproj, d->sharded, &full));
    loom_matmul_bwd(m->dev, NULL, g->proj_w, g->proj_b, full, a->atty, w->proj_w, N, Cl, C);
    LOOM_TRY(sp_regather(m, a->ln1, 1, &full));
    loom_matmul_bwd(m->dev, NULL, g->qkv_w, NULL, d->dqkv, full, w->qkv_w, N, C, 3 * Cl);
    qkv_bias_grad(m->dev, g->qkv_b, d->dqkv, N, Cl);
    loom_layernorm_bwd(m->dev, NULL, g->ln1_w, g->ln1_b, d->dln1, block_out(s, li - 1), w->ln1_w, a->ln1_mean,
                       a->ln1_rstd, Nx, C);
    return LOOM_OK;
}

/* The head's share of the tied wte gradient: dlogits^T ln_f-out. */
static loom_status head_bwd_wte(loom_gpt *m, loom_gpt_slot *s) {
    const float *lnfg; /* (N,C) */
    LOOM_TRY(sp_regather(m, s->lnf, 1, &lnfg));
    loom_matmul_nt_bwd(m->dev, NULL, m->g.wte, s->logits, lnfg, m->w.wte, m->N, m->C, m->V_l);
    return LOOM_OK;
}

static void head_bwd_lnf(loom_gpt *m, loom_gpt_slot *s, const float *dlnf) {
    loom_layernorm_bwd(m->dev, NULL, m->g.lnf_w, m->g.lnf_b, dlnf, block_out(s, m->L_l - 1), m->w.lnf_w,
                       s->lnf_mean, s->lnf_rstd, m->Nx, m->C);
}

/* From s->dx = d(embedding output). */
static loom_status embed_bwd_weight(loom_gpt *m, loom_gpt_slot *s) {
    const int sp = m->part.tp.sp;
    float *full = sp ? m->dfull : s->dx; /* (N,C) */
    LOOM_TRY(row_out_bwd(m, s->dx, full));
    int taken = 0; /* a DP engine may sum these rows over dp apart from the rest of wte */
    if (m->hooks.embed_rows) LOOM_TRY(m->hooks.embed_rows(m->hooks.ctx, m, s->inputs, full, &taken));
    if (!taken) loom_embed_bwd(m->dev, m->g.wte, full, s->inputs, m->vocab_start, m->V_l, m->N, m->C);
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
        if (!p->sp_partial || p->offset < lo || p->offset >= lo + n) continue;
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
