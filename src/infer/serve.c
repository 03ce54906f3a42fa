/* serve.c - `loom serve`: HTTP on rank 0 (libmicrohttpd threads), the model
 * loop on every rank's main thread, continuous batching between steps. See
 * include/loom/serve.h. Only the main thread of each rank calls the
 * communicator; HTTP threads touch requests under the server mutex. */
#include "loom/serve.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/log.h"

#define HDR_TAG 7401
#define LAT_KEEP 65536

/* ---- requests ------------------------------------------------------------ */

struct server;
typedef struct req {
    struct server *srv;
    long id;
    loom_ids prompt, out;
    int max_tokens, stream;
    loom_sample_opts so;
    int slot;           /* -1 while waiting */
    size_t prefill_pos; /* prompt tokens already in the cache */
    int finished, cancelled;
    const char *finish_reason;
    double t_arrive, t_first, t_last;
    int refs;           /* the HTTP response and the model loop */
    struct req *next;   /* waiting queue */
    /* HTTP side only */
    size_t sent_tokens;
    char *pend;         /* bytes ready to go out */
    size_t pend_len, pend_off, pend_cap;
    char hold[8];       /* an incomplete UTF-8 sequence held back (stream) */
    size_t hold_len;
    int done_sent;
} req;

typedef struct server {
    const loom_serve_config *cfg;
    loom_infer *inf;
    loom_tokenizer *tok;
    pthread_mutex_t mu, tok_mu;
    pthread_cond_t work, progress;
    req *wait_head, *wait_tail;
    int n_wait;
    req **slots; /* (max_seqs) running requests */
    long next_id;
    int stopping;
    /* metrics */
    double *ttft, *tpot;
    long n_ttft, n_tpot, completed, rejected, tokens_out;
    double t_start, t_first_req;
    long loop_iters;  /* model-loop wake-ups on rank 0 (liveness) */
    double last_loop; /* when the loop last planned a step */
} server;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CLOCK_REALTIME now + ns, for pthread_cond_timedwait. */
static struct timespec deadline_in(long ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ns;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    return ts;
}

static void req_unref(server *s, req *r) { /* under s->mu */
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

static enum MHD_Result send_error(struct MHD_Connection *con, unsigned code, const char *type, const char *msg) {
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
    cJSON_AddNumberToObject(o, "ms_since_loop", 1e3 * (now_s() - s->last_loop));

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
    double span = s->t_first_req > 0 ? now_s() - s->t_first_req : 0;
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
static void admit(server *s) {
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
    else if (tk && (!cJSON_IsNumber(tk) || tk->valuedouble != floor(tk->valuedouble) || tk->valuedouble > 1e9))
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
                if (*c >= V || loom_ids_push(&r->prompt, *c) != LOOM_OK) snprintf(msg, cap, "prompt byte outside the vocabulary");
        } else {
            pthread_mutex_lock(&s->tok_mu);
            if (loom_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), 1, &r->prompt) != LOOM_OK)
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
        if ((c & 0xC0) == 0x80) { i--; continue; }
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
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *ids = cJSON_AddArrayToObject(c, "token_ids");
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
        char *text = decode_ids(s, &t, 1, &len);
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
        struct timespec ts = deadline_in(200000000);
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
    req_unref(s, r);
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
                          stopping ? "the server is shutting down" : "the request queue is full; retry later");
    }
    r->id = ++s->next_id;
    r->t_arrive = now_s();
    if (s->t_first_req == 0) s->t_first_req = r->t_arrive;
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->n_wait++;
    admit(s);
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, r, reader_free);
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
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
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
        if (strcmp(method, "GET") != 0) return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "use GET /health");
        return health(s, con);
    }
    if (strcmp(url, "/v1/completions") == 0) {
        if (strcmp(method, "POST") != 0)
            return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "use POST /v1/completions");
        return completions(s, con, cn);
    }
    return send_error(con, MHD_HTTP_NOT_FOUND, "invalid_request_error", "unknown path; try POST /v1/completions or GET /health");
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode t) {
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

/* ---- the model loop ----------------------------------------------------------- */

/* One entry of a step's plan, the same on every rank. */
typedef struct plan_entry {
    int32_t seq, n_new, fresh, final, top_k;
    float temperature, top_p;
    uint64_t seed, index;
} plan_entry;

typedef struct plan {
    int32_t hdr[3]; /* entries, rows, shutdown */
    plan_entry *e;
    int32_t *tok, *next;
    req **owner; /* rank 0: the request of each entry */
    float *probs;
    int *iscratch;
    int *seq, *n_new;
} plan;

/* Rank 0: drop finished / cancelled requests, admit waiting ones, and lay
 * out the next step: one token for every running sequence, then prefill
 * chunks in the rows left (under s->mu). */
static void plan_step(server *s, plan *p) {
    const loom_infer_opts *io = loom_infer_options(s->inf);
    for (int i = 0; i < io->max_seqs; i++) {
        req *r = s->slots[i];
        if (r && (r->finished || r->cancelled)) {
            s->slots[i] = NULL;
            r->finished = 1;
            if (!r->finish_reason) r->finish_reason = "cancelled";
            req_unref(s, r);
        }
    }
    /* drop cancelled waiters, then admit into free slots */
    for (req **pp = &s->wait_head; *pp;) {
        req *r = *pp;
        if (r->cancelled) {
            *pp = r->next;
            s->n_wait--;
            r->finished = 1;
            req_unref(s, r);
            continue;
        }
        pp = &r->next;
    }
    s->wait_tail = NULL;
    for (req *r = s->wait_head; r; r = r->next) s->wait_tail = r;
    admit(s);
    int n = 0, rows = 0;
    for (int i = 0; i < io->max_seqs; i++) { /* decode first: running sequences never wait */
        req *r = s->slots[i];
        if (!r || r->prefill_pos < r->prompt.n) continue;
        p->e[n] = (plan_entry){.seq = i, .n_new = 1, .fresh = 0, .final = 1};
        p->tok[rows++] = (int32_t)r->out.v[r->out.n - 1];
        p->owner[n++] = r;
    }
    for (int i = 0; i < io->max_seqs && rows < io->max_rows; i++) {
        req *r = s->slots[i];
        if (!r || r->prefill_pos >= r->prompt.n) continue;
        size_t left = r->prompt.n - r->prefill_pos;
        int take = left < (size_t)(io->max_rows - rows) ? (int)left : io->max_rows - rows;
        p->e[n] = (plan_entry){.seq = i, .n_new = take, .fresh = r->prefill_pos == 0,
                               .final = r->prefill_pos + (size_t)take == r->prompt.n};
        for (int k = 0; k < take; k++) p->tok[rows++] = (int32_t)r->prompt.v[r->prefill_pos + (size_t)k];
        r->prefill_pos += (size_t)take;
        p->owner[n++] = r;
    }
    for (int j = 0; j < n; j++) {
        req *r = p->owner[j];
        p->e[j].top_k = r->so.top_k;
        p->e[j].temperature = r->so.temperature;
        p->e[j].top_p = r->so.top_p;
        p->e[j].seed = r->so.seed;
        p->e[j].index = ((uint64_t)r->id << 32) | r->out.n;
    }
    p->hdr[0] = n;
    p->hdr[1] = rows;
    p->hdr[2] = 0;
}

/* Rank 0 -> every rank: the header by point-to-point, then the plan. */
static loom_status share_plan(loom_comm *world, plan *p) {
    const int rank = loom_comm_rank(world), size = loom_comm_size(world);
    if (size == 1) return LOOM_OK;
    if (rank == 0) {
        for (int r = 1; r < size; r++) LOOM_TRY(loom_comm_send(world, p->hdr, sizeof p->hdr, r, HDR_TAG));
    } else {
        loom_req *q;
        LOOM_TRY(loom_comm_irecv(world, p->hdr, sizeof p->hdr, 0, HDR_TAG, &q));
        for (int done = 0;;) { /* idle ranks sleep between polls instead of spinning in MPI */
            LOOM_TRY(loom_comm_test(q, &done));
            if (done) break;
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    if (p->hdr[2] || p->hdr[0] == 0) return LOOM_OK;
    LOOM_TRY(loom_comm_bcast(world, p->e, sizeof(plan_entry) * (size_t)p->hdr[0], 0));
    return loom_comm_bcast(world, p->tok, sizeof(int32_t) * (size_t)p->hdr[1], 0);
}

/* Every rank: run the planned step; the root samples, everyone gets the tokens. */
static loom_status run_step(loom_infer *inf, loom_comm *world, int root, plan *p) {
    const int n = p->hdr[0], V = loom_infer_config(inf)->vocab_size;
    for (int j = 0; j < n; j++) {
        if (p->e[j].fresh) loom_infer_reset(inf, p->e[j].seq);
        p->seq[j] = p->e[j].seq;
        p->n_new[j] = p->e[j].n_new;
    }
    const float *logits;
    LOOM_TRY(loom_infer_step(inf, n, p->seq, p->n_new, p->tok, &logits));
    if (logits && loom_comm_rank(world) == root)
        for (int j = 0; j < n; j++) {
            if (!p->e[j].final) continue;
            loom_sample_opts so = {p->e[j].temperature, p->e[j].top_k, p->e[j].top_p, p->e[j].seed};
            p->next[j] = loom_sample(logits + (size_t)j * V, V, &so, p->e[j].index, p->probs, p->iscratch);
        }
    if (loom_comm_size(world) > 1) LOOM_TRY(loom_comm_bcast(world, p->next, sizeof(int32_t) * (size_t)n, root));
    return LOOM_OK;
}

/* Rank 0 after a step: hand the new tokens to their requests (under s->mu). */
static void deliver(server *s, plan *p) {
    const double t = now_s();
    const int eot = s->tok ? loom_tokenizer_eot(s->tok) : -1;
    for (int j = 0; j < p->hdr[0]; j++) {
        req *r = p->owner[j];
        if (!p->e[j].final || r->finished) continue;
        if (loom_ids_push(&r->out, (uint32_t)p->next[j]) != LOOM_OK) {
            r->finished = 1;
            r->finish_reason = "error";
            continue;
        }
        s->tokens_out++;
        if (r->out.n == 1) {
            r->t_first = t;
            s->ttft[s->n_ttft++ % LAT_KEEP] = t - r->t_arrive;
        } else {
            s->tpot[s->n_tpot++ % LAT_KEEP] = t - r->t_last;
        }
        r->t_last = t;
        if (p->next[j] == eot) {
            r->finished = 1;
            r->finish_reason = "stop";
        } else if ((int)r->out.n >= r->max_tokens) {
            r->finished = 1;
            r->finish_reason = "length";
        }
        if (r->finished) s->completed++;
    }
    pthread_cond_broadcast(&s->progress);
}

static loom_status plan_alloc(plan *p, const loom_infer_opts *io, int V) {
    size_t S = (size_t)io->max_seqs, R = (size_t)io->max_rows + S;
    p->e = calloc(S, sizeof *p->e);
    p->tok = calloc(R, sizeof *p->tok);
    p->next = calloc(S, sizeof *p->next);
    p->owner = calloc(S, sizeof *p->owner);
    p->seq = calloc(S, sizeof *p->seq);
    p->n_new = calloc(S, sizeof *p->n_new);
    p->probs = malloc(sizeof(float) * 2 * (size_t)V);
    p->iscratch = malloc(sizeof(int) * (size_t)V);
    if (!p->e || !p->tok || !p->next || !p->owner || !p->seq || !p->n_new || !p->probs || !p->iscratch)
        return loom_fail(LOOM_EOS, "serve: out of memory for the step plan");
    return LOOM_OK;
}

static void plan_free(plan *p) {
    free(p->e);
    free(p->tok);
    free(p->next);
    free(p->owner);
    free(p->seq);
    free(p->n_new);
    free(p->probs);
    free(p->iscratch);
}

static struct MHD_Daemon *start_http(server *s, int *port) {
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

loom_status loom_serve_run(const loom_serve_config *c, loom_infer *inf, loom_tokenizer *tok, loom_comm *world,
                           int root) {
    world = loom_comm_host(world); /* host data only: requests, plans, token ids */
    const loom_infer_opts *io = loom_infer_options(inf);
    const int rank = loom_comm_rank(world);
    server s;
    memset(&s, 0, sizeof s);
    s.cfg = c;
    s.inf = inf;
    s.tok = tok;
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&s.tok_mu, NULL);
    pthread_cond_init(&s.work, NULL);
    pthread_cond_init(&s.progress, NULL);
    plan p;
    memset(&p, 0, sizeof p);
    loom_status st = plan_alloc(&p, io, loom_infer_config(inf)->vocab_size);
    struct MHD_Daemon *d = NULL;
    if (st == LOOM_OK && rank == 0) {
        s.slots = calloc((size_t)io->max_seqs, sizeof *s.slots);
        s.ttft = calloc(LAT_KEEP, sizeof(double));
        s.tpot = calloc(LAT_KEEP, sizeof(double));
        if (!s.slots || !s.ttft || !s.tpot) st = loom_fail(LOOM_EOS, "serve: out of memory");
        int port = 0;
        if (st == LOOM_OK && !(d = start_http(&s, &port)))
            st = loom_fail(LOOM_EUNAVAIL, "serve: cannot listen on 127.0.0.1:%d (in use?)", c->port);
        if (st == LOOM_OK) {
            loom_info("serving on http://127.0.0.1:%d (POST /v1/completions, GET /health); KV cache %d slots x %d "
                      "positions, %.1f MiB per rank",
                      port, io->max_seqs, io->max_len, loom_infer_cache_bytes(inf) / 1048576.0);
            if (c->port_file && c->port_file[0]) {
                FILE *fp = fopen(c->port_file, "w");
                if (!fp || fprintf(fp, "%d\n", port) < 0 || fclose(fp) != 0)
                    st = loom_fail(LOOM_ECANTCREAT, "serve: cannot write --port-file %s", c->port_file);
            }
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    st = loom_comm_agree(world, st);
    double last_sent = now_s();
    while (st == LOOM_OK) {
        if (rank == 0) {
            pthread_mutex_lock(&s.mu);
            for (;;) {
                if (g_stop) {
                    s.stopping = 1;
                    break;
                }
                plan_step(&s, &p);
                s.loop_iters++;
                s.last_loop = now_s();
                if (p.hdr[0] > 0 || now_s() - last_sent > 1.0) break; /* work, or a heartbeat */
                struct timespec ts = deadline_in(50000000);
                pthread_cond_timedwait(&s.work, &s.mu, &ts);
            }
            if (s.stopping) p.hdr[0] = p.hdr[1] = 0, p.hdr[2] = 1;
            pthread_mutex_unlock(&s.mu);
            last_sent = now_s();
        }
        st = share_plan(world, &p);
        if (st != LOOM_OK || p.hdr[2]) break;
        if (p.hdr[0] == 0) continue;
        st = run_step(inf, world, root, &p);
        if (st == LOOM_OK && rank == 0) {
            pthread_mutex_lock(&s.mu);
            deliver(&s, &p);
            pthread_mutex_unlock(&s.mu);
        }
    }
    if (rank == 0) {
        pthread_mutex_lock(&s.mu);
        s.stopping = 1;
        pthread_cond_broadcast(&s.progress);
        pthread_mutex_unlock(&s.mu);
        if (d) MHD_stop_daemon(d); /* joins the connection threads; responses are freed */
        for (int i = 0; s.slots && i < io->max_seqs; i++)
            if (s.slots[i]) req_unref(&s, s.slots[i]);
        for (req *r = s.wait_head, *nx; r; r = nx) {
            nx = r->next;
            req_unref(&s, r);
        }
        if (st == LOOM_OK) loom_info("serve: stopped after %ld completed requests", s.completed);
    }
    plan_free(&p);
    free(s.slots);
    free(s.ttft);
    free(s.tpot);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_destroy(&s.tok_mu);
    pthread_cond_destroy(&s.work);
    pthread_cond_destroy(&s.progress);
    return st;
}
