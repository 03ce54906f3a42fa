/* nan.c - what a step with a non-finite loss or gradient does: name the
 * first parameter whose gradient is non-finite, then abort or skip the
 * update (--nan-policy). Collective over the world. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/log.h"
#include "train/internal.h"

const char *const loom_nan_policy_names[] = {"abort", "skip", NULL};

/* The index in the whole-model table of this rank's first non-finite
 * gradient, INT32_MAX if none. */
static int32_t first_bad(const loom_train_run_state *s, const loom_param *table, int n) {
    for (int i = 0; i < n; i++)
        for (int part = 0; part < s->n_parts; part++) {
            const loom_gpt *m = s->parts[part];
            for (int k = 0; k < m->n_params; k++)
                if (strcmp(m->params[k].name, table[i].name) == 0 && !loom_dp_grad_finite(s->dp, part, k))
                    return i;
        }
    return INT32_MAX;
}

loom_status loom_train_nonfinite(loom_train_run_state *s, int step, double loss, double grad_norm) {
    loom_param *table = NULL;
    int n = 0;
    size_t total;
    loom_status st = loom_param_table_whole(&s->parts[0]->cfg, &table, &n, &total);
    int32_t idx = st == LOOM_OK ? first_bad(s, table, n) : INT32_MAX;
    /* every rank reaches this together: the loss and the norm are global */
    loom_status cst = loom_comm_allreduce(s->mesh->world, &idx, 1, LOOM_I32, LOOM_MIN);
    char what[LOOM_PARAM_NAME_MAX + 64];
    if (idx != INT32_MAX) snprintf(what, sizeof what, "first non-finite gradient in %s", table[idx].name);
    else snprintf(what, sizeof what, "every parameter gradient finite");
    free(table);
    if (cst != LOOM_OK) return cst;
    if (s->cfg->nan_policy == LOOM_NAN_POLICY_SKIP) {
        if (s->mesh->rank == 0)
            loom_warn("step %d: non-finite %s (loss %g, grad norm %g; %s): update skipped "
                      "(--nan-policy skip)",
                      step + 1, isfinite(loss) ? "gradient" : "loss", loss, grad_norm, what);
        return LOOM_OK;
    }
    st = loom_fail(LOOM_EDATA,
                   "step %d: non-finite %s (loss %g, grad norm %g; %s); stopping before "
                   "the update, nothing saved (try a lower --lr, or --nan-policy skip)",
                   step + 1, isfinite(loss) ? "gradient" : "loss", loss, grad_norm, what);
    if (s->mesh->rank != 0) loom_clear_error(); /* seen by all: rank 0 reports */
    return st;
}
