/* moe_config.c - the Mixture-of-Experts configuration (include/loom/moe.h):
 * which layers are MoE, sizes, capacity, config.json keys in Mixtral's
 * spelling and the built-in models. Local, no model state: config.c and its
 * fuzz harness (tests/fuzz) link it without the MoE blocks. */
#include "loom/moe.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- config ---------------------------------------------------------------- */

int loom_moe_layer(const loom_model_config *c, int l) {
    return c->n_expert > 0 && l >= c->moe_first && (l + 1) % (c->moe_every > 0 ? c->moe_every : 1) == 0;
}

int loom_moe_has_bias(const loom_model_config *c) {
    return c->n_expert > 0 && (c->bias_rate > 0 || c->moe_sigmoid);
}

int loom_moe_hidden(const loom_model_config *c) {
    return c->expert_hidden > 0 ? c->expert_hidden : 4 * c->n_embd;
}

int loom_moe_capacity(const loom_model_config *c, int N) {
    if (c->capacity_factor <= 0) return N;
    double cap = ceil((double)c->capacity_factor * N * c->top_k / c->n_expert);
    return cap > N ? N : (int)cap;
}

double loom_moe_active_params_delta(const loom_model_config *c) {
    double d = 0, C = c->n_embd, H = loom_moe_hidden(c);
    for (int l = 0; l < c->n_layer; l++)
        if (loom_moe_layer(c, l)) d += C * c->n_expert + c->top_k * 2.0 * C * H - 8.0 * C * C;
    return d;
}

loom_status loom_moe_config_check(const loom_model_config *c) {
    if (c->n_expert == 0) return LOOM_OK;
    if (c->n_expert < 1 || c->n_expert > 1024)
        return loom_fail(LOOM_ECONFIG, "model %s: num_local_experts=%d must be in [1, 1024]", c->name,
                         c->n_expert);
    if (c->top_k < 1 || c->top_k > c->n_expert)
        return loom_fail(LOOM_ECONFIG,
                         "model %s: num_experts_per_tok=%d must be in [1, num_local_experts=%d]", c->name,
                         c->top_k, c->n_expert);
    if (c->moe_every < 1 || c->moe_every > c->n_layer)
        return loom_fail(LOOM_ECONFIG, "model %s: moe_layer_freq=%d must be in [1, n_layer=%d]", c->name,
                         c->moe_every, c->n_layer);
    if (c->expert_hidden < 0 || c->expert_hidden > 1 << 20)
        return loom_fail(LOOM_ECONFIG, "model %s: moe_intermediate_size=%d out of range", c->name,
                         c->expert_hidden);
    if (!(c->aux_coef >= 0) || !(c->z_coef >= 0) || !(c->capacity_factor >= 0) || c->capacity_factor > 1e6 ||
        !(c->bias_rate >= 0))
        return loom_fail(LOOM_ECONFIG,
                         "model %s: router_aux_loss_coef=%g, router_z_loss_coef=%g, "
                         "capacity_factor=%g and aux_free_bias_rate=%g must be >= 0",
                         c->name, c->aux_coef, c->z_coef, c->capacity_factor, c->bias_rate);
    if (c->moe_sigmoid && (c->aux_coef > 0 || c->z_coef > 0))
        return loom_fail(LOOM_ECONFIG,
                         "model %s: sigmoid router scores take no router_aux_loss_coef (%g) or "
                         "router_z_loss_coef (%g); balance with aux_free_bias_rate",
                         c->name, c->aux_coef, c->z_coef);
    if (!(c->routed_scale >= 0) || c->routed_scale > 1e6)
        return loom_fail(LOOM_ECONFIG, "model %s: routed_scaling_factor=%g must be > 0", c->name,
                         (double)c->routed_scale);
    return LOOM_OK;
}

static void moe_defaults(loom_model_config *c, int n_expert) {
    c->n_expert = n_expert;
    c->top_k = 2;
    c->moe_every = 1;
    c->expert_hidden = 0;
    c->norm_topk = 1;
    c->aux_coef = 0.01f;
    c->z_coef = 0.0f;
    c->capacity_factor = 0.0f;
    c->bias_rate = 0.0f;
}

int loom_moe_builtin(const char *name, loom_model_config *cfg) {
    static const struct {
        const char *name, *base;
        int n_expert;
    } MOE[] = {
        {"tiny-moe", "tiny", 4}, /* tests */
        {"mini-moe", "mini", 8}, /* 8 experts, top-2 */
    };
    for (size_t i = 0; i < sizeof MOE / sizeof MOE[0]; i++) {
        if (strcmp(name, MOE[i].name) != 0) continue;
        if (loom_model_config_builtin(MOE[i].base, cfg) != LOOM_OK) return 0;
        snprintf(cfg->name, sizeof cfg->name, "%s", MOE[i].name);
        moe_defaults(cfg, MOE[i].n_expert);
        return 1;
    }
    return 0;
}

loom_status loom_moe_config_key(const char *path, const cJSON *it, loom_model_config *cfg, int *handled) {
    const struct {
        const char *key;
        int *i;
        float *f;
    } KEYS[] = {
        {"num_local_experts", &cfg->n_expert, NULL},
        {"num_experts_per_tok", &cfg->top_k, NULL},
        {"moe_layer_freq", &cfg->moe_every, NULL},
        {"moe_intermediate_size", &cfg->expert_hidden, NULL},
        {"router_aux_loss_coef", NULL, &cfg->aux_coef},
        {"router_z_loss_coef", NULL, &cfg->z_coef},
        {"capacity_factor", NULL, &cfg->capacity_factor},
        {"aux_free_bias_rate", NULL, &cfg->bias_rate},
    };
    *handled = 1;
    if (cfg->n_expert == 0 && cfg->top_k == 0) { /* first MoE key: the defaults, then the key */
        moe_defaults(cfg, 0);
    }
    if (strcmp(it->string, "norm_topk_prob") == 0) {
        if (!cJSON_IsBool(it))
            return loom_fail(LOOM_ECONFIG, "%s: \"norm_topk_prob\" must be true or false", path);
        cfg->norm_topk = cJSON_IsTrue(it);
        return LOOM_OK;
    }
    if (strcmp(it->string, "output_router_logits") == 0) return LOOM_OK; /* HF: an output option */
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++) {
        if (strcmp(it->string, KEYS[i].key) != 0) continue;
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || !(v >= 0 && v <= 1e9) || (KEYS[i].i && v != floor(v)))
            return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be a non-negative %s", path, KEYS[i].key,
                             KEYS[i].i ? "integer" : "number");
        if (KEYS[i].i) *KEYS[i].i = (int)v;
        else *KEYS[i].f = (float)v;
        return LOOM_OK;
    }
    *handled = 0;
    return LOOM_OK;
}
