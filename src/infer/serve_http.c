/* serve_http.c - the HTTP half of `loom serve` (include/loom/serve.h), on
 * rank 0 only: libmicrohttpd's connection threads parse requests, queue them
 * for the model loop (serve.c) and stream its tokens back; /health reports
 * the queue, the KV cache and latency percentiles. Every request is touched
 * under the server mutex. Nothing here calls the communicator. */
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"
#include "loom/log.h"

double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct timespec serve_deadline_in(long ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ns;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    return ts;
}

void serve_req_unref(server *s, req *r) { /* under s->mu */
    (void)s;
    if (--r->refs > 0) return;
    loom_ids_free(&r->prompt);
    loom_ids_free(&r->out);
    free(r->pend);
    free(r);
}

/* ---- JSON helpers ---------------------------------------------------------- */

static enum MHD_Result send_json(struct MHD_Connection *con, unsigned code, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(con, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *con, unsigned code, const char *type,
                                  const char *msg) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "code", code);
    return send_json(con, code, o);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* p50/p95/p99 in milliseconds of the kept samples (under s->mu). */
static void add_percentiles(cJSON *o, const char *name, const double *xs, long n) {
    cJSON *p = cJSON_AddObjectToObject(o, name);
    long k = n < LAT_KEEP ? n : LAT_KEEP;
    cJSON_AddNumberToObject(p, "count", (double)n);
    if (k == 0) return;
    double *c = malloc(sizeof(double) * (size_t)k);
    if (!c) return;
    memcpy(c, xs, sizeof(double) * (size_t)k);
    qsort(c, (size_t)k, sizeof *c, cmp_double);
    const double qs[3] = {0.50, 0.95, 0.99};
    const char *names[3] = {"p50", "p95", "p99"};
    for (int i = 0; i < 3; i++) {
        long idx = (long)ceil(qs[i] * (double)k) - 1;
        cJSON_AddNumberToObject(p, names[i], 1e3 * c[idx < 0 ? 0 : idx]);
    }
    free(c);
}

static enum MHD_Result health(server *s, struct MHD_Connection *con) {
    cJSON *o = cJSON_CreateObject();
    const loom_infer_opts *io = loom_infer_options(s->inf);
    pthread_mutex_lock(&s->mu);
    int used = 0;
    long positions = 0;
    for (int i = 0; i < io->max_seqs; i++)
        if (s->slots[i]) {
            used++;
            positions += (long)(s->slots[i]->prefill_pos + s->slots[i]->out.n);
        }
    cJSON_AddStringToObject(o, "status", s->stopping ? "stopping" : "ok");
    cJSON_AddStringToObject(o, "model", s->cfg->model_name);
    cJSON_AddNumberToObject(o, "running", used);
    cJSON_AddNumberToObject(o, "waiting", s->n_wait);
    cJSON_AddNumberToObject(o, "completed", (double)s->completed);
    cJSON_AddNumberToObject(o, "loop_iterations", (double)s->loop_iters);
    cJSON_AddNumberToObject(o, "ms_since_loop", 1e3 * (serve_now() - s->last_loop));

    cJSON_AddNumberToObject(o, "rejected_503", (double)s->rejected);
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache");
    cJSON_AddNumberToObject(kv, "slots", io->max_seqs);
    cJSON_AddNumberToObject(kv, "slots_used", used);
    cJSON_AddNumberToObject(kv, "positions", (double)io->max_seqs * io->max_len);
    cJSON_AddNumberToObject(kv, "positions_used", (double)positions);
    cJSON_AddNumberToObject(kv, "bytes_per_rank", (double)loom_infer_cache_bytes(s->inf));
    add_percentiles(o, "ttft_ms", s->ttft, s->n_ttft);
    add_percentiles(o, "inter_token_ms", s->tpot, s->n_tpot);
    cJSON_AddNumberToObject(o, "tokens_generated", (double)s->tokens_out);
    double span = s->t_first_req > 0 ? serve_now() - s->t_first_req : 0;
    cJSON_AddNumberToObject(o, "tokens_per_s", span > 0 ? (double)s->tokens_out / span : 0);
    pthread_mutex_unlock(&s->mu);
    return send_json(con, MHD_HTTP_OK, o);
}

/* ---- POST /v1/completions ------------------------------------------------ */

typedef struct conn {
    char *body;
    size_t len, cap;
    int too_large;
} conn;

/* Move waiters into free KV slots, oldest first (under s->mu). Called when a
 * request arrives and when the loop plans a step, so that whenever the lock
 * is free a request waits only while every slot is taken: /health never sees
 * a waiter beside a free slot, and an arrival does not wait for the loop's
 * next wake-up to get a slot. A slot is free only once plan_step released it,
 * so the step in flight does not touch it; the new request's first step
 * resets its cache (fresh). */
void serve_admit(server *s) {
    const int max_seqs = loom_infer_options(s->inf)->max_seqs;
    for (int i = 0; i < max_seqs && s->wait_head; i++) {
        if (s->slots[i]) continue;
        req *r = s->wait_head;
        s->wait_head = r->next;
        if (!s->wait_head) s->wait_tail = NULL;
        s->n_wait--;
        r->next = NULL;
        r->slot = i;
        r->prefill_pos = 0;
        s->slots[i] = r;
    }
}

/* Parse and check a request; on failure *msg says why (400). */
static req *parse_request(server *s, const char *body, size_t len, char *msg, size_t cap) {
    const loom_infer_opts *io = loom_infer_options(s->inf);
    const int V = loom_infer_config(s->inf)->vocab_size;
    cJSON *o = cJSON_ParseWithLength(body, len);
    req *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(msg, cap, "out of memory");
        cJSON_Delete(o);
        return NULL;
    }
    r->max_tokens = 16;
    r->so = (loom_sample_opts){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int has_seed = 0;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "max_tokens");
    const cJSON *te = cJSON_GetObjectItemCaseSensitive(o, "temperature");
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(o, "top_p");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(o, "top_k");
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(o, "seed");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stream");
    msg[0] = '\0';
    if (!o || !cJSON_IsObject(o)) snprintf(msg, cap, "the body is not a JSON object");
    else if (!p) snprintf(msg, cap, "'prompt' is required");
    else if (mt && (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > 1e9 ||
                    mt->valuedouble != floor(mt->valuedouble)))
        snprintf(msg, cap, "'max_tokens' must be a positive integer");
    else if (te && !cJSON_IsNumber(te)) snprintf(msg, cap, "'temperature' must be a number");
    else if (tp && !cJSON_IsNumber(tp)) snprintf(msg, cap, "'top_p' must be a number");
    else if (tk &&
             (!cJSON_IsNumber(tk) || tk->valuedouble != floor(tk->valuedouble) || tk->valuedouble > 1e9))
        snprintf(msg, cap, "'top_k' must be an integer");
    else if (sd && (!cJSON_IsNumber(sd) || sd->valuedouble < 0 || sd->valuedouble > 9007199254740992.0))
        snprintf(msg, cap, "'seed' must be a non-negative integer");
    else if (st && !cJSON_IsBool(st)) snprintf(msg, cap, "'stream' must be true or false");
    if (!msg[0]) {
        if (mt) r->max_tokens = (int)mt->valuedouble;
        if (te) r->so.temperature = (float)te->valuedouble;
        if (tp) r->so.top_p = (float)tp->valuedouble;
        if (tk) r->so.top_k = (int)tk->valuedouble;
        if (sd) {
            r->so.seed = (uint64_t)sd->valuedouble;
            has_seed = 1;
        }
        r->stream = st && cJSON_IsTrue(st);
        if (loom_sample_check(&r->so) != LOOM_OK) snprintf(msg, cap, "%s", loom_errmsg());
    }
    if (!msg[0] && cJSON_IsString(p)) {
        if (!s->tok) {
            for (const unsigned char *c = (const unsigned char *)p->valuestring; *c && !msg[0]; c++)
                if (*c >= V || loom_ids_push(&r->prompt, *c) != LOOM_OK)
                    snprintf(msg, cap, "prompt byte outside the vocabulary");
        } else {
            pthread_mutex_lock(&s->tok_mu);
            int bos = loom_tokenizer_bos(s->tok); /* as Hugging Face's tokenizer(prompt) adds it */
            if ((bos >= 0 && loom_ids_push(&r->prompt, (uint32_t)bos) != LOOM_OK) ||
                loom_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), 1, &r->prompt) !=
                    LOOM_OK)
                snprintf(msg, cap, "%s", loom_errmsg());
            pthread_mutex_unlock(&s->tok_mu);
        }
    } else if (!msg[0] && cJSON_IsArray(p)) {
        for (const cJSON *e = p->child; e && !msg[0]; e = e->next) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= V ||
                e->valuedouble != floor(e->valuedouble))
                snprintf(msg, cap, "'prompt' token ids must be integers in [0, %d)", V);
            else if (loom_ids_push(&r->prompt, (uint32_t)e->valuedouble) != LOOM_OK)
                snprintf(msg, cap, "out of memory");
        }
    } else if (!msg[0]) {
        snprintf(msg, cap, "'prompt' must be a string or an array of token ids");
    }
    if (!msg[0] && r->prompt.n == 0) snprintf(msg, cap, "'prompt' is empty");
    if (!msg[0] && r->prompt.n + (size_t)r->max_tokens > (size_t)io->max_len)
        snprintf(msg, cap, "prompt (%zu tokens) + max_tokens (%d) exceeds the context length %d", r->prompt.n,
                 r->max_tokens, io->max_len);
    cJSON_Delete(o);
    if (msg[0]) {
        loom_ids_free(&r->prompt);
        free(r);
        return NULL;
    }
    r->slot = -1;
    r->refs = 2;
    if (!has_seed) r->so.seed = 0x5eed;
    return r;
}

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

/* Length of the longest prefix of b that does not end inside a UTF-8 sequence. */
static size_t utf8_complete(const char *b, size_t n) {
    size_t i = n;
    for (int back = 0; back < 4 && i > 0; back++) {
        unsigned char c = (unsigned char)b[i - 1];
        if ((c & 0xC0) == 0x80) {
            i--;
            continue;
        }
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return (n - (i - 1) >= need) ? n : i - 1;
    }
    return n;
}

static char *decode_ids(server *s, const uint32_t *ids, size_t n, size_t *len) {
    char *text = NULL;
    *len = 0;
    if (s->tok) {
        pthread_mutex_lock(&s->tok_mu);
        if (loom_tokenizer_decode(s->tok, ids, n, &text, len) != LOOM_OK) text = NULL;
        pthread_mutex_unlock(&s->tok_mu);
        return text;
    }
    text = malloc(n + 1);
    for (size_t i = 0; text && i < n; i++) text[i] = (char)(ids[i] < 256 ? ids[i] : '?');
    if (text) text[n] = '\0';
    *len = n;
    return text;
}

/* The bytes of one token, malloc'd. */
static char *token_text(server *s, uint32_t t, size_t *len) {
    pthread_mutex_lock(&s->tok_mu);
    const char *b = loom_tokenizer_token_bytes(s->tok, t, len);
    char *text = malloc(*len + 1);
    if (text) {
        if (*len) memcpy(text, b, *len);
        text[*len] = '\0';
    }
    pthread_mutex_unlock(&s->tok_mu);
    return text;
}

static cJSON *completion_json(server *s, req *r, const char *text, const char *finish) {
    cJSON *o = cJSON_CreateObject();
    char id[48];
    snprintf(id, sizeof id, "cmpl-%ld", r->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    cJSON_AddStringToObject(o, "model", s->cfg->model_name);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddStringToObject(c, "text", text);
    cJSON_AddNumberToObject(c, "index", 0);
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return o;
}

/* Fill r->pend with what can go out now (under s->mu). Returns 1 when the
 * response is complete after pend drains. */
static int produce(server *s, req *r) {
    if (!r->stream) {
        if (r->done_sent) return 1;
        if (!r->finished) return 0;
        r->done_sent = 1;
        size_t len;
        char *text = decode_ids(s, r->out.v, r->out.n, &len);
        cJSON *o = completion_json(s, r, text ? text : "", r->finish_reason);
        free(text);
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0),
              *ids = cJSON_AddArrayToObject(c, "token_ids");
        for (size_t i = 0; i < r->out.n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->out.v[i]));
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->prompt.n);
        cJSON_AddNumberToObject(u, "completion_tokens", (double)r->out.n);
        cJSON_AddNumberToObject(u, "total_tokens", (double)(r->prompt.n + r->out.n));
        cJSON *t = cJSON_AddObjectToObject(o, "timing");
        cJSON_AddNumberToObject(t, "ttft_ms", 1e3 * (r->t_first - r->t_arrive));
        cJSON_AddNumberToObject(t, "total_ms", 1e3 * (r->t_last - r->t_arrive));
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (js) pend_add(r, js, strlen(js));
        free(js);
        return 1;
    }
    while (r->sent_tokens < r->out.n) { /* one event per token, text held back mid-character */
        size_t len;
        uint32_t t = r->out.v[r->sent_tokens];
        /* a token's own bytes: decode would drop a byte-fallback tokenizer's
         * leading space from every event, not only from the first */
        char *text = r->sent_tokens == 0 || !s->tok ? decode_ids(s, &t, 1, &len) : token_text(s, t, &len);
        char buf[64];
        size_t n = 0;
        memcpy(buf, r->hold, r->hold_len);
        n = r->hold_len;
        if (text) {
            size_t k = len < sizeof buf - n - 1 ? len : sizeof buf - n - 1;
            memcpy(buf + n, text, k);
            n += k;
        }
        free(text);
        r->sent_tokens++;
        int last = r->finished && r->sent_tokens == r->out.n;
        size_t ok = last ? n : utf8_complete(buf, n); /* the last event flushes what is held */
        r->hold_len = n - ok < sizeof r->hold ? n - ok : 0;
        memcpy(r->hold, buf + ok, r->hold_len);
        buf[ok] = '\0';
        cJSON *o = completion_json(s, r, buf, last ? r->finish_reason : NULL);
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        cJSON_AddNumberToObject(c, "token_id", t);
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (js) {
            pend_add(r, "data: ", 6);
            pend_add(r, js, strlen(js));
            pend_add(r, "\n\n", 2);
        }
        free(js);
    }
    if (r->finished && r->sent_tokens == r->out.n && !r->done_sent) {
        pend_add(r, "data: [DONE]\n\n", 14);
        r->done_sent = 1;
    }
    return r->done_sent;
}

/* Response body callback (an HTTP thread): wait for output, copy it out. */
static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    req *r = cls;
    server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (r->pend_off < r->pend_len) break;
        r->pend_off = r->pend_len = 0;
        int complete = produce(s, r);
        if (r->pend_len > 0) break;
        if (complete || s->stopping) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct timespec ts = serve_deadline_in(200000000);
        pthread_cond_timedwait(&s->progress, &s->mu, &ts);
    }
    size_t n = r->pend_len - r->pend_off < max ? r->pend_len - r->pend_off : max;
    memcpy(buf, r->pend + r->pend_off, n);
    r->pend_off += n;
    pthread_mutex_unlock(&s->mu);
    return (ssize_t)n;
}

/* The response is gone (sent, or the client went away): the HTTP side's
 * reference; an unfinished request is cancelled and its slot freed by the
 * loop at the next step. */
static void reader_free(void *cls) {
    req *r = cls;
    server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    if (!r->finished) r->cancelled = 1;
    pthread_cond_broadcast(&s->work);
    serve_req_unref(s, r);
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result completions(server *s, struct MHD_Connection *con, conn *cn) {
    char msg[512];
    if (cn->too_large) {
        snprintf(msg, sizeof msg, "request body over %d bytes", s->cfg->max_body);
        return send_error(con, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", msg);
    }
    req *r = parse_request(s, cn->body ? cn->body : "", cn->len, msg, sizeof msg);
    if (!r) return send_error(con, MHD_HTTP_BAD_REQUEST, "invalid_request_error", msg);
    r->srv = s;
    pthread_mutex_lock(&s->mu);
    int free_slots = 0; /* waiters the next step admits do not count against the queue */
    for (int i = 0; i < loom_infer_options(s->inf)->max_seqs; i++) free_slots += s->slots[i] == NULL;
    if (s->stopping || s->n_wait >= s->cfg->queue + free_slots) {
        s->rejected++;
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        loom_ids_free(&r->prompt);
        free(r);
        return send_error(con, MHD_HTTP_SERVICE_UNAVAILABLE, "server_busy",
                          stopping ? "the server is shutting down"
                                   : "the request queue is full; retry later");
    }
    r->id = ++s->next_id;
    r->t_arrive = serve_now();
    if (s->t_first_req == 0) s->t_first_req = r->t_arrive;
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->n_wait++;
    serve_admit(s);
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, r, reader_free);
    if (!resp) {
        reader_free(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", r->stream ? "text/event-stream" : "application/json");
    if (r->stream) MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(con, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    (void)version;
    server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!cn->too_large) {
            if (cn->len + *upload_size > (size_t)s->cfg->max_body) {
                cn->too_large = 1;
            } else {
                if (cn->len + *upload_size + 1 > cn->cap) {
                    size_t nc = (cn->len + *upload_size + 1) * 2;
                    char *p = realloc(cn->body, nc);
                    if (!p) return MHD_NO;
                    cn->body = p;
                    cn->cap = nc;
                }
                memcpy(cn->body + cn->len, upload, *upload_size);
                cn->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(url, "/health") == 0) {
        if (strcmp(method, "GET") != 0)
            return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "use GET /health");
        return health(s, con);
    }
    if (strcmp(url, "/v1/completions") == 0) {
        if (strcmp(method, "POST") != 0)
            return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                              "use POST /v1/completions");
        return completions(s, con, cn);
    }
    return send_error(con, MHD_HTTP_NOT_FOUND, "invalid_request_error",
                      "unknown path; try POST /v1/completions or GET /health");
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls,
                         enum MHD_RequestTerminationCode t) {
    (void)cls;
    (void)con;
    (void)t;
    conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
    }
    *con_cls = NULL;
}

struct MHD_Daemon *serve_start_http(server *s, int *port) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->cfg->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(s->cfg->queue + 64), MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    if (!d) return NULL;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : s->cfg->port;
    return d;
}
