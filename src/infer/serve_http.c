/* serve_http.c - the HTTP side of `loom serve` (include/loom/serve.h), on
 * rank 0 only: libmicrohttpd with a thread per connection; routes
 * (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics),
 * the request queue the model loop (serve.c) drains, the response bodies it
 * fills (serve_resp.c), OpenAI's error shape.
 *
 * Slow clients cannot hold the server: every connection must deliver a
 * whole request (headers and body) within --read-timeout seconds of
 * opening, or of its previous response ending (keep-alive), or a reaper
 * thread shuts its socket down; connections are limited to
 * --max-connections, polled with poll() (no FD_SETSIZE bound).
 * libmicrohttpd reports a connection closed before it closes the socket,
 * and both happen under the reaper's mutex, so the reaper never shuts down
 * a descriptor that was reused. Every request is touched under the server
 * mutex. Nothing here calls the communicator. */
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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

/* ---- connections and their read deadline ---------------------------------------- */

typedef struct conn_track { /* one TCP connection (libmicrohttpd's socket context) */
    struct conn_track *prev, *next;
    int fd;
    int reading;  /* waiting for (the rest of) a request */
    double since; /* ... since then */
} conn_track;

typedef struct http_side {
    pthread_mutex_t mu;
    conn_track *head;
    pthread_t reaper;
    int run;
} http_side;

static void on_connection(void *cls, struct MHD_Connection *con, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    http_side *h = s->http;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_track *t = calloc(1, sizeof *t);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = t;
        if (!t) return;
        t->fd = ci ? ci->connect_fd : -1;
        t->reading = 1;
        t->since = serve_now();
        pthread_mutex_lock(&h->mu);
        t->next = h->head;
        if (h->head) h->head->prev = t;
        h->head = t;
        pthread_mutex_unlock(&h->mu);
        pthread_mutex_lock(&s->mu);
        s->open_conns++;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    conn_track *t = *socket_context;
    if (!t) return;
    pthread_mutex_lock(&h->mu);
    if (t->prev) t->prev->next = t->next;
    else h->head = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&h->mu);
    free(t);
    *socket_context = NULL;
    pthread_mutex_lock(&s->mu);
    s->open_conns--;
    pthread_mutex_unlock(&s->mu);
}

static void set_reading(server *s, conn_track *t, int reading) {
    if (!t) return;
    pthread_mutex_lock(&s->http->mu);
    t->reading = reading;
    t->since = serve_now();
    pthread_mutex_unlock(&s->http->mu);
}

/* Every 100 ms: shut down the connections past their read deadline. */
static void *reaper(void *arg) {
    server *s = arg;
    http_side *h = s->http;
    for (;;) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        int cut = 0;
        pthread_mutex_lock(&h->mu);
        if (!h->run) {
            pthread_mutex_unlock(&h->mu);
            break;
        }
        const double now = serve_now();
        for (conn_track *t = h->head; t; t = t->next)
            if (t->reading && t->fd >= 0 && now - t->since > s->cfg->read_timeout) {
                shutdown(t->fd, SHUT_RDWR);
                t->reading = 0; /* once */
                cut++;
            }
        pthread_mutex_unlock(&h->mu);
        if (cut) {
            pthread_mutex_lock(&s->mu);
            s->conns_timed_out += cut;
            pthread_mutex_unlock(&s->mu);
        }
    }
    return NULL;
}

/* ---- JSON helpers ---------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *con, unsigned code, char *body, const char *type) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(con, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *con, unsigned code, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return send_text(con, code, s, "application/json");
}

/* OpenAI's error object: message, type, param (the field, or null), code. */
static enum MHD_Result send_error(struct MHD_Connection *con, unsigned code, const char *param,
                                  const char *ecode, const char *msg) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    /* a message or param cut inside a character the client sent stays valid UTF-8 */
    char *m = serve_utf8_lossy(msg, strlen(msg), NULL),
         *pm = param ? serve_utf8_lossy(param, strlen(param), NULL) : NULL;
    cJSON_AddStringToObject(e, "message", m ? m : "");
    free(m);
    param = pm;
    cJSON_AddStringToObject(e, "type", code >= 500 ? "server_error" : "invalid_request_error");
    if (param && param[0]) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    free(pm);
    if (ecode) cJSON_AddStringToObject(e, "code", ecode);
    else cJSON_AddNullToObject(e, "code");
    return send_json(con, code, o);
}

/* ---- /v1/models ---------------------------------------------------------------- */

static cJSON *model_json(const server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->cfg->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(time(NULL) - (long)(serve_now() - s->t_start)));
    cJSON_AddStringToObject(m, "owned_by", "loom");
    cJSON_AddNumberToObject(m, "max_model_len", loom_infer_options(s->inf)->max_len);
    return m;
}

static enum MHD_Result models(server *s, struct MHD_Connection *con, const char *url) {
    if (strcmp(url, "/v1/models") == 0) {
        cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data");
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(d, model_json(s));
        return send_json(con, MHD_HTTP_OK, o);
    }
    const char *id = url + strlen("/v1/models/");
    if (strcmp(id, s->cfg->model_name) == 0) return send_json(con, MHD_HTTP_OK, model_json(s));
    char msg[512];
    snprintf(msg, sizeof msg, "The model '%.200s' does not exist; this server serves '%s'", id,
             s->cfg->model_name);
    return send_error(con, MHD_HTTP_NOT_FOUND, "model", "model_not_found", msg);
}

/* ---- POST /v1/completions, /v1/chat/completions -------------------------------- */

typedef struct conn { /* one HTTP request (libmicrohttpd's con_cls) */
    char *body;
    size_t len, cap;
    int too_large;
    conn_track *track;
} conn;

/* Response body callback (a connection thread): wait for output, copy it out. */
static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    req *r = cls;
    server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (r->pend_off < r->pend_len) break;
        r->pend_off = r->pend_len = 0;
        int complete = serve_produce(s, r);
        if (r->pend_len > 0) break;
        if (complete) {
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
 * reference; an unfinished request is cancelled and its choices freed by
 * the loop at the next step. */
static void reader_free(void *cls) {
    req *r = cls;
    server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    if (r->n_finished < r->n_choices) r->cancelled = 1;
    s->live_reqs--;
    pthread_cond_broadcast(&s->work);
    serve_req_unref(s, r);
    pthread_mutex_unlock(&s->mu);
}

static const char *error_code(int code, const char *msg) {
    if (code == 404) return "model_not_found";
    if (strstr(msg, "not supported") || strstr(msg, "unsupported")) return "unsupported_parameter";
    return "invalid_value";
}

static enum MHD_Result api(server *s, struct MHD_Connection *con, conn *cn, api_kind kind) {
    char msg[640], param[96];
    if (cn->too_large) {
        snprintf(msg, sizeof msg, "request body over %d bytes", s->cfg->max_body);
        return send_error(con, MHD_HTTP_CONTENT_TOO_LARGE, "", "request_too_large", msg);
    }
    int code = 400;
    req *r = serve_parse_request(s, kind, cn->body ? cn->body : "", cn->len, &code, msg, sizeof msg, param,
                                 sizeof param);
    if (!r) return send_error(con, (unsigned)code, param, error_code(code, msg), msg);
    r->srv = s;
    pthread_mutex_lock(&s->mu);
    const int max_seqs = loom_infer_options(s->inf)->max_seqs;
    int free_slots = 0; /* waiters the next step admits do not count against the queue */
    for (int i = 0; i < max_seqs; i++) free_slots += s->slots[i] == NULL;
    if (s->stopping || s->n_wait + r->n_choices > s->cfg->queue + free_slots) {
        s->rejected++;
        const int stopping = s->stopping;
        serve_req_unref(s, r);
        pthread_mutex_unlock(&s->mu);
        return send_error(con, MHD_HTTP_SERVICE_UNAVAILABLE, "", stopping ? "shutting_down" : "server_busy",
                          stopping ? "the server is shutting down"
                                   : "the request queue is full; retry later");
    }
    r->id = ++s->next_id;
    r->t_arrive = serve_now();
    r->created = (long)time(NULL);
    if (s->t_first_req == 0) s->t_first_req = r->t_arrive;
    s->requests++;
    s->live_reqs++;
    for (int i = 0; i < r->n_choices; i++) {
        choice *c = &r->ch[i];
        s->prompt_tokens += (long)r->prompts[c->prompt].n;
        r->refs++;
        if (s->wait_tail) s->wait_tail->next = c;
        else s->wait_head = c;
        s->wait_tail = c;
        s->n_wait++;
    }
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

/* ---- routes ------------------------------------------------------------------- */

static enum MHD_Result route(server *s, struct MHD_Connection *con, conn *cn, const char *url,
                             const char *method) {
    const int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    char *body;
    if (strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0) {
        if (!get) return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "", NULL, "use GET");
        pthread_mutex_lock(&s->mu);
        body = url[1] == 'h' ? serve_health_json(s) : serve_metrics_text(s);
        pthread_mutex_unlock(&s->mu);
        return send_text(con, MHD_HTTP_OK, body,
                         url[1] == 'h' ? "application/json" : "text/plain; version=0.0.4; charset=utf-8");
    }
    if (strcmp(url, "/v1/models") == 0 || strncmp(url, "/v1/models/", 11) == 0) {
        if (!get) return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "", NULL, "use GET /v1/models");
        return models(s, con, url);
    }
    if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0) {
        if (!post) return send_error(con, MHD_HTTP_METHOD_NOT_ALLOWED, "", NULL, "use POST");
        return api(s, con, cn, url[4] == 'c' && url[5] == 'h' ? API_CHAT : API_COMPLETIONS);
    }
    return send_error(con, MHD_HTTP_NOT_FOUND, "", NULL,
                      "unknown path; try POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                      "GET /health or GET /metrics");
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
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cn->track = ci ? ci->socket_context : NULL;
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
    set_reading(s, cn->track, 0); /* the whole request is in: no read deadline while answering */
    return route(s, con, cn, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls,
                         enum MHD_RequestTerminationCode t) {
    server *s = cls;
    (void)con;
    (void)t;
    conn *cn = *con_cls;
    if (cn) {
        set_reading(s, cn->track, 1); /* keep-alive: the next request has read_timeout from now */
        free(cn->body);
        free(cn);
    }
    *con_cls = NULL;
}

/* libmicrohttpd's messages: kept while the daemon starts (its bind failure
 * names the port it was given, 0, as the address came in a sockaddr), so
 * serve.c can say why in one line; afterwards printed as warnings, but not
 * one line per connection the client (or the read deadline) closed:
 * /metrics counts those. */
static char g_mhd_error[256];
static int g_mhd_started;

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = '\0';
    if (!g_mhd_started) {
        snprintf(g_mhd_error, sizeof g_mhd_error, "%.*s", (int)sizeof g_mhd_error - 1, line);
        return;
    }
    if (strstr(line, "connection closure") || strstr(line, "Connection reset")) return;
    loom_warn("serve: http: %s", line);
}

const char *serve_http_error(void) {
    const char *why = strrchr(g_mhd_error, ':'); /* "Failed to bind to port 0: Address already in use" */
    return why && why[1] ? why + 2 : g_mhd_error[0] ? g_mhd_error : "unknown error";
}

struct MHD_Daemon *serve_start_http(server *s, int *port) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->cfg->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!(s->http = calloc(1, sizeof *s->http))) return NULL;
    pthread_mutex_init(&s->http->mu, NULL);
    unsigned idle = s->cfg->read_timeout > 60 ? (unsigned)s->cfg->read_timeout + 1 : 60;
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1 << 20), MHD_OPTION_END);
    s->http->run = 1;
    if (!d || pthread_create(&s->http->reaper, NULL, reaper, s) != 0) {
        if (d) MHD_stop_daemon(d);
        pthread_mutex_destroy(&s->http->mu);
        free(s->http);
        s->http = NULL;
        return NULL;
    }
    g_mhd_started = 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : s->cfg->port;
    return d;
}

void serve_stop_http(server *s, struct MHD_Daemon *d) {
    MHD_stop_daemon(d); /* joins the connection threads; each reports its close first */
    pthread_mutex_lock(&s->http->mu);
    s->http->run = 0;
    pthread_mutex_unlock(&s->http->mu);
    pthread_join(s->http->reaper, NULL);
    pthread_mutex_destroy(&s->http->mu);
    free(s->http);
    s->http = NULL;
}
