/* optim.c - AdamW on one whole model part with no engine (the tests'
 * single-device reference: a run of the AdamW driver per parameter,
 * include/loom/adamw.h) and the learning-rate schedule. Local compute only.
 * The state (m, v) is one arena, sized once. */
#include <math.h>
#include <stdlib.h>

#include "loom/device.h"
#include "loom/train.h"

loom_status loom_adamw_create(loom_adamw *o, loom_gpt *m) {
    const size_t n = m->num_params;
    *o = (loom_adamw){.dev = m->dev, .n_runs = m->n_params};
    loom_device_arena_init(m->dev, &o->arena, "optimizer");
    loom_arena_reserve(&o->arena, n * sizeof(float));
    loom_arena_reserve(&o->arena, n * sizeof(float));
    LOOM_TRY(loom_arena_commit(&o->arena));
    o->m = loom_arena_alloc(&o->arena, n * sizeof(float));
    o->v = loom_arena_alloc(&o->arena, n * sizeof(float));
    o->runs = calloc((size_t)(m->n_params ? m->n_params : 1), sizeof *o->runs);
    if (!o->runs) return loom_fail(LOOM_EOS, "out of memory for the optimizer");
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *p = &m->params[i];
        const size_t k = p->offset;
        o->runs[i] = (loom_adamw_run){.p = m->param_mem + k,
                                      .g = m->grad_mem + k,
                                      .m = o->m + k,
                                      .v = o->v + k,
                                      .n = p->numel,
                                      .decay = p->decay};
    }
    return LOOM_OK;
}

void loom_adamw_free(loom_adamw *o) {
    free(o->runs);
    o->runs = NULL;
    loom_arena_free(&o->arena);
}

void loom_adamw_step(loom_adamw *o, const loom_adamw_hparams *hp, float lr) {
    o->t++;
    loom_adamw_update_runs(o->dev, hp, o->runs, o->n_runs, o->t, lr, 1.0f, 0);
}

float loom_lr_at(const loom_train_config *c, int s) {
    if (c->warmup > 0 && s < c->warmup) return c->lr * (float)(s + 1) / (float)c->warmup;
    int span = c->steps - c->warmup - 1;
    if (span <= 0) return c->lr;
    double progress = (double)(s - c->warmup) / span; /* 0 .. 1 */
    double coeff = 0.5 * (1.0 + cos(M_PI * progress));
    double lo = c->lr * c->min_lr_frac;
    return (float)(lo + coeff * (c->lr - lo));
}
