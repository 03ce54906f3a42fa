/* edp.c - the expert-data-parallel engine of include/loom/edp.h: the
 * expert tensors' gradient sum over the edp group (the ranks holding the
 * same experts), their share of the global gradient norm and their AdamW
 * step. Axis: edp (ep consecutive ranks' counterparts inside dp x cp).
 * Collective: loom_edp_engine_create (over dp x cp, which it splits),
 * loom_edp_finish_grads (edp), loom_edp_grad_norm (tp, ep, pp); the rest
 * is local. */
#include "loom/edp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/moe.h"

struct loom_edp_engine {
    loom_gpt **parts;
    int n_parts;
    const loom_mesh *mesh;
    loom_adamw_hparams hp;
    loom_comm *edp;      /* ranks holding the same experts (the mesh's: not owned) */
    size_t *lo, *n;      /* per part: the expert unit's flat range */
    float **par, **grad; /* per part: its storage (moe.h), laid out like that range */
    float **opt_m, **opt_v;
    loom_adamw_run *adamw; /* every part's expert tensors, part by part (adamw.h) */
    int *run0;             /* (n_parts+1) part i's runs: adamw[run0[i] .. run0[i+1]) */
    int t;
};

/* The AdamW runs of the expert tensors: one per tensor of unit
 * LOOM_UNIT_EXPERTS, in table order, part by part. */
static loom_status build_adamw_runs(loom_edp_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n_parts; i++)
        for (int k = 0; k < e->parts[i]->n_params; k++) n += e->parts[i]->params[k].unit == LOOM_UNIT_EXPERTS;
    e->adamw = calloc((size_t)(n ? n : 1), sizeof *e->adamw);
    e->run0 = calloc((size_t)e->n_parts + 1, sizeof *e->run0);
    if (!e->adamw || !e->run0) return loom_fail(LOOM_EOS, "out of memory for the expert-parallel engine");
    n = 0;
    for (int i = 0; i < e->n_parts; i++) {
        const loom_gpt *m = e->parts[i];
        e->run0[i] = n;
        for (int k = 0; k < m->n_params; k++) {
            const loom_param *p = &m->params[k];
            if (p->unit != LOOM_UNIT_EXPERTS) continue;
            size_t so = p->offset - e->lo[i];
            e->adamw[n++] = (loom_adamw_run){.p = e->par[i] + so,
                                             .g = e->grad[i] + so,
                                             .m = e->opt_m[i] + so,
                                             .v = e->opt_v[i] + so,
                                             .n = p->numel,
                                             .decay = p->decay};
        }
    }
    e->run0[e->n_parts] = n;
    return LOOM_OK;
}

loom_status loom_edp_engine_create(loom_gpt **parts, int n_parts, const loom_mesh *mesh,
                                   const loom_adamw_hparams *hp, loom_edp_engine **out) {
    *out = NULL;
    loom_edp_engine *e = calloc(1, sizeof *e);
    if (!e) return loom_fail(LOOM_EOS, "out of memory for the expert-parallel engine");
    e->parts = parts;
    e->n_parts = n_parts;
    e->mesh = mesh;
    e->hp = *hp;
    e->lo = calloc((size_t)n_parts, sizeof *e->lo);
    e->n = calloc((size_t)n_parts, sizeof *e->n);
    e->opt_m = calloc((size_t)n_parts, sizeof *e->opt_m);
    e->opt_v = calloc((size_t)n_parts, sizeof *e->opt_v);
    e->par = calloc((size_t)n_parts, sizeof *e->par);
    e->grad = calloc((size_t)n_parts, sizeof *e->grad);
    loom_status st = e->lo && e->n && e->opt_m && e->opt_v && e->par && e->grad
                         ? LOOM_OK
                         : loom_fail(LOOM_EOS, "out of memory for the expert-parallel engine");
    size_t total = 0;
    for (int i = 0; st == LOOM_OK && i < n_parts; i++) {
        loom_moe_expert_storage(parts[i], &e->par[i], &e->grad[i], &e->lo[i], &e->n[i]);
        total += e->n[i];
        /* the part's device memory, zeroed */
        e->opt_m[i] = loom_device_alloc(parts[i]->dev, (e->n[i] ? e->n[i] : 1) * sizeof(float));
        e->opt_v[i] = loom_device_alloc(parts[i]->dev, (e->n[i] ? e->n[i] : 1) * sizeof(float));
        if (!e->opt_m[i] || !e->opt_v[i])
            st = loom_fail(LOOM_EOS, "out of memory for the experts' optimizer state (%zu floats)", e->n[i]);
    }
    if (st == LOOM_OK) st = build_adamw_runs(e);
    e->edp = mesh->edp; /* the mesh's (NULL at ep = 1) */
    (void)total;
    if (st != LOOM_OK) {
        loom_edp_engine_free(e);
        return st;
    }
    *out = e;
    return LOOM_OK;
}

void loom_edp_engine_free(loom_edp_engine *e) {
    if (!e) return;
    for (int i = 0; e->n && e->opt_m && i < e->n_parts; i++)
        loom_device_release(e->parts[i]->dev, e->opt_m[i], (e->n[i] ? e->n[i] : 1) * sizeof(float));
    for (int i = 0; e->n && e->opt_v && i < e->n_parts; i++)
        loom_device_release(e->parts[i]->dev, e->opt_v[i], (e->n[i] ? e->n[i] : 1) * sizeof(float));
    free(e->opt_m);
    free(e->opt_v);
    free(e->lo);
    free(e->n);
    free(e->par);
    free(e->grad);
    free(e->adamw);
    free(e->run0);
    free(e);
}

size_t loom_edp_state(const loom_edp_engine *e, int part, float **par, float **m, float **v, size_t *lo) {
    if (!e || !e->edp || part < 0 || part >= e->n_parts || !e->n[part]) return 0;
    *par = e->par[part];
    *m = e->opt_m[part];
    *v = e->opt_v[part];
    *lo = e->lo[part];
    return e->n[part];
}

void loom_edp_set_steps_taken(loom_edp_engine *e, int t) {
    if (e) e->t = t;
}

void loom_edp_memory_bytes(const loom_edp_engine *e, loom_dp_memory *mem) {
    for (int i = 0; e && i < e->n_parts; i++) {
        size_t par, grad, buf;
        loom_moe_memory_bytes(e->parts[i], &par, &grad, &buf);
        mem->params += par;
        mem->grads += grad;
        mem->activations += buf;
        if (e->edp) mem->optimizer += 2 * e->n[i] * sizeof(float); /* opt_m, opt_v */
    }
}

loom_comm *loom_edp_comm(const loom_edp_engine *e) { return e ? e->edp : NULL; }

loom_status loom_edp_finish_grads(loom_edp_engine *e) {
    if (!e || !e->edp || loom_comm_size(e->edp) == 1) return LOOM_OK;
    for (int i = 0; i < e->n_parts; i++)
        if (e->n[i]) LOOM_TRY(loom_comm_allreduce(e->edp, e->grad[i], e->n[i], LOOM_F32, LOOM_SUM));
    return LOOM_OK;
}

loom_status loom_edp_grad_norm(loom_edp_engine *e, double *norm) {
    if (!e || !e->edp) return LOOM_OK;
    double sq[2] = {0, 0}; /* tensors TP cuts (summed over tp), replicated ones (once) */
    for (int i = 0; i < e->n_parts; i++) {
        const loom_gpt *m = e->parts[i];
        for (int k = 0; k < m->n_params; k++) {
            const loom_param *p = &m->params[k];
            if (p->unit == LOOM_UNIT_EXPERTS)
                sq[p->split_dim < 0] += loom_sumsq(m->dev, e->grad[i] + (p->offset - e->lo[i]), p->numel);
        }
    }
    LOOM_TRY(loom_comm_allreduce(loom_comm_host(e->mesh->tp), sq, 1, LOOM_F64, LOOM_SUM)); /* host doubles */
    double total = sq[0] + sq[1];
    LOOM_TRY(loom_comm_allreduce(loom_comm_host(e->mesh->ep), &total, 1, LOOM_F64, LOOM_SUM));
    /* every stage's experts */
    LOOM_TRY(loom_comm_allreduce(loom_comm_host(e->mesh->pp), &total, 1, LOOM_F64, LOOM_SUM));
    *norm = sqrt(*norm * *norm + total);
    return LOOM_OK;
}

loom_status loom_edp_step(loom_edp_engine *e, float lr, float grad_scale) {
    if (!e || !e->edp) return LOOM_OK;
    e->t++;
    for (int i = 0; i < e->n_parts; i++) {
        loom_gpt *m = e->parts[i];
        loom_adamw_update_runs(m->dev, &e->hp, e->adamw + e->run0[i], e->run0[i + 1] - e->run0[i], e->t, lr,
                               grad_scale, 0);
        /* consumed: the next step accumulates from zero (the DP engine zeroes
         * grad_mem at zero 0/1, but not the experts' own storage at 2/3) */
        loom_tensor_zero(m->dev, e->grad[i], e->n[i]);
    }
    return LOOM_OK;
}
