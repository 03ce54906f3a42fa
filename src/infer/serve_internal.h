/* serve_internal.h - between the two halves of `loom serve`: the HTTP side
 * (serve_http.c: requests, JSON, /v1/completions, /health, the daemon on
 * rank 0) and the model loop (serve.c: planning, running and delivering
 * steps on every rank). Not public API. */
#ifndef LOOM_SERVE_INTERNAL_H
#define LOOM_SERVE_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "loom/serve.h"

#define LAT_KEEP 65536 /* latency samples kept for /health's percentiles */

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
    int refs;         /* the HTTP response and the model loop */
    struct req *next; /* waiting queue */
    /* HTTP side only */
    size_t sent_tokens;
    char *pend; /* bytes ready to go out */
    size_t pend_len, pend_off, pend_cap;
    char hold[8]; /* an incomplete UTF-8 sequence held back (stream) */
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

/* Monotonic seconds. */
double serve_now(void);
/* CLOCK_REALTIME now + ns, for pthread_cond_timedwait. */
struct timespec serve_deadline_in(long ns);
/* Drop one reference to r (under s->mu); the last frees it. */
void serve_req_unref(server *s, req *r);
/* Move waiters into free KV slots, oldest first (under s->mu). */
void serve_admit(server *s);
/* Rank 0: the HTTP daemon on 127.0.0.1:cfg->port (0: any), its port in *port;
 * NULL when it cannot listen. */
struct MHD_Daemon *serve_start_http(server *s, int *port);
/* Why the last serve_start_http failed, as the OS said it ("Address already in use"). */
const char *serve_http_error(void);

#endif
