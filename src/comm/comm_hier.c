/* comm_hier.c - a host-aware all-reduce over a group that spans hosts
 * (comm.h: loom_comm_wrap_hier): reduce-scatter among the group's ranks on
 * this host, all-reduce of this rank's slice with the ranks holding the same
 * slice on the other hosts, all-gather on this host. Each rank then sends
 * 1/L of the buffer over the link between hosts (L ranks of the group a
 * host), where a flat all-reduce's schedule may send all of it.
 *
 * Every other op, and an all-reduce too small to split (fewer elements than
 * L), runs on the flat group underneath. The hierarchical all-reduce is
 * blocking even when started (loom_comm_iallreduce): its three stages run in
 * start, so it does not overlap the caller's compute. A non-blocking chain
 * (one subgroup per stage, each stage of a request started after that of
 * every older request) was measured slower on 2 hosts x 2 ranks: Open MPI's
 * non-blocking all-reduce of 2 ranks is a reduce then a broadcast, twice the
 * link time of the blocking one (docs/cluster.md).
 *
 * The stages are calls on two subgroups (named "<group>.host" and
 * "<group>.link"), each counting its own bytes; the wrapper's calls count in
 * the flat group's stats, once, as the entry points count them.
 */
#include "loom/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

typedef struct hier {
    loom_comm *flat;  /* not owned */
    loom_comm *intra; /* this rank's host's members of flat */
    loom_comm *inter; /* the members with the same place on every host */
} hier;

/* A started call: 1 when it ran here (done at start), else the flat group's request. */
typedef struct hier_req {
    int ran;
    max_align_t flat_req[];
} hier_req;

static const loom_comm_ops hier_ops;

static int is_hier_allreduce(const loom_comm *c, const loom_comm_call *k) {
    const hier *h = c->impl;
    return k->op == LOOM_OP_ALLREDUCE && k->redop == LOOM_SUM && k->count >= (size_t)h->intra->size;
}

/* In place on k->recv: n = L * chunk + rem elements; the first L * chunk in
 * three stages, the last rem on the flat group. */
static loom_status hier_allreduce(loom_comm *c, const loom_comm_call *k) {
    hier *h = c->impl;
    const size_t L = (size_t)h->intra->size, esz = loom_dtype_size(k->type);
    const size_t chunk = k->count / L, rem = k->count % L;
    char *x = k->recv;
    char *mine = x + (size_t)h->intra->rank * chunk * esz;
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
    r->ran = is_hier_allreduce(c, k);
    if (r->ran) return hier_allreduce(c, k);
    return h->flat->ops->start(h->flat, k, r->flat_req);
}

static loom_status hier_wait(loom_comm *c, void *req) {
    hier *h = c->impl;
    hier_req *r = req;
    return r->ran ? LOOM_OK : h->flat->ops->wait(h->flat, r->flat_req);
}

static loom_status hier_test(loom_comm *c, void *req, int *done) {
    hier *h = c->impl;
    hier_req *r = req;
    if (r->ran) {
        *done = 1;
        return LOOM_OK;
    }
    return h->flat->ops->test(h->flat, r->flat_req, done);
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
    loom_comm *c = NULL;
    if (st == LOOM_OK)
        st = loom_comm_create(&hier_ops, h, sizeof(hier_req) + flat->req_size, &flat->mem, flat->rank,
                              flat->size, flat->world_rank, flat->name, &c);
    else {
        loom_comm_free(h->intra);
        loom_comm_free(h->inter);
        free(h);
    }
    if (st != LOOM_OK) return st;
    c->stats = flat->stats; /* its calls are the flat group's, counted once */
    c->seq = flat->seq;
    *out = c;
    return LOOM_OK;
}
