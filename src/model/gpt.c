/* gpt.c - GPT-2 forward and backward on one device, llm.c style.
 *
 * The single-device model: the spec every parallel layout is compared with
 * (invariant 1) and the thing checked against PyTorch (invariant 2). The
 * backward pass is the exact mirror of the forward. Parameters, gradients and
 * activations each live in one arena; tensors are views into them. No
 * collectives here: parallel strategies wrap this compute with their regions.
 */
#include "loom/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/kernels.h"
#include "loom/rng.h"

/* ---- the parameter table ------------------------------------------------ */

static void add_param(loom_param *p, int *n, size_t *off, const char *name, int64_t d0, int64_t d1,
                      loom_init_kind init, float std) {
    loom_param *q = &p[(*n)++];
    snprintf(q->name, sizeof q->name, "%s", name);
    q->ndim = d1 > 0 ? 2 : 1;
    q->shape[0] = d0;
    q->shape[1] = d1 > 0 ? d1 : 0;
    q->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    q->offset = *off;
    q->decay = q->ndim >= 2;
    q->init = init;
    q->init_std = std;
    /* keep every tensor 64-byte aligned inside the flat buffer */
    *off += (q->numel + 15) & ~(size_t)15;
}

/* Fills p[] (capacity 4 + 12 L + 2) in the order a Hugging Face GPT-2 file
 * lists them; returns the float count of the flat buffer. */
static size_t build_table(const loom_model_config *c, loom_param *p, int *n) {
    const int64_t C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    const float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)L);
    size_t off = 0;
    char nm[LOOM_PARAM_NAME_MAX];
    *n = 0;
    add_param(p, n, &off, "wte.weight", V, C, LOOM_INIT_NORMAL, std);
    add_param(p, n, &off, "wpe.weight", c->n_positions, C, LOOM_INIT_NORMAL, std);
    for (int l = 0; l < L; l++) {
#define P(suffix, d0, d1, init, s)                                                                 \
    snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);                                                  \
    add_param(p, n, &off, nm, d0, d1, init, s)
        P("ln_1.weight", C, 0, LOOM_INIT_ONES, 0);
        P("ln_1.bias", C, 0, LOOM_INIT_ZEROS, 0);
        P("attn.c_attn.weight", C, 3 * C, LOOM_INIT_NORMAL, std);
        P("attn.c_attn.bias", 3 * C, 0, LOOM_INIT_ZEROS, 0);
        P("attn.c_proj.weight", C, C, LOOM_INIT_NORMAL, res_std);
        P("attn.c_proj.bias", C, 0, LOOM_INIT_ZEROS, 0);
        P("ln_2.weight", C, 0, LOOM_INIT_ONES, 0);
        P("ln_2.bias", C, 0, LOOM_INIT_ZEROS, 0);
        P("mlp.c_fc.weight", C, 4 * C, LOOM_INIT_NORMAL, std);
        P("mlp.c_fc.bias", 4 * C, 0, LOOM_INIT_ZEROS, 0);
        P("mlp.c_proj.weight", 4 * C, C, LOOM_INIT_NORMAL, res_std);
        P("mlp.c_proj.bias", C, 0, LOOM_INIT_ZEROS, 0);
#undef P
    }
    add_param(p, n, &off, "ln_f.weight", C, 0, LOOM_INIT_ONES, 0);
    add_param(p, n, &off, "ln_f.bias", C, 0, LOOM_INIT_ZEROS, 0);
    return off;
}

/* Point the named views at a flat buffer laid out by build_table. */
static void bind_weights(const loom_gpt *m, float *base, loom_gpt_weights *w) {
    const loom_param *p = m->params;
    int i = 0;
    w->wte = base + p[i++].offset;
    w->wpe = base + p[i++].offset;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        loom_gpt_layer_w *h = &w->h[l];
        float **slot[] = {&h->ln1_w, &h->ln1_b, &h->qkv_w, &h->qkv_b, &h->proj_w, &h->proj_b,
                          &h->ln2_w, &h->ln2_b, &h->fc_w,  &h->fc_b,  &h->fcp_w, &h->fcp_b};
        for (size_t k = 0; k < sizeof slot / sizeof slot[0]; k++) *slot[k] = base + p[i++].offset;
    }
    w->lnf_w = base + p[i++].offset;
    w->lnf_b = base + p[i++].offset;
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

/* Walk every activation once; run on a planning arena it counts bytes, on the
 * committed one it hands out the pointers. */
static void layout_acts(loom_gpt *m, loom_arena *a) {
    const size_t B = (size_t)m->B, T = (size_t)m->T, C = (size_t)m->cfg.n_embd;
    const size_t NH = (size_t)m->cfg.n_head, V = (size_t)m->cfg.vocab_size, BT = B * T;
#define A(ptr, type, count) ptr = (type *)take(a, (count) * sizeof(type))
    A(m->inputs, int32_t, BT);
    A(m->targets, int32_t, BT);
    A(m->encoded, float, BT * C);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        loom_gpt_layer_acts *x = &m->acts[l];
        A(x->ln1, float, BT * C);
        A(x->ln1_mean, float, BT);
        A(x->ln1_rstd, float, BT);
        A(x->qkv, float, BT * 3 * C);
        A(x->atty, float, BT * C);
        A(x->att, float, B * NH * T * T);
        A(x->res2, float, BT * C);
        A(x->ln2, float, BT * C);
        A(x->ln2_mean, float, BT);
        A(x->ln2_rstd, float, BT);
        A(x->fch, float, BT * 4 * C);
        A(x->fch_gelu, float, BT * 4 * C);
        A(x->res3, float, BT * C);
    }
    A(m->lnf, float, BT * C);
    A(m->lnf_mean, float, BT);
    A(m->lnf_rstd, float, BT);
    A(m->logits, float, BT * V);
    A(m->losses, float, BT);
    A(m->dres, float, BT * C);
    A(m->dc, float, BT * C);
    A(m->d3c, float, BT * 3 * C);
    A(m->d4c_a, float, BT * 4 * C);
    A(m->d4c_b, float, BT * 4 * C);
    A(m->att_scratch, float, loom_attention_scratch_floats(m->T));
#undef A
}

loom_status loom_gpt_create(const loom_model_config *cfg, int B, int T, loom_gpt **out) {
    *out = NULL;
    LOOM_TRY(loom_model_config_check(cfg));
    if (B < 1 || T < 1)
        return loom_fail(LOOM_EUSAGE, "batch %d x sequence %d: both must be >= 1", B, T);
    if (T > cfg->n_positions)
        return loom_fail(LOOM_EUSAGE, "--seq %d exceeds the model's n_positions=%d", T,
                         cfg->n_positions);
    loom_gpt *m = calloc(1, sizeof *m);
    int max_params = 4 + 12 * cfg->n_layer + 2;
    if (m) {
        m->params = calloc((size_t)max_params, sizeof *m->params);
        m->acts = calloc((size_t)cfg->n_layer, sizeof *m->acts);
        m->w.h = calloc((size_t)cfg->n_layer, sizeof *m->w.h);
        m->g.h = calloc((size_t)cfg->n_layer, sizeof *m->g.h);
    }
    if (!m || !m->params || !m->acts || !m->w.h || !m->g.h) {
        loom_gpt_free(m);
        return loom_fail(LOOM_EOS, "out of memory creating the model");
    }
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->num_params = build_table(cfg, m->params, &m->n_params);

    loom_arena_init(&m->a_params, "params");
    loom_arena_init(&m->a_grads, "grads");
    loom_arena_init(&m->a_acts, "activations");
    loom_arena_reserve(&m->a_params, m->num_params * sizeof(float));
    loom_arena_reserve(&m->a_grads, m->num_params * sizeof(float));
    layout_acts(m, &m->a_acts); /* plan */
    loom_status st = loom_arena_commit(&m->a_params);
    if (st == LOOM_OK) st = loom_arena_commit(&m->a_grads);
    if (st == LOOM_OK) st = loom_arena_commit(&m->a_acts);
    if (st != LOOM_OK) {
        loom_gpt_free(m);
        return st;
    }
    m->param_mem = loom_arena_alloc(&m->a_params, m->num_params * sizeof(float));
    m->grad_mem = loom_arena_alloc(&m->a_grads, m->num_params * sizeof(float));
    layout_acts(m, &m->a_acts); /* hand out */
    bind_weights(m, m->param_mem, &m->w);
    bind_weights(m, m->grad_mem, &m->g);
    *out = m;
    return LOOM_OK;
}

void loom_gpt_free(loom_gpt *m) {
    if (!m) return;
    loom_arena_free(&m->a_params);
    loom_arena_free(&m->a_grads);
    loom_arena_free(&m->a_acts);
    free(m->params);
    free(m->acts);
    free(m->w.h);
    free(m->g.h);
    free(m);
}

void loom_gpt_init_params(loom_gpt *m, uint64_t seed) {
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *p = &m->params[i];
        float *x = m->param_mem + p->offset;
        if (p->init == LOOM_INIT_NORMAL) {
            loom_rng_fill_normal(loom_rng_key_make(seed, p->name), 0, x, p->numel, p->init_std);
        } else {
            float v = p->init == LOOM_INIT_ONES ? 1.0f : 0.0f;
            for (size_t k = 0; k < p->numel; k++) x[k] = v;
        }
    }
}

const loom_param *loom_gpt_find_param(const loom_gpt *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

size_t loom_gpt_activation_bytes(const loom_gpt *m) { return m->a_acts.cap; }

void loom_gpt_zero_grad(loom_gpt *m) { memset(m->grad_mem, 0, m->num_params * sizeof(float)); }

double loom_gpt_flops_per_token(const loom_model_config *c, int T) {
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    double matmul_params = L * 12.0 * C * C + V * C;
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

/* ---- forward ------------------------------------------------------------ */

void loom_gpt_forward(loom_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                      double *loss_sum) {
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size, N = B * T;
    m->cur_B = B;
    m->cur_T = T;
    m->have_targets = targets != NULL;
    memcpy(m->inputs, inputs, (size_t)N * sizeof(int32_t));
    if (targets) memcpy(m->targets, targets, (size_t)N * sizeof(int32_t));

    loom_encoder_fwd(m->encoded, m->inputs, m->w.wte, m->w.wpe, B, T, C);
    const float *res = m->encoded; /* (B,T,C) the residual stream entering layer l */
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const loom_gpt_layer_w *w = &m->w.h[l];
        loom_gpt_layer_acts *a = &m->acts[l];
        loom_layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1_w, w->ln1_b, N, C);
        loom_matmul_fwd(a->qkv, a->ln1, w->qkv_w, w->qkv_b, N, C, 3 * C);
        loom_attention_fwd(a->atty, a->att, a->qkv, B, T, C, NH);
        loom_matmul_fwd(a->res2, a->atty, w->proj_w, w->proj_b, N, C, C); /* attn out */
        loom_residual_fwd(a->res2, res, a->res2, (size_t)N * C);
        loom_layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b, N, C);
        loom_matmul_fwd(a->fch, a->ln2, w->fc_w, w->fc_b, N, C, 4 * C);
        loom_gelu_fwd(a->fch_gelu, a->fch, (size_t)N * 4 * C);
        loom_matmul_fwd(a->res3, a->fch_gelu, w->fcp_w, w->fcp_b, N, 4 * C, C); /* mlp out */
        loom_residual_fwd(a->res3, a->res2, a->res3, (size_t)N * C);
        res = a->res3;
    }
    loom_layernorm_fwd(m->lnf, m->lnf_mean, m->lnf_rstd, res, m->w.lnf_w, m->w.lnf_b, N, C);
    loom_matmul_nt_fwd(m->logits, m->lnf, m->w.wte, N, C, V);
    if (!targets) return;
    loom_softmax_xent_fwd(m->losses, m->logits, m->logits, m->targets, N, V);
    if (loss_sum) {
        double s = 0;
        for (int i = 0; i < N; i++) s += m->losses[i];
        *loss_sum = s;
    }
}

/* ---- backward: the forward, mirrored ------------------------------------ */

/* dqkv_b (3C) += column sums of dqkv (N,3C) for the query and value parts.
 * The key bias gets exactly zero: adding b to every key adds q.b to all
 * scores of a query, which the softmax cancels, so its true gradient is 0.
 * Summing dK would give rounding noise instead, and AdamW turns noise of any
 * size into steps of up to lr - a random walk that would differ between
 * layouts. Exact zeros keep the parameter where the math says it stays. */
static void qkv_bias_grad(float *db, const float *dqkv, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *row = dqkv + (size_t)i * 3 * C;
        for (int j = 0; j < C; j++) db[j] += row[j];
        for (int j = 2 * C; j < 3 * C; j++) db[j] += row[j];
    }
}

void loom_gpt_backward(loom_gpt *m, float dloss) {
    const int B = m->cur_B, T = m->cur_T, N = B * T;
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size;
    const size_t NC = (size_t)N * C;
    float *dres = m->dres; /* (B,T,C) gradient of the residual stream */

    loom_softmax_xent_bwd(m->logits, m->logits, m->targets, dloss, N, V); /* dlogits in place */
    memset(m->dc, 0, NC * sizeof(float));
    loom_matmul_nt_bwd(m->dc, m->g.wte, m->logits, m->lnf, m->w.wte, N, C, V);
    const float *res_last = m->cfg.n_layer ? m->acts[m->cfg.n_layer - 1].res3 : m->encoded;
    memset(dres, 0, NC * sizeof(float));
    loom_layernorm_bwd(dres, m->g.lnf_w, m->g.lnf_b, m->dc, res_last, m->w.lnf_w, m->lnf_mean,
                       m->lnf_rstd, N, C);

    for (int l = m->cfg.n_layer - 1; l >= 0; l--) {
        const loom_gpt_layer_w *w = &m->w.h[l];
        loom_gpt_layer_w *g = &m->g.h[l];
        const loom_gpt_layer_acts *a = &m->acts[l];
        const float *res_in = l ? m->acts[l - 1].res3 : m->encoded;
        float *dfch_gelu = m->d4c_a, *dfch = m->d4c_b;
        /* MLP branch: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); dres is d(res3) = d(res2) so far */
        memset(dfch_gelu, 0, NC * 4 * sizeof(float));
        loom_matmul_bwd(dfch_gelu, g->fcp_w, g->fcp_b, dres, a->fch_gelu, w->fcp_w, N, 4 * C, C);
        memset(dfch, 0, NC * 4 * sizeof(float));
        loom_gelu_bwd(dfch, a->fch, dfch_gelu, NC * 4);
        memset(m->dc, 0, NC * sizeof(float));
        loom_matmul_bwd(m->dc, g->fc_w, g->fc_b, dfch, a->ln2, w->fc_w, N, C, 4 * C);
        loom_layernorm_bwd(dres, g->ln2_w, g->ln2_b, m->dc, a->res2, w->ln2_w, a->ln2_mean,
                           a->ln2_rstd, N, C);
        /* attention branch: res2 = res_in + c_proj(attn(c_attn(ln_1(res_in)))) */
        float *datty = m->dc;
        memset(datty, 0, NC * sizeof(float));
        loom_matmul_bwd(datty, g->proj_w, g->proj_b, dres, a->atty, w->proj_w, N, C, C);
        memset(m->d3c, 0, NC * 3 * sizeof(float));
        loom_attention_bwd(m->d3c, m->att_scratch, datty, a->qkv, a->att, B, T, C, NH);
        float *dln1 = m->d4c_a; /* reuse: (B,T,C) fits in (B,T,4C) */
        memset(dln1, 0, NC * sizeof(float));
        loom_matmul_bwd(dln1, g->qkv_w, NULL, m->d3c, a->ln1, w->qkv_w, N, C, 3 * C);
        qkv_bias_grad(g->qkv_b, m->d3c, N, C);
        loom_layernorm_bwd(dres, g->ln1_w, g->ln1_b, dln1, res_in, w->ln1_w, a->ln1_mean,
                           a->ln1_rstd, N, C);
    }
    loom_encoder_bwd(m->g.wte, m->g.wpe, dres, m->inputs, B, T, C);
}
