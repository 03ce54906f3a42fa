/* moe.c - Mixture-of-Experts blocks (include/loom/moe.h): config keys and
 * built-ins (moe_config.c), the parameter rows, and route -> dispatch -> experts -> combine
 * with its mirror backward. Collective over the part's EP group (the
 * alltoall(v) of dispatch and combine), local without one, and over the TP
 * group: experts are cut as Megatron's MLP (c_fc by columns, c_proj by rows,
 * its bias added on tp rank 0), so the block's output is summed over tp
 * (gpt.c's row_out_fwd: all-reduce, or reduce-scatter under SP) and so is
 * its input gradient (col_in_bwd); the gates' gradients (N x k) are summed
 * here; the router is replicated. Under SP, gpt.c gathers the input rows
 * (N,C) for forward and again for the router's weight gradient.
 *
 * Dispatch packs the kept assignments expert by expert, tokens in order
 * within an expert, into (A,C) rows, A <= N top_k: destination-major, so
 * the EP region (ep.h: loom_ep_counts, loom_ep_dispatch) sends each owner
 * its experts' rows and hands them over expert-major, so each local expert
 * is two plain matmuls over contiguous rows; loom_ep_combine brings the
 * outputs back and this file scatters them weighted by the gates. The
 * backward calls the pair again, swapped.
 *
 * Tensors (activations, scratch, the selection bias, the expert storage)
 * are the part's device memory and are touched only through its kernels
 * (kernels.h, device.h). The routing bookkeeping - the chosen experts, each
 * row's token, the counts per expert that go to MPI as counts, the
 * capacity decisions - is host memory: sel comes down with memcpy_d2h after
 * topk_gate, and row, tok, routed and the token groups go up with
 * memcpy_h2d into device copies for the kernels that read them.
 */
#include "loom/moe.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/cp.h"
#include "loom/ep.h"
#include "loom/kernels.h"
#include "model/internal.h"

/* The experts' hidden units on this TP rank (c_fc by columns, c_proj by rows). */
static int hidden_l(const loom_gpt *m) { return loom_moe_hidden(&m->cfg) / m->part.tp.size; }
/* The width of an expert's first product: [gate | up] with SwiGLU (Mixtral's w1 | w3), else H_l. */
static int first_l(const loom_gpt *m) { return (m->cfg.mlp == LOOM_MLP_SWIGLU ? 2 : 1) * hidden_l(m); }
/* Qwen2-MoE's shared expert's hidden units on this TP rank (0: none). */
static int shared_l(const loom_gpt *m) { return m->cfg.shared_hidden / m->part.tp.size; }

/* ---- parameters ------------------------------------------------------------ */

int loom_moe_extra_params(const loom_model_config *c, const loom_model_part *part) {
    int n = 0;
    for (int l = part->layer_begin; l < part->layer_end; l++)
        if (loom_moe_layer(c, l)) n += 1 + 4 * c->n_expert;
    return n;
}

static int ep_size(const loom_gpt *m) { return m->part.ep ? loom_comm_size(m->part.ep) : 1; }
static int ep_rank(const loom_gpt *m) { return m->part.ep ? loom_comm_rank(m->part.ep) : 0; }

/* The router of block l; with expert parallelism its experts wait for
 * loom_moe_add_experts (they go after every block), else they follow. */
void loom_moe_add_params(loom_gpt *m, size_t *off, int l, float std, float res_std) {
    char name[LOOM_PARAM_NAME_MAX];
    snprintf(name, sizeof name, "h.%d.mlp.router.weight", l);
    const int64_t C = m->cfg.n_embd; /* m->C is not set for loom_param_table_whole */
    loom_gpt_add_param(m, off, name, C, m->cfg.n_expert, -1, 1, C, LOOM_INIT_NORMAL, std, 0, l);
    if (ep_size(m) == 1) loom_moe_add_experts(m, off, l, std, res_std);
}

void loom_moe_add_experts(loom_gpt *m, size_t *off, int l, float std, float res_std) {
    const int64_t C = m->cfg.n_embd, H = loom_moe_hidden(&m->cfg);
    const int El = m->cfg.n_expert / ep_size(m), e0 = ep_rank(m) * El;
    const int unit = ep_size(m) > 1 ? LOOM_UNIT_EXPERTS : l;
    char name[LOOM_PARAM_NAME_MAX];
    for (int e = e0; e < e0 + El; e++) { /* Megatron's MLP cut: c_fc by columns, c_proj by rows */
        snprintf(name, sizeof name, "h.%d.mlp.experts.%d.c_fc.weight", l, e);
        loom_gpt_add_param(m, off, name, C, H, 1, 1, H, LOOM_INIT_NORMAL, std, 0, unit);
        snprintf(name, sizeof name, "h.%d.mlp.experts.%d.c_fc.bias", l, e);
        loom_gpt_add_param(m, off, name, H, 0, 0, 1, H, LOOM_INIT_ZEROS, 0, 0, unit);
        snprintf(name, sizeof name, "h.%d.mlp.experts.%d.c_proj.weight", l, e);
        loom_gpt_add_param(m, off, name, H, C, 0, 1, H, LOOM_INIT_NORMAL, res_std, 0, unit);
        snprintf(name, sizeof name, "h.%d.mlp.experts.%d.c_proj.bias", l, e);
        loom_gpt_add_param(m, off, name, C, 0, -1, 1, C, LOOM_INIT_ZEROS, 0, 0, unit);
    }
}

/* ---- state ----------------------------------------------------------------- */

/* What one MoE block keeps from forward for backward, per slot. A <= N k
 * rows this rank dispatches (its tokens' kept choices, expert-major); R
 * rows this rank's El = E/P experts receive from the P ranks of the EP
 * group, kept expert-major (local expert, then source rank, then token). */
typedef struct {
    float *probs; /* (N,E) router softmax */
    /* device copies of host index tables, for the kernels */
    int32_t *sel_d, *row_d, *tok_d, *routed_d;
    float *lse;          /* (N) logsumexp of the router logits */
    int32_t *sel;        /* (N,k) chosen experts */
    float *gate;         /* (N,k) combine weights */
    int32_t *row;        /* (N,k) dispatched row of each choice, -1 if dropped */
    int32_t *tok;        /* (A) token of each dispatched row */
    int32_t *start;      /* (E+1) first dispatched row of each expert */
    int32_t *routed;     /* (G,E) choices per routing group and expert before capacity */
    loom_ep_routes rt;   /* what the local experts receive from each source, and where (ep.h) */
    float *ye;           /* (A,C) expert outputs of the dispatched rows */
    float *xp, *hp, *gp; /* (R,C) (R,FH) (R,H) received inputs, c_fc out, its activation */
    float *dyp, *dhp;    /* (R,C) (R,FH) output gradients kept for W */
    float *dlogit;       /* (N,E) kept for W */
    /* Qwen2-MoE's shared expert (Hs = its hidden units on this TP rank) */
    float *hs, *as, *ys; /* (N,2Hs) [gate | up] (N,Hs) SwiGLU (N,C) its output, partial over tp */
    float *sg, *dls;     /* (N) sigmoid gate, d(its logit) kept for W */
    float *dys, *dhs;    /* (N,C) (N,2Hs) gradients kept for W */
    const float *x;      /* (N,C) the block's input rows (ln_2 output), valid in forward */
    double aux, z;       /* this group's losses */
    int counted;         /* full recompute: its routing is in the stats already,
                               so the forward rerun in backward adds it once only */
} moe_acts;

typedef struct {
    float *router;                        /* (C,E), or (E,C) as nn.Linear */
    float **fc_w, **fc_b, **cp_w, **cp_b; /* El each: (C,H) (H) (H,C) (C) */
    float *sgu, *sdown, *sgate;           /* Qwen2-MoE's shared expert: (2Hs,C) (C,Hs), its gate (1,C) */
} moe_w;

typedef struct {
    int l;       /* global block */
    float *bias; /* (E) aux-loss-free selection bias */
    moe_w w, g;
    moe_acts *acts; /* per slot */
} moe_block;

struct loom_moe {
    loom_device *dev;        /* the part's */
    int n_blocks, P, El, e0; /* EP group size, local experts, first local expert */
    int G;                   /* routing groups per micro-batch (opts.moe_route_cp, >= 1) */
    int32_t *order;          /* (N) tokens group by group, each group in its CP rank's order */
    int32_t *gid_d;          /* (N) device: the routing group of each token */
    float *hprobs;           /* (N,E) host scratch: probabilities for the aux loss, bias steps */
    int32_t *cnt_g;          /* (G,E) scratch: kept per group and expert */
    double *P_g;             /* (G,E) scratch: router probabilities summed per group */
    size_t Rmax;             /* rows the local experts can receive */
    loom_ep ep;              /* the dispatch / combine region over the part's EP group (ep.h) */
    moe_block *blocks;
    int *of_local; /* local block -> index in blocks, -1 if dense */
    float dloss;
    float *dgate;   /* (N,k) scratch */
    float *dp;      /* (N,E) scratch */
    float *sendA;   /* (A,C) scratch: rows to dispatch, then their gradients */
    float *t1, *t2; /* (R,C) scratch */
    float *tH;      /* (R,H) scratch */
    int32_t *idrow; /* (N) device: 0 .. N-1, the shared expert's rows for combine_rows */
    float *sdact;   /* (N,Hs) scratch: d(shared SwiGLU out) */
    float *sdg;     /* (N) scratch: d(shared gate) */
    loom_moe_stats *stats;
    int64_t *stat_mem;
    void *mem;                    /* one device allocation for every tensor above */
    void *hmem;                   /* one host allocation for the bookkeeping */
    size_t mem_bytes, dmem_bytes; /* both allocations, the device one */
    size_t ex_lo, ex_n;           /* the expert unit's flat range (expert parallelism) */
    float *ex_params, *ex_grads;  /* its own storage when the part has no flat buffer */
};

static moe_block *block_of(const loom_gpt *m, int li) {
    int b = m->moe ? m->moe->of_local[li] : -1;
    return b >= 0 ? &m->moe->blocks[b] : NULL;
}

/* Carve n bytes (64-aligned) from base, or only count them when base is NULL. */
static void *carve(char *base, size_t *used, size_t n) {
    void *r = base ? base + *used : NULL;
    *used += (n + 63) & ~(size_t)63;
    return r;
}

/* Carves device memory from p and host memory from h (either NULL: only
 * counted); returns the device bytes, the host bytes in *hbytes. */
static size_t layout(loom_gpt *m, struct loom_moe *moe, char *p, char *h, size_t *hbytes) {
    const size_t N = (size_t)m->N, C = (size_t)m->C, E = (size_t)m->cfg.n_expert, k = (size_t)m->cfg.top_k,
                 H = (size_t)hidden_l(m), A = N * k, P = (size_t)moe->P, El = (size_t)moe->El, R = moe->Rmax,
                 FH = (size_t)first_l(m);
    size_t used = 0, hu = 0, a2a_bytes, sent_bytes;
    loom_ep_scratch_bytes(moe->P, moe->El, &a2a_bytes, &sent_bytes);
    moe->dgate = carve(p, &used, N * k * 4);
    moe->dp = carve(p, &used, N * E * 4);
    moe->sendA = carve(p, &used, A * C * 4);
    moe->t1 = carve(p, &used, R * C * 4);
    moe->t2 = carve(p, &used, R * C * 4);
    moe->tH = carve(p, &used, R * H * 4);
    moe->gid_d = carve(p, &used, N * 4);
    const size_t Hs = (size_t)shared_l(m);
    if (Hs) {
        moe->idrow = carve(p, &used, N * 4);
        moe->sdact = carve(p, &used, N * Hs * 4);
        moe->sdg = carve(p, &used, N * 4);
    }
    moe->ep.a2a = carve(h, &hu, a2a_bytes);
    moe->order = carve(h, &hu, N * 4);
    moe->cnt_g = carve(h, &hu, (size_t)moe->G * E * 4);
    moe->P_g = carve(h, &hu, (size_t)moe->G * E * 8);
    moe->stat_mem = carve(h, &hu, (size_t)moe->n_blocks * 2 * E * 8);
    moe->hprobs = carve(h, &hu, N * E * 4);
    moe->ep.sent = carve(h, &hu, sent_bytes);
    for (int b = 0; b < moe->n_blocks; b++) {
        moe_block *bl = &moe->blocks[b];
        float ***views[8] = {&bl->w.fc_w, &bl->w.fc_b, &bl->w.cp_w, &bl->w.cp_b,
                             &bl->g.fc_w, &bl->g.fc_b, &bl->g.cp_w, &bl->g.cp_b};
        for (int v = 0; v < 8; v++) *views[v] = carve(h, &hu, El * sizeof(float *));
        bl->bias = carve(p, &used, E * 4);
        for (int s = 0; s < m->opts.n_slots; s++) {
            moe_acts *a = &bl->acts[s];
            a->probs = carve(p, &used, N * E * 4);
            a->lse = carve(p, &used, N * 4);
            a->gate = carve(p, &used, N * k * 4);
            a->sel_d = carve(p, &used, N * k * 4);
            a->row_d = carve(p, &used, N * k * 4);
            a->tok_d = carve(p, &used, A * 4);
            a->routed_d = carve(p, &used, (size_t)moe->G * E * 4);
            a->sel = carve(h, &hu, N * k * 4);
            a->row = carve(h, &hu, N * k * 4);
            a->tok = carve(h, &hu, A * 4);
            a->start = carve(h, &hu, (E + 1) * 4);
            a->routed = carve(h, &hu, (size_t)moe->G * E * 4);
            a->rt.rc = carve(h, &hu, P * El * 4);
            a->rt.soff = carve(h, &hu, P * El * 4);
            a->rt.eoff = carve(h, &hu, P * El * 4);
            a->rt.estart = carve(h, &hu, (El + 1) * 4);
            a->ye = carve(p, &used, A * C * 4);
            a->xp = carve(p, &used, R * C * 4);
            a->hp = carve(p, &used, R * FH * 4);
            a->gp = carve(p, &used, R * H * 4);
            a->dyp = carve(p, &used, R * C * 4);
            a->dhp = carve(p, &used, R * FH * 4);
            a->dlogit = carve(p, &used, N * E * 4);
            if (!Hs) continue;
            a->hs = carve(p, &used, N * 2 * Hs * 4);
            a->as = carve(p, &used, N * Hs * 4);
            a->ys = carve(p, &used, N * C * 4);
            a->sg = carve(p, &used, N * 4);
            a->dls = carve(p, &used, N * 4);
            a->dys = carve(p, &used, N * C * 4);
            a->dhs = carve(p, &used, N * 2 * Hs * 4);
        }
    }
    *hbytes = hu;
    return used;
}

loom_status loom_moe_create(loom_gpt *m) {
    int n = 0;
    for (int l = m->part.layer_begin; l < m->part.layer_end; l++) n += loom_moe_layer(&m->cfg, l);
    if (n == 0) return LOOM_OK;
    LOOM_TRY(loom_moe_config_check(&m->cfg)); /* tp divides the experts' hidden size: gpt.c check_part */
    const int P = ep_size(m), E = m->cfg.n_expert, k = m->cfg.top_k;
    if (m->cfg.shared_hidden % m->part.tp.size)
        return loom_fail(LOOM_EUSAGE, "tp=%d does not divide shared_expert_intermediate_size=%d of model %s",
                         m->part.tp.size, m->cfg.shared_hidden, m->cfg.name);
    if (E % P)
        return loom_fail(LOOM_EUSAGE, "ep=%d does not divide num_local_experts=%d of model %s", P, E,
                         m->cfg.name);
    const int G = m->opts.moe_route_cp > 1 ? m->opts.moe_route_cp : 1;
    if (G > 1 && m->T % (2 * G))
        return loom_fail(LOOM_EUSAGE,
                         "MoE routing groups of %d CP ranks: 2*%d = %d does not divide "
                         "the sequence length %d",
                         G, G, 2 * G, m->T);
    struct loom_moe *moe = calloc(1, sizeof *moe);
    if (!moe) return loom_fail(LOOM_EOS, "out of memory creating the MoE blocks");
    m->moe = moe;
    moe->dev = m->dev;
    moe->G = G;
    moe->n_blocks = n;
    moe->P = P;
    moe->El = E / P;
    moe->e0 = ep_rank(m) * moe->El;
    const char *ov = getenv("LOOM_EP_OVERLAP");
    moe->ep = (loom_ep){.dev = m->dev,
                        .comm = m->part.ep,
                        .size = P,
                        .rank = ep_rank(m),
                        .n_local = moe->El,
                        .overlap = !(ov && strcmp(ov, "0") == 0)};
    /* each of the P sources sends each local expert at most N rows, and at
     * most N k rows in all */
    moe->Rmax = (size_t)P * m->N * (size_t)(k < moe->El ? k : moe->El);
    moe->blocks = calloc((size_t)n, sizeof *moe->blocks);
    moe->of_local = calloc((size_t)(m->L_l ? m->L_l : 1), sizeof *moe->of_local);
    moe->stats = calloc((size_t)n, sizeof *moe->stats);
    if (!moe->blocks || !moe->of_local || !moe->stats)
        return loom_fail(LOOM_EOS, "out of memory creating the MoE blocks");
    for (int li = 0, b = 0; li < m->L_l; li++) {
        moe->of_local[li] = -1;
        if (!loom_moe_layer(&m->cfg, m->part.layer_begin + li)) continue;
        moe->of_local[li] = b;
        moe->blocks[b].l = m->part.layer_begin + li;
        moe->blocks[b].acts = calloc((size_t)m->opts.n_slots, sizeof(moe_acts));
        if (!moe->blocks[b].acts) return loom_fail(LOOM_EOS, "out of memory creating the MoE blocks");
        b++;
    }
    size_t hbytes = 0, bytes = layout(m, moe, NULL, NULL, &hbytes);
    moe->mem = loom_device_alloc(m->dev, bytes ? bytes : 64); /* zeroed, 64-aligned */
    moe->hmem = calloc(1, hbytes + 64);
    if (!moe->mem || !moe->hmem)
        return loom_fail(LOOM_EOS, "out of memory for the MoE activations (%zu bytes)", bytes + hbytes);
    moe->dmem_bytes = bytes ? bytes : 64;
    layout(m, moe, moe->mem, (char *)(((uintptr_t)moe->hmem + 63) & ~(uintptr_t)63), &hbytes);
    moe->mem_bytes = moe->dmem_bytes + hbytes + 64;
    for (int g = 0, i = 0; g < G; g++) { /* cp.h's split: group g = CP rank g's rows, b-major */
        const loom_cp part = {.size = G, .rank = g};
        for (int b = 0; b < m->B; b++)
            for (int t = 0; t < m->T / G; t++)
                moe->order[i++] = b * m->T + loom_cp_position(&part, t, m->T / G);
    }
    { /* each token's routing group, to the device once (hprobs as host scratch) */
        int32_t *gid = (int32_t *)moe->hprobs;
        for (int q = 0; q < m->N; q++) gid[G > 1 ? moe->order[q] : q] = q / (m->N / G);
        loom_tensor_upload_i32(m->dev, moe->gid_d, gid, (size_t)m->N);
        if (moe->idrow) { /* the shared expert's rows: identity */
            for (int q = 0; q < m->N; q++) gid[q] = q;
            loom_tensor_upload_i32(m->dev, moe->idrow, gid, (size_t)m->N);
        }
    }
    loom_gpt_unit_range(m, LOOM_UNIT_EXPERTS, &moe->ex_lo, &moe->ex_n);
    if (moe->ex_n && m->opts.external_params)
        moe->ex_params = loom_device_alloc(m->dev, moe->ex_n * sizeof(float));
    if (moe->ex_n && m->opts.external_grads)
        moe->ex_grads = loom_device_alloc(m->dev, moe->ex_n * sizeof(float));
    if ((m->opts.external_params && moe->ex_n && !moe->ex_params) ||
        (m->opts.external_grads && moe->ex_n && !moe->ex_grads))
        return loom_fail(LOOM_EOS, "out of memory for the expert tensors (%zu floats)", moe->ex_n);
    for (int b = 0; b < n; b++) {
        moe->stats[b].layer = moe->blocks[b].l;
        moe->stats[b].n_expert = E;
        moe->stats[b].routed = moe->stat_mem + (size_t)b * 2 * E;
        moe->stats[b].kept = moe->stat_mem + (size_t)b * 2 * E + E;
    }
    return LOOM_OK;
}

void loom_moe_free(struct loom_moe *moe) {
    if (!moe) return;
    for (int b = 0; moe->blocks && b < moe->n_blocks; b++) free(moe->blocks[b].acts);
    free(moe->blocks);
    free(moe->of_local);
    free(moe->stats);
    loom_device_release(moe->dev, moe->mem, moe->dmem_bytes);
    free(moe->hmem);
    if (moe->ex_params) loom_device_release(moe->dev, moe->ex_params, moe->ex_n * sizeof(float));
    if (moe->ex_grads) loom_device_release(moe->dev, moe->ex_grads, moe->ex_n * sizeof(float));
    free(moe);
}

void loom_moe_bind_storage(loom_gpt *m) {
    if (m->moe && (m->moe->ex_params || m->moe->ex_grads))
        loom_gpt_bind_unit(m, LOOM_UNIT_EXPERTS, m->moe->ex_params, m->moe->ex_grads);
}

void loom_moe_expert_storage(const loom_gpt *m, float **params, float **grads, size_t *lo, size_t *n) {
    const struct loom_moe *moe = m->moe;
    *lo = moe ? moe->ex_lo : 0;
    *n = moe ? moe->ex_n : 0;
    *params = moe && moe->ex_params ? moe->ex_params : m->param_mem ? m->param_mem + *lo : NULL;
    *grads = moe && moe->ex_grads ? moe->ex_grads : m->grad_mem ? m->grad_mem + *lo : NULL;
}

void loom_moe_memory_bytes(const loom_gpt *m, size_t *params, size_t *grads, size_t *buffers) {
    const struct loom_moe *moe = m->moe;
    *params = moe && moe->ex_params ? moe->ex_n * sizeof(float) : 0;
    *grads = moe && moe->ex_grads ? moe->ex_n * sizeof(float) : 0;
    *buffers = moe ? moe->mem_bytes : 0;
}

int loom_moe_bind(loom_gpt *m, int l, const char *suffix, float *v, int grads) {
    moe_block *bl = block_of(m, l - m->part.layer_begin);
    if (!bl) return 0;
    moe_w *w = grads ? &bl->g : &bl->w;
    if (!strcmp(suffix, "mlp.router.weight") || !strcmp(suffix, "block_sparse_moe.gate.weight") ||
        !strcmp(suffix, "mlp.gate.weight")) {
        w->router = v;
        return 1;
    }
    if (!strncmp(suffix, "mlp.shared_expert", 17)) { /* Qwen2-MoE: gate_proj | up_proj packed */
        const char *what = suffix + 17;
        if (!strcmp(what, ".gate_proj.weight")) w->sgu = v;
        else if (!strcmp(what, ".down_proj.weight")) w->sdown = v;
        else if (!strcmp(what, "_gate.weight")) w->sgate = v;
        else if (strcmp(what, ".up_proj.weight")) return 0; /* read through gate_proj's view */
        return 1;
    }
    int e;
    char what[32];
    if (sscanf(suffix, "mlp.experts.%d.%31s", &e, what) != 2 &&
        sscanf(suffix, "block_sparse_moe.experts.%d.%31s", &e, what) != 2)
        return 0;
    e -= m->moe->e0;
    if (e < 0 || e >= m->moe->El) return 0;
    if (!strcmp(what, "w1.weight") || !strcmp(what, "gate_proj.weight")) w->fc_w[e] = v; /* [gate | up] */
    else if (!strcmp(what, "w3.weight") || !strcmp(what, "up_proj.weight")) return 1;    /* through gate's */
    else if (!strcmp(what, "w2.weight") || !strcmp(what, "down_proj.weight")) w->cp_w[e] = v; /* down */
    else if (!strcmp(what, "c_fc.weight")) w->fc_w[e] = v;
    else if (!strcmp(what, "c_fc.bias")) w->fc_b[e] = v;
    else if (!strcmp(what, "c_proj.weight")) w->cp_w[e] = v;
    else if (!strcmp(what, "c_proj.bias")) w->cp_b[e] = v;
    else return 0;
    return 1;
}

/* ---- routing ------------------------------------------------------------------ */

/* probs (N,E) = softmax(x @ router) (the router (C,E), or (E,C) as
 * nn.Linear in the Llama family); lse (N); returns the z-loss sum of lse^2. */
static double route_probs(const loom_gpt *m, moe_acts *a, const float *router, int N, int C, int E) {
    loom_part_linear_fwd(m, a->probs, a->x, router, NULL, N, C, E);
    return loom_tensor_softmax_lse(m->dev, a->probs, a->lse, N, E);
}

/* h (n,H) = the activation of the first product fc (n,FH); dfc (n,FH) WRITES its gradient from dh. */
static void expert_act_fwd(const loom_gpt *m, float *h, const float *fc, int n, int H) {
    if (m->cfg.mlp == LOOM_MLP_SWIGLU) loom_swiglu_fwd(m->dev, h, fc, n, H);
    else loom_gelu_fwd(m->dev, h, fc, (size_t)n * H);
}
static void expert_act_bwd(const loom_gpt *m, float *dfc, const float *fc, const float *dh, int n, int H) {
    if (m->cfg.mlp == LOOM_MLP_SWIGLU) loom_swiglu_bwd(m->dev, dfc, fc, dh, n, H);
    else loom_gelu_bwd(m->dev, dfc, fc, dh, (size_t)n * H); /* dfc was zeroed */
}

/* sel (N,k): each token's top_k experts by probability + bias, ties to the
 * lower index; gate (N,k) their probabilities, renormalised if asked. */
static void route_topk(loom_device *dev, moe_acts *a, const float *bias, int N, int E, int k, int norm) {
    loom_tensor_topk_gate(dev, a->sel_d, a->gate, a->probs, bias, N, E, k, norm);
    /* the choices to the host: route_dispatch's capacity and layout are host bookkeeping */
    loom_tensor_download_i32(dev, a->sel, a->sel_d, (size_t)N * k);
}

/* Capacity per routing group (group by group; in each, choice-major, then
 * the group's token order) and the dispatch layout: row (N,k), start (E+1),
 * tok (A); routed (G,E). Returns the number of dropped choices. */
static int64_t route_dispatch(struct loom_moe *moe, moe_acts *a, int N, int E, int k, int cap) {
    const int G = moe->G, Ng = N / G;
    int32_t *cnt = a->start + 1; /* kept per expert, then turned into offsets */
    memset(a->start, 0, (size_t)(E + 1) * sizeof *a->start);
    memset(a->routed, 0, (size_t)G * E * sizeof *a->routed);
    memset(moe->cnt_g, 0, (size_t)G * E * sizeof *moe->cnt_g);
    int64_t dropped = 0;
    for (int g = 0; g < G; g++)
        for (int j = 0; j < k; j++)
            for (int q = 0; q < Ng; q++) {
                const int i = G > 1 ? moe->order[g * Ng + q] : q, e = a->sel[(size_t)i * k + j];
                a->routed[g * E + e]++;
                if (moe->cnt_g[g * E + e] < cap) {
                    moe->cnt_g[g * E + e]++;
                    cnt[e]++;
                    a->row[(size_t)i * k + j] = 0; /* kept; its row is set below */
                } else {
                    a->row[(size_t)i * k + j] = -1;
                    dropped++;
                }
            }
    for (int e = 0; e < E; e++) a->start[e + 1] += a->start[e];
    int32_t fill[1024];
    for (int e = 0; e < E; e++) fill[e] = a->start[e];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < k; j++) {
            int32_t *r = &a->row[(size_t)i * k + j];
            if (*r < 0) continue;
            *r = fill[a->sel[(size_t)i * k + j]]++;
            a->tok[*r] = i;
        }
    /* the layout to the device, for gather, combine and their backward */
    loom_tensor_upload_i32(moe->dev, a->row_d, a->row, (size_t)N * k);
    loom_tensor_upload_i32(moe->dev, a->tok_d, a->tok, (size_t)a->start[E]);
    loom_tensor_upload_i32(moe->dev, a->routed_d, a->routed, (size_t)G * E);
    return dropped;
}

/* ---- Qwen2-MoE's shared expert -------------------------------------------------- */

/* v (n floats) = sigmoid(v), or with g, v * g (1 - g) (the sigmoid's
 * backward); on the host, through the (N,E) host scratch (E >= 2 with g). */
static void sigmoid_host(const loom_gpt *m, float *v, const float *g, int n) {
    float *h = m->moe->hprobs, *hg = h + n;
    loom_tensor_download(m->dev, h, v, (size_t)n);
    if (g) loom_tensor_download(m->dev, hg, g, (size_t)n);
    for (int i = 0; i < n; i++) h[i] = g ? h[i] * hg[i] * (1.0f - hg[i]) : 1.0f / (1.0f + expf(-h[i]));
    loom_tensor_upload(m->dev, v, h, (size_t)n);
}

/* out (N,C) += sigmoid(x w_gate) * down(SwiGLU([gate | up](x))); the
 * shared expert's output is partial over tp like the experts' (its down by
 * columns), the gate replicated. */
static void shared_fwd(const loom_gpt *m, moe_block *bl, moe_acts *a, int N, const float *x, float *out) {
    const int C = m->C, Hs = shared_l(m);
    loom_part_linear_fwd(m, a->hs, x, bl->w.sgu, NULL, N, C, 2 * Hs);
    loom_swiglu_fwd(m->dev, a->as, a->hs, N, Hs);
    loom_part_linear_fwd(m, a->ys, a->as, bl->w.sdown, NULL, N, Hs, C);
    loom_part_linear_fwd(m, a->sg, x, bl->w.sgate, NULL, N, C, 1);
    sigmoid_host(m, a->sg, NULL, N);
    loom_tensor_combine_rows(m->dev, m->moe->sendA, a->ys, m->moe->idrow, a->sg, N, 1, C); /* sendA: free */
    loom_tensor_add(m->dev, out, m->moe->sendA, (size_t)N * C);
}

/* dx (N,C) += the shared expert's input gradient from dout (N,C): its MLP's
 * partial over tp (the caller sums dx), the gate's on tp rank 0 only. */
static loom_status shared_bwd_input(const loom_gpt *m, moe_block *bl, moe_acts *a, int N, const float *dout,
                                    float *dx) {
    struct loom_moe *moe = m->moe;
    const int C = m->C, Hs = shared_l(m);
    /* dys = g dout; d(g) = dout . ys, summed over tp (ys is partial) */
    loom_tensor_combine_rows_bwd(m->dev, a->dys, moe->sdg, dout, a->ys, moe->idrow, a->sg, N, 1, C);
    LOOM_TRY(loom_tp_copy_bwd(&m->part.tp, moe->sdg, (size_t)N));
    loom_tensor_copy(m->dev, a->dls, moe->sdg, (size_t)N);
    sigmoid_host(m, a->dls, a->sg, N); /* d(gate logit) */
    if (m->part.tp.rank == 0) loom_part_linear_bwd(m, dx, NULL, NULL, a->dls, NULL, bl->w.sgate, N, C, 1);
    loom_tensor_zero(m->dev, moe->sdact, (size_t)N * Hs);
    loom_part_linear_bwd(m, moe->sdact, NULL, NULL, a->dys, NULL, bl->w.sdown, N, Hs, C);
    loom_swiglu_bwd(m->dev, a->dhs, a->hs, moe->sdact, N, Hs);
    loom_part_linear_bwd(m, dx, NULL, NULL, a->dhs, NULL, bl->w.sgu, N, C, 2 * Hs);
    return LOOM_OK;
}

static void shared_bwd_weight(const loom_gpt *m, moe_block *bl, moe_acts *a, int N, const float *x) {
    const int C = m->C, Hs = shared_l(m);
    loom_part_linear_bwd(m, NULL, bl->g.sgate, NULL, a->dls, x, bl->w.sgate, N, C, 1);
    loom_part_linear_bwd(m, NULL, bl->g.sdown, NULL, a->dys, a->as, bl->w.sdown, N, Hs, C);
    loom_part_linear_bwd(m, NULL, bl->g.sgu, NULL, a->dhs, x, bl->w.sgu, N, C, 2 * Hs);
}

/* ---- the experts over the rows dispatched to them --------------------------- */

/* Local expert j over its expert-major rows [r0, r0 + n): forward, or the
 * input gradient. Each row's result depends on that row alone, so the rows
 * of an expert may be taken in any split. */
typedef void (*expert_rows_fn)(loom_gpt *m, moe_block *bl, moe_acts *a, int j, int r0, int n);

static void experts_fwd(loom_gpt *m, moe_block *bl, moe_acts *a, int j, int r0, int n) {
    const int C = m->C, H = hidden_l(m), FH = first_l(m);
    loom_part_linear_fwd(m, a->hp + (size_t)r0 * FH, a->xp + (size_t)r0 * C, bl->w.fc_w[j], bl->w.fc_b[j], n,
                         C, FH);
    expert_act_fwd(m, a->gp + (size_t)r0 * H, a->hp + (size_t)r0 * FH, n, H);
    /* row-parallel c_proj: partial sums over tp, its bias added once (tp rank 0) */
    loom_part_linear_fwd(m, m->moe->t2 + (size_t)r0 * C, a->gp + (size_t)r0 * H, bl->w.cp_w[j],
                         m->part.tp.rank == 0 ? bl->w.cp_b[j] : NULL, n, H, C);
}

static void experts_bwd_input(loom_gpt *m, moe_block *bl, moe_acts *a, int j, int r0, int n) {
    const int C = m->C, H = hidden_l(m), FH = first_l(m);
    float *tH = m->moe->tH, *t2 = m->moe->t2;
    loom_part_linear_bwd(m, tH + (size_t)r0 * H, NULL, NULL, a->dyp + (size_t)r0 * C, NULL, bl->w.cp_w[j], n,
                         H, C);
    expert_act_bwd(m, a->dhp + (size_t)r0 * FH, a->hp + (size_t)r0 * FH, tH + (size_t)r0 * H, n, H);
    loom_part_linear_bwd(m, t2 + (size_t)r0 * C, NULL, NULL, a->dhp + (size_t)r0 * FH, NULL, bl->w.fc_w[j], n,
                         C, FH);
}

static void rows_run(expert_rows_fn fn, loom_gpt *m, moe_block *bl, moe_acts *a, int j, int r0, int r1) {
    if (r1 > r0) fn(m, bl, a, j, r0, r1 - r0);
}

/* moe->sendA's rows dispatched to out (expert-major), then fn over each
 * local expert's rows. With the EP group's overlap on, the rows this rank
 * sent itself are computed while the others are in flight
 * (loom_ep_dispatch_start), then the rest; off, one blocking dispatch and
 * each expert's rows in one call. */
static loom_status dispatch_run(loom_gpt *m, moe_block *bl, moe_acts *a, loom_moe_stats *st, float *out,
                                expert_rows_fn fn) {
    struct loom_moe *moe = m->moe;
    const loom_ep_routes *rt = &a->rt;
    const int El = moe->El, me = moe->ep.rank;
    if (!moe->ep.overlap || !moe->ep.comm) {
        LOOM_TRY(loom_ep_dispatch(&moe->ep, rt, moe->sendA, moe->t1, out, m->C, &st->a2a));
        for (int j = 0; j < El; j++) rows_run(fn, m, bl, a, j, rt->estart[j], rt->estart[j + 1]);
        return LOOM_OK;
    }
    loom_req *req = NULL;
    LOOM_TRY(loom_ep_dispatch_start(&moe->ep, rt, moe->sendA, moe->t1, out, m->C, &st->a2a, &req));
    for (int j = 0; j < El; j++) {
        const int own = rt->eoff[me * El + j];
        rows_run(fn, m, bl, a, j, own, own + rt->rc[me * El + j]);
    }
    LOOM_TRY(loom_ep_dispatch_finish(&moe->ep, rt, moe->t1, out, m->C, &st->a2a, req));
    for (int j = 0; j < El; j++) {
        const int own = rt->eoff[me * El + j], end = own + rt->rc[me * El + j];
        rows_run(fn, m, bl, a, j, rt->estart[j], own);
        rows_run(fn, m, bl, a, j, end, rt->estart[j + 1]);
    }
    return LOOM_OK;
}

/* ---- forward ----------------------------------------------------------------- */

loom_status loom_moe_fwd(loom_gpt *m, loom_gpt_slot *s, int li, int N, const float *x, float *out) {
    moe_block *bl = block_of(m, li);
    struct loom_moe *moe = m->moe;
    moe_acts *a = &bl->acts[s - m->slots];
    loom_moe_stats *st = &moe->stats[moe->of_local[li]];
    const loom_model_config *c = &m->cfg;
    const int C = m->C, E = c->n_expert, k = c->top_k;
    const int El = moe->El;
    a->x = x;
    double zsum = route_probs(m, a, bl->w.router, N, C, E);
    route_topk(m->dev, a, bl->bias, N, E, k, c->norm_topk);
    const int G = moe->G, Ng = N / G;
    const int cap = m->opts.forward_only ? Ng : loom_moe_capacity(c, Ng); /* inference: dropless */
    int64_t dropped = route_dispatch(moe, a, N, E, k, cap);
    /* per group g of Ng tokens: aux_g = coef E sum_e (routed_ge / Ng) (mean p_ie over g);
     * a->aux, a->z = the means over the G groups (equal sizes: z's is the plain mean) */
    double aux = 0;
    /* the aux loss is a host scalar from host counts: the probabilities come down */
    loom_tensor_download(m->dev, moe->hprobs, a->probs, (size_t)N * E);
    memset(moe->P_g, 0, (size_t)G * E * sizeof *moe->P_g);
    for (int q = 0; q < N; q++) {
        const int i = G > 1 ? moe->order[q] : q;
        double *Pg = moe->P_g + (size_t)(q / Ng) * E;
        for (int e = 0; e < E; e++) Pg[e] += moe->hprobs[(size_t)i * E + e];
    }
    for (int g = 0; g < G; g++)
        for (int e = 0; e < E; e++)
            aux += (double)a->routed[g * E + e] / Ng * (moe->P_g[(size_t)g * E + e] / Ng);
    a->aux = c->aux_coef * E * aux / G;
    a->z = c->z_coef * zsum / N;
    /* dispatch: this rank's kept rows, expert-major, to the experts' owners */
    const int A = a->start[E];
    loom_tensor_gather_rows(m->dev, moe->sendA, x, a->tok_d, A, C);
    LOOM_TRY(loom_ep_counts(&moe->ep, a->start, &a->rt, &st->a2a));
    /* the local experts over the rows they receive */
    LOOM_TRY(dispatch_run(m, bl, a, st, a->xp, experts_fwd));
    /* combine: outputs back to their tokens' ranks, weighted by the gates */
    LOOM_TRY(loom_ep_combine(&moe->ep, &a->rt, moe->t2, moe->t1, a->ye, C, &st->a2a));
    loom_tensor_combine_rows(m->dev, out, a->ye, a->row_d, a->gate, N, k, C);
    if (a->hs) shared_fwd(m, bl, a, N, x, out);
    /* statistics (a2a bytes and time above count every exchange, a recompute's too) */
    if (a->counted) return LOOM_OK; /* the recompute of a counted forward */
    a->counted = m->opts.recompute == LOOM_RECOMPUTE_FULL;
    for (int g = 0; g < G; g++)
        for (int e = 0; e < E; e++) st->routed[e] += a->routed[g * E + e];
    for (int e = 0; e < E; e++) st->kept[e] += a->start[e + 1] - a->start[e];
    st->assignments += (int64_t)N * k;
    st->dropped += dropped;
    st->aux += a->aux * G;
    st->z += a->z * G;
    st->groups += G;
    st->sent_rows += A;
    st->recv_rows += a->rt.estart[El];
    return LOOM_OK;
}

double loom_moe_loss_sum(const loom_gpt *m, const loom_gpt_slot *s) {
    double sum = 0;
    if (m->opts.loss_lm_only) return 0; /* evaluation: cross-entropy alone */
    for (int b = 0; m->moe && b < m->moe->n_blocks; b++) {
        const moe_acts *a = &m->moe->blocks[b].acts[s - m->slots];
        sum += (a->aux + a->z) * m->N;
    }
    return sum;
}

/* ---- backward ----------------------------------------------------------------- */

void loom_moe_set_dloss(loom_gpt *m, float dloss) {
    if (m->moe) m->moe->dloss = dloss;
}

/* dlogit (N,E) WRITES the router logits' gradient from the gates' gradient
 * dgate (N,k) and the two losses (weight of the whole micro-batch wg; each
 * of its G routing groups weighs wg / G). */
static void router_bwd(struct loom_moe *moe, moe_acts *a, const loom_model_config *c, int N, float wg) {
    const int E = c->n_expert, k = c->top_k;
    /* aux: d/dp_ie = coef E routed_{g(i)e} / Ng^2 for token i of group g(i) of Ng;
     * z: d/dlogit_ie = 2 coef lse_i p_ie / N */
    const int G = moe->G, Ng = N / G;
    const float wgg = G > 1 ? wg / (float)G : wg;
    const float aux_scale = wgg * c->aux_coef * (float)E / ((float)Ng * (float)Ng);
    loom_tensor_topk_gate_bwd(moe->dev, a->dlogit, moe->dp, moe->dgate, a->sel_d, a->gate, a->probs, a->lse,
                              a->routed_d, moe->gid_d, aux_scale, wg * c->z_coef * 2.0f, N, E, k,
                              c->norm_topk);
}

loom_status loom_moe_bwd_input(loom_gpt *m, loom_gpt_slot *s, int li, const float *dout, float *dx) {
    moe_block *bl = block_of(m, li);
    struct loom_moe *moe = m->moe;
    moe_acts *a = &bl->acts[s - m->slots];
    loom_moe_stats *st = &moe->stats[moe->of_local[li]];
    const loom_model_config *c = &m->cfg;
    const int N = m->N, C = m->C, E = c->n_expert, k = c->top_k, H = hidden_l(m), FH = first_l(m);
    const int El = moe->El, A = a->start[E];
    a->counted = 0; /* the next forward of this slot is a new micro-batch */
    /* combine: d(expert output) = gate dout_i, sent to the experts' owners;
     * dgate = dout_i . ye_r */
    loom_tensor_combine_rows_bwd(m->dev, moe->sendA, moe->dgate, dout, a->ye, a->row_d, a->gate, N, k, C);
    /* the local experts' input gradients (accumulated into zeros) */
    const size_t R = (size_t)a->rt.estart[El];
    loom_tensor_zero(m->dev, moe->tH, R * H);
    loom_tensor_zero(m->dev, a->dhp, R * FH);
    loom_tensor_zero(m->dev, moe->t2, R * C);
    LOOM_TRY(dispatch_run(m, bl, a, st, a->dyp, experts_bwd_input));
    /* back to the tokens' ranks (sendA is free again) */
    LOOM_TRY(loom_ep_combine(&moe->ep, &a->rt, moe->t2, moe->t1, moe->sendA, C, &st->a2a));
    /* un-dispatch: each dispatched row's input gradient back to its token;
     * partial over tp (column-parallel c_fc): the caller sums dx over tp */
    loom_tensor_zero(m->dev, dx, (size_t)N * C);
    loom_tensor_scatter_add_rows(m->dev, dx, moe->sendA, a->tok_d, A, C);
    /* router: replicated over tp; dgate = dout . ye was taken from this
     * rank's partial ye, so summed first; its input gradient, complete on
     * every rank, joins dx on tp rank 0 only (the caller's sum adds it once) */
    LOOM_TRY(loom_tp_copy_bwd(&m->part.tp, moe->dgate, (size_t)N * k));
    router_bwd(moe, a, c, N, moe->dloss * (float)N);
    if (m->part.tp.rank == 0) loom_part_linear_bwd(m, dx, NULL, NULL, a->dlogit, NULL, bl->w.router, N, C, E);
    if (a->hs) LOOM_TRY(shared_bwd_input(m, bl, a, N, dout, dx));
    return LOOM_OK;
}

loom_status loom_moe_bwd_weight(loom_gpt *m, loom_gpt_slot *s, int li, const float *x) {
    moe_block *bl = block_of(m, li);
    moe_acts *a = &bl->acts[s - m->slots];
    const loom_model_config *c = &m->cfg;
    const int N = m->N, C = m->C, E = c->n_expert, H = hidden_l(m), FH = first_l(m), El = m->moe->El;
    loom_part_linear_bwd(m, NULL, bl->g.router, NULL, a->dlogit, x, bl->w.router, N, C, E);
    if (a->hs) shared_bwd_weight(m, bl, a, N, x);
    for (int j = 0; j < El; j++) {
        int r0 = a->rt.estart[j], n = a->rt.estart[j + 1] - r0;
        if (n == 0) continue;
        loom_part_linear_bwd(m, NULL, bl->g.cp_w[j], bl->g.cp_b[j], a->dyp + (size_t)r0 * C,
                             a->gp + (size_t)r0 * H, bl->w.cp_w[j], n, H, C);
        loom_part_linear_bwd(m, NULL, bl->g.fc_w[j], bl->g.fc_b[j], a->dhp + (size_t)r0 * FH,
                             a->xp + (size_t)r0 * C, bl->w.fc_w[j], n, C, FH);
    }
    return LOOM_OK;
}

void loom_moe_balance(loom_gpt *m, int b, const double *routed) {
    const int E = m->cfg.n_expert;
    if (!m->moe || m->cfg.bias_rate <= 0) return;
    double mean = 0;
    for (int e = 0; e < E; e++) mean += routed[e] / E;
    /* the step per expert on the host (from host counts), added on the device:
     * hprobs is host scratch, dp device scratch, both free between steps */
    float *step = m->moe->hprobs;
    for (int e = 0; e < E; e++) step[e] = m->cfg.bias_rate * (float)((routed[e] < mean) - (routed[e] > mean));
    loom_tensor_upload(m->dev, m->moe->dp, step, (size_t)E);
    loom_tensor_add(m->dev, m->moe->blocks[b].bias, m->moe->dp, (size_t)E);
}

float *loom_moe_selection_bias(const loom_gpt *m, int b, int *layer) {
    if (!m->moe || b < 0 || b >= m->moe->n_blocks || m->cfg.bias_rate <= 0) return NULL;
    *layer = m->moe->blocks[b].l;
    return m->moe->blocks[b].bias;
}

/* ---- statistics ---------------------------------------------------------------- */

const loom_moe_stats *loom_moe_stats_get(const loom_gpt *m, int *n) {
    *n = m->moe ? m->moe->n_blocks : 0;
    return m->moe ? m->moe->stats : NULL;
}

void loom_moe_stats_reset(loom_gpt *m) {
    for (int b = 0; m->moe && b < m->moe->n_blocks; b++) {
        loom_moe_stats *st = &m->moe->stats[b];
        memset(st->routed, 0, (size_t)2 * st->n_expert * sizeof *st->routed);
        st->assignments = st->dropped = st->sent_rows = st->recv_rows = st->a2a.bytes = 0;
        st->a2a.seconds = 0;
        st->a2a.overlapped = 0;
        st->aux = st->z = 0;
        st->groups = 0;
        for (int s = 0; s < m->opts.n_slots; s++) m->moe->blocks[b].acts[s].counted = 0;
    }
}
