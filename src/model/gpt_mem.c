/* gpt_mem.c - a model part's life: what it is cut into, the memory it
 * plans and allocates up front (parameters, gradients, activations per
 * slot, backward scratch; llm.c's one allocation per lifetime class), its
 * creation and its end, and the small per-step switches around forward and
 * backward. Local; no collectives.
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
    const size_t N = (size_t)m->N, Nx = (size_t)m->Nx, C = (size_t)m->C;
    const size_t Nr = sharded ? Nx : N;
    d->sharded = sharded;
    d->dfcp = take(a, F(Nr * C));
    d->dfch = take(a, F(N * (size_t)m->FC_l));
    d->dln2 = take(a, F(Nx * C));
    d->dproj = take(a, F(Nr * C));
    d->dqkv = take(a, F(N * (size_t)m->QKV_l));
    d->dln1 = take(a, F(Nx * C));
}

/* One block's activations but its output res3. */
static void layout_block(loom_gpt *m, loom_arena *a, loom_gpt_layer_acts *x) {
    const size_t B = (size_t)m->B, T = (size_t)m->T, N = (size_t)m->N, Nx = (size_t)m->Nx;
    const size_t C = (size_t)m->C, Cl = (size_t)m->C_l, NHl = (size_t)m->NH_l;
    x->ln1 = take(a, F(Nx * C));
    x->ln1_mean = take(a, F(Nx));
    x->ln1_rstd = take(a, F(Nx));
    x->qkv = take(a, F(N * (size_t)m->QKV_l));
    x->atty = take(a, F(N * Cl));
    x->lse = take(a, F(B * NHl * T));
    x->res2 = take(a, F(Nx * C));
    x->ln2 = take(a, F(Nx * C));
    x->ln2_mean = take(a, F(Nx));
    x->ln2_rstd = take(a, F(Nx));
    x->fch = take(a, F(N * (size_t)m->FC_l));
    x->fch_gelu = take(a, F(N * (size_t)m->H_l));
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

/* Floats loom_tp_grad_replica_sum gathers into: tp copies of the largest
 * replicated slice (key/value heads when tp exceeds them), else 0. */
static size_t rep_scratch_floats(const loom_gpt *m) {
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].split_rep > 1 && m->params[i].numel > most) most = m->params[i].numel;
    return most * (size_t)m->part.tp.size;
}

static void layout_acts(loom_gpt *m, loom_arena *a) {
    const size_t N = (size_t)m->N, Nx = (size_t)m->Nx, C = (size_t)m->C, Cl = (size_t)m->C_l;
    if (m->cfg.rope) { /* the rows' rotary positions and the frequencies */
        m->pos = take(a, N * sizeof(int32_t));
        m->inv_freq = take(a, F(m->HS / 2));
    }
    layout_work(m, a);
    for (int s = 0; s < m->opts.n_slots; s++) layout_slot(m, a, &m->slots[s]);
    if (m->opts.forward_only) return; /* no backward, no head */
    m->dres = take(a, F(Nx * C));
    m->dfull = m->part.tp.sp ? take(a, F(N * C)) : NULL; /* SP's gathered rows, one at a time */
    m->d4c = take(a, F(N * (size_t)m->H_l));
    m->datty = take(a, F(N * Cl));
    m->dlnfull = take(a, F(N * C));
    m->dlnf = take(a, F(Nx * C));
    m->xmax = take(a, F(N));
    m->xsum = take(a, F(2 * N));
    const size_t rep = rep_scratch_floats(m);
    m->rep_scratch = rep ? take(a, F(rep)) : NULL; /* NULL: no replicated slices */
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

/* The local sizes of the part's blocks (model.h's loom_gpt). */
static void set_sizes(loom_gpt *m) {
    const loom_model_config *c = &m->cfg;
    const int tp = m->part.tp.size, kv = loom_model_kv_heads(c);
    m->C = c->n_embd;
    m->C_l = c->n_embd / tp;
    m->NH_l = c->n_head / tp;
    m->HS = loom_model_head_size(c);
    m->NKV_l = kv >= tp ? kv / tp : 1; /* more ranks than key/value heads: one, replicated */
    m->KV_l = m->NKV_l * m->HS;
    m->QKV_l = m->C_l + 2 * m->KV_l;
    m->H_l = loom_model_ffn(c) / tp;
    m->FC_l = c->mlp == LOOM_MLP_SWIGLU ? 2 * m->H_l : m->H_l;
    m->heads = (loom_att_heads){m->NH_l, m->NKV_l, m->HS, c->window};
}

/* The rotary frequencies, and each training row's position: row i of a
 * micro-batch is token i % T of its sequence, at its global position under
 * CP (the 2 cp balanced chunks). An inference forward writes its own. */
static loom_status rope_tables(loom_gpt *m) {
    float *f = malloc((size_t)(m->HS / 2) * sizeof *f);
    int32_t *pos = malloc((size_t)m->N * sizeof *pos);
    if (!f || !pos) {
        free(f);
        free(pos);
        return loom_fail(LOOM_EOS, "out of memory for the rotary tables");
    }
    loom_model_rope_freqs(&m->cfg, f);
    for (int i = 0; i < m->N; i++) pos[i] = loom_cp_position(&m->part.cp, i % m->T, m->T);
    loom_tensor_upload(m->dev, m->inv_freq, f, (size_t)(m->HS / 2));
    loom_tensor_upload_i32(m->dev, m->pos, pos, (size_t)m->N);
    free(f);
    m->pos_host = pos; /* kept: an inference forward writes its rows' positions here */
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
    set_sizes(m);
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
    if (st == LOOM_OK) st = loom_cp_alloc(&m->part.cp, m->B, m->T, &m->heads);
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
    if (m->pos && (st = rope_tables(m)) != LOOM_OK) {
        loom_gpt_free(m);
        return st;
    }
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
    free(m->pos_host);
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
    if (on) loom_gemm_keep(m->dev, m->w.lm_head, (size_t)m->V_l * m->C);
    else loom_gemm_unkeep(m->dev, m->w.lm_head);
}

double loom_gpt_flops_per_token(const loom_model_config *c, int T) {
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    if (c->family == LOOM_FAMILY_LLAMA) { /* q, o; k, v of the kv heads; gate, up, down */
        double kvw = (double)loom_model_kv_heads(c) * loom_model_head_size(c), H = loom_model_ffn(c);
        double block = 2.0 * C * C + 2.0 * C * kvw + 3.0 * C * H;
        return 6.0 * (L * block + V * C + loom_moe_active_params_delta(c)) + 12.0 * L * C * (double)T;
    }
    double matmul_params = L * 12.0 * C * C + V * C + loom_moe_active_params_delta(c);
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}
