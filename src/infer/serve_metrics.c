/* serve_metrics.c - what `loom serve` tells about itself (serve_internal.h),
 * on rank 0: GET /health as JSON (status, queue, KV cache, TTFT and
 * inter-token percentiles of the last LAT_KEEP samples, tokens/s, the model
 * loop's liveness) and GET /metrics in Prometheus' text format (the same
 * gauges and counters, and cumulative histograms of TTFT, inter-token and
 * end-to-end latency, named as vLLM names them with a loom_ prefix). Both
 * are built under the server mutex. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"

static const double LE_TTFT[HIST_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                             0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
static const double LE_TPOT[HIST_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                             0.1,    0.15,  0.2,    0.3,   0.5,  1.0,   2.5,  5.0};
static const double LE_E2E[HIST_BUCKETS] = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,  1.0,  2.5,
                                            5.0,  10.0,  15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

void serve_metrics_init(server *s) {
    s->h_ttft.le = LE_TTFT;
    s->h_tpot.le = LE_TPOT;
    s->h_e2e.le = LE_E2E;
}

void serve_hist_add(histogram *h, double x) {
    int i = 0;
    while (i < HIST_BUCKETS && x > h->le[i]) i++;
    h->count[i]++;
    h->sum += x;
    h->n++;
}

/* ---- occupancy ------------------------------------------------------------------ */

typedef struct occupancy {
    int running, slots;
    long positions, positions_used;
} occupancy;

static occupancy occupancy_now(const server *s) {
    const loom_infer_opts *io = loom_infer_options(s->inf);
    occupancy o = {.slots = io->max_seqs, .positions = (long)io->n_blocks * io->block_size};
    for (int i = 0; i < io->max_seqs; i++)
        if (s->slots[i]) {
            o.running++;
            o.positions_used += (long)s->cached[i].n; /* shared blocks count once per sequence */
        }
    return o;
}

static double tokens_per_s(const server *s) {
    const double span = s->t_first_req > 0 ? serve_now() - s->t_first_req : 0;
    return span > 0 ? (double)s->tokens_out / span : 0;
}

/* ---- /health ---------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* p50/p95/p99 in milliseconds of the kept samples. */
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

char *serve_health_json(server *s) {
    cJSON *o = cJSON_CreateObject();
    const occupancy oc = occupancy_now(s);
    cJSON_AddStringToObject(o, "status", s->stopping ? "draining" : "ok");
    cJSON_AddStringToObject(o, "model", s->cfg->model_name);
    cJSON_AddNumberToObject(o, "running", oc.running);
    cJSON_AddNumberToObject(o, "waiting", s->n_wait);
    cJSON_AddNumberToObject(o, "completed", (double)s->completed);
    cJSON_AddNumberToObject(o, "loop_iterations", (double)s->loop_iters);
    cJSON_AddNumberToObject(o, "ms_since_loop", 1e3 * (serve_now() - s->last_loop));
    cJSON_AddNumberToObject(o, "rejected_503", (double)s->rejected);
    cJSON_AddNumberToObject(o, "open_connections", s->open_conns);
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache");
    cJSON_AddNumberToObject(kv, "slots", oc.slots);
    cJSON_AddNumberToObject(kv, "slots_used", oc.running);
    cJSON_AddNumberToObject(kv, "positions", (double)oc.positions);
    cJSON_AddNumberToObject(kv, "positions_used", (double)oc.positions_used);
    cJSON_AddNumberToObject(kv, "bytes_per_rank", (double)loom_infer_cache_bytes(s->inf));
    cJSON_AddNumberToObject(kv, "block_size", s->kv.bs);
    cJSON_AddNumberToObject(kv, "blocks", s->kv.n_blocks);
    cJSON_AddNumberToObject(kv, "blocks_used", kv_pool_used(&s->kv));
    cJSON_AddNumberToObject(kv, "blocks_cached", s->kv.n_cached);
    cJSON_AddNumberToObject(kv, "waiting_for_blocks", s->waiting_blocks);
    cJSON_AddNumberToObject(kv, "preemptions", (double)s->preemptions);
    cJSON_AddNumberToObject(kv, "evictions", (double)s->kv.evictions);
    cJSON *pc = cJSON_AddObjectToObject(o, "prefix_cache");
    cJSON_AddBoolToObject(pc, "enabled", s->cfg->prefix_cache);
    cJSON_AddNumberToObject(pc, "hit_tokens", (double)s->prefix_hit_tokens);
    cJSON_AddNumberToObject(pc, "computed_prompt_tokens", (double)s->prefill_tokens);
    cJSON_AddNumberToObject(pc, "shared_blocks", (double)s->shared_blocks);
    cJSON_AddNumberToObject(pc, "copies", (double)s->prefix_copies);
    add_percentiles(o, "ttft_ms", s->ttft, s->n_ttft);
    add_percentiles(o, "inter_token_ms", s->tpot, s->n_tpot);
    cJSON_AddNumberToObject(o, "tokens_generated", (double)s->tokens_out);
    cJSON_AddNumberToObject(o, "tokens_per_s", tokens_per_s(s));
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return js;
}

/* ---- /metrics --------------------------------------------------------------------- */

typedef struct textbuf {
    char *b;
    size_t len, cap;
    int oom;
} textbuf;

__attribute__((format(printf, 2, 3))) static void put(textbuf *t, const char *fmt, ...) {
    for (int tries = 0; tries < 2 && !t->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->b ? t->b + t->len : NULL, t->b ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = 1;
            return;
        }
        if (t->b && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t nc = t->cap ? t->cap : 4096;
        while (nc <= t->len + (size_t)n) nc *= 2;
        char *p = realloc(t->b, nc);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->b = p;
        t->cap = nc;
    }
}

static void metric(textbuf *t, const char *name, const char *type, const char *help) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histogram_text(textbuf *t, const char *name, const char *help, const histogram *h,
                           const char *lab) {
    metric(t, name, "histogram", help);
    long cum = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        cum += h->count[i];
        put(t, "%s_bucket{%s,le=\"%g\"} %ld\n", name, lab, h->le[i], cum);
    }
    put(t, "%s_bucket{%s,le=\"+Inf\"} %ld\n", name, lab, h->n);
    put(t, "%s_sum{%s} %.9g\n%s_count{%s} %ld\n", name, lab, h->sum, name, lab, h->n);
}

char *serve_metrics_text(server *s) {
    textbuf t = {0};
    char lab[300];
    size_t k = 0;
    k += (size_t)snprintf(lab, sizeof lab, "model_name=\"");
    for (const char *c = s->cfg->model_name; *c && k + 3 < sizeof lab - 2; c++) { /* escape \ " newline */
        if (*c == '\\' || *c == '"' || *c == '\n') lab[k++] = '\\';
        lab[k++] = *c == '\n' ? 'n' : *c;
    }
    lab[k++] = '"';
    lab[k] = '\0';
    const occupancy oc = occupancy_now(s);
    metric(&t, "loom_num_requests_running", "gauge",
           "Sequences (choices) in the KV cache, decoding or prefilling.");
    put(&t, "loom_num_requests_running{%s} %d\n", lab, oc.running);
    metric(&t, "loom_num_requests_waiting", "gauge", "Sequences waiting for room in the KV cache.");
    put(&t, "loom_num_requests_waiting{%s} %d\n", lab, s->n_wait);
    metric(&t, "loom_num_requests_waiting_for_blocks", "gauge",
           "Sequences admitted but waiting for free KV blocks (or for a prefill they share).");
    put(&t, "loom_num_requests_waiting_for_blocks{%s} %d\n", lab, s->waiting_blocks);
    metric(&t, "loom_kv_cache_usage_perc", "gauge",
           "Fraction of the KV cache's blocks held by sequences (0 to 1).");
    put(&t, "loom_kv_cache_usage_perc{%s} %.6g\n", lab,
        (double)kv_pool_used(&s->kv) / (double)s->kv.n_blocks);
    metric(&t, "loom_kv_cache_blocks_total", "gauge", "KV-cache blocks in the pool.");
    put(&t, "loom_kv_cache_blocks_total{%s} %d\n", lab, s->kv.n_blocks);
    metric(&t, "loom_kv_cache_block_size", "gauge", "Positions per KV-cache block.");
    put(&t, "loom_kv_cache_block_size{%s} %d\n", lab, s->kv.bs);
    metric(&t, "loom_kv_cache_blocks_used", "gauge", "KV-cache blocks held by sequences.");
    put(&t, "loom_kv_cache_blocks_used{%s} %d\n", lab, kv_pool_used(&s->kv));
    metric(&t, "loom_kv_cache_blocks_cached", "gauge",
           "Full KV-cache blocks findable by prefix caching (held or not).");
    put(&t, "loom_kv_cache_blocks_cached{%s} %d\n", lab, s->kv.n_cached);
    metric(&t, "loom_kv_cache_evictions_total", "counter", "Cached blocks reused for other tokens.");
    put(&t, "loom_kv_cache_evictions_total{%s} %ld\n", lab, s->kv.evictions);
    metric(&t, "loom_num_preemptions_total", "counter",
           "Sequences that gave back their KV blocks for others to decode, and were computed again.");
    put(&t, "loom_num_preemptions_total{%s} %ld\n", lab, s->preemptions);
    metric(&t, "loom_kv_cache_sequences_total", "gauge", "Sequences running at once at most (--max-seqs).");
    put(&t, "loom_kv_cache_sequences_total{%s} %d\n", lab, oc.slots);
    metric(&t, "loom_kv_cache_positions_used", "gauge", "KV-cache positions in use.");
    put(&t, "loom_kv_cache_positions_used{%s} %ld\n", lab, oc.positions_used);
    metric(&t, "loom_kv_cache_bytes", "gauge", "Bytes of the KV cache on each rank.");
    put(&t, "loom_kv_cache_bytes{%s} %zu\n", lab, loom_infer_cache_bytes(s->inf));
    metric(&t, "loom_prompt_tokens_total", "counter", "Prompt tokens of the requests accepted.");
    put(&t, "loom_prompt_tokens_total{%s} %ld\n", lab, s->prompt_tokens);
    metric(
        &t, "loom_prefix_cache_hit_tokens_total", "counter",
        "Prompt tokens whose keys and values were taken from the cache (shared blocks or a copied part of one), "
        "not computed.");
    put(&t, "loom_prefix_cache_hit_tokens_total{%s} %ld\n", lab, s->prefix_hit_tokens);
    metric(&t, "loom_prefill_tokens_total", "counter", "Prompt tokens computed (prefill work).");
    put(&t, "loom_prefill_tokens_total{%s} %ld\n", lab, s->prefill_tokens);
    metric(&t, "loom_generation_tokens_total", "counter", "Tokens generated.");
    put(&t, "loom_generation_tokens_total{%s} %ld\n", lab, s->tokens_out);
    metric(&t, "loom_generation_tokens_per_second", "gauge",
           "Tokens generated per second since the first request.");
    put(&t, "loom_generation_tokens_per_second{%s} %.6g\n", lab, tokens_per_s(s));
    metric(&t, "loom_request_success_total", "counter", "Choices finished, by finish reason.");
    const char *why[4] = {"stop", "length", "abort", "error"};
    for (int i = 0; i < 4; i++)
        put(&t, "loom_request_success_total{%s,finished_reason=\"%s\"} %ld\n", lab, why[i],
            s->finished_by[i]);
    metric(&t, "loom_requests_total", "counter", "Requests accepted.");
    put(&t, "loom_requests_total{%s} %ld\n", lab, s->requests);
    metric(&t, "loom_requests_rejected_total", "counter",
           "Requests refused with 503 (queue full or draining).");
    put(&t, "loom_requests_rejected_total{%s} %ld\n", lab, s->rejected);
    metric(&t, "loom_open_connections", "gauge", "HTTP connections open.");
    put(&t, "loom_open_connections{%s} %d\n", lab, s->open_conns);
    metric(&t, "loom_connections_timed_out_total", "counter",
           "Connections closed for not sending a whole request within --read-timeout.");
    put(&t, "loom_connections_timed_out_total{%s} %ld\n", lab, s->conns_timed_out);
    metric(&t, "loom_model_loop_iterations_total", "counter", "Wake-ups of the model loop on rank 0.");
    put(&t, "loom_model_loop_iterations_total{%s} %ld\n", lab, s->loop_iters);
    metric(&t, "loom_draining", "gauge", "1 after a signal, while running requests finish.");
    put(&t, "loom_draining{%s} %d\n", lab, s->stopping);
    histogram_text(&t, "loom_time_to_first_token_seconds",
                   "Time from arrival to the first token of each choice.", &s->h_ttft, lab);
    histogram_text(&t, "loom_inter_token_latency_seconds", "Time between consecutive tokens of a choice.",
                   &s->h_tpot, lab);
    histogram_text(&t, "loom_e2e_request_latency_seconds", "Time from arrival to the last choice's end.",
                   &s->h_e2e, lab);
    if (t.oom) {
        free(t.b);
        return NULL;
    }
    return t.b;
}
