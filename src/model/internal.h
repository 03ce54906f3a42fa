/* internal.h - shared between the model's files; not public API. */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include "loom/model.h"

/* Upper bound of table rows for a part. */
int loom_gpt_max_params(const loom_model_part *part);
/* Fill m->params for m->cfg / m->part; returns floats of the flat buffer. */
size_t loom_gpt_build_table(loom_gpt *m);
/* Bind every unit's views to param_mem / grad_mem. */
void loom_gpt_bind_all(loom_gpt *m);

#endif
