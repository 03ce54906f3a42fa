/* serve_req.c - the requests of `loom serve` (serve_internal.h), parsed and
 * checked on rank 0's connection threads before anything is queued: the body
 * must be valid UTF-8 JSON; every field must be one loom honours (a field it
 * does not know, or a value it cannot honour - tools, logit_bias, echo with
 * logprobs - is a 400 naming the field, never silently ignored); `model`, if
 * given, must be the served one (else 404). /v1/completions takes a prompt
 * as text, token ids, or a list of either; /v1/chat/completions renders
 * `messages` through the chat template and tokenizes the result. Each prompt
 * gets n choices. Nothing here calls the communicator. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"

typedef struct pctx {
    server *s;
    api_kind kind;
    int code;
    char *msg, *param;
    size_t cap, pcap;
} pctx;

__attribute__((format(printf, 4, 5))) static int fail(pctx *x, int code, const char *param, const char *fmt,
                                                      ...) {
    if (x->msg[0]) return 0; /* the first error speaks */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->msg, x->cap, fmt, ap);
    va_end(ap);
    snprintf(x->param, x->pcap, "%s", param);
    x->code = code;
    return 0;
}

void serve_req_unref(server *s, req *r) { /* under s->mu */
    if (--r->refs > 0) return;
    (void)s;
    for (int i = 0; i < r->n_prompts; i++) {
        loom_ids_free(&r->prompts[i]);
        if (r->prompt_text) free(r->prompt_text[i]);
    }
    for (int i = 0; r->ch && i < r->n_choices; i++) {
        loom_ids_free(&r->ch[i].out);
        free(r->ch[i].lp);
        free(r->ch[i].text);
    }
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->prompts);
    free(r->prompt_text);
    free(r->ch);
    free(r->pend);
    free(r);
}

/* ---- field checks ------------------------------------------------------------ */

static const char *const COMMON[] = {"model",
                                     "max_tokens",
                                     "max_completion_tokens",
                                     "temperature",
                                     "top_p",
                                     "top_k",
                                     "n",
                                     "stream",
                                     "stream_options",
                                     "stop",
                                     "stop_token_ids",
                                     "presence_penalty",
                                     "frequency_penalty",
                                     "seed",
                                     "user",
                                     "logprobs",
                                     "ignore_eos",
                                     "logit_bias",
                                     NULL};
static const char *const COMPLETIONS[] = {"prompt", "echo", "best_of", "suffix", NULL};
static const char *const CHAT[] = {"messages",
                                   "top_logprobs",
                                   "tools",
                                   "tool_choice",
                                   "response_format",
                                   "functions",
                                   "function_call",
                                   "parallel_tool_calls",
                                   "add_generation_prompt",
                                   NULL};

static int listed(const char *const *names, const char *k) {
    for (; *names; names++)
        if (strcmp(*names, k) == 0) return 1;
    return 0;
}

static int known_fields(pctx *x, const cJSON *o) {
    for (const cJSON *f = o->child; f; f = f->next)
        if (!listed(COMMON, f->string) && !listed(x->kind == API_CHAT ? CHAT : COMPLETIONS, f->string))
            return fail(x, 400, f->string, "unsupported field '%s'", f->string);
    return 1;
}

/* The field, or NULL when it is absent or null (both mean: the default). */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int is_int(const cJSON *f, double lo, double hi) {
    return cJSON_IsNumber(f) && f->valuedouble == floor(f->valuedouble) && f->valuedouble >= lo &&
           f->valuedouble <= hi;
}

static int get_int(pctx *x, const cJSON *o, const char *name, double lo, double hi, int *out) {
    const cJSON *f = field(o, name);
    if (!f) return 1;
    if (!is_int(f, lo, hi))
        return fail(x, 400, name, "'%s' must be an integer in [%.0f, %.0f]", name, lo, hi);
    *out = (int)f->valuedouble;
    return 1;
}

static int get_num(pctx *x, const cJSON *o, const char *name, double lo, double hi, float *out) {
    const cJSON *f = field(o, name);
    if (!f) return 1;
    if (!cJSON_IsNumber(f) || !(f->valuedouble >= lo && f->valuedouble <= hi))
        return fail(x, 400, name, "'%s' must be a number in [%g, %g]", name, lo, hi);
    *out = (float)f->valuedouble;
    return 1;
}

static int get_bool(pctx *x, const cJSON *o, const char *name, int *out) {
    const cJSON *f = field(o, name);
    if (!f) return 1;
    if (!cJSON_IsBool(f)) return fail(x, 400, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(f);
    return 1;
}

/* Fields loom accepts only with the value that asks for nothing. */
static int unsupported(pctx *x, const cJSON *o) {
    const cJSON *f;
    if ((f = field(o, "logit_bias")) && !(cJSON_IsObject(f) && !f->child))
        return fail(x, 400, "logit_bias", "'logit_bias' is not supported");
    if ((f = field(o, "suffix")) && !(cJSON_IsString(f) && !f->valuestring[0]))
        return fail(x, 400, "suffix", "'suffix' is not supported");
    if ((f = field(o, "tools")) && !(cJSON_IsArray(f) && !f->child))
        return fail(x, 400, "tools", "'tools' is not supported (no tool calling)");
    if ((f = field(o, "tool_choice")) && !(cJSON_IsString(f) && strcmp(f->valuestring, "none") == 0))
        return fail(x, 400, "tool_choice", "'tool_choice' is not supported (only \"none\")");
    if ((f = field(o, "functions"))) return fail(x, 400, "functions", "'functions' is not supported");
    if ((f = field(o, "function_call")))
        return fail(x, 400, "function_call", "'function_call' is not supported");
    if ((f = field(o, "parallel_tool_calls")) && !cJSON_IsBool(f))
        return fail(x, 400, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    if ((f = field(o, "response_format"))) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(f, "type");
        if (!cJSON_IsObject(f) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0)
            return fail(x, 400, "response_format",
                        "'response_format' is not supported (only {\"type\": \"text\"})");
    }
    if ((f = field(o, "user")) && !cJSON_IsString(f)) return fail(x, 400, "user", "'user' must be a string");
    return 1;
}

static int parse_stop(pctx *x, const cJSON *o, req *r) {
    const int V = loom_infer_config(x->s->inf)->vocab_size;
    const cJSON *f = field(o, "stop");
    if (f && cJSON_IsString(f)) {
        if (f->valuestring[0] && !(r->stop[r->n_stop] = strdup(f->valuestring)))
            return fail(x, 400, "stop", "out of memory");
        r->n_stop += f->valuestring[0] != 0;
    } else if (f && cJSON_IsArray(f)) {
        for (const cJSON *e = f->child; e; e = e->next) {
            if (!cJSON_IsString(e))
                return fail(x, 400, "stop", "'stop' must be a string or a list of strings");
            if (r->n_stop == STOP_MAX)
                return fail(x, 400, "stop", "'stop' has more than %d strings", STOP_MAX);
            if (!e->valuestring[0]) continue;
            if (!(r->stop[r->n_stop++] = strdup(e->valuestring)))
                return fail(x, 400, "stop", "out of memory");
        }
    } else if (f) {
        return fail(x, 400, "stop", "'stop' must be a string or a list of strings");
    }
    for (int i = 0; i < r->n_stop; i++) {
        r->stop_len[i] = strlen(r->stop[i]);
        if (r->stop_len[i] > r->stop_longest) r->stop_longest = r->stop_len[i];
    }
    if ((f = field(o, "stop_token_ids"))) {
        if (!cJSON_IsArray(f))
            return fail(x, 400, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
        for (const cJSON *e = f->child; e; e = e->next) {
            if (!is_int(e, 0, V - 1))
                return fail(x, 400, "stop_token_ids", "'stop_token_ids' must be token ids in [0, %d)", V);
            if (r->n_stop_ids == STOP_MAX)
                return fail(x, 400, "stop_token_ids", "'stop_token_ids' has more than %d ids", STOP_MAX);
            r->stop_ids[r->n_stop_ids++] = (int32_t)e->valuedouble;
        }
    }
    return 1;
}

/* Sampling, lengths, streaming, logprobs: every field but the prompt. */
static int parse_options(pctx *x, const cJSON *o, req *r) {
    const cJSON *f;
    int v;
    r->max_tokens = x->kind == API_CHAT ? 0 : 16; /* chat: the rest of the context */
    r->so = (loom_sample_opts){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f};
    r->n = 1;
    r->top_lp = -1;
    if ((f = field(o, "model")) && !cJSON_IsString(f))
        return fail(x, 400, "model", "'model' must be a string");
    if (f && strcmp(f->valuestring, x->s->cfg->model_name) != 0)
        return fail(x, 404, "model", "The model '%.200s' does not exist; this server serves '%s'",
                    f->valuestring, x->s->cfg->model_name);
    if (!unsupported(x, o) || !get_int(x, o, "max_tokens", 1, 1e9, &r->max_tokens) ||
        !get_int(x, o, "max_completion_tokens", 1, 1e9, &r->max_tokens) ||
        !get_int(x, o, "n", 1, 128, &r->n) || !get_num(x, o, "temperature", 0, 1e6, &r->so.temperature) ||
        !get_num(x, o, "top_p", 1e-9, 1, &r->so.top_p) || !get_int(x, o, "top_k", -1, 1e9, &r->so.top_k) ||
        !get_num(x, o, "presence_penalty", -2, 2, &r->presence) ||
        !get_num(x, o, "frequency_penalty", -2, 2, &r->frequency) || !get_bool(x, o, "stream", &r->stream) ||
        !get_bool(x, o, "ignore_eos", &r->ignore_eos) || !parse_stop(x, o, r))
        return 0;
    if (r->so.top_k < 0) r->so.top_k = 0; /* -1: all, as vLLM */
    if ((f = field(o, "seed"))) {
        if (!is_int(f, -9223372036854775807.0, 18446744073709549568.0))
            return fail(x, 400, "seed", "'seed' must be an integer");
        r->so.seed = f->valuedouble < 0 ? (uint64_t)(int64_t)f->valuedouble : (uint64_t)f->valuedouble;
    } else {
        r->so.seed = x->s->seed_base ^
                     (__atomic_add_fetch(&x->s->seed_count, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull);
    }
    if ((f = field(o, "stream_options"))) {
        if (!cJSON_IsObject(f)) return fail(x, 400, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return fail(x, 400, "stream_options", "'stream_options' is only allowed with \"stream\": true");
        for (const cJSON *e = f->child; e; e = e->next) {
            if (strcmp(e->string, "include_usage") != 0 || !cJSON_IsBool(e))
                return fail(x, 400, "stream_options",
                            "'stream_options' takes only include_usage (true or false)");
            r->include_usage = cJSON_IsTrue(e);
        }
    }
    if (x->kind == API_CHAT) {
        int want = 0, top = 0;
        if (!get_bool(x, o, "logprobs", &want) || !get_int(x, o, "top_logprobs", 0, LP_MAX, &top)) return 0;
        if (field(o, "top_logprobs") && !want)
            return fail(x, 400, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
        r->top_lp = want ? top : -1;
    } else {
        v = -1;
        if (!get_int(x, o, "logprobs", 0, LP_MAX, &v) || !get_bool(x, o, "echo", &r->echo)) return 0;
        r->top_lp = v;
        if (r->echo && r->top_lp >= 0)
            return fail(x, 400, "echo",
                        "'echo' with 'logprobs' is not supported (no prompt log-probabilities)");
        if ((f = field(o, "best_of")) && !(is_int(f, 1, 128) && (int)f->valuedouble == r->n))
            return fail(x, 400, "best_of", "'best_of' is not supported (only best_of = n)");
    }
    if (loom_sample_check(&r->so) != LOOM_OK) return fail(x, 400, "temperature", "%s", loom_errmsg());
    return 1;
}

/* ---- prompts ------------------------------------------------------------ */

static int add_prompt(req *r) {
    loom_ids *p = realloc(r->prompts, sizeof *p * (size_t)(r->n_prompts + 1));
    if (!p) return 0;
    r->prompts = p;
    char **t = realloc(r->prompt_text, sizeof *t * (size_t)(r->n_prompts + 1));
    if (!t) return 0;
    r->prompt_text = t;
    memset(&r->prompts[r->n_prompts], 0, sizeof *p);
    r->prompt_text[r->n_prompts] = NULL;
    r->n_prompts++;
    return 1;
}

/* Text to ids: the tokenizer's, or its bytes. */
static int encode_text(pctx *x, const char *text, size_t len, loom_ids *ids, const char *param) {
    server *s = x->s;
    const int V = loom_infer_config(s->inf)->vocab_size;
    if (!s->tok) {
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)text[i] >= V || loom_ids_push(ids, (unsigned char)text[i]) != LOOM_OK)
                return fail(x, 400, param, "prompt byte %u outside the vocabulary (%d)",
                            (unsigned char)text[i], V);
        return 1;
    }
    pthread_mutex_lock(&s->tok_mu);
    /* a prompt begins with the tokenizer's BOS, as Hugging Face's tokenizer(prompt)
     * adds it (Llama 3's <|begin_of_text|>); a chat template writes its own */
    int bos = strcmp(param, "prompt") == 0 ? loom_tokenizer_bos(s->tok) : -1;
    loom_status st = LOOM_OK;
    if (bos >= 0 && loom_ids_push(ids, (uint32_t)bos) != LOOM_OK) st = loom_fail(LOOM_EOS, "out of memory");
    if (st == LOOM_OK) st = loom_tokenizer_encode(s->tok, text, len, 1, ids);
    pthread_mutex_unlock(&s->tok_mu);
    return st == LOOM_OK ? 1 : fail(x, 400, param, "%s", loom_errmsg());
}

static int ids_prompt(pctx *x, const cJSON *a, req *r) {
    const int V = loom_infer_config(x->s->inf)->vocab_size;
    loom_ids *ids = &r->prompts[r->n_prompts - 1];
    for (const cJSON *e = a->child; e; e = e->next) {
        if (!is_int(e, 0, V - 1))
            return fail(x, 400, "prompt", "'prompt' token ids must be integers in [0, %d)", V);
        if (loom_ids_push(ids, (uint32_t)e->valuedouble) != LOOM_OK)
            return fail(x, 400, "prompt", "out of memory");
    }
    return 1;
}

static int parse_prompt(pctx *x, const cJSON *o, req *r) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const char *bad =
        "'prompt' must be a string, a list of token ids, or a list of strings or of token-id lists";
    if (!p) return fail(x, 400, "prompt", "'prompt' is required");
    if (cJSON_IsString(p) || (cJSON_IsArray(p) && p->child && cJSON_IsNumber(p->child))) {
        if (!add_prompt(r)) return fail(x, 400, "prompt", "out of memory");
        if (cJSON_IsString(p)) {
            r->prompt_text[0] = strdup(p->valuestring);
            return encode_text(x, p->valuestring, strlen(p->valuestring), &r->prompts[0], "prompt");
        }
        return ids_prompt(x, p, r);
    }
    if (!cJSON_IsArray(p) || !p->child) return fail(x, 400, "prompt", "%s", bad);
    for (const cJSON *e = p->child; e; e = e->next) {
        if (!add_prompt(r)) return fail(x, 400, "prompt", "out of memory");
        if (cJSON_IsString(e)) {
            r->prompt_text[r->n_prompts - 1] = strdup(e->valuestring);
            if (!encode_text(x, e->valuestring, strlen(e->valuestring), &r->prompts[r->n_prompts - 1],
                             "prompt"))
                return 0;
        } else if (cJSON_IsArray(e)) {
            if (!ids_prompt(x, e, r)) return 0;
        } else {
            return fail(x, 400, "prompt", "%s", bad);
        }
    }
    return 1;
}

/* A message's content: a string, null, or text parts (joined by newlines, as vLLM does). */
static int message_content(pctx *x, const cJSON *c, int i, char **out) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c || cJSON_IsNull(c)) return (*out = NULL), 1;
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 1 : fail(x, 400, param, "out of memory");
    if (!cJSON_IsArray(c)) return fail(x, 400, param, "'%s' must be a string or a list of text parts", param);
    size_t len = 0;
    for (const cJSON *e = c->child; e; e = e->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type"),
                    *tx = cJSON_GetObjectItemCaseSensitive(e, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0 || !cJSON_IsString(tx))
            return fail(x, 400, param, "'%s': only {\"type\": \"text\", \"text\": ...} parts are supported",
                        param);
        len += strlen(tx->valuestring) + 1;
    }
    char *s = malloc(len + 1);
    if (!s) return fail(x, 400, param, "out of memory");
    s[0] = '\0';
    for (const cJSON *e = c->child; e; e = e->next) {
        if (e != c->child) strcat(s, "\n");
        strcat(s, cJSON_GetObjectItemCaseSensitive(e, "text")->valuestring);
    }
    *out = s;
    return 1;
}

static int parse_messages(pctx *x, const cJSON *o, req *r) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!ms) return fail(x, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(ms) || !ms->child)
        return fail(x, 400, "messages", "'messages' must be a non-empty list");
    int n = cJSON_GetArraySize(ms), ok = 1, agp = 1;
    if (!get_bool(x, o, "add_generation_prompt", &agp)) return 0;
    loom_chat_message *m = calloc((size_t)n, sizeof *m);
    if (!m) return fail(x, 400, "messages", "out of memory");
    int i = 0;
    for (const cJSON *e = ms->child; e && ok; e = e->next, i++) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        if (!cJSON_IsObject(e) || !cJSON_IsString(role)) {
            ok = fail(x, 400, param, "'%s' must be an object with a string 'role'", param);
            break;
        }
        for (const cJSON *f = e->child; f && ok; f = f->next)
            if (strcmp(f->string, "role") && strcmp(f->string, "content") && strcmp(f->string, "name")) {
                snprintf(param, sizeof param, "messages[%d].%.40s", i, f->string);
                ok = fail(x, 400, param, "'%s' is not supported", param);
            }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (ok && name && !cJSON_IsString(name))
            ok = fail(x, 400, param, "'%s.name' must be a string", param);
        m[i].role = role->valuestring;
        m[i].name = name ? name->valuestring : NULL;
        if (ok)
            ok =
                message_content(x, cJSON_GetObjectItemCaseSensitive(e, "content"), i, (char **)&m[i].content);
    }
    char *text = NULL;
    size_t len = 0;
    if (ok) {
        loom_chat_vars v = {.add_generation_prompt = agp,
                            .bos_token = x->s->cfg->bos_token,
                            .eos_token = x->s->cfg->eos_token};
        if (loom_chat_template_render(x->s->chat, m, n, &v, &text, &len) != LOOM_OK)
            ok = fail(x, 400, "messages", "chat template: %s", loom_errmsg());
    }
    for (int k = 0; k < n; k++) free((char *)m[k].content);
    free(m);
    if (ok && !add_prompt(r)) ok = fail(x, 400, "messages", "out of memory");
    if (ok) ok = encode_text(x, text, len, &r->prompts[0], "messages");
    free(text);
    return ok;
}

/* ---- the request --------------------------------------------------------------- */

static int make_choices(pctx *x, req *r) {
    const loom_infer_opts *io = loom_infer_options(x->s->inf);
    const int total = r->n_prompts * r->n;
    if (total > io->max_seqs + x->s->cfg->queue)
        return fail(x, 400, "n",
                    "%d prompts x n=%d = %d choices; the server holds at most %d (--max-seqs + --queue)",
                    r->n_prompts, r->n, total, io->max_seqs + x->s->cfg->queue);
    int max_new = r->max_tokens;
    for (int i = 0; i < r->n_prompts; i++) {
        const size_t pn = r->prompts[i].n;
        if (pn == 0) return fail(x, 400, x->kind == API_CHAT ? "messages" : "prompt", "'prompt' is empty");
        const int rest = pn < (size_t)io->max_len ? io->max_len - (int)pn : 0;
        if (r->max_tokens == 0 && rest > 0) max_new = max_new == 0 || rest < max_new ? rest : max_new;
        if (pn + (size_t)(r->max_tokens ? r->max_tokens : 1) > (size_t)io->max_len)
            return fail(x, 400, r->max_tokens ? "max_tokens" : "messages",
                        "prompt (%zu tokens) + max_tokens (%d) exceeds the context length %d", pn,
                        r->max_tokens ? r->max_tokens : 1, io->max_len);
    }
    r->max_tokens = max_new;
    r->ch = calloc((size_t)total, sizeof *r->ch);
    if (!r->ch) return fail(x, 400, "", "out of memory");
    r->n_choices = total;
    for (int i = 0; i < total; i++) r->ch[i] = (choice){.req = r, .index = i, .prompt = i / r->n, .slot = -1};
    return 1;
}

/* Text of token-id prompts, for echo. */
static void echo_texts(server *s, req *r) {
    for (int i = 0; r->echo && i < r->n_prompts; i++) {
        if (r->prompt_text[i]) continue;
        const loom_ids *p = &r->prompts[i];
        size_t total = 0, len, m = 0;
        for (size_t k = 0; k < p->n; k++) {
            serve_token_bytes(s, p->v[k], &len);
            total += len;
        }
        char *b = malloc(total + 1), *t = NULL;
        if (!b) continue;
        for (size_t k = 0; k < p->n; k++) {
            const char *tb = serve_token_bytes(s, p->v[k], &len);
            memcpy(b + m, tb, len);
            m += len;
        }
        t = serve_utf8_lossy(b, m, NULL);
        free(b);
        if (!t) continue;
        r->prompt_text[i] = t;
    }
}

req *serve_parse_request(server *s, api_kind kind, const char *body, size_t len, int *code, char *msg,
                         size_t cap, char *param, size_t pcap) {
    pctx x = {.s = s, .kind = kind, .code = 400, .msg = msg, .param = param, .cap = cap, .pcap = pcap};
    msg[0] = param[0] = '\0';
    req *r = calloc(1, sizeof *r);
    if (!r) {
        fail(&x, 400, "", "out of memory");
        *code = x.code;
        return NULL;
    }
    r->kind = kind;
    r->refs = 1;
    const size_t valid = loom_utf8_valid_len(body, len);
    cJSON *o = NULL;
    if (valid != len) fail(&x, 400, "", "the body is not valid UTF-8 (byte %zu)", valid);
    else if (!(o = cJSON_ParseWithLength(body, len)) || !cJSON_IsObject(o))
        fail(&x, 400, "", "the body is not a JSON object");
    else if (known_fields(&x, o) && parse_options(&x, o, r) &&
             (kind == API_CHAT ? parse_messages(&x, o, r) : parse_prompt(&x, o, r)) && make_choices(&x, r))
        echo_texts(s, r);
    cJSON_Delete(o);
    if (msg[0]) {
        *code = x.code;
        serve_req_unref(s, r);
        return NULL;
    }
    return r;
}
