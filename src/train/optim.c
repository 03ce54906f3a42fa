/* optim.c - AdamW over the parameter table and the learning-rate schedule.
 * Local compute only. The state (m, v) is one arena, sized once. */
#include <math.h>

#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/train.h"

loom_status loom_adamw_create(loom_adamw *o, const loom_device *dev, size_t n) {
    loom_device_arena_init(dev, &o->arena, "optimizer");
    loom_arena_reserve(&o->arena, n * sizeof(float));
    loom_arena_reserve(&o->arena, n * sizeof(float));
    LOOM_TRY(loom_arena_commit(&o->arena));
    o->m = loom_arena_alloc(&o->arena, n * sizeof(float));
    o->v = loom_arena_alloc(&o->arena, n * sizeof(float));
    o->n = n;
    o->t = 0;
    return LOOM_OK;
}

void loom_adamw_free(loom_adamw *o) { loom_arena_free(&o->arena); }

void loom_adamw_step(loom_adamw *o, loom_gpt *m, float lr, float beta1, float beta2, float eps,
                     float wd) {
    o->t++;
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *p = &m->params[i];
        size_t k = p->offset;
        loom_adamw_update(m->dev, m->param_mem + k, m->grad_mem + k, o->m + k, o->v + k, p->numel, lr,
                          beta1, beta2, eps, p->decay ? wd : 0.0f, o->t, 1.0f);
    }
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
