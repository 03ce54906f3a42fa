/* config_hf.c - the Llama family's config.json (model_type llama, mistral,
 * qwen2) into a loom_model_config, the Llama family's built-in shapes, and
 * the derived sizes every module asks of a config. Local, no collectives.
 *
 * Each model_type has Hugging Face's class defaults for the keys a config
 * may leave out; the size keys are required. A key is either read (it
 * changes the math), accepted only at the value loom computes (hidden_act
 * "silu", head_dim = hidden_size / heads, mlp_bias false, ...), ignored
 * (generation settings, ids, dtypes, dropout - loom trains without dropout,
 * as it does GPT-2) or refused by name.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/model.h"
#include "loom/moe.h"
#include "model/internal.h"

int loom_model_kv_heads(const loom_model_config *c) { return c->n_kv_head > 0 ? c->n_kv_head : c->n_head; }
int loom_model_head_size(const loom_model_config *c) { return c->n_head > 0 ? c->n_embd / c->n_head : 0; }
int loom_model_ffn(const loom_model_config *c) { return c->ffn > 0 ? c->ffn : 4 * c->n_embd; }
const char *loom_model_embed_name(const loom_model_config *c) {
    return c->family == LOOM_FAMILY_LLAMA ? "model.embed_tokens.weight" : "wte.weight";
}

void loom_model_rope_freqs(const loom_model_config *c, float *out) {
    const int HS = loom_model_head_size(c);
    for (int i = 0; i < HS / 2; i++) {
        float e = (float)(2 * i) / (float)HS;
        float f = 1.0f / powf(c->rope_theta > 0 ? c->rope_theta : 10000.0f, e);
        if (c->rope_factor > 0) { /* Llama 3: long wavelengths slowed down, a smooth ramp between */
            const float pi = 3.14159265358979323846f, old = (float)c->rope_orig_max;
            float wavelen = 2.0f * pi / f, lo_wl = old / c->rope_low_freq, hi_wl = old / c->rope_high_freq;
            float scaled = wavelen > lo_wl ? f / c->rope_factor : f;
            if (!(wavelen < hi_wl) && !(wavelen > lo_wl)) {
                float s = (old / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                scaled = (1.0f - s) * scaled / c->rope_factor + s * scaled;
            }
            f = scaled;
        }
        out[i] = f;
    }
}

/* ---- built-in shapes ------------------------------------------------------- */

typedef struct {
    const char *name, *arch;
    int n_layer, n_head, n_kv_head, n_embd, ffn, vocab_size, n_positions, window;
    float theta;
} llama_builtin;

/* Tiny ones for tests; the published sizes for plan and sim. */
static const llama_builtin LLAMA_BUILTINS[] = {
    {"tiny-llama", "llama", 2, 4, 2, 64, 176, 256, 256, 0, 10000.0f},
    {"tiny-mistral", "mistral", 2, 4, 2, 64, 176, 256, 256, 32, 10000.0f},
    {"tiny-qwen2", "qwen2", 2, 4, 2, 64, 176, 256, 256, 0, 1000000.0f},
    {"llama3-8b", "llama", 32, 32, 8, 4096, 14336, 128256, 8192, 0, 500000.0f},
    {"llama3-70b", "llama", 80, 64, 8, 8192, 28672, 128256, 8192, 0, 500000.0f},
    {"llama3-405b", "llama", 126, 128, 8, 16384, 53248, 128256, 8192, 0, 500000.0f},
    {"mistral-7b", "mistral", 32, 32, 8, 4096, 14336, 32000, 32768, 4096, 10000.0f},
    {"qwen2-7b", "qwen2", 28, 28, 4, 3584, 18944, 152064, 32768, 0, 1000000.0f},
};

/* The parts every model_type of the family shares, at its class defaults. */
static void llama_parts(loom_model_config *c, const char *arch) {
    c->family = LOOM_FAMILY_LLAMA;
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    c->norm = LOOM_NORM_RMS;
    c->norm_eps = 1e-6f;
    c->mlp = LOOM_MLP_SWIGLU;
    c->rope = 1;
    c->rope_theta = 10000.0f;
    c->untied = 1;
    c->qkv_bias = c->o_bias = 0;
    if (!strcmp(arch, "qwen2")) c->qkv_bias = 1; /* Qwen2: q, k, v with biases, o_proj without */
    if (!strcmp(arch, "mixtral")) { /* every block's MLP: softmax top-2 of 8 SwiGLU experts, renormalised */
        c->n_expert = 8, c->top_k = 2, c->moe_every = 1, c->norm_topk = 1;
        c->aux_coef = c->z_coef = c->capacity_factor = c->bias_rate = 0; /* dropless, no aux loss */
    }
    if (!strcmp(arch, "qwen2_moe")) { /* Qwen2-MoE: 60 experts, top 4, not renormalised, a shared expert */
        c->qkv_bias = 1;
        c->n_expert = 60, c->top_k = 4, c->moe_every = 1, c->norm_topk = 0;
        c->expert_hidden = 1408, c->shared_hidden = 5632;
        c->aux_coef = c->z_coef = c->capacity_factor = c->bias_rate = 0;
    }
}

int loom_llama_builtin(const char *name, loom_model_config *cfg) {
    for (size_t i = 0; i < sizeof LLAMA_BUILTINS / sizeof LLAMA_BUILTINS[0]; i++) {
        const llama_builtin *b = &LLAMA_BUILTINS[i];
        if (strcmp(b->name, name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        snprintf(cfg->name, sizeof cfg->name, "%s", b->name);
        llama_parts(cfg, b->arch);
        cfg->n_layer = b->n_layer;
        cfg->n_head = b->n_head;
        cfg->n_kv_head = b->n_kv_head;
        cfg->n_embd = b->n_embd;
        cfg->ffn = b->ffn;
        cfg->vocab_size = b->vocab_size;
        cfg->n_positions = b->n_positions;
        cfg->window = b->window;
        cfg->rope_theta = b->theta;
        if (!strcmp(b->name, "llama3-405b") || !strcmp(b->name, "llama3-70b") ||
            !strcmp(b->name, "llama3-8b")) {
            cfg->rope_factor = 8.0f, cfg->rope_low_freq = 1.0f, cfg->rope_high_freq = 4.0f;
            cfg->rope_orig_max = 8192;
            cfg->n_positions = 131072;
            cfg->norm_eps = 1e-5f;
        }
        return 1;
    }
    return 0;
}

const char *loom_llama_builtin_names(void) {
    return "tiny-llama, tiny-mistral, tiny-qwen2, llama3-8b, llama3-70b, llama3-405b, mistral-7b, qwen2-7b";
}

/* ---- config.json ------------------------------------------------------------ */

/* Keys of every PretrainedConfig (and the family's) that do not change the
 * math of training or inference. */
static const char *IGNORED[] = {
    "architectures",
    "model_type",
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "initializer_range",
    "attention_dropout",
    "pretraining_tp",
    "tokenizer_class",
    "prefix",
    "id2label",
    "label2id",
    "_num_labels",
    "num_labels",
    "task_specific_params",
    "problem_type",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "use_bfloat16",
    "tf_legacy_loss",
    "pruned_heads",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "is_decoder",
    "finetuning_task",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "_commit_hash",
    "_attn_implementation",
    "_attn_implementation_internal",
    "name",
    "gradient_checkpointing",
    "output_router_logits",
    "max_window_layers",
    "tie_encoder_decoder",
    "cross_attention_hidden_size",
    "add_cross_attention",
};

int loom_hf_key_ignored(const char *key) {
    for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++)
        if (strcmp(key, IGNORED[i]) == 0) return 1;
    return 0;
}

static loom_status want_int(const char *path, const cJSON *it, int lo, int *out) {
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !(v >= lo && v <= 1e9) || v != floor(v))
        return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be an integer >= %d", path, it->string, lo);
    *out = (int)v;
    return LOOM_OK;
}

static loom_status want_pos(const char *path, const cJSON *it, float *out) {
    if (!cJSON_IsNumber(it) || !(it->valuedouble > 0) || !(it->valuedouble < 1e30))
        return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be a positive number", path, it->string);
    *out = (float)it->valuedouble;
    return LOOM_OK;
}

static loom_status want_bool(const char *path, const cJSON *it, int *out) {
    if (!cJSON_IsBool(it))
        return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be true or false", path, it->string);
    *out = cJSON_IsTrue(it);
    return LOOM_OK;
}

/* rope_scaling: null, or Llama 3's {"rope_type" (or "type"): "llama3", factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings}. */
static loom_status rope_scaling(const char *path, const cJSON *it, loom_model_config *c) {
    if (cJSON_IsNull(it)) return LOOM_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (!cJSON_IsObject(it) || !cJSON_IsString(type) || strcmp(type->valuestring, "llama3") != 0)
        return loom_fail(LOOM_ECONFIG,
                         "%s: \"rope_scaling\" of type %s is not supported (null or \"llama3\")", path,
                         cJSON_IsString(type) ? type->valuestring : "(none)");
    for (const cJSON *k = it->child; k; k = k->next) {
        loom_status st = LOOM_OK;
        if (!strcmp(k->string, "factor")) st = want_pos(path, k, &c->rope_factor);
        else if (!strcmp(k->string, "low_freq_factor")) st = want_pos(path, k, &c->rope_low_freq);
        else if (!strcmp(k->string, "high_freq_factor")) st = want_pos(path, k, &c->rope_high_freq);
        else if (!strcmp(k->string, "original_max_position_embeddings"))
            st = want_int(path, k, 1, &c->rope_orig_max);
        else if (strcmp(k->string, "rope_type") && strcmp(k->string, "type"))
            st = loom_fail(LOOM_ECONFIG, "%s: unknown key \"rope_scaling.%s\"", path, k->string);
        LOOM_TRY(st);
    }
    if (!(c->rope_factor > 0 && c->rope_low_freq > 0 && c->rope_high_freq > c->rope_low_freq &&
          c->rope_orig_max > 0))
        return loom_fail(LOOM_ECONFIG,
                         "%s: \"rope_scaling\" llama3 needs factor, low_freq_factor < high_freq_factor and "
                         "original_max_position_embeddings",
                         path);
    return LOOM_OK;
}

/* Keys accepted only at the value loom computes. */
static loom_status fixed_key(const char *path, const cJSON *it, const loom_model_config *c, int *handled) {
    const char *k = it->string;
    *handled = 1;
    if (!strcmp(k, "hidden_act")) {
        if (!cJSON_IsString(it) || strcmp(it->valuestring, "silu") != 0)
            return loom_fail(LOOM_ECONFIG, "%s: \"hidden_act\" must be \"silu\" (SwiGLU)", path);
    } else if (!strcmp(k, "mlp_bias")) {
        if (!cJSON_IsFalse(it)) return loom_fail(LOOM_ECONFIG, "%s: \"mlp_bias\" must be false", path);
    } else if (!strcmp(k, "router_jitter_noise")) {
        if (!cJSON_IsNumber(it) || it->valuedouble != 0)
            return loom_fail(LOOM_ECONFIG, "%s: \"router_jitter_noise\" must be 0", path);
    } else if (!strcmp(k, "head_dim")) {
        if (!cJSON_IsNull(it) &&
            !(cJSON_IsNumber(it) && c->n_head > 0 && it->valuedouble * c->n_head == c->n_embd))
            return loom_fail(LOOM_ECONFIG, "%s: \"head_dim\" must be hidden_size / num_attention_heads",
                             path);
    } else if (!strcmp(k, "use_sliding_window")) {
        if (!cJSON_IsFalse(it))
            return loom_fail(LOOM_ECONFIG, "%s: \"use_sliding_window\" true is not supported for %s", path,
                             c->arch);
    } else {
        *handled = 0;
    }
    return LOOM_OK;
}

/* One key of a Llama-family config.json. */
static loom_status want_nonneg(const char *path, const cJSON *it, float *out) {
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0) || !(it->valuedouble < 1e30))
        return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be a number >= 0", path, it->string);
    *out = (float)it->valuedouble;
    return LOOM_OK;
}

/* One key of a Llama-family config.json (Mixtral's router_aux_loss_coef to
 * *aux, output_router_logits to *use_aux: Hugging Face adds the aux loss
 * to the loss only with it). */
static loom_status llama_key(const char *path, const cJSON *it, loom_model_config *c, float *aux,
                             int *use_aux) {
    const char *k = it->string;
    const struct {
        const char *key;
        int *dst, lo;
    } INTS[] = {
        {"hidden_size", &c->n_embd, 1},
        {"num_hidden_layers", &c->n_layer, 1},
        {"num_attention_heads", &c->n_head, 1},
        {"num_key_value_heads", &c->n_kv_head, 1},
        {"intermediate_size", &c->ffn, 1},
        {"vocab_size", &c->vocab_size, 2},
        {"max_position_embeddings", &c->n_positions, 1},
    };
    for (size_t i = 0; i < sizeof INTS / sizeof INTS[0]; i++)
        if (!strcmp(k, INTS[i].key)) return want_int(path, it, INTS[i].lo, INTS[i].dst);
    if (c->n_expert > 0) { /* Mixtral's and Qwen2-MoE's experts */
        if (!strcmp(k, "num_local_experts") || !strcmp(k, "num_experts"))
            return want_int(path, it, 1, &c->n_expert);
        if (!strcmp(k, "num_experts_per_tok")) return want_int(path, it, 1, &c->top_k);
        if (!strcmp(k, "router_aux_loss_coef")) return want_nonneg(path, it, aux);
        if (!strcmp(k, "output_router_logits")) return want_bool(path, it, use_aux);
        if (!strcmp(k, "moe_intermediate_size")) return want_int(path, it, 1, &c->expert_hidden);
        if (!strcmp(k, "shared_expert_intermediate_size")) return want_int(path, it, 1, &c->shared_hidden);
        if (!strcmp(k, "decoder_sparse_step")) return want_int(path, it, 1, &c->moe_every);
        if (!strcmp(k, "norm_topk_prob")) return want_bool(path, it, &c->norm_topk);
        if (!strcmp(k, "mlp_only_layers")) {
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 0)
                return loom_fail(LOOM_ECONFIG,
                                 "%s: \"mlp_only_layers\" must be [] (loom places MoE blocks "
                                 "by decoder_sparse_step only)",
                                 path);
            return LOOM_OK;
        }
    }
    int handled = 0, tie = 0;
    LOOM_TRY(fixed_key(path, it, c, &handled));
    if (handled || loom_hf_key_ignored(k)) return LOOM_OK;
    if (!strcmp(k, "rms_norm_eps")) return want_pos(path, it, &c->norm_eps);
    if (!strcmp(k, "rope_theta")) return want_pos(path, it, &c->rope_theta);
    if (!strcmp(k, "rope_scaling")) return rope_scaling(path, it, c);
    if (!strcmp(k, "initializer_range")) return want_pos(path, it, &c->init_std);
    if (!strcmp(k, "tie_word_embeddings")) {
        LOOM_TRY(want_bool(path, it, &tie));
        c->untied = !tie;
        return LOOM_OK;
    }
    if (!strcmp(k, "attention_bias") && !strcmp(c->arch, "llama")) {
        LOOM_TRY(want_bool(path, it, &c->qkv_bias));
        c->o_bias = c->qkv_bias;
        return LOOM_OK;
    }
    if (!strcmp(k, "sliding_window") && strcmp(c->arch, "llama") != 0) {
        if (cJSON_IsNull(it)) return LOOM_OK;
        return want_int(path, it, 1, &c->window);
    }
    return loom_fail(LOOM_ECONFIG, "%s: unknown key \"%s\" for model_type %s", path, k, c->arch);
}

/* Hugging Face's defaults of the keys a config may leave out. */
static void class_defaults(loom_model_config *c) {
    if (!strcmp(c->arch, "llama")) c->n_positions = 2048;
    if (!strcmp(c->arch, "mistral")) c->n_positions = 4096 * 32, c->window = 4096;
    if (!strcmp(c->arch, "qwen2")) c->n_positions = 32768;
    if (!strcmp(c->arch, "mixtral")) c->n_positions = 4096 * 32;
    if (!strcmp(c->arch, "qwen2_moe")) c->n_positions = 8192;
}

loom_status loom_hf_config_parse(const char *path, const cJSON *root, const char *arch,
                                 loom_model_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", path);
    llama_parts(c, arch);
    class_defaults(c);
    /* Qwen2 (in Hugging Face 4.40) masks with its sliding_window only under
     * use_sliding_window, which loom refuses; its sliding_window is ignored */
    const int qwen = !strcmp(arch, "qwen2") || !strcmp(arch, "qwen2_moe");
    float aux = 0.001f; /* MixtralConfig's default */
    int use_aux = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (qwen && !strcmp(it->string, "sliding_window")) continue;
        LOOM_TRY(llama_key(path, it, c, &aux, &use_aux));
    }
    if (c->n_expert > 0) { /* Mixtral: the experts are intermediate_size wide */
        if (!strcmp(arch, "mixtral")) c->expert_hidden = c->ffn;
        c->aux_coef = use_aux ? aux : 0.0f;
    }
    const char *need[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                          "vocab_size"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!cJSON_GetObjectItemCaseSensitive(root, need[i]))
            return loom_fail(LOOM_ECONFIG, "%s: missing \"%s\"", path, need[i]);
    return LOOM_OK;
}

/* The parts' own rules (loom_model_config_check calls it). */
loom_status loom_model_parts_check(const loom_model_config *c) {
    const int kv = loom_model_kv_heads(c), HS = loom_model_head_size(c);
    if (c->family == LOOM_FAMILY_GPT2) {
        if (c->norm || c->mlp || c->rope || c->n_kv_head || c->untied || c->window || c->ffn)
            return loom_fail(LOOM_ECONFIG, "model %s: a GPT-2 model has GPT-2's block parts", c->name);
        return LOOM_OK;
    }
    if (c->n_head % kv)
        return loom_fail(LOOM_ECONFIG,
                         "model %s: num_key_value_heads=%d does not divide num_attention_heads=%d", c->name,
                         kv, c->n_head);
    if (HS % 2 || HS > 256)
        return loom_fail(LOOM_ECONFIG,
                         "model %s: head size %d (hidden_size / num_attention_heads) must be even "
                         "and at most 256",
                         c->name, HS);
    if (c->ffn < 1 || c->ffn > 1 << 20)
        return loom_fail(LOOM_ECONFIG, "model %s: intermediate_size=%d out of range", c->name, c->ffn);
    if (!(c->norm_eps > 0) || !(c->rope_theta > 1))
        return loom_fail(LOOM_ECONFIG, "model %s: rms_norm_eps=%g must be > 0 and rope_theta=%g > 1", c->name,
                         (double)c->norm_eps, (double)c->rope_theta);
    if (c->window < 0) return loom_fail(LOOM_ECONFIG, "model %s: sliding_window=%d", c->name, c->window);
    return LOOM_OK;
}

/* ---- writing config.json ------------------------------------------------------ */

static const char *hf_class(const char *arch) {
    if (!strcmp(arch, "mistral")) return "MistralForCausalLM";
    if (!strcmp(arch, "qwen2")) return "Qwen2ForCausalLM";
    if (!strcmp(arch, "mixtral")) return "MixtralForCausalLM";
    if (!strcmp(arch, "qwen2_moe")) return "Qwen2MoeForCausalLM";
    return "LlamaForCausalLM";
}

/* The Llama family's keys of c into root. */
static void llama_write(const loom_model_config *c, cJSON *root) {
    cJSON *arr = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arr, cJSON_CreateString(hf_class(c->arch)));
    cJSON_AddStringToObject(root, "model_type", c->arch);
    cJSON_AddNumberToObject(root, "hidden_size", c->n_embd);
    cJSON_AddNumberToObject(root, "intermediate_size", loom_model_ffn(c));
    cJSON_AddNumberToObject(root, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(root, "num_key_value_heads", loom_model_kv_heads(c));
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(root, "max_position_embeddings", c->n_positions);
    cJSON_AddNumberToObject(root, "rms_norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(root, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(root, "initializer_range", c->init_std > 0 ? c->init_std : 0.02);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON_AddBoolToObject(root, "tie_word_embeddings", !c->untied);
    cJSON_AddStringToObject(root, "torch_dtype", "float32");
    if (!strcmp(c->arch, "llama")) cJSON_AddBoolToObject(root, "attention_bias", c->qkv_bias);
    if (!strcmp(c->arch, "mixtral")) {
        cJSON_AddNumberToObject(root, "num_local_experts", c->n_expert);
        cJSON_AddNumberToObject(root, "num_experts_per_tok", c->top_k);
        cJSON_AddNumberToObject(root, "router_aux_loss_coef", c->aux_coef);
        cJSON_AddBoolToObject(root, "output_router_logits", c->aux_coef > 0);
        cJSON_AddNumberToObject(root, "router_jitter_noise", 0);
    }
    if (!strcmp(c->arch, "qwen2_moe")) {
        cJSON_AddNumberToObject(root, "num_experts", c->n_expert);
        cJSON_AddNumberToObject(root, "num_experts_per_tok", c->top_k);
        cJSON_AddNumberToObject(root, "moe_intermediate_size", loom_moe_hidden(c));
        cJSON_AddNumberToObject(root, "shared_expert_intermediate_size", c->shared_hidden);
        cJSON_AddNumberToObject(root, "decoder_sparse_step", c->moe_every);
        cJSON_AddBoolToObject(root, "norm_topk_prob", c->norm_topk);
        cJSON_AddItemToObject(root, "mlp_only_layers", cJSON_CreateArray());
        cJSON_AddNumberToObject(root, "router_aux_loss_coef", c->aux_coef);
        cJSON_AddBoolToObject(root, "output_router_logits", c->aux_coef > 0);
    }
    if (!strcmp(c->arch, "mistral") || !strcmp(c->arch, "mixtral")) {
        if (c->window) cJSON_AddNumberToObject(root, "sliding_window", c->window);
        else cJSON_AddNullToObject(root, "sliding_window");
    }
    if (!strncmp(c->arch, "qwen2", 5)) cJSON_AddBoolToObject(root, "use_sliding_window", 0);
    if (c->rope_factor > 0) {
        cJSON *s = cJSON_AddObjectToObject(root, "rope_scaling");
        cJSON_AddStringToObject(s, "rope_type", "llama3");
        cJSON_AddNumberToObject(s, "factor", c->rope_factor);
        cJSON_AddNumberToObject(s, "low_freq_factor", c->rope_low_freq);
        cJSON_AddNumberToObject(s, "high_freq_factor", c->rope_high_freq);
        cJSON_AddNumberToObject(s, "original_max_position_embeddings", c->rope_orig_max);
    } else {
        cJSON_AddNullToObject(root, "rope_scaling");
    }
}

/* GPT-2's keys of c into root. */
static void gpt2_write(const loom_model_config *c, cJSON *root) {
    cJSON *arr = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arr, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(root, "model_type", "gpt2");
    cJSON_AddNumberToObject(root, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(root, "n_head", c->n_head);
    cJSON_AddNumberToObject(root, "n_embd", c->n_embd);
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(root, "n_positions", c->n_positions);
    cJSON_AddNumberToObject(root, "n_ctx", c->n_positions);
}

struct cJSON *loom_model_config_hf_json(const loom_model_config *c) {
    if (c->n_expert > 0 && c->family != LOOM_FAMILY_LLAMA) return NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    if (c->family == LOOM_FAMILY_LLAMA) llama_write(c, root);
    else gpt2_write(c, root);
    return root;
}

loom_status loom_model_config_write_hf(const loom_model_config *c, const char *path) {
    if (c->n_expert > 0 && c->family != LOOM_FAMILY_LLAMA)
        return loom_fail(LOOM_EUSAGE,
                         "%s: a Hugging Face config.json of a GPT-2 MoE model is not written yet "
                         "(Mixtral's and Qwen2-MoE's are)",
                         path);
    cJSON *root = loom_model_config_hf_json(c);
    if (!root) return loom_fail(LOOM_EOS, "out of memory");
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return loom_fail(LOOM_EOS, "out of memory");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    loom_status st = LOOM_OK;
    if (!f) st = loom_fail(LOOM_EOS, "%s: cannot write: %s", tmp, strerror(errno));
    else if (fputs(text, f) < 0 || fputc('\n', f) < 0) st = loom_fail(LOOM_EOS, "%s: write failed", tmp);
    if (f && fclose(f) != 0 && st == LOOM_OK) st = loom_fail(LOOM_EOS, "%s: write failed", tmp);
    if (st == LOOM_OK && rename(tmp, path) != 0)
        st = loom_fail(LOOM_EOS, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (st != LOOM_OK) remove(tmp);
    cJSON_free(text);
    return st;
}
