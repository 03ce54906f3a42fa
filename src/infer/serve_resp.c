/* serve_resp.c - the answers of `loom serve` (serve_internal.h), on rank 0:
 * each choice's text as its tokens arrive - bytes decoded incrementally
 * (an incomplete character held back, U+FFFD for ill-formed bytes, as
 * Hugging Face decodes), a stop token left out, a stop string cut and any
 * text that could still begin one held back - and the OpenAI bodies built
 * from it: text_completion / chat.completion objects, or server-sent events
 * (one per token and choice, a final one with finish_reason, usage when
 * asked, [DONE]). Everything here runs under the server mutex. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"

/* ---- a choice's text ------------------------------------------------------------ */

static int text_reserve(choice *c, size_t more) {
    if (c->text_len + more + 1 <= c->text_cap) return 1;
    size_t nc = c->text_cap ? c->text_cap : 256;
    while (nc < c->text_len + more + 1) nc *= 2;
    char *p = realloc(c->text, nc);
    if (!p) return 0;
    c->text = p;
    c->text_cap = nc;
    return 1;
}

#define B4(x) (x), (x) + 1, (x) + 2, (x) + 3
#define B16(x) B4(x), B4((x) + 4), B4((x) + 8), B4((x) + 12)
#define B64(x) B16(x), B16((x) + 16), B16((x) + 32), B16((x) + 48)
static const unsigned char ALL_BYTES[256] = {B64(0), B64(64), B64(128), B64(192)};

/* The bytes of token t: the tokenizer's, or without one the byte itself
 * (ids >= 256 have no bytes: U+FFFD). */
const char *serve_token_bytes(const server *s, uint32_t t, size_t *len) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    if (s->tok) return loom_tokenizer_token_bytes(s->tok, t, len);
    if (t >= 256) {
        *len = 3;
        return fffd;
    }
    *len = 1;
    return (const char *)&ALL_BYTES[t];
}

/* Cut the text at the first stop string that ends in its bytes from `from`
 * on; 1 if one did. */
static int cut_stop(const req *r, choice *c, size_t from) {
    size_t best = (size_t)-1;
    for (int i = 0; i < r->n_stop; i++) {
        const size_t L = r->stop_len[i];
        if (L == 0 || c->text_len < L) continue;
        size_t start = from + 1 > L ? from + 1 - L : 0;
        const char *hit = memmem(c->text + start, c->text_len - start, r->stop[i], L);
        if (hit && (size_t)(hit - c->text) < best) best = (size_t)(hit - c->text);
    }
    if (best == (size_t)-1) return 0;
    c->text_len = best;
    c->text[best] = '\0';
    return 1;
}

/* Bytes at the end of the text that could begin a stop string. */
static size_t stop_prefix_held(const req *r, const choice *c) {
    size_t held = 0;
    for (int i = 0; i < r->n_stop; i++)
        for (size_t k = r->stop_len[i] - 1; k > held; k--)
            if (k <= c->text_len && memcmp(c->text + c->text_len - k, r->stop[i], k) == 0) {
                held = k;
                break;
            }
    return held;
}

static void flush_decoder(choice *c) {
    if (c->dec.n && text_reserve(c, 3)) c->text_len += loom_utf8_flush(&c->dec, c->text + c->text_len);
    if (c->text) c->text[c->text_len] = '\0';
}

void serve_choice_finish(server *s, choice *c, const char *reason) {
    if (c->finished) return;
    const size_t before = c->text_len;
    flush_decoder(c);
    if (cut_stop(c->req, c, before)) reason = "stop";
    c->finished = 1;
    c->finish_reason = reason;
    c->text_ok = c->text_len;
    const char *names[4] = {"stop", "length", "abort", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(reason, names[i]) == 0) s->finished_by[i]++;
    req *r = c->req;
    if (++r->n_finished == r->n_choices) {
        s->completed++;
        serve_hist_add(&s->h_e2e, serve_now() - r->t_arrive);
    }
}

static int is_stop_token(const server *s, const req *r, int32_t t) {
    if (!r->ignore_eos && s->tok && t == loom_tokenizer_eot(s->tok)) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == t) return 1;
    return 0;
}

void serve_choice_push(server *s, choice *c, int32_t token, const tok_lp *lp) {
    req *r = c->req;
    if (loom_ids_push(&c->out, (uint32_t)token) != LOOM_OK) {
        serve_choice_finish(s, c, "error");
        return;
    }
    if (r->top_lp >= 0) {
        if (c->out.n > c->lp_cap) {
            size_t nc = c->lp_cap ? 2 * c->lp_cap : 16;
            tok_lp *p = realloc(c->lp, nc * sizeof *p);
            if (!p) {
                serve_choice_finish(s, c, "error");
                return;
            }
            c->lp = p;
            c->lp_cap = nc;
        }
        c->lp[c->out.n - 1] = lp ? *lp : (tok_lp){0};
    }
    if (is_stop_token(s, r, token)) {
        serve_choice_finish(s, c, "stop");
        return;
    }
    size_t len;
    const char *b = serve_token_bytes(s, (uint32_t)token, &len);
    const size_t before = c->text_len;
    if (!text_reserve(c, 3 * (len + 1))) {
        serve_choice_finish(s, c, "error");
        return;
    }
    c->text_len += loom_utf8_feed(&c->dec, b, len, c->text + c->text_len);
    c->text[c->text_len] = '\0';
    if (cut_stop(r, c, before)) {
        c->dec.n = 0; /* what it held follows the stop string */
        serve_choice_finish(s, c, "stop");
    } else if ((int)c->out.n >= r->max_tokens) {
        serve_choice_finish(s, c, "length");
    } else {
        c->text_ok = c->text_len - stop_prefix_held(r, c);
    }
}

/* ---- JSON ------------------------------------------------------------------ */

static int pend_add(req *r, const char *b, size_t n) {
    if (r->pend_len + n > r->pend_cap) {
        size_t nc = r->pend_cap ? r->pend_cap : 1024;
        while (nc < r->pend_len + n) nc *= 2;
        char *p = realloc(r->pend, nc);
        if (!p) return 0;
        r->pend = p;
        r->pend_cap = nc;
    }
    memcpy(r->pend + r->pend_len, b, n);
    r->pend_len += n;
    return 1;
}

/* A JSON string of s[0..n) (valid UTF-8) as a raw item: cJSON's own strings
 * end at a NUL byte, and a model may well generate one (\u0000). */
static cJSON *text_json(const char *s, size_t n) {
    char *o = malloc(6 * n + 3), *w = o;
    if (!o) return cJSON_CreateString("");
    *w++ = '"';
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') *w++ = '\\', *w++ = (char)c;
        else if (c == '\n') *w++ = '\\', *w++ = 'n';
        else if (c == '\r') *w++ = '\\', *w++ = 'r';
        else if (c == '\t') *w++ = '\\', *w++ = 't';
        else if (c < 0x20) w += sprintf(w, "\\u%04x", c);
        else *w++ = (char)c;
    }
    *w++ = '"';
    *w = '\0';
    cJSON *j = cJSON_CreateRaw(o);
    free(o);
    return j;
}

char *serve_utf8_lossy(const char *b, size_t len, size_t *out_len) {
    char *o = malloc(3 * (len + 1) + 1);
    if (!o) return NULL;
    loom_utf8_dec d = {0};
    size_t m = loom_utf8_feed(&d, b, len, o);
    m += loom_utf8_flush(&d, o + m);
    o[m] = '\0';
    if (out_len) *out_len = m;
    return o;
}

/* Token t's text alone, decoded (U+FFFD for a part of a character), as a
 * JSON string; its length in bytes in *n. */
static cJSON *token_string(const server *s, uint32_t t, size_t *n) {
    size_t len, m = 0;
    const char *b = serve_token_bytes(s, t, &len);
    char *o = serve_utf8_lossy(b, len, &m);
    cJSON *j = o ? text_json(o, m) : cJSON_CreateString("");
    if (n) *n = m;
    free(o);
    return j;
}

/* The same as a C string, for an object key (a NUL ends it). */
static char *token_key(const server *s, uint32_t t) {
    size_t len;
    const char *b = serve_token_bytes(s, t, &len);
    return serve_utf8_lossy(b, len, NULL);
}

static cJSON *token_bytes_json(const server *s, uint32_t t) {
    size_t len;
    const char *b = serve_token_bytes(s, t, &len);
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < len; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

/* The legacy completions logprobs of tokens [from, to) of c. */
static cJSON *lp_completion(const server *s, const choice *c, size_t from, size_t to, size_t offset) {
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (size_t i = from; i < to; i++) {
        const tok_lp *l = &c->lp[i];
        size_t tl = 0;
        cJSON *ts = token_string(s, c->out.v[i], &tl);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        offset += tl;
        cJSON_AddItemToArray(toks, ts);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(l->lp));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < l->n_top; k++) {
            char *key = token_key(s, (uint32_t)l->top_id[k]);
            if (key && !cJSON_GetObjectItemCaseSensitive(top, key))
                cJSON_AddNumberToObject(top, key, l->top_lp[k]);
            free(key);
        }
        cJSON_AddItemToArray(tops, top);
    }
    return o;
}

/* The chat logprobs ({"content": [...]}) of tokens [from, to) of c. */
static cJSON *lp_chat(const server *s, const choice *c, size_t from, size_t to) {
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (size_t i = from; i < to; i++) {
        const tok_lp *l = &c->lp[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "token", token_string(s, c->out.v[i], NULL));
        cJSON_AddNumberToObject(e, "logprob", l->lp);
        cJSON_AddItemToObject(e, "bytes", token_bytes_json(s, c->out.v[i]));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < l->n_top; k++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddItemToObject(t, "token", token_string(s, (uint32_t)l->top_id[k], NULL));
            cJSON_AddNumberToObject(t, "logprob", l->top_lp[k]);
            cJSON_AddItemToObject(t, "bytes", token_bytes_json(s, (uint32_t)l->top_id[k]));
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

static cJSON *lp_json(const server *s, const choice *c, size_t from, size_t to, size_t offset) {
    if (c->req->top_lp < 0) return cJSON_CreateNull();
    return c->req->kind == API_CHAT ? lp_chat(s, c, from, to) : lp_completion(s, c, from, to, offset);
}

static cJSON *envelope(const server *s, const req *r, int chunk) {
    cJSON *o = cJSON_CreateObject();
    char id[48];
    snprintf(id, sizeof id, "%s-%ld", r->kind == API_CHAT ? "chatcmpl" : "cmpl", r->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            r->kind == API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", s->cfg->model_name);
    return o;
}

static cJSON *usage_json(const req *r) {
    size_t prompt = 0, out = 0;
    for (int i = 0; i < r->n_prompts; i++) prompt += r->prompts[i].n;
    for (int i = 0; i < r->n_choices; i++) out += r->ch[i].out.n;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)out);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + out));
    return u;
}

static const char *echo_text(const req *r, const choice *c) {
    return r->echo && r->prompt_text && r->prompt_text[c->prompt] ? r->prompt_text[c->prompt] : "";
}

static void emit(req *r, cJSON *o) {
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js) return;
    if (r->stream) pend_add(r, "data: ", 6);
    pend_add(r, js, strlen(js));
    if (r->stream) pend_add(r, "\n\n", 2);
    free(js);
}

/* The whole answer once every choice has finished. */
static void full_response(server *s, req *r) {
    cJSON *o = envelope(s, r, 0), *chs = cJSON_AddArrayToObject(o, "choices");
    double ttft = 0, total = 0;
    for (int i = 0; i < r->n_choices; i++) {
        const choice *c = &r->ch[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "index", c->index);
        const char *echo = echo_text(r, c);
        if (r->kind == API_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(j, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content", text_json(c->text ? c->text : "", c->text_len));
        } else {
            size_t el = strlen(echo), tl = c->text_len;
            char *t = malloc(el + tl + 1);
            if (t) {
                memcpy(t, echo, el);
                if (tl) memcpy(t + el, c->text, tl);
                t[el + tl] = '\0';
            }
            cJSON_AddItemToObject(j, "text", text_json(t ? t : "", t ? el + tl : 0));
            free(t);
        }
        cJSON_AddItemToObject(j, "logprobs", lp_json(s, c, 0, c->out.n, strlen(echo)));
        cJSON_AddStringToObject(j, "finish_reason", c->finish_reason ? c->finish_reason : "abort");
        cJSON *ids = cJSON_AddArrayToObject(j, "token_ids");
        for (size_t k = 0; k < c->out.n; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(c->out.v[k]));
        cJSON_AddItemToArray(chs, j);
        if (c->out.n && (ttft == 0 || c->t_first - r->t_arrive < ttft)) ttft = c->t_first - r->t_arrive;
        if (c->t_last - r->t_arrive > total) total = c->t_last - r->t_arrive;
    }
    cJSON_AddItemToObject(o, "usage", usage_json(r));
    cJSON *t = cJSON_AddObjectToObject(o, "timing");
    cJSON_AddNumberToObject(t, "ttft_ms", 1e3 * ttft);
    cJSON_AddNumberToObject(t, "total_ms", 1e3 * total);
    emit(r, o);
}

/* One event of choice c: text piece, optionally token k, optionally the end. */
static void event(server *s, req *r, const choice *c, const char *piece, size_t plen, long k, int role,
                  const char *finish) {
    cJSON *o = envelope(s, r, 1), *chs = cJSON_AddArrayToObject(o, "choices"), *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", c->index);
    if (r->kind == API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(j, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (role || plen || !finish) cJSON_AddItemToObject(d, "content", text_json(piece, plen));
    } else {
        cJSON_AddItemToObject(j, "text", text_json(piece, plen));
    }
    if (k >= 0) {
        cJSON_AddItemToObject(j, "logprobs", lp_json(s, c, (size_t)k, (size_t)k + 1, c->sent_text));
        cJSON_AddNumberToObject(j, "token_id", c->out.v[k]);
    } else {
        cJSON_AddNullToObject(j, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(j, "finish_reason", finish);
    else cJSON_AddNullToObject(j, "finish_reason");
    cJSON_AddItemToArray(chs, j);
    if (r->include_usage) cJSON_AddNullToObject(o, "usage");
    emit(r, o);
}

/* The events choice c can send now: one per new token (the text that became
 * safe to send goes with the latest), the final one with finish_reason. */
static void stream_choice(server *s, req *r, choice *c) {
    if (!c->started) {
        c->started = 1;
        const char *echo = echo_text(r, c);
        if (r->kind == API_CHAT) event(s, r, c, "", 0, -1, 1, NULL);
        else if (echo[0]) event(s, r, c, echo, strlen(echo), -1, 0, NULL);
    }
    while (c->sent_tokens < c->out.n || (c->finished && !c->final_sent)) {
        const int is_tok = c->sent_tokens < c->out.n;
        const int last = !is_tok || c->sent_tokens + 1 == c->out.n;
        const int fin = c->finished && last;
        size_t to = last ? c->text_ok : c->sent_text;
        if (to < c->sent_text) to = c->sent_text;
        event(s, r, c, c->text ? c->text + c->sent_text : "", to - c->sent_text,
              is_tok ? (long)c->sent_tokens : -1, 0,
              fin ? (c->finish_reason ? c->finish_reason : "abort") : NULL);
        c->sent_tokens += (size_t)is_tok;
        c->sent_text = to;
        if (fin) c->final_sent = 1;
    }
}

int serve_produce(server *s, req *r) {
    if (r->done_sent) return 1;
    if (!r->stream) {
        if (r->n_finished < r->n_choices) return 0;
        full_response(s, r);
        r->done_sent = 1;
        return 1;
    }
    int all = 1;
    for (int i = 0; i < r->n_choices; i++) {
        stream_choice(s, r, &r->ch[i]);
        all &= r->ch[i].final_sent;
    }
    if (!all) return 0;
    if (r->include_usage) {
        cJSON *o = envelope(s, r, 1);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(r));
        emit(r, o);
    }
    pend_add(r, "data: [DONE]\n\n", 14);
    r->done_sent = 1;
    return 1;
}
