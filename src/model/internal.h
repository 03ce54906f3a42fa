/* internal.h - shared between the model's files; not public API. */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include "loom/model.h"

/* Upper bound of table rows for a part. */
int loom_gpt_max_params(const loom_model_config *cfg, const loom_model_part *part);
/* Fill m->params for m->cfg / m->part; returns floats of the flat buffer. */
size_t loom_gpt_build_table(loom_gpt *m);
/* Bind every unit's views to param_mem / grad_mem. */
void loom_gpt_bind_all(loom_gpt *m);

/* Append one table row (params.c's cut of a global (r, c) tensor; c = 0: 1-D). */
void loom_gpt_add_param(loom_gpt *m, size_t *off, const char *name, int64_t r, int64_t c, int split_dim,
                        int parts, int64_t valid, loom_init_kind init, float std, int sp_partial, int unit);

/* ---- MoE blocks (moe.c) ---- */
struct cJSON;
/* Config: a built-in "<base>-moe" (1 if name is one, cfg filled); a config.json key
 * (*handled = 1 if the key is an MoE key; LOOM_ECONFIG naming it if bad). */
int loom_moe_builtin(const char *name, loom_model_config *cfg);
loom_status loom_moe_config_key(const char *path, const struct cJSON *it, loom_model_config *cfg,
                                int *handled);
/* Table rows of the MoE blocks in [layer_begin, layer_end) beyond the dense MLP's. */
int loom_moe_extra_params(const loom_model_config *cfg, const loom_model_part *part);
/* The rows of MoE block l (instead of mlp.c_fc / mlp.c_proj): the router, and
 * unless the part is expert-parallel its experts; an expert-parallel part
 * adds its local experts of every MoE block after all blocks
 * (loom_moe_add_experts, unit LOOM_UNIT_EXPERTS). */
void loom_moe_add_params(loom_gpt *m, size_t *off, int l, float std, float res_std);
void loom_moe_add_experts(loom_gpt *m, size_t *off, int l, float std, float res_std);
/* State and activations of the part's MoE blocks (after the table is built). */
loom_status loom_moe_create(loom_gpt *m);
void loom_moe_free(struct loom_moe *moe);
/* Bind the expert unit to its own storage when the part has no flat buffer
 * for it (after loom_gpt_bind_all). */
void loom_moe_bind_storage(loom_gpt *m);
/* Point the view named by `suffix` (after "h.<l>.") at v; 1 if it is an MoE tensor. */
int loom_moe_bind(loom_gpt *m, int l, const char *suffix, float *v, int grads);
/* out (N,C) WRITES the MoE MLP of x (N,C) for local block li of slot s:
 * N = m->N rows in training, fewer in an inference forward (forward_only:
 * one routing group, dropless). */
loom_status loom_moe_fwd(loom_gpt *m, loom_gpt_slot *s, int li, int N, const float *x, float *out);
/* dx (N,C) WRITES d(x) from dout (N,C), partial over tp (the caller sums
 * it); keeps what the weight half needs. */
loom_status loom_moe_bwd_input(loom_gpt *m, loom_gpt_slot *s, int li, const float *dout, float *dx);
/* Router and expert gradients (+=) of local block li of slot s; x (N,C)
 * the block's input rows again (re-gathered under SP). */
loom_status loom_moe_bwd_weight(loom_gpt *m, loom_gpt_slot *s, int li, const float *x);
/* The loss weight per token of this backward (the losses' group weight is dloss * N). */
void loom_moe_set_dloss(loom_gpt *m, float dloss);
/* N x (aux + z) summed over the part's MoE blocks for slot s's last forward. */
double loom_moe_loss_sum(const loom_gpt *m, const loom_gpt_slot *s);

#endif
