/* comm_hier.c - a host-aware all-reduce over a group that spans hosts
 * (comm.h: loom_comm_wrap_hier): reduce-scatter among the group's ranks on
 * this host, all-reduce of this rank's slice with the ranks holding the same
 * slice on the other hosts, all-gather on this host. Each rank then sends
 * 1/L of the buffer over the link between hosts (L ranks of the group a
 * host), where a flat all-reduce's schedule may send all of it.
 *
 * Every other op, and an all-reduce too small to split (fewer elements than
 * L), runs on the flat group underneath; so do the last count % L elements
 * (blocking, at the start).
 *
 * Started (loom_comm_iallreduce), the three stages are non-blocking calls
 * chained by wait and test. MPI needs the collectives on one communicator
 * started in the same order on every rank, whatever order a rank tests its
 * requests in, so each stage has its own subgroup - "<group>.host" for the
 * reduce-scatters (started in the caller's order), "<group>.link" for the
 * all-reduces, "<group>.gather" for the all-gathers - and a request moves
 * to its next stage only after every request started before it has (the
 * group's queue, oldest first). Each subgroup counts its own bytes; the
 * wrapper's calls count in the flat group's stats, once, as the entry
 * points count them.
 */
#include "loom/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

struct hier_req;

typedef struct hier {
    loom_comm *flat;              /* not owned */
    loom_comm *intra;             /* this rank's host's members of flat: reduce-scatters */
    loom_comm *inter;             /* the members with the same place on every host: all-reduces */
    loom_comm *gather;            /* intra's members again: all-gathers */
    struct hier_req *head, *tail; /* started hierarchical all-reduces, oldest first */
} hier;

/* The stages of a started hierarchical all-reduce, in order. */
enum { ST_SCATTER, ST_REDUCE, ST_GATHER, ST_DONE };

/* A started call: a hierarchical all-reduce's stages, or the flat group's request. */
typedef struct hier_req {
    int hierarchical;
    int stage;     /* the stage started last (ST_DONE: complete) */
    loom_req *cur; /* its request; NULL once complete */
    char *x;       /* the buffer, in place */
    size_t chunk;  /* elements of this rank's slice */
    loom_dtype type;
    struct hier_req *next;
    max_align_t flat_req[];
} hier_req;

static const loom_comm_ops hier_ops;

static int is_hier_allreduce(const loom_comm *c, const loom_comm_call *k) {
    const hier *h = c->impl;
    return k->op == LOOM_OP_ALLREDUCE && k->redop == LOOM_SUM && k->count >= (size_t)h->intra->size;
}

/* Start stage `stage` of r. */
static loom_status start_stage(hier *h, hier_req *r, int stage) {
    const size_t esz = loom_dtype_size(r->type);
    char *mine = r->x + (size_t)h->intra->rank * r->chunk * esz;
    r->stage = stage;
    r->cur = NULL;
    switch (stage) {
    case ST_SCATTER:
        return loom_comm_ireduce_scatter(h->intra, r->x, r->x, r->chunk, r->type, LOOM_SUM, &r->cur);
    case ST_REDUCE: return loom_comm_iallreduce(h->inter, r->x, r->chunk, r->type, LOOM_SUM, &r->cur);
    case ST_GATHER:
        if (mine != r->x) memmove(mine, r->x, r->chunk * esz);
        return loom_comm_iallgather(h->gather, mine, r->x, r->chunk * esz, &r->cur);
    default: return LOOM_OK;
    }
}

/* Move every started all-reduce on as far as it can without waiting: a
 * request whose stage completed starts the next one once every older
 * request has started it. Complete requests leave the queue. */
static loom_status advance(hier *h) {
    int older = ST_DONE; /* the least stage an older request has started */
    for (hier_req *r = h->head; r; r = r->next) {
        for (;;) {
            if (r->cur) {
                int done = 0;
                LOOM_TRY(loom_comm_test(r->cur, &done));
                if (!done) break;
                r->cur = NULL;
            }
            if (r->stage == ST_DONE || r->stage + 1 > older) break;
            LOOM_TRY(start_stage(h, r, r->stage + 1));
        }
        if (r->stage < older) older = r->stage;
    }
    while (h->head && h->head->stage == ST_DONE) {
        h->head = h->head->next;
        if (!h->head) h->tail = NULL;
    }
    return LOOM_OK;
}

/* Unlink a complete request that is not at the head (tests may complete them out of order). */
static void unlink_req(hier *h, hier_req *r) {
    hier_req **p = &h->head, *prev = NULL;
    while (*p && *p != r) prev = *p, p = &(*p)->next;
    if (!*p) return;
    *p = r->next;
    if (h->tail == r) h->tail = prev;
}

/* Complete every started all-reduce (they stay queued until their caller's wait or test). */
static loom_status drain(loom_comm *c) {
    hier *h = c->impl;
    for (;;) {
        LOOM_TRY(advance(h));
        hier_req *q = h->head;
        while (q && !q->cur) q = q->next;
        if (!q) return LOOM_OK;
        loom_status st = loom_comm_wait(q->cur);
        q->cur = NULL;
        LOOM_TRY(st);
    }
}

/* Blocking, in place on k->recv: n = L * chunk + rem elements; the first
 * L * chunk in three stages, the last rem on the flat group. */
static loom_status hier_allreduce(loom_comm *c, const loom_comm_call *k) {
    hier *h = c->impl;
    const size_t L = (size_t)h->intra->size, esz = loom_dtype_size(k->type);
    const size_t chunk = k->count / L, rem = k->count % L;
    char *x = k->recv;
    char *mine = x + (size_t)h->intra->rank * chunk * esz;
    LOOM_TRY(drain(c)); /* the started ones first: their stages then stand in the same order everywhere */
    LOOM_TRY(loom_comm_reduce_scatter(h->intra, x, x, chunk, k->type, LOOM_SUM)); /* my slice at x */
    LOOM_TRY(loom_comm_allreduce(h->inter, x, chunk, k->type, LOOM_SUM));
    if (mine != x) memmove(mine, x, chunk * esz);
    LOOM_TRY(loom_comm_allgather(h->intra, mine, x, chunk * esz));
    if (!rem) return LOOM_OK;
    loom_comm_call tail = *k;
    tail.send = tail.recv = x + L * chunk * esz;
    tail.count = rem;
    return h->flat->ops->run(h->flat, &tail);
}

static loom_status hier_run(loom_comm *c, const loom_comm_call *k) {
    hier *h = c->impl;
    if (is_hier_allreduce(c, k)) return hier_allreduce(c, k);
    return h->flat->ops->run(h->flat, k);
}

static loom_status hier_start(loom_comm *c, const loom_comm_call *k, void *req) {
    hier *h = c->impl;
    hier_req *r = req;
    memset(r, 0, sizeof *r);
    r->hierarchical = is_hier_allreduce(c, k);
    if (!r->hierarchical) return h->flat->ops->start(h->flat, k, r->flat_req);
    const size_t L = (size_t)h->intra->size, esz = loom_dtype_size(k->type);
    r->x = k->recv;
    r->chunk = k->count / L;
    r->type = k->type;
    const size_t rem = k->count % L;
    if (rem) { /* the tail on the flat group, now, in the caller's order */
        loom_comm_call tail = *k;
        tail.send = tail.recv = r->x + L * r->chunk * esz;
        tail.count = rem;
        LOOM_TRY(h->flat->ops->run(h->flat, &tail));
    }
    LOOM_TRY(start_stage(h, r, ST_SCATTER));
    if (h->tail) h->tail->next = r;
    else h->head = r;
    h->tail = r;
    return LOOM_OK;
}

static loom_status hier_wait(loom_comm *c, void *req) {
    hier *h = c->impl;
    hier_req *r = req;
    if (!r->hierarchical) return h->flat->ops->wait(h->flat, r->flat_req);
    for (;;) {
        LOOM_TRY(advance(h));
        if (r->stage == ST_DONE && !r->cur) break;
        /* block on the oldest request with a stage in flight: it holds up the rest */
        hier_req *q = h->head;
        while (q && !q->cur) q = q->next;
        if (!q)
            return loom_fail(LOOM_EINTERNAL, "rank %d: group %s: a hierarchical all-reduce waits on nothing",
                             c->world_rank, c->name);
        loom_status st = loom_comm_wait(q->cur);
        q->cur = NULL;
        LOOM_TRY(st);
    }
    unlink_req(h, r);
    return LOOM_OK;
}

static loom_status hier_test(loom_comm *c, void *req, int *done) {
    hier *h = c->impl;
    hier_req *r = req;
    if (!r->hierarchical) return h->flat->ops->test(h->flat, r->flat_req, done);
    loom_status st = advance(h);
    *done = st != LOOM_OK || (r->stage == ST_DONE && !r->cur);
    if (*done) unlink_req(h, r);
    return st;
}

static loom_status hier_split(loom_comm *parent, int color, int key, const char *name, loom_comm **out) {
    hier *h = parent->impl;
    return loom_comm_split(h->flat, color, key, name, out);
}

static void hier_free(loom_comm *c) {
    hier *h = c->impl;
    if (!h) return;
    loom_comm_free(h->intra);
    loom_comm_free(h->inter);
    loom_comm_free(h->gather);
    free(h);
    c->impl = NULL;
}

static const loom_comm_ops hier_ops = {
    .name = "hier",
    .run = hier_run,
    .start = hier_start,
    .wait = hier_wait,
    .test = hier_test,
    .split = hier_split,
    .reserve = NULL,
    .free = hier_free,
};

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

loom_status loom_comm_wrap_hier(loom_comm *flat, loom_comm **out) {
    *out = NULL;
    if (flat->host || strcmp(flat->ops->name, "mpi") != 0) /* an MPI group on host memory only */
        return loom_fail(LOOM_EUSAGE,
                         "rank %d: group %s: a hierarchical all-reduce needs an MPI group on host memory",
                         flat->world_rank, flat->name);
    const int n = flat->size;
    int *hosts = calloc((size_t)n * 2, sizeof *hosts);
    if (!hosts)
        return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", flat->world_rank, flat->name);
    int me = loom_comm_host_of(flat->world_rank);
    loom_status st = loom_comm_allgather(flat, &me, hosts, sizeof me);
    if (st != LOOM_OK) {
        free(hosts);
        return st;
    }
    /* hierarchical only if >= 2 hosts each hold the same number >= 2 of the members */
    int *sorted = hosts + n, distinct = 0, same = 1, L = 0, local = 0;
    memcpy(sorted, hosts, (size_t)n * sizeof *hosts);
    qsort(sorted, (size_t)n, sizeof *sorted, int_cmp);
    for (int i = 0, run = 0; i < n; i++) {
        run++;
        if (i == n - 1 || sorted[i + 1] != sorted[i]) {
            distinct++;
            if (L == 0) L = run;
            same &= run == L;
            run = 0;
        }
    }
    for (int i = 0; i < flat->rank; i++) local += hosts[i] == me;
    free(hosts);
    if (distinct < 2 || !same || L < 2) return LOOM_OK;
    hier *h = calloc(1, sizeof *h);
    if (!h) return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", flat->world_rank, flat->name);
    h->flat = flat;
    char name[80];
    snprintf(name, sizeof name, "%s.host", flat->name);
    st = loom_comm_split(flat, me, flat->rank, name, &h->intra);
    snprintf(name, sizeof name, "%s.link", flat->name);
    if (st == LOOM_OK) st = loom_comm_split(flat, local, flat->rank, name, &h->inter);
    snprintf(name, sizeof name, "%s.gather", flat->name);
    if (st == LOOM_OK) st = loom_comm_split(flat, me, flat->rank, name, &h->gather);
    loom_comm *c = NULL;
    if (st == LOOM_OK)
        st = loom_comm_create(&hier_ops, h, sizeof(hier_req) + flat->req_size, &flat->mem, flat->rank,
                              flat->size, flat->world_rank, flat->name, &c);
    else {
        loom_comm_free(h->intra);
        loom_comm_free(h->inter);
        loom_comm_free(h->gather);
        free(h);
    }
    if (st != LOOM_OK) return st;
    c->stats = flat->stats; /* its calls are the flat group's, counted once */
    c->seq = flat->seq;
    *out = c;
    return LOOM_OK;
}
