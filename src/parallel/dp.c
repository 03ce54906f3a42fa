/* dp.c - the data-parallel engine, plain DDP: after the last micro-batch's
 * backward, every part's gradients are all-reduced (summed) over the DP
 * group; each rank then runs AdamW on its full replica. Axis: dp.
 * Collective over dp: loom_dp_finish_grads; over tp, pp, dp:
 * loom_dp_grad_norm. At dp = 1 no communication is issued.
 * Also: loom_comm_agree, which every multi-rank path uses to fail together.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/dp.h"
#include "loom/kernels.h"
#include "loom/train.h"

struct loom_dp_engine {
    loom_gpt **parts;
    int n_parts;
    const loom_mesh *mesh;
    loom_dp_config cfg;
    loom_adamw_hparams hp;
    loom_adamw *opt; /* one per part */
    int last_micro;
};

loom_status loom_dp_grad_sync(loom_comm *dp, float *grads, size_t n) {
    if (loom_comm_size(dp) == 1) return LOOM_OK;
    return loom_comm_allreduce(dp, grads, n, LOOM_F32, LOOM_SUM);
}

loom_status loom_dp_engine_create(loom_gpt **parts, int n_parts, const loom_mesh *mesh,
                                  const loom_dp_config *cfg, const loom_adamw_hparams *hp,
                                  loom_dp_engine **out) {
    *out = NULL;
    if (cfg->zero != 0)
        return loom_fail(LOOM_EUSAGE, "--zero %d: ZeRO is not available in this build yet", cfg->zero);
    loom_dp_engine *e = calloc(1, sizeof *e);
    if (!e) return loom_fail(LOOM_EOS, "out of memory");
    e->parts = parts;
    e->n_parts = n_parts;
    e->mesh = mesh;
    e->cfg = *cfg;
    e->hp = *hp;
    e->opt = calloc((size_t)n_parts, sizeof *e->opt);
    loom_status st = e->opt ? LOOM_OK : loom_fail(LOOM_EOS, "out of memory");
    for (int i = 0; i < n_parts && st == LOOM_OK; i++)
        st = loom_adamw_create(&e->opt[i], parts[i]->num_params);
    if (st != LOOM_OK) {
        loom_dp_engine_free(e);
        return st;
    }
    *out = e;
    return LOOM_OK;
}

void loom_dp_engine_free(loom_dp_engine *e) {
    if (!e) return;
    for (int i = 0; e->opt && i < e->n_parts; i++) loom_adamw_free(&e->opt[i]);
    free(e->opt);
    free(e);
}

loom_status loom_dp_begin_step(loom_dp_engine *e) {
    for (int i = 0; i < e->n_parts; i++) loom_gpt_zero_grad(e->parts[i]);
    e->last_micro = 0;
    return LOOM_OK;
}

void loom_dp_set_last_micro(loom_dp_engine *e, int last) { e->last_micro = last; }

loom_status loom_dp_finish_grads(loom_dp_engine *e) {
    for (int i = 0; i < e->n_parts; i++)
        LOOM_TRY(loom_dp_grad_sync(e->mesh->dp, e->parts[i]->grad_mem, e->parts[i]->num_params));
    return LOOM_OK;
}

void loom_dp_sumsq_parts(loom_gpt **parts, int n_parts, const float *const *grads, double sq[2]) {
    sq[0] = sq[1] = 0;
    for (int k = 0; k < n_parts; k++) {
        const loom_gpt *m = parts[k];
        const float *g = grads ? grads[k] : m->grad_mem;
        for (int i = 0; i < m->n_params; i++) {
            const loom_param *p = &m->params[i];
            if (!m->part.has_embed && strcmp(p->name, "wte.weight") == 0) continue; /* tied copy */
            sq[p->split_dim < 0] += loom_sumsq(g + p->offset, p->numel);
        }
    }
}

loom_status loom_dp_grad_norm(loom_dp_engine *e, double *norm) {
    double sq[2];
    loom_dp_sumsq_parts(e->parts, e->n_parts, NULL, sq);
    if (loom_comm_size(e->mesh->tp) > 1)
        LOOM_TRY(loom_comm_allreduce(e->mesh->tp, sq, 1, LOOM_F64, LOOM_SUM));
    double total = sq[0] + sq[1];
    if (loom_comm_size(e->mesh->pp) > 1)
        LOOM_TRY(loom_comm_allreduce(e->mesh->pp, &total, 1, LOOM_F64, LOOM_SUM));
    *norm = sqrt(total);
    return LOOM_OK;
}

loom_status loom_dp_step(loom_dp_engine *e, float lr, float grad_scale) {
    for (int i = 0; i < e->n_parts; i++) {
        loom_gpt *m = e->parts[i];
        if (grad_scale != 1.0f) loom_scale(m->grad_mem, m->num_params, grad_scale);
        loom_adamw_step(&e->opt[i], m, lr, e->hp.beta1, e->hp.beta2, e->hp.eps, e->hp.weight_decay);
    }
    return LOOM_OK;
}

void loom_dp_memory_bytes(const loom_dp_engine *e, loom_dp_memory *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < e->n_parts; i++) {
        out->params += e->parts[i]->a_params.cap;
        out->grads += e->parts[i]->a_grads.cap;
        out->optimizer += e->opt[i].arena.cap;
        out->activations += loom_gpt_activation_bytes(e->parts[i]);
    }
}

loom_status loom_comm_agree(loom_comm *world, loom_status local) {
    /* the lowest failing rank speaks for all: its status, its message */
    const int none = 1 << 30;
    int me = local != LOOM_OK ? loom_comm_rank(world) : none, first = me;
    loom_status st = loom_comm_allreduce(world, &first, 1, LOOM_I32, LOOM_MIN);
    if (st != LOOM_OK) return st;
    if (first == none) return LOOM_OK;
    int code = (int)local;
    st = loom_comm_bcast(world, &code, sizeof code, first);
    if (st != LOOM_OK) return st;
    if (me != first) loom_fail((loom_status)code, "%s", "");
    return (loom_status)code;
}
