/* serve.c - `loom serve`: the model loop on every rank's main thread, with
 * continuous batching between steps: rank 0 plans each step (drops finished
 * choices, admits waiting ones, gives KV blocks to sequences from the pool
 * of serve_kv.c - preempting the youngest when a decode finds none - one
 * decode token per running sequence and prefill chunks in the rows left),
 * the plan and the block tables that changed go to every rank, all run the
 * step, the sampling rank applies the penalties, samples and measures the
 * log-probabilities, and its tokens come back to rank 0, which delivers them
 * to the requests. A signal drains: no new requests, the running ones finish
 * (or are cut at --drain-timeout with a final event), then every rank
 * stops. The HTTP side is serve_http.c. See include/loom/serve.h. Only the
 * main thread of each rank calls the communicator. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"
#include "loom/log.h"
#include "loom/rng.h"

#define HDR_TAG 7401
/* An idle rank's longest sleep between polls of the next plan: 1 ms within
 * a second of the last step (at most ~1 ms added to a step's start), 10 ms
 * after that (a long-idle rank polls ~100 times a second). */
#define NAP_BUSY_NS 1000000L
#define NAP_IDLE_NS 10000000L

static volatile sig_atomic_t g_signals;
static void on_signal(int sig) {
    (void)sig;
    g_signals++;
}

/* ---- the step's plan ---------------------------------------------------------- */

/* One entry of a step's plan, the same on every rank. */
typedef struct plan_entry {
    int32_t seq, n_new, fresh, final, top_k, top_lp;
    float temperature, top_p, presence, frequency;
    uint64_t seed, index;
} plan_entry;

enum { H_ENTRIES, H_ROWS, H_SHUTDOWN, H_ANY_LP, H_COPIES, H_TABLES, H_COUNT };

/* A partly filled block continued by a new choice: the first n positions of
 * block src copied into its block dst. */
typedef struct block_copy {
    int32_t dst, src, n;
} block_copy;

typedef struct plan {
    int32_t hdr[H_COUNT];
    plan_entry *e;
    int32_t *tok, *next;
    block_copy *copy; /* (max_seqs) */
    int32_t *tab;     /* H_TABLES words: per changed slot s, len, nb, its nb blocks */
    tok_lp *lp;
    choice **owner; /* rank 0: the choice of each entry */
    loom_ids *hist; /* (max_seqs) the sampling rank: each sequence's generated tokens, for penalties */
    float *probs, *row;
    int *iscratch, *count;
    int *seq, *n_new;
    unsigned char *dirty; /* rank 0: (max_seqs) slots whose block table changed */
    unsigned char *seen;  /* rank 0: (max_seqs) slots placed or passed over in this plan */
    uint32_t *blk;        /* rank 0: one block's tokens */
} plan;

/* Move waiters into free KV slots, oldest first (under s->mu). Called when a
 * request arrives and when the loop plans a step, so that whenever the lock
 * is free a choice waits only while every slot is taken. A slot is free only
 * once plan_step released it, so the step in flight does not touch it; the
 * new choice's blocks are planned by place(). */
void serve_admit(server *s) {
    const int max_seqs = loom_infer_options(s->inf)->max_seqs;
    for (int i = 0; i < max_seqs && s->wait_head; i++) {
        if (s->slots[i]) continue;
        choice *c = s->wait_head;
        s->wait_head = c->next;
        if (!s->wait_head) s->wait_tail = NULL;
        s->n_wait--;
        c->next = NULL;
        c->slot = i;
        c->prefill_pos = 0;
        c->order = s->next_order++;
        s->slots[i] = c;
    }
}

/* What choice c's cache must hold before its next decode step: its prompt,
 * and after a preemption the tokens it generated but the last. */
static size_t feed_len(const choice *c) {
    return c->req->prompts[c->prompt].n + (c->out.n ? c->out.n - 1 : 0);
}
static uint32_t feed_tok(const choice *c, size_t k) {
    const loom_ids *pr = &c->req->prompts[c->prompt];
    return k < pr->n ? pr->v[k] : c->out.v[k - pr->n];
}

static size_t common_feed(const choice *c, const loom_ids *b) {
    size_t n = feed_len(c) < b->n ? feed_len(c) : b->n, k = 0;
    while (k < n && feed_tok(c, k) == b->v[k]) k++;
    return k;
}

static size_t common_feeds(const choice *a, const choice *b) {
    size_t n = feed_len(a) < feed_len(b) ? feed_len(a) : feed_len(b), k = 0;
    while (k < n && feed_tok(a, k) == feed_tok(b, k)) k++;
    return k;
}

/* Rank 0: where choice c, admitted in slot i, starts, and its blocks: 1
 * placed, 0 not yet (it waits for a prefill in flight that shares more of
 * its prompt), -1 when the pool has too few free blocks. With prefix
 * caching, the leading full blocks of its prompt (all but its last token:
 * the step needs a row for the logits) that are registered are taken by
 * reference; then the rest of the longest prefix some slot's cache holds,
 * which ends inside that slot's next block, is copied into a block of its
 * own (full blocks are never written again, so only this partly filled one
 * is ever copied). It gets blocks for its prompt and its first generated
 * token up front, so a prefill never runs out. */
static int place(server *s, plan *p, choice *c, int i) {
    kv_pool *kv = &s->kv;
    const int S = loom_infer_options(s->inf)->max_seqs, bs = kv->bs;
    const size_t tgt = feed_len(c), cap = tgt - 1;
    int32_t *tab = kv->table + (size_t)i * kv->max_blocks;
    int hits = 0, zero_ref = 0, src = -1;
    size_t tail = 0;
    if (s->cfg->prefix_cache) {
        uint64_t parent = 0;
        while ((size_t)(hits + 1) * bs <= cap) {
            for (int k = 0; k < bs; k++) p->blk[k] = feed_tok(c, (size_t)hits * bs + (size_t)k);
            const int b = kv_pool_lookup(kv, parent, p->blk);
            if (b < 0) break;
            tab[hits++] = b;
            zero_ref += kv->ref[b] == 0;
            parent = kv->hash[b];
        }
        const size_t have = (size_t)hits * bs;
        for (int j = 0; j < S; j++) {
            const choice *o = s->slots[j];
            if (j == i || !o || !o->placed) continue;
            size_t k = common_feed(c, &s->cached[j]);
            k = k < cap ? k : cap;
            if (k > have + tail) tail = k - have < (size_t)bs - 1 ? k - have : (size_t)bs - 1, src = j;
        }
        for (int j = 0; j < S; j++) {
            const choice *o = s->slots[j];
            if (!o || o == c || !o->placed || o->prefill_pos >= o->feed_n) continue;
            const size_t k = common_feeds(c, o);
            if ((k < cap ? k : cap) > have + tail) return 0;
        }
    }
    const int need = (int)((tgt + (size_t)bs) / (size_t)bs); /* positions 0 .. tgt */
    if (kv->n_free - zero_ref < need - hits) return -1;
    for (int k = 0; k < hits; k++) kv_pool_ref(kv, tab[k]);
    for (int k = hits; k < need; k++) tab[k] = kv_pool_alloc(kv);
    kv->nb[i] = need;
    kv->n_reg[i] = hits;
    if (tail > 0) {
        p->copy[p->hdr[H_COPIES]++] = (block_copy){
            .dst = tab[hits], .src = kv->table[(size_t)src * kv->max_blocks + hits], .n = (int32_t)tail};
        s->prefix_copies++;
    }
    const size_t start = (size_t)hits * bs + tail;
    s->cached[i].n = 0;
    for (size_t k = 0; k < start; k++) loom_ids_push(&s->cached[i], feed_tok(c, k));
    c->prefill_pos = c->prefix_hit = start;
    c->feed_n = tgt;
    c->placed = 1;
    s->prefix_hit_tokens += (long)start;
    s->shared_blocks += hits;
    p->dirty[i] = 1;
    return 1;
}

/* Rank 0: slot i's choice gives back its blocks (the full ones stay cached
 * while nothing needs their room) and starts over when blocks are free:
 * its prompt and generated tokens are prefilled again, mostly from the
 * cache. */
static void preempt(server *s, plan *p, int i) {
    choice *c = s->slots[i];
    kv_pool_drop_seq(&s->kv, i);
    s->cached[i].n = 0;
    c->placed = 0;
    c->prefill_pos = c->prefix_hit = 0;
    s->preemptions++;
    p->dirty[i] = p->seen[i] = 1; /* placed again in a later step */
}

static void release_slot(server *s, int i) {
    choice *c = s->slots[i];
    s->slots[i] = NULL;
    kv_pool_drop_seq(&s->kv, i);
    s->cached[i].n = 0;
    if (!c->finished) serve_choice_finish(s, c, "abort");
    serve_req_unref(s, c->req);
}

/* Rank 0: register the full blocks that the steps so far computed. */
static void register_full_blocks(server *s, plan *p) {
    kv_pool *kv = &s->kv;
    for (int i = 0; i < kv->max_seqs && s->cfg->prefix_cache; i++) {
        const int32_t *tab = kv->table + (size_t)i * kv->max_blocks;
        for (; s->slots[i] && (size_t)(kv->n_reg[i] + 1) * kv->bs <= s->cached[i].n; kv->n_reg[i]++) {
            const int r = kv->n_reg[i];
            memcpy(p->blk, s->cached[i].v + (size_t)r * kv->bs, sizeof *p->blk * (size_t)kv->bs);
            kv_pool_register(kv, tab[r], r ? kv->hash[tab[r - 1]] : 0, p->blk);
        }
    }
}

/* Rank 0: the placed choice that took its slot last (-1: none). */
static int youngest(const server *s) {
    int y = -1;
    for (int i = 0; i < s->kv.max_seqs; i++)
        if (s->slots[i] && s->slots[i]->placed && (y < 0 || s->slots[i]->order > s->slots[y]->order)) y = i;
    return y;
}

/* Rank 0: a block for the next token of every decoding sequence that has
 * filled its last one, oldest first; when the pool is out of blocks, the
 * youngest sequence is preempted (possibly the one asking). A sequence
 * alone always fits (a request needing more blocks than the pool holds is
 * refused), so the oldest always advances. */
static void grow_decoders(server *s, plan *p) {
    kv_pool *kv = &s->kv;
    for (long last = -1;;) {
        int i = -1; /* the next decoding slot by age */
        for (int j = 0; j < kv->max_seqs; j++) {
            const choice *c = s->slots[j];
            if (c && c->placed && c->prefill_pos >= c->feed_n && c->order > last &&
                (i < 0 || c->order < s->slots[i]->order))
                i = j;
        }
        if (i < 0) return;
        last = s->slots[i]->order;
        while (s->slots[i]->placed && s->cached[i].n == (size_t)kv->nb[i] * kv->bs &&
               kv->nb[i] < kv->max_blocks) {
            const int b = kv_pool_alloc(kv);
            if (b >= 0) {
                kv->table[(size_t)i * kv->max_blocks + kv->nb[i]++] = b;
                p->dirty[i] = 1;
            } else {
                preempt(s, p, youngest(s));
            }
        }
    }
}

/* Rank 0: the block tables that changed, as words for every rank. */
static void put_tables(server *s, plan *p) {
    const kv_pool *kv = &s->kv;
    int w = 0;
    for (int i = 0; i < kv->max_seqs; i++) {
        if (!p->dirty[i]) continue;
        p->dirty[i] = 0;
        p->tab[w++] = i;
        p->tab[w++] = (int32_t)s->cached[i].n;
        p->tab[w++] = kv->nb[i];
        for (int b = 0; b < kv->nb[i]; b++) p->tab[w++] = kv->table[(size_t)i * kv->max_blocks + b];
    }
    p->hdr[H_TABLES] = w;
}

/* Rank 0: drop finished / cancelled choices, admit waiting ones, give
 * blocks to the decoding sequences and to new ones, and lay out the next
 * step: one token for every running sequence, then prefill chunks in the
 * rows left (under s->mu). */
static void plan_step(server *s, plan *p) {
    const loom_infer_opts *io = loom_infer_options(s->inf);
    for (int i = 0; i < io->max_seqs; i++)
        if (s->slots[i] && (s->slots[i]->finished || s->slots[i]->req->cancelled)) {
            release_slot(s, i);
            p->dirty[i] = 1;
        }
    for (choice **pp = &s->wait_head; *pp;) { /* drop cancelled waiters */
        choice *c = *pp;
        if (c->req->cancelled || c->finished) {
            *pp = c->next;
            s->n_wait--;
            if (!c->finished) serve_choice_finish(s, c, "abort");
            serve_req_unref(s, c->req);
            continue;
        }
        pp = &c->next;
    }
    s->wait_tail = NULL;
    for (choice *c = s->wait_head; c; c = c->next) s->wait_tail = c;
    register_full_blocks(s, p);
    serve_admit(s);
    p->hdr[H_COPIES] = 0;
    memset(p->seen, 0, (size_t)io->max_seqs);
    grow_decoders(s, p);
    for (;;) { /* unplaced choices oldest first; one short of blocks stops the rest */
        int i = -1;
        for (int j = 0; j < io->max_seqs; j++)
            if (s->slots[j] && !s->slots[j]->placed && !p->seen[j] &&
                (i < 0 || s->slots[j]->order < s->slots[i]->order))
                i = j;
        if (i < 0 || place(s, p, s->slots[i], i) < 0) break;
        p->seen[i] = 1;
    }
    s->waiting_blocks = 0;
    for (int i = 0; i < io->max_seqs; i++) s->waiting_blocks += s->slots[i] && !s->slots[i]->placed;
    put_tables(s, p);
    int n = 0, rows = 0, any_lp = 0;
    for (int i = 0; i < io->max_seqs; i++) { /* decode first: running sequences never wait */
        choice *c = s->slots[i];
        if (!c || !c->placed || c->prefill_pos < c->feed_n) continue;
        p->e[n] = (plan_entry){.seq = i, .n_new = 1, .fresh = 0, .final = 1};
        p->tok[rows++] = (int32_t)c->out.v[c->out.n - 1];
        loom_ids_push(&s->cached[i], c->out.v[c->out.n - 1]);
        p->owner[n++] = c;
    }
    for (int i = 0; i < io->max_seqs && rows < io->max_rows; i++) {
        choice *c = s->slots[i];
        if (!c || !c->placed || c->prefill_pos >= c->feed_n) continue;
        const size_t left = c->feed_n - c->prefill_pos;
        int take = left < (size_t)(io->max_rows - rows) ? (int)left : io->max_rows - rows;
        p->e[n] = (plan_entry){.seq = i,
                               .n_new = take,
                               .fresh = c->out.n == 0 && c->prefill_pos == c->prefix_hit,
                               .final = c->out.n == 0 && c->prefill_pos + (size_t)take == c->feed_n};
        for (int k = 0; k < take; k++) {
            p->tok[rows++] = (int32_t)feed_tok(c, c->prefill_pos + (size_t)k);
            loom_ids_push(&s->cached[i], feed_tok(c, c->prefill_pos + (size_t)k));
        }
        c->prefill_pos += (size_t)take;
        s->prefill_tokens += take;
        p->owner[n++] = c;
    }
    for (int j = 0; j < n; j++) {
        const choice *c = p->owner[j];
        const req *r = c->req;
        p->e[j].top_k = r->so.top_k;
        p->e[j].temperature = r->so.temperature;
        p->e[j].top_p = r->so.top_p;
        p->e[j].presence = r->presence;
        p->e[j].frequency = r->frequency;
        p->e[j].top_lp = r->top_lp;
        /* the sampling key: the request's seed, this choice, this token -
         * nothing about the batch, so a seed reproduces whatever else runs */
        p->e[j].seed = r->so.seed;
        p->e[j].index = ((uint64_t)c->index << 32) | c->out.n;
        any_lp |= p->e[j].final && r->top_lp >= 0;
    }
    p->hdr[H_ENTRIES] = n;
    p->hdr[H_ROWS] = rows;
    p->hdr[H_SHUTDOWN] = 0;
    p->hdr[H_ANY_LP] = any_lp;
}

/* Rank 0 -> every rank: the header by point-to-point, then the plan. An idle
 * rank polls the header with growing sleeps (NAP_*: busy_at is when it last
 * ran a step), so it blocks instead of spinning inside MPI. */
static loom_status share_plan(loom_comm *world, plan *p, double busy_at) {
    const int rank = loom_comm_rank(world), size = loom_comm_size(world);
    if (size == 1) return LOOM_OK;
    if (rank == 0) {
        for (int r = 1; r < size; r++) LOOM_TRY(loom_comm_send(world, p->hdr, sizeof p->hdr, r, HDR_TAG));
    } else {
        loom_req *q;
        LOOM_TRY(loom_comm_irecv(world, p->hdr, sizeof p->hdr, 0, HDR_TAG, &q));
        long nap = 20000; /* ns */
        for (int done = 0;;) {
            LOOM_TRY(loom_comm_test(q, &done));
            if (done) break;
            struct timespec ts = {0, nap};
            nanosleep(&ts, NULL);
            if (nap < (serve_now() - busy_at < 1.0 ? NAP_BUSY_NS : NAP_IDLE_NS)) nap *= 2;
        }
    }
    if (p->hdr[H_SHUTDOWN]) return LOOM_OK;
    if (p->hdr[H_TABLES] > 0)
        LOOM_TRY(loom_comm_bcast(world, p->tab, sizeof(int32_t) * (size_t)p->hdr[H_TABLES], 0));
    if (p->hdr[H_COPIES] > 0)
        LOOM_TRY(loom_comm_bcast(world, p->copy, sizeof(block_copy) * (size_t)p->hdr[H_COPIES], 0));
    if (p->hdr[H_ENTRIES] == 0) return LOOM_OK;
    LOOM_TRY(loom_comm_bcast(world, p->e, sizeof(plan_entry) * (size_t)p->hdr[H_ENTRIES], 0));
    return loom_comm_bcast(world, p->tok, sizeof(int32_t) * (size_t)p->hdr[H_ROWS], 0);
}

/* log-softmax of the raw logits: the token's and the k most likely. */
static void measure_lp(const float *x, int V, int32_t token, int k, tok_lp *o) {
    double mx = x[0], sum = 0;
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    const double lse = mx + log(sum);
    o->lp = (float)((double)x[token] - lse);
    const int k_top = k < V ? k : V;
    int have = 0;
    for (int i = 0; i < V && k_top > 0; i++) { /* the sorted top k: higher first, the lower id on ties */
        if (have == k_top && !(x[i] > x[o->top_id[k_top - 1]])) continue;
        int at = have < k_top ? have : k_top - 1;
        for (; at > 0 && x[i] > x[o->top_id[at - 1]]; at--) o->top_id[at] = o->top_id[at - 1];
        o->top_id[at] = i;
        if (have < k_top) have++;
    }
    o->n_top = k_top;
    for (int j = 0; j < o->n_top; j++) o->top_lp[j] = (float)((double)x[o->top_id[j]] - lse);
}

/* OpenAI's penalties on a copy of the logits: each token already generated
 * in this sequence loses presence + frequency x its count. */
static const float *penalised(plan *p, const plan_entry *e, const float *x, int V) {
    const loom_ids *h = &p->hist[e->seq];
    if ((e->presence == 0 && e->frequency == 0) || h->n == 0) return x;
    memcpy(p->row, x, sizeof(float) * (size_t)V);
    for (size_t i = 0; i < h->n; i++) p->count[h->v[i]]++;
    for (size_t i = 0; i < h->n; i++) {
        const uint32_t t = h->v[i];
        if (p->count[t] == 0) continue;
        p->row[t] -= e->presence + e->frequency * (float)p->count[t];
        p->count[t] = 0;
    }
    return p->row;
}

/* Every rank: run the planned step; the root samples, everyone gets the
 * tokens (and rank 0 their log-probabilities when asked for). */
static loom_status run_step(loom_infer *inf, loom_comm *world, int root, plan *p) {
    const int n = p->hdr[H_ENTRIES], V = loom_infer_config(inf)->vocab_size;
    const int is_root = loom_comm_rank(world) == root;
    for (int w = 0; w < p->hdr[H_TABLES]; w += 3 + p->tab[w + 2])
        LOOM_TRY(loom_infer_set_blocks(inf, p->tab[w], p->tab[w + 1], p->tab[w + 2], p->tab + w + 3));
    for (int j = 0; j < p->hdr[H_COPIES]; j++)
        LOOM_TRY(loom_infer_copy_block(inf, p->copy[j].dst, p->copy[j].src, p->copy[j].n));
    if (n == 0) return LOOM_OK;
    for (int j = 0; j < n; j++) {
        if (p->e[j].fresh) p->hist[p->e[j].seq].n = 0; /* a new choice: no tokens to penalise */
        p->seq[j] = p->e[j].seq;
        p->n_new[j] = p->e[j].n_new;
    }
    const float *logits;
    LOOM_TRY(loom_infer_step(inf, n, p->seq, p->n_new, p->tok, &logits));
    if (logits && is_root)
        for (int j = 0; j < n; j++) {
            const plan_entry *e = &p->e[j];
            if (!e->final) continue;
            const float *x = logits + (size_t)j * V;
            loom_sample_opts so = {e->temperature, e->top_k, e->top_p, e->seed};
            p->next[j] = loom_sample(penalised(p, e, x, V), V, &so, e->index, p->probs, p->iscratch);
            if (e->top_lp >= 0) measure_lp(x, V, p->next[j], e->top_lp, &p->lp[j]);
            LOOM_TRY(loom_ids_push(&p->hist[e->seq], (uint32_t)p->next[j]));
        }
    if (loom_comm_size(world) > 1) {
        LOOM_TRY(loom_comm_bcast(world, p->next, sizeof(int32_t) * (size_t)n, root));
        if (p->hdr[H_ANY_LP]) LOOM_TRY(loom_comm_bcast(world, p->lp, sizeof(tok_lp) * (size_t)n, root));
    }
    return LOOM_OK;
}

/* Rank 0 after a step: hand the new tokens to their choices (under s->mu). */
static void deliver(server *s, plan *p) {
    const double t = serve_now();
    for (int j = 0; j < p->hdr[H_ENTRIES]; j++) {
        choice *c = p->owner[j];
        if (!p->e[j].final || c->finished) continue;
        s->tokens_out++;
        if (c->out.n == 0) {
            c->t_first = t;
            s->ttft[s->n_ttft++ % LAT_KEEP] = t - c->req->t_arrive;
            serve_hist_add(&s->h_ttft, t - c->req->t_arrive);
        } else {
            s->tpot[s->n_tpot++ % LAT_KEEP] = t - c->t_last;
            serve_hist_add(&s->h_tpot, t - c->t_last);
        }
        c->t_last = t;
        serve_choice_push(s, c, p->next[j], p->e[j].top_lp >= 0 ? &p->lp[j] : NULL);
    }
    pthread_cond_broadcast(&s->progress);
}

static loom_status plan_alloc(plan *p, const loom_infer_opts *io, int V) {
    size_t S = (size_t)io->max_seqs, R = (size_t)io->max_rows + S;
    const size_t max_blocks = ((size_t)io->max_len + (size_t)io->block_size - 1) / (size_t)io->block_size;
    p->tab = malloc(sizeof *p->tab * S * (3 + max_blocks));
    p->dirty = calloc(S, 1);
    p->seen = calloc(S, 1);
    p->blk = malloc(sizeof *p->blk * (size_t)io->block_size);
    p->e = calloc(S, sizeof *p->e);
    p->tok = calloc(R, sizeof *p->tok);
    p->next = calloc(S, sizeof *p->next);
    p->lp = calloc(S, sizeof *p->lp);
    p->copy = calloc(S, sizeof *p->copy);
    p->owner = calloc(S, sizeof *p->owner);
    p->hist = calloc(S, sizeof *p->hist);
    p->seq = calloc(S, sizeof *p->seq);
    p->n_new = calloc(S, sizeof *p->n_new);
    p->probs = malloc(sizeof(float) * 2 * (size_t)V);
    p->row = malloc(sizeof(float) * (size_t)V);
    p->iscratch = malloc(sizeof(int) * (size_t)V);
    p->count = calloc((size_t)V, sizeof(int));
    if (!p->e || !p->tok || !p->next || !p->lp || !p->copy || !p->owner || !p->hist || !p->seq || !p->n_new ||
        !p->tab || !p->dirty || !p->seen || !p->blk || !p->probs || !p->row || !p->iscratch || !p->count)
        return loom_fail(LOOM_EOS, "serve: out of memory for the step plan");
    return LOOM_OK;
}

static void plan_free(plan *p, int max_seqs) {
    for (int i = 0; p->hist && i < max_seqs; i++) loom_ids_free(&p->hist[i]);
    free(p->e);
    free(p->tok);
    free(p->next);
    free(p->lp);
    free(p->copy);
    free(p->tab);
    free(p->dirty);
    free(p->seen);
    free(p->blk);
    free(p->owner);
    free(p->hist);
    free(p->seq);
    free(p->n_new);
    free(p->probs);
    free(p->row);
    free(p->iscratch);
    free(p->count);
}

/* Rank 0: the server's tables and the HTTP daemon (*d), its port printed
 * and written to --port-file. */
static loom_status open_server(server *s, const loom_serve_config *c, struct MHD_Daemon **d) {
    const loom_infer_opts *io = loom_infer_options(s->inf);
    s->slots = calloc((size_t)io->max_seqs, sizeof *s->slots);
    s->cached = calloc((size_t)io->max_seqs, sizeof *s->cached);
    s->ttft = calloc(LAT_KEEP, sizeof(double));
    s->tpot = calloc(LAT_KEEP, sizeof(double));
    if (!s->slots || !s->cached || !s->ttft || !s->tpot ||
        !kv_pool_init(&s->kv, io->n_blocks, io->block_size, io->max_seqs,
                      (io->max_len + io->block_size - 1) / io->block_size))
        return loom_fail(LOOM_EOS, "serve: out of memory");
    serve_metrics_init(s);
    int port = 0;
    if (!(*d = serve_start_http(s, &port)))
        return loom_fail(LOOM_EUNAVAIL,
                         "serve: cannot listen on 127.0.0.1:%d: %s (--port 0 picks a free port)", c->port,
                         serve_http_error());
    loom_info(
        "serving %s on http://127.0.0.1:%d (POST /v1/completions, /v1/chat/completions; GET /v1/models, "
        "/health, /metrics); KV cache %d blocks of %d positions (%.1f MiB per rank, %.1f KiB a block), "
        "%d sequences at once, %d positions each at most; prefix caching %s",
        c->model_name, port, io->n_blocks, io->block_size, loom_infer_cache_bytes(s->inf) / 1048576.0,
        loom_infer_block_bytes(s->inf) / 1024.0, io->max_seqs, io->max_len, c->prefix_cache ? "on" : "off");
    if (c->port_file && c->port_file[0]) {
        FILE *fp = fopen(c->port_file, "w");
        if (!fp || fprintf(fp, "%d\n", port) < 0 || fclose(fp) != 0)
            return loom_fail(LOOM_ECANTCREAT, "serve: cannot write --port-file %s", c->port_file);
    }
    return LOOM_OK;
}

/* Rank 0 while draining: is every choice done, or the deadline passed (then
 * every choice still held is cut with a final event)? (under s->mu) */
static int drained(server *s, double deadline) {
    const int max_seqs = loom_infer_options(s->inf)->max_seqs;
    int busy = s->n_wait > 0;
    for (int i = 0; i < max_seqs; i++) busy |= s->slots[i] != NULL;
    if (!busy) return 1;
    if (serve_now() < deadline && g_signals < 2) return 0;
    for (int i = 0; i < max_seqs; i++)
        if (s->slots[i]) release_slot(s, i);
    for (choice *c = s->wait_head, *nx; c; c = nx) {
        nx = c->next;
        serve_choice_finish(s, c, "abort");
        serve_req_unref(s, c->req);
    }
    s->wait_head = s->wait_tail = NULL;
    s->n_wait = 0;
    pthread_cond_broadcast(&s->progress);
    return 1;
}

/* Rank 0: wait until there is a step to run or a heartbeat is due (1 s
 * after the last plan sent); after a signal, drain, and once drained let the
 * responses go out (at most 5 s) and plan the shutdown. */
static void next_plan(server *s, plan *p, double *last_sent, double *drain_until) {
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (g_signals && !s->stopping) {
            s->stopping = 1;
            *drain_until = serve_now() + s->cfg->drain_timeout;
            loom_info("serve: signal: draining (no new requests; %d waiting, cut after %.0f s)", s->n_wait,
                      s->cfg->drain_timeout);
        }
        if (s->stopping && drained(s, *drain_until)) {
            const double until = serve_now() + 5.0;
            pthread_cond_broadcast(&s->progress);
            while (s->live_reqs > 0 && serve_now() < until) {
                struct timespec ts = serve_deadline_in(20000000);
                pthread_cond_timedwait(&s->work, &s->mu, &ts);
            }
            p->hdr[H_ENTRIES] = p->hdr[H_ROWS] = p->hdr[H_COPIES] = p->hdr[H_TABLES] = 0;
            p->hdr[H_SHUTDOWN] = 1;
            break;
        }
        plan_step(s, p);
        s->loop_iters++;
        s->last_loop = serve_now();
        if (p->hdr[H_ENTRIES] > 0 || p->hdr[H_COPIES] > 0 || p->hdr[H_TABLES] > 0 ||
            serve_now() - *last_sent > 1.0)
            break; /* work, or a heartbeat */
        struct timespec ts = serve_deadline_in(50000000);
        pthread_cond_timedwait(&s->work, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    *last_sent = serve_now();
}

/* Rank 0: stop the daemon (joining its connection threads) and release every
 * request still held. */
static void close_server(server *s, struct MHD_Daemon *d, loom_status st) {
    const int max_seqs = loom_infer_options(s->inf)->max_seqs;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (int i = 0; s->slots && i < max_seqs; i++)
        if (s->slots[i]) release_slot(s, i);
    for (choice *c = s->wait_head, *nx; c; c = nx) {
        nx = c->next;
        serve_choice_finish(s, c, st == LOOM_OK ? "abort" : "error");
        serve_req_unref(s, c->req);
    }
    s->wait_head = s->wait_tail = NULL;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    if (d) serve_stop_http(s, d); /* joins the connection threads; responses are freed */
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
    if (loom_infer_options(inf)->block_size < 1)
        return loom_fail(LOOM_EUSAGE, "serve: the KV cache must be paged (loom_infer_opts.block_size >= 1)");
    world = loom_comm_host(world); /* host data only: requests, plans, token ids */
    const int rank = loom_comm_rank(world), max_seqs = loom_infer_options(inf)->max_seqs;
    server s;
    memset(&s, 0, sizeof s);
    s.cfg = c;
    s.inf = inf;
    s.tok = tok;
    s.chat = c->chat_template;
    s.t_start = serve_now();
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s.seed_base = loom_rng_u64(loom_rng_key_make((uint64_t)now.tv_nsec ^ (uint64_t)now.tv_sec, "serve"), 0);
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&s.tok_mu, NULL);
    pthread_cond_init(&s.work, NULL);
    pthread_cond_init(&s.progress, NULL);
    plan p;
    memset(&p, 0, sizeof p);
    loom_status st = plan_alloc(&p, loom_infer_options(inf), loom_infer_config(inf)->vocab_size);
    struct MHD_Daemon *d = NULL;
    catch_signals();
    if (st == LOOM_OK && rank == 0) st = open_server(&s, c, &d);
    st = loom_comm_agree(world, st);
    double last_sent = serve_now(), drain_until = 0, busy_at = serve_now();
    while (st == LOOM_OK) {
        if (rank == 0) next_plan(&s, &p, &last_sent, &drain_until);
        st = share_plan(world, &p, busy_at);
        if (st != LOOM_OK || p.hdr[H_SHUTDOWN]) break;
        if (p.hdr[H_ENTRIES] == 0 && p.hdr[H_COPIES] == 0 && p.hdr[H_TABLES] == 0) continue;
        busy_at = serve_now();
        st = run_step(inf, world, root, &p);
        if (st == LOOM_OK && rank == 0) {
            pthread_mutex_lock(&s.mu);
            deliver(&s, &p);
            pthread_mutex_unlock(&s.mu);
        }
    }
    if (rank == 0) close_server(&s, d, st);
    plan_free(&p, max_seqs);
    free(s.slots);
    for (int i = 0; s.cached && i < max_seqs; i++) loom_ids_free(&s.cached[i]);
    free(s.cached);
    kv_pool_free(&s.kv);
    free(s.ttft);
    free(s.tpot);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_destroy(&s.tok_mu);
    pthread_cond_destroy(&s.work);
    pthread_cond_destroy(&s.progress);
    return st;
}
