/* serve_internal.h - between the parts of `loom serve`: the HTTP side
 * (serve_http.c: the daemon on rank 0, connections and their deadlines,
 * routes), the OpenAI requests (serve_req.c: parsing and checking
 * /v1/completions and /v1/chat/completions bodies), the responses
 * (serve_resp.c: each choice's text with UTF-8 held back and stop strings
 * cut, JSON bodies and server-sent events), the instruments
 * (serve_metrics.c: /health and /metrics) and the model loop (serve.c:
 * planning, running and delivering steps on every rank). Not public API.
 *
 * A request (req) has one or more choices (n per prompt, prompts in a list);
 * each choice is one sequence of the KV cache. The model loop admits, runs
 * and finishes choices; the HTTP side turns them into one response. Every
 * req and choice field is touched under the server mutex. */
#ifndef LOOM_SERVE_INTERNAL_H
#define LOOM_SERVE_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "loom/chat_template.h"
#include "loom/serve.h"

#define LAT_KEEP 65536 /* latency samples kept for /health's percentiles */
#define LP_MAX 20      /* top_logprobs at most (OpenAI's limit) */
#define STOP_MAX 8     /* stop strings and stop token ids per request at most */

/* ---- requests ------------------------------------------------------------ */

/* The log-probabilities of one generated token, from the raw logits. */
typedef struct tok_lp {
    float lp; /* of the token itself */
    int32_t n_top;
    int32_t top_id[LP_MAX]; /* most likely first, the lowest id among ties */
    float top_lp[LP_MAX];
} tok_lp;

struct req;
typedef struct choice {
    struct req *req;
    int index;    /* in the response's choices */
    int prompt;   /* which of the request's prompts it continues */
    loom_ids out; /* generated ids (a stop token included) */
    tok_lp *lp;   /* (out.n) when the request asked for logprobs */
    size_t lp_cap;
    int slot; /* KV-cache sequence; -1 while waiting */
    size_t prefill_pos;
    size_t feed_n;     /* positions its prefill fills (feed_len when placed) */
    int placed;        /* holds KV blocks: its start planned (prefix caching); 0 again when preempted */
    long order;        /* when it took its slot: the youngest is preempted first */
    size_t prefix_hit; /* prompt tokens it took from the cache */
    int finished;
    const char *finish_reason; /* "stop", "length", "abort" */
    double t_first, t_last;
    struct choice *next; /* waiting queue */
    /* the text: the bytes of out (not a stop token's) decoded, stop string cut */
    loom_utf8_dec dec;
    char *text;
    size_t text_len, text_cap;
    size_t text_ok; /* bytes that can go out: not a possible start of a stop string */
    /* stream (HTTP side) */
    size_t sent_tokens, sent_text;
    int started, final_sent;
} choice;

typedef enum api_kind { API_COMPLETIONS, API_CHAT } api_kind;

typedef struct req {
    struct server *srv;
    long id;
    api_kind kind;
    loom_ids *prompts;  /* (n_prompts) */
    char **prompt_text; /* (n_prompts) the prompts as text, for echo (or NULL) */
    int n_prompts, n;   /* n choices per prompt */
    choice *ch;         /* (n_choices = n_prompts * n) */
    int n_choices;
    int max_tokens;
    int stream, include_usage, echo, ignore_eos;
    int top_lp; /* -1: no logprobs; else alternatives per token (0..LP_MAX) */
    loom_sample_opts so;
    float presence, frequency;
    char *stop[STOP_MAX];
    size_t stop_len[STOP_MAX], stop_longest;
    int n_stop;
    int32_t stop_ids[STOP_MAX];
    int n_stop_ids;
    double t_arrive;
    long created; /* Unix seconds */
    int n_finished;
    int refs; /* the HTTP response and each choice still held by the model loop */
    int cancelled;
    /* HTTP side */
    char *pend; /* bytes ready to go out */
    size_t pend_len, pend_off, pend_cap;
    int done_sent;
} req;

/* ---- the paged KV cache's blocks (serve_kv.c) ---------------------------- */

typedef struct kv_pool {
    int n_blocks, bs, max_seqs, max_blocks;
    int *ref;                /* (n_blocks) sequences holding each block */
    uint64_t *hash;          /* (n_blocks) of a full block: its tokens and its parent's hash (0: not full) */
    uint64_t *parent;        /* (n_blocks) the hash of the block before it (0: the first) */
    uint32_t *toks;          /* (n_blocks, bs) the tokens of a registered block */
    unsigned char *in_table; /* registered: findable by its hash */
    int *prev, *next, head, tail; /* the free list (ref 0): empty blocks first, then cached ones by release */
    int *chain, *bucket, n_bucket; /* the hash table of registered blocks */
    int n_free, n_cached;
    long evictions;
    int32_t *table; /* (max_seqs, max_blocks) each slot's blocks */
    int *nb;        /* (max_seqs) blocks in each slot's table */
    int *n_reg;     /* (max_seqs) its leading full blocks already registered */
} kv_pool;

/* 0 when out of memory. */
int kv_pool_init(kv_pool *p, int n_blocks, int bs, int max_seqs, int max_blocks);
void kv_pool_free(kv_pool *p);
uint64_t kv_block_hash(uint64_t parent, const uint32_t *toks, int bs);
/* A block for a sequence (ref 1): an empty one, else the least recently
 * released cached one (evicted); -1 when every block is held. */
int kv_pool_alloc(kv_pool *p);
void kv_pool_ref(kv_pool *p, int b);
void kv_pool_release(kv_pool *p, int b);
/* The registered block holding toks (bs) after the block hashed parent, or -1. */
int kv_pool_lookup(const kv_pool *p, uint64_t parent, const uint32_t *toks);
/* Block b, now full of toks after the block hashed parent: findable (unless
 * an equal block already is); its hash is set either way. */
void kv_pool_register(kv_pool *p, int b, uint64_t parent, const uint32_t *toks);
/* Slot s lets go of every block of its table. */
void kv_pool_drop_seq(kv_pool *p, int s);
/* Blocks some sequence holds. */
int kv_pool_used(const kv_pool *p);

/* ---- instruments ------------------------------------------------------------ */

#define HIST_BUCKETS 16
typedef struct histogram { /* Prometheus: cumulative counts at upper bounds */
    const double *le;      /* (HIST_BUCKETS) seconds */
    long count[HIST_BUCKETS + 1];
    double sum;
    long n;
} histogram;

typedef struct server {
    const loom_serve_config *cfg;
    loom_infer *inf;
    loom_tokenizer *tok;
    const loom_chat_template *chat;
    pthread_mutex_t mu, tok_mu;
    pthread_cond_t work, progress;
    choice *wait_head, *wait_tail;
    int n_wait;
    choice **slots;   /* (max_seqs) running choices */
    loom_ids *cached; /* (max_seqs) the tokens each slot's cache holds, after the step planned */
    kv_pool kv;       /* the KV blocks and each slot's table */
    long next_order;
    long next_id;
    uint64_t seed_base, seed_count; /* a request without "seed" gets a fresh one from these */
    int stopping;                   /* no new requests (a signal: draining) */
    int live_reqs;                  /* requests whose response is not yet freed */
    double t_start, t_first_req;
    /* metrics */
    double *ttft, *tpot;
    long prefix_hit_tokens, prefill_tokens; /* prompt tokens taken from the cache / computed */
    long prefix_copies;                     /* partly filled blocks copied from another slot */
    long shared_blocks;                     /* full blocks taken by reference from the cache */
    long preemptions;                       /* sequences that gave back their blocks to let others decode */
    int waiting_blocks;                     /* admitted choices waiting for KV blocks */
    long n_ttft, n_tpot, completed, rejected, tokens_out, prompt_tokens, requests;
    long finished_by[4]; /* stop, length, abort, error */
    histogram h_ttft, h_tpot, h_e2e;
    long loop_iters;  /* model-loop wake-ups on rank 0 (liveness) */
    double last_loop; /* when the loop last planned a step */
    int open_conns;
    long conns_timed_out;
    struct http_side *http; /* serve_http.c: connections and their read deadline */
} server;

/* serve_http.c */
double serve_now(void);
/* CLOCK_REALTIME now + ns, for pthread_cond_timedwait. */
struct timespec serve_deadline_in(long ns);
/* Rank 0: the HTTP daemon on 127.0.0.1:cfg->port (0: any), its port in *port;
 * NULL when it cannot listen. serve_stop_http stops it (joining every
 * connection thread). */
struct MHD_Daemon *serve_start_http(server *s, int *port);
void serve_stop_http(server *s, struct MHD_Daemon *d);

/* serve_req.c: parse and check a body; NULL with *code (400/404) and the
 * message and the field (param, or "") when it is refused. */
req *serve_parse_request(server *s, api_kind kind, const char *body, size_t len, int *code, char *msg,
                         size_t cap, char *param, size_t pcap);
/* Drop one reference to r (under s->mu); the last frees it. */
void serve_req_unref(server *s, req *r);

/* serve_resp.c */
/* The bytes of token t (without a tokenizer: the byte t; U+FFFD past 255). */
const char *serve_token_bytes(const server *s, uint32_t t, size_t *len);
/* b[0..len) decoded as Hugging Face does (U+FFFD for ill-formed bytes),
 * malloc'd and NUL-terminated, its length in *out_len (if not NULL). */
char *serve_utf8_lossy(const char *b, size_t len, size_t *out_len);
/* A new token of c (under s->mu, rank 0's model loop): its text, stop token
 * and stop strings, max_tokens. lp: its log-probabilities or NULL. */
void serve_choice_push(server *s, choice *c, int32_t token, const tok_lp *lp);
/* c ends now with reason (a cut: "abort", "error"; under s->mu). */
void serve_choice_finish(server *s, choice *c, const char *reason);
/* Fill r->pend with what can go out now (under s->mu); 1 when the response
 * is complete once pend drains. */
int serve_produce(server *s, req *r);

/* serve_metrics.c: the bodies of GET /health (JSON) and GET /metrics
 * (Prometheus text), malloc'd (under s->mu). */
char *serve_health_json(server *s);
char *serve_metrics_text(server *s);
void serve_metrics_init(server *s);
void serve_hist_add(histogram *h, double x);

/* serve.c */
/* Move waiters into free KV slots, oldest first (under s->mu). */
void serve_admit(server *s);
/* Why the last serve_start_http failed, as the OS said it ("Address already in use"). */
const char *serve_http_error(void);

#endif
