/* internal.h - shared between the model's files; not public API. */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include "loom/model.h"

/* Upper bound of table rows for a part. */
int loom_gpt_max_params(const loom_model_config *cfg, const loom_model_part *part);
/* Fill m->params for m->cfg / m->part; returns floats of the flat buffer. */
size_t loom_gpt_build_table(loom_gpt *m);
/* The suffix of a block tensor's name after its block's prefix ("h.<l>." or
 * "model.layers.<l>."), with *layer set; NULL for a tensor outside the blocks. */
const char *loom_param_block(const loom_model_config *cfg, const char *name, int *layer);
/* Bind every unit's views to param_mem / grad_mem. */
void loom_gpt_bind_all(loom_gpt *m);

/* Append one table row (params.c's cut of a global (r, c) tensor; c = 0: 1-D). */
void loom_gpt_add_param(loom_gpt *m, size_t *off, const char *name, int64_t r, int64_t c, int split_dim,
                        int parts, int64_t valid, loom_init_kind init, float std, int sp_partial, int unit);

/* ---- a block's parts (parts.c): each runs the kernel the config names ---- */
/* loom_part_norm_fwd: model.h (inference's final norm calls it too); backward +=. */
void loom_part_norm_bwd(const loom_gpt *m, float *dx, float *dw, float *db, const float *dout, const float *x,
                        const float *w, const float *mean, const float *rstd, int N);
/* out (N,OC) = x (N,K) times the weight (Conv1D (K,OC) or nn.Linear (OC,K)) + b; backward +=. */
void loom_part_linear_fwd(const loom_gpt *m, float *out, const float *x, const float *w, const float *b,
                          int N, int K, int OC);
void loom_part_linear_bwd(const loom_gpt *m, float *dx, float *dw, float *db, const float *dout,
                          const float *x, const float *w, int N, int K, int OC);
/* h (N,H_l) WRITES the activation of fc (N,FC_l); dfc (N,FC_l) WRITES its gradient from dh. */
void loom_part_act_fwd(const loom_gpt *m, float *h, const float *fc, int N);
void loom_part_act_bwd(const loom_gpt *m, float *dfc, const float *fc, const float *dh, int N);
/* out (N,C) += res + bias (bias may be NULL). */
void loom_part_residual(const loom_gpt *m, float *out, const float *res, const float *bias, int N);
/* Rotary positions of m->pos on the q and k heads of qkv (N,QKV_l), in place
 * (inverse: the backward); nothing without RoPE. */
void loom_part_rope(const loom_gpt *m, float *qkv, int N, int inverse);
/* db (QKV_l) += the q|k|v bias gradient from dqkv (N,QKV_l); db may be NULL. */
void loom_part_qkv_bias_grad(const loom_gpt *m, float *db, const float *dqkv, int N);
/* The causal attention view of the part's qkv (B,T,QKV_l): its heads, groups and window. */
loom_att_view loom_part_att_view(const loom_gpt *m, const float *qkv, int B, int T);

/* ---- the Llama family's config (config_hf.c) ---- */
struct cJSON;
/* A built-in Llama-family shape (1 if name is one, cfg filled), and their names. */
int loom_llama_builtin(const char *name, loom_model_config *cfg);
const char *loom_llama_builtin_names(void);
/* 1 if a config.json key never changes the math (generation settings, ids, dtypes, dropout). */
int loom_hf_key_ignored(const char *key);
/* cfg from a parsed config.json of model_type arch (llama, mistral, qwen2). */
loom_status loom_hf_config_parse(const char *path, const struct cJSON *root, const char *arch,
                                 loom_model_config *cfg);
/* The block parts' rules (part of loom_model_config_check). */
loom_status loom_model_parts_check(const loom_model_config *cfg);

/* ---- MoE blocks (moe.c) ---- */
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
