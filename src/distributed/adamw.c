/* adamw.c - the AdamW driver of include/loom/adamw.h: one kernel per
 * parameter run, fused with the gradient zeroing where asked and the
 * backend has it. No mesh axis; local, no collectives.
 */
#include "loom/adamw.h"

int loom_adamw_update_runs(loom_device *dev, const loom_adamw_hparams *hp, const loom_adamw_run *runs,
                           int n_runs, int t, float lr, float grad_scale, int zero_grads) {
    int zeroed = zero_grads;
    for (int i = 0; i < n_runs; i++) {
        const loom_adamw_run *r = &runs[i];
        const float wd = r->decay ? hp->weight_decay : 0.0f;
        if (!zeroed || !loom_adamw_update_zero(dev, r->p, r->g, r->m, r->v, r->n, lr, hp->beta1, hp->beta2,
                                               hp->eps, wd, t, grad_scale, r->p16)) {
            loom_adamw_update(dev, r->p, r->g, r->m, r->v, r->n, lr, hp->beta1, hp->beta2, hp->eps, wd, t,
                              grad_scale);
            zeroed = 0; /* no fused kernel: the plain one from here on */
        }
    }
    return zeroed;
}
