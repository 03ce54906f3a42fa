/* serve.c - `loom serve`: the model loop on every rank's main thread, with
 * continuous batching between steps: rank 0 plans each step (drops finished
 * requests, admits waiting ones, one decode token per running sequence and
 * prefill chunks in the rows left), the plan goes to every rank, all run the
 * step, the sampling rank's tokens come back to rank 0, which delivers them
 * to the requests. The HTTP side is serve_http.c. See include/loom/serve.h.
 * Only the main thread of each rank calls the communicator. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"
#include "loom/log.h"

#define HDR_TAG 7401

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
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
            serve_req_unref(s, r);
        }
    }
    /* drop cancelled waiters, then admit into free slots */
    for (req **pp = &s->wait_head; *pp;) {
        req *r = *pp;
        if (r->cancelled) {
            *pp = r->next;
            s->n_wait--;
            r->finished = 1;
            serve_req_unref(s, r);
            continue;
        }
        pp = &r->next;
    }
    s->wait_tail = NULL;
    for (req *r = s->wait_head; r; r = r->next) s->wait_tail = r;
    serve_admit(s);
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
        p->e[n] = (plan_entry){.seq = i,
                               .n_new = take,
                               .fresh = r->prefill_pos == 0,
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
    if (loom_comm_size(world) > 1)
        LOOM_TRY(loom_comm_bcast(world, p->next, sizeof(int32_t) * (size_t)n, root));
    return LOOM_OK;
}

/* Rank 0 after a step: hand the new tokens to their requests (under s->mu). */
static void deliver(server *s, plan *p) {
    const double t = serve_now();
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
/* Rank 0: the server's tables and the HTTP daemon (*d), its port printed
 * and written to --port-file. */
static loom_status open_server(server *s, const loom_serve_config *c, struct MHD_Daemon **d) {
    const loom_infer_opts *io = loom_infer_options(s->inf);
    s->slots = calloc((size_t)io->max_seqs, sizeof *s->slots);
    s->ttft = calloc(LAT_KEEP, sizeof(double));
    s->tpot = calloc(LAT_KEEP, sizeof(double));
    if (!s->slots || !s->ttft || !s->tpot) return loom_fail(LOOM_EOS, "serve: out of memory");
    int port = 0;
    if (!(*d = serve_start_http(s, &port)))
        return loom_fail(LOOM_EUNAVAIL,
                         "serve: cannot listen on 127.0.0.1:%d: %s (--port 0 picks a free port)", c->port,
                         serve_http_error());
    loom_info("serving on http://127.0.0.1:%d (POST /v1/completions, GET /health); KV cache %d slots x %d "
              "positions, %.1f MiB per rank",
              port, io->max_seqs, io->max_len, loom_infer_cache_bytes(s->inf) / 1048576.0);
    if (c->port_file && c->port_file[0]) {
        FILE *fp = fopen(c->port_file, "w");
        if (!fp || fprintf(fp, "%d\n", port) < 0 || fclose(fp) != 0)
            return loom_fail(LOOM_ECANTCREAT, "serve: cannot write --port-file %s", c->port_file);
    }
    return LOOM_OK;
}

/* Rank 0: wait until there is a step to run, a heartbeat is due (1 s after
 * the last plan sent) or a signal asks to stop (the plan then says so). */
static void next_plan(server *s, plan *p, double *last_sent) {
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (g_stop) {
            s->stopping = 1;
            break;
        }
        plan_step(s, p);
        s->loop_iters++;
        s->last_loop = serve_now();
        if (p->hdr[0] > 0 || serve_now() - *last_sent > 1.0) break; /* work, or a heartbeat */
        struct timespec ts = serve_deadline_in(50000000);
        pthread_cond_timedwait(&s->work, &s->mu, &ts);
    }
    if (s->stopping) p->hdr[0] = p->hdr[1] = 0, p->hdr[2] = 1;
    pthread_mutex_unlock(&s->mu);
    *last_sent = serve_now();
}

/* Rank 0: stop the daemon (joining its connection threads) and release every
 * request still held. */
static void close_server(server *s, struct MHD_Daemon *d, loom_status st) {
    const int max_seqs = loom_infer_options(s->inf)->max_seqs;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    if (d) MHD_stop_daemon(d); /* joins the connection threads; responses are freed */
    for (int i = 0; s->slots && i < max_seqs; i++)
        if (s->slots[i]) serve_req_unref(s, s->slots[i]);
    for (req *r = s->wait_head, *nx; r; r = nx) {
        nx = r->next;
        serve_req_unref(s, r);
    }
    if (st == LOOM_OK) loom_info("serve: stopped after %ld completed requests", s->completed);
}

static void catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

loom_status loom_serve_run(const loom_serve_config *c, loom_infer *inf, loom_tokenizer *tok, loom_comm *world,
                           int root) {
    world = loom_comm_host(world); /* host data only: requests, plans, token ids */
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
    loom_status st = plan_alloc(&p, loom_infer_options(inf), loom_infer_config(inf)->vocab_size);
    struct MHD_Daemon *d = NULL;
    if (st == LOOM_OK && rank == 0) st = open_server(&s, c, &d);
    catch_signals();
    st = loom_comm_agree(world, st);
    double last_sent = serve_now();
    while (st == LOOM_OK) {
        if (rank == 0) next_plan(&s, &p, &last_sent);
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
    if (rank == 0) close_server(&s, d, st);
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
