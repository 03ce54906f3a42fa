/* config.c - model configurations: built-in names, Hugging Face config.json
 * files and directories (GPT-2 here; the Llama family's keys in
 * config_hf.c). Local, no collectives. */
#include "loom/model.h"
#include "loom/moe.h"
#include "model/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const char *name;
    int n_layer, n_head, n_embd, vocab_size, n_positions;
} builtin;

static const builtin BUILTINS[] = {
    {"tiny", 2, 4, 64, 256, 128},  /* tests: runs in milliseconds */
    {"mini", 4, 4, 256, 256, 256}, /* the default: byte-level, trains in minutes on a laptop */
    {"gpt2-small", 12, 12, 768, 50257, 1024},
    {"gpt2-medium", 24, 16, 1024, 50257, 1024},
    {"gpt2-large", 36, 20, 1280, 50257, 1024},
    {"gpt2-xl", 48, 25, 1600, 50257, 1024},
};
#define N_BUILTINS (sizeof BUILTINS / sizeof BUILTINS[0])

loom_status loom_model_config_builtin(const char *name, loom_model_config *cfg) {
    const char *lookup = strcmp(name, "gpt2") == 0 ? "gpt2-small" : name;
    if (loom_moe_builtin(name, cfg)) return LOOM_OK;   /* tiny-moe, mini-moe */
    if (loom_llama_builtin(name, cfg)) return LOOM_OK; /* tiny-llama, llama3-8b, ... */
    for (size_t i = 0; i < N_BUILTINS; i++) {
        const builtin *b = &BUILTINS[i];
        if (strcmp(b->name, lookup) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        snprintf(cfg->name, sizeof cfg->name, "%s", b->name);
        cfg->n_layer = b->n_layer;
        cfg->n_head = b->n_head;
        cfg->n_embd = b->n_embd;
        cfg->vocab_size = b->vocab_size;
        cfg->n_positions = b->n_positions;
        return LOOM_OK;
    }
    char known[512] = "";
    for (size_t i = 0; i < N_BUILTINS; i++) {
        strncat(known, BUILTINS[i].name, sizeof known - strlen(known) - 3);
        if (i + 1 < N_BUILTINS) strcat(known, ", ");
    }
    strncat(known, ", tiny-moe, mini-moe, ", sizeof known - strlen(known) - 1);
    strncat(known, loom_llama_builtin_names(), sizeof known - strlen(known) - 1);
    return loom_fail(LOOM_EUSAGE,
                     "--model %s: unknown model (built-in: %s; or a config.json path or a Hugging Face "
                     "directory)",
                     name, known);
}

loom_status loom_model_config_check(const loom_model_config *c) {
    if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->vocab_size < 2 || c->n_positions < 1)
        return loom_fail(LOOM_ECONFIG,
                         "model %s: sizes must be positive (n_layer=%d n_head=%d n_embd=%d "
                         "vocab_size=%d n_positions=%d)",
                         c->name, c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->n_positions);
    /* Bounds that keep every size product (12 * n_layer * n_embd^2 parameters,
     * vocab_size * n_embd, n_positions * n_embd) far inside 64 bits and every
     * single dimension inside int. */
    const struct {
        const char *key;
        int value, max;
    } bound[] = {
        {"n_layer", c->n_layer, 1024},
        {"n_embd", c->n_embd, 65536},
        {"vocab_size", c->vocab_size, 1 << 24},
        {"n_positions", c->n_positions, 1 << 20},
    };
    for (size_t i = 0; i < sizeof bound / sizeof bound[0]; i++)
        if (bound[i].value > bound[i].max)
            return loom_fail(LOOM_ECONFIG, "model %s: %s=%d exceeds the supported maximum %d", c->name,
                             bound[i].key, bound[i].value, bound[i].max);
    if (c->n_embd % c->n_head)
        return loom_fail(LOOM_ECONFIG, "model %s: n_head=%d does not divide n_embd=%d", c->name, c->n_head,
                         c->n_embd);
    LOOM_TRY(loom_model_parts_check(c));
    return loom_moe_config_check(c);
}

loom_layout_model loom_model_shape(const loom_model_config *c) {
    return (loom_layout_model){.name = c->name,
                               .n_layer = c->n_layer,
                               .n_head = c->n_head,
                               .ffn = c->n_expert > 0 ? loom_moe_hidden(c) : loom_model_ffn(c),
                               .n_kv_head = loom_model_kv_heads(c),
                               .n_positions = c->n_positions,
                               .n_expert = c->n_expert};
}

static char *read_file(const char *path, loom_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb; /* Linux opens a directory for reading; its "size" is nonsense */
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        *st = loom_fail(LOOM_ENOINPUT, "%s: is a directory, not a config file", path);
        return NULL;
    }
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) != 0) n = -1;
    if (n < 0 || n > (1 << 24)) {
        fclose(f);
        *st = loom_fail(LOOM_ECONFIG, "%s: not a config file (size %ld bytes)", path, n);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        *st = loom_fail(LOOM_EIO, "%s: read failed", path);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    if (memchr(buf, '\0', (size_t)n)) { /* the parser would stop there and miss the rest */
        size_t at = (size_t)((char *)memchr(buf, '\0', (size_t)n) - buf);
        free(buf);
        *st = loom_fail(LOOM_ECONFIG, "%s: not a config file (a NUL byte at byte %zu)", path, at);
        return NULL;
    }
    *st = LOOM_OK;
    return buf;
}

/* Keys of Hugging Face's GPT2Config that do not change the architecture. */
static const char *HF_IGNORED[] = {
    "architectures",
    "model_type",
    "attn_pdrop",
    "embd_pdrop",
    "resid_pdrop",
    "bos_token_id",
    "eos_token_id",
    "initializer_range",
    "summary_activation",
    "summary_first_dropout",
    "summary_proj_to_labels",
    "summary_type",
    "summary_use_proj",
    "task_specific_params",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "_name_or_path",
    "output_past",
    "pad_token_id",
    "n_special",
    "predict_special_tokens",
    "gradient_checkpointing",
    "id2label",
    "label2id",
    "tokenizer_class",
    "prefix",
    "name",
};

static int is_ignored(const char *key) {
    for (size_t i = 0; i < sizeof HF_IGNORED / sizeof HF_IGNORED[0]; i++)
        if (strcmp(key, HF_IGNORED[i]) == 0) return 1;
    return loom_hf_key_ignored(key); /* every PretrainedConfig's */
}

static loom_status get_int(const char *path, const cJSON *item, int *out) {
    double v = item->valuedouble;
    if (!cJSON_IsNumber(item) || !(v >= 1 && v <= 1e9) || v != (double)(long)v)
        return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be a positive integer", path, item->string);
    *out = (int)v;
    return LOOM_OK;
}

/* Keys that would change the architecture are accepted only at GPT-2's values. */
static loom_status check_arch_key(const char *path, const cJSON *it, int n_embd_seen) {
    const char *k = it->string;
    if (strcmp(k, "activation_function") == 0) {
        if (!cJSON_IsString(it) ||
            (strcmp(it->valuestring, "gelu_new") != 0 && strcmp(it->valuestring, "gelu_pytorch_tanh") != 0))
            return loom_fail(LOOM_ECONFIG, "%s: activation_function must be \"gelu_new\" (GELU tanh)", path);
    } else if (strcmp(k, "layer_norm_epsilon") == 0) {
        if (!cJSON_IsNumber(it) || it->valuedouble != 1e-5)
            return loom_fail(LOOM_ECONFIG, "%s: layer_norm_epsilon must be 1e-05", path);
    } else if (strcmp(k, "tie_word_embeddings") == 0) {
        if (!cJSON_IsTrue(it)) return loom_fail(LOOM_ECONFIG, "%s: tie_word_embeddings must be true", path);
    } else if (strcmp(k, "n_inner") == 0) {
        if (!cJSON_IsNull(it) &&
            !(cJSON_IsNumber(it) && n_embd_seen > 0 && it->valuedouble == 4.0 * n_embd_seen))
            return loom_fail(LOOM_ECONFIG, "%s: n_inner must be null (4 * n_embd)", path);
    } else if (strcmp(k, "scale_attn_weights") == 0) {
        if (!cJSON_IsTrue(it)) return loom_fail(LOOM_ECONFIG, "%s: scale_attn_weights must be true", path);
    } else if (strcmp(k, "scale_attn_by_inverse_layer_idx") == 0 ||
               strcmp(k, "reorder_and_upcast_attn") == 0 || strcmp(k, "add_cross_attention") == 0) {
        if (!cJSON_IsFalse(it)) return loom_fail(LOOM_ECONFIG, "%s: %s must be false", path, k);
    } else if (!is_ignored(k)) {
        return loom_fail(LOOM_ECONFIG, "%s: unknown key \"%s\"", path, k);
    }
    return LOOM_OK;
}

static loom_status gpt2_load(const char *path, const cJSON *root, loom_model_config *cfg);

/* Another model_type than gpt2: the Llama family's, or refused by name. */
static loom_status model_type_load(const char *path, const cJSON *root, const cJSON *type,
                                   loom_model_config *cfg) {
    static const char *LLAMA[] = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe"};
    if (!cJSON_IsString(type)) return loom_fail(LOOM_ECONFIG, "%s: \"model_type\" must be a string", path);
    for (size_t i = 0; i < sizeof LLAMA / sizeof LLAMA[0]; i++)
        if (!strcmp(type->valuestring, LLAMA[i])) return loom_hf_config_parse(path, root, LLAMA[i], cfg);
    return loom_fail(
        LOOM_ECONFIG,
        "%s: model_type \"%s\" is not an architecture loom has (gpt2, llama, mistral, qwen2, mixtral, qwen2_moe)",
        path, type->valuestring);
}

loom_status loom_model_config_from_hf_json(const char *path, const cJSON *root, loom_model_config *cfg) {
    if (!cJSON_IsObject(root))
        return loom_fail(LOOM_ECONFIG, "%s: a model config must be a JSON object", path);
    return model_type_load(path, root, cJSON_GetObjectItem(root, "model_type"), cfg);
}

loom_status loom_model_config_load(const char *path, loom_model_config *cfg) {
    loom_status st;
    char *text = read_file(path, &st);
    if (!text) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1); /* 1: nothing may follow the value */
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        int line = 1;
        for (size_t i = 0; i < at && text[i]; i++) line += text[i] == '\n';
        st = loom_fail(LOOM_ECONFIG, "%s: not valid JSON, or text after the JSON value (line %d, byte %zu)",
                       path, line, at);
        free(text);
        return st;
    }
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_fail(LOOM_ECONFIG, "%s: not a JSON object", path);
    }
    for (const cJSON *it = root->child; it; it = it->next)
        for (const cJSON *o = it->next; o; o = o->next)
            if (strcmp(it->string, o->string) == 0) {
                st = loom_fail(LOOM_ECONFIG, "%s: key \"%s\" appears twice", path, it->string);
                cJSON_Delete(root);
                return st;
            }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "gpt2") != 0)) {
        st = model_type_load(path, root, type, cfg);
        cJSON_Delete(root);
        return st == LOOM_OK ? loom_model_config_check(cfg) : st;
    }
    st = gpt2_load(path, root, cfg);
    cJSON_Delete(root);
    return st == LOOM_OK ? loom_model_config_check(cfg) : st;
}

/* A GPT-2 config.json's keys (the MoE ones in Mixtral's spelling). */
static loom_status gpt2_load(const char *path, const cJSON *root, loom_model_config *cfg) {
    loom_status st;
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->name, sizeof cfg->name, "%s", path);
    struct {
        const char *key;
        int *dst;
    } req[] = {
        {"n_layer", &cfg->n_layer},       {"n_head", &cfg->n_head},           {"n_embd", &cfg->n_embd},
        {"vocab_size", &cfg->vocab_size}, {"n_positions", &cfg->n_positions},
    };
    st = LOOM_OK;
    int n_ctx = 0;
    const cJSON *n_embd = cJSON_GetObjectItemCaseSensitive(root, "n_embd");
    int n_embd_seen = cJSON_IsNumber(n_embd) ? n_embd->valueint : 0;
    for (const cJSON *it = root->child; it && st == LOOM_OK; it = it->next) {
        int matched = 0;
        for (size_t i = 0; i < 5; i++)
            if (strcmp(it->string, req[i].key) == 0) {
                st = get_int(path, it, req[i].dst);
                matched = 1;
            }
        int moe_key = 0;
        if (!matched && strcmp(it->string, "n_ctx") == 0) st = get_int(path, it, &n_ctx);
        else if (!matched && (st = loom_moe_config_key(path, it, cfg, &moe_key)) != LOOM_OK) break;
        else if (!matched && !moe_key) st = check_arch_key(path, it, n_embd_seen);
    }
    for (size_t i = 0; i < 5 && st == LOOM_OK; i++)
        if (*req[i].dst == 0) st = loom_fail(LOOM_ECONFIG, "%s: missing \"%s\"", path, req[i].key);
    if (st == LOOM_OK && n_ctx && n_ctx != cfg->n_positions) /* GPT-2 has one context length */
        st = loom_fail(LOOM_ECONFIG, "%s: \"n_ctx\"=%d must equal \"n_positions\"=%d", path, n_ctx,
                       cfg->n_positions);
    return st;
}

loom_status loom_model_config_resolve(const char *s, loom_model_config *cfg) {
    size_t n = strlen(s);
    struct stat sb;
    if (stat(s, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face directory */
        char path[4096];
        if (snprintf(path, sizeof path, "%s/config.json", s) >= (int)sizeof path)
            return loom_fail(LOOM_EUSAGE, "--model %s: path too long", s);
        if (access(path, F_OK) != 0)
            return loom_fail(LOOM_ENOINPUT, "--model %s: a directory without config.json", s);
        if (n >= sizeof cfg->dir) return loom_fail(LOOM_EUSAGE, "--model %s: path too long", s);
        LOOM_TRY(loom_model_config_load(path, cfg));
        snprintf(cfg->dir, sizeof cfg->dir, "%s", s);
        return LOOM_OK;
    }
    if (strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0)) return loom_model_config_load(s, cfg);
    LOOM_TRY(loom_model_config_builtin(s, cfg));
    return loom_model_config_check(cfg);
}
