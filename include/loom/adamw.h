/* adamw.h - the one AdamW driver: a step over runs of parameters, each run
 * a parameter (or the part of one) with its gradient and moments side by
 * side. The engines that drive the model feed it what they update: the DP
 * engine (dp.h) one run per parameter slice of this rank's shard, the
 * expert-data-parallel engine (edp.h) one per local expert tensor, and the
 * single-device reference of the tests (train.h's loom_adamw) one per
 * parameter of the table. Local: no mesh axis, no collective; every run is
 * device memory of the device given.
 *
 * Each run is one adamw_update kernel (kernel_list.h: torch.optim.AdamW,
 * decoupled decay, bias correction, the gradient scaled by grad_scale), in
 * the order given, with weight decay where the run's decay says so. With
 * zero_grads the driver asks for the fused kernel instead (adamw_update_zero:
 * the same p, m and v, and g = 0 in the same pass, the next step's gradient
 * zeroing; and the new p's bf16 bits where a run names p16); a backend
 * without it gets the plain kernel from that run on, and the caller zeroes
 * the gradients itself.
 */
#ifndef LOOM_ADAMW_H
#define LOOM_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "loom/kernels.h"

typedef struct loom_adamw_hparams {
    float beta1, beta2, eps, weight_decay;
} loom_adamw_hparams;

/* n floats of parameters p, their gradients g and AdamW moments m, v. */
typedef struct loom_adamw_run {
    float *p, *g, *m, *v;
    size_t n;
    int decay;     /* weight decay applies (the parameter table's decay) */
    uint16_t *p16; /* NULL, or where the fused kernel writes the new p's bf16 bits (n) */
} loom_adamw_run;

/* One AdamW step over runs[0 .. n_runs) on dev: t is the 1-based step
 * count, lr the learning rate, grad_scale the clip factor (1: unclipped).
 * zero_grads: use the fused update that zeroes each g (see above). Returns
 * 1 when it did so for every run (p16 written where given), 0 when any run
 * took the plain kernel (or zero_grads was 0). */
int loom_adamw_update_runs(loom_device *dev, const loom_adamw_hparams *hp, const loom_adamw_run *runs,
                           int n_runs, int t, float lr, float grad_scale, int zero_grads);

#endif
