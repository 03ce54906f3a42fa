/* comm_staged.c - the host-staged implementation of the communicator
 * (comm.h: loom_comm_wrap_staged): buffers in another memory (a device's,
 * through the group's loom_comm_mem), each op run by the MPI group
 * underneath on a host copy. Not tied to a mesh axis; collective as the op.
 *
 * Each op: one copy to the host of what this rank contributes, the MPI
 * implementation's op on the host staging buffer (in place where comm.h
 * allows it), one copy back of the result. Nothing else is communicated, so
 * the group's stats hold exactly the op's bytes (counted once, by the entry
 * points: the host group's implementation is called directly). A started op
 * copies in at its start and out when wait / test completes it; it holds its
 * staging buffer until then. The staging buffers are host memory owned by
 * the group (a pool: reserved by loom_comm_reserve_wire, otherwise grown to
 * the largest message and kept).
 *
 * A failed copy returns its status before the collective, on that rank only:
 * as for any failure not agreed, the caller aborts the job (the trainer calls
 * loom_comm_abort), so no rank waits.
 */
#include "loom/comm.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

/* One group's staging side (loom_comm.impl). */
typedef struct staged {
    loom_comm_pool stage; /* host staging buffers */
} staged;

/* Where one call's data goes on the host: this rank's input copied to
 * in_off (in_bytes from in_src), the host call run, out_bytes copied from
 * out_off to out_dst. */
typedef struct staged_plan {
    size_t total, in_off, in_bytes, out_off, out_bytes;
    const void *in_src;
    void *out_dst;
} staged_plan;

/* A started call (loom_req.impl): its buffer and copy back, then the host
 * implementation's request. */
typedef struct staged_req {
    int buf;
    staged_plan plan;
    const size_t *recv_bytes, *recv_displ; /* alltoallv: its blocks, copied back one by one */
    max_align_t host_req[];
} staged_req;

static const loom_comm_ops staged_ops;

/* Where k's data goes on the host. */
static void plan_call(const loom_comm *c, const loom_comm_call *k, staged_plan *p) {
    const size_t esz = loom_dtype_size(k->type), n = (size_t)c->size;
    *p = (staged_plan){.in_src = k->send, .out_dst = k->recv};
    switch (k->op) {
    case LOOM_OP_ALLREDUCE: p->total = p->in_bytes = p->out_bytes = k->count * esz; break;
    case LOOM_OP_REDUCE_SCATTER: /* in place: the result at the start */
        p->total = p->in_bytes = k->count * esz * n;
        p->out_bytes = k->count * esz;
        break;
    case LOOM_OP_ALLGATHER: /* in place at this rank's block */
        p->total = p->out_bytes = k->count * n;
        p->in_off = k->count * (size_t)c->rank;
        p->in_bytes = k->count;
        break;
    case LOOM_OP_ALLTOALL: /* [send | recv] */
        p->in_bytes = p->out_bytes = p->out_off = k->count * n;
        p->total = 2 * p->in_bytes;
        break;
    case LOOM_OP_BCAST: /* the root's buffer in, everyone's out */
        p->total = p->out_bytes = k->count;
        p->in_src = k->recv;
        p->in_bytes = c->rank == k->peer ? k->count : 0;
        break;
    case LOOM_OP_SEND: p->total = p->in_bytes = k->count; break;
    case LOOM_OP_RECV: p->total = p->out_bytes = k->count; break;
    default: break; /* barrier, alltoallv: not planned here */
    }
}

/* k on the host staging buffer h, as p places it. */
static loom_comm_call host_call(const loom_comm_call *k, char *h, const staged_plan *p) {
    loom_comm_call hk = *k;
    switch (k->op) {
    case LOOM_OP_ALLREDUCE:
    case LOOM_OP_REDUCE_SCATTER: hk.send = hk.recv = h; break;
    case LOOM_OP_ALLGATHER: hk.send = h + p->in_off, hk.recv = h; break;
    case LOOM_OP_ALLTOALL: hk.send = h, hk.recv = h + p->out_off; break;
    case LOOM_OP_BCAST:
    case LOOM_OP_RECV: hk.recv = h; break;
    case LOOM_OP_SEND: hk.send = h; break;
    default: break;
    }
    return hk;
}

static loom_status copy_in(loom_comm *c, char *h, const staged_plan *p) {
    if (!p->in_bytes) return LOOM_OK;
    return c->mem.copy_to_host(c->mem.ctx, h + p->in_off, p->in_src, p->in_bytes);
}

static loom_status copy_out(loom_comm *c, const char *h, const staged_plan *p) {
    if (!p->out_bytes) return LOOM_OK;
    return c->mem.copy_from_host(c->mem.ctx, p->out_dst, h + p->out_off, p->out_bytes);
}

/* The bytes spanned by blocks (displ[p], bytes[p]). */
static size_t span(const size_t *bytes, const size_t *displ, int n) {
    size_t end = 0;
    for (int p = 0; p < n; p++)
        if (bytes[p] && displ[p] + bytes[p] > end) end = displ[p] + bytes[p];
    return end;
}

/* alltoallv on the host: [send span | recv span] (p->out_off = the send
 * span); only the received blocks are copied back (bytes between them in
 * the destination stay as they were). */
static loom_status alltoallv_in(loom_comm *c, const loom_comm_call *k, int *buf, staged_plan *p,
                                loom_comm_call *hk) {
    staged *s = c->impl;
    const int n = c->size;
    size_t sspan = span(k->send_bytes, k->send_displ, n), rspan = span(k->recv_bytes, k->recv_displ, n);
    *p = (staged_plan){.total = sspan + rspan, .out_off = sspan, .out_dst = k->recv};
    *buf = loom_comm_pool_take(&s->stage, p->total);
    if (*buf < 0) return LOOM_EOS;
    char *h = s->stage.b[*buf].p;
    *hk = *k;
    hk->send = h, hk->recv = h + sspan;
    loom_status st = sspan ? c->mem.copy_to_host(c->mem.ctx, h, k->send, sspan) : LOOM_OK;
    if (st != LOOM_OK) loom_comm_pool_give(&s->stage, *buf);
    return st;
}

static loom_status alltoallv_out(loom_comm *c, const char *h, const staged_plan *p, const size_t *bytes,
                                 const size_t *displ) {
    loom_status st = LOOM_OK;
    for (int q = 0; st == LOOM_OK && q < c->size; q++)
        if (bytes[q])
            st = c->mem.copy_from_host(c->mem.ctx, (char *)p->out_dst + displ[q], h + p->out_off + displ[q],
                                       bytes[q]);
    return st;
}

static loom_status run_alltoallv(loom_comm *c, const loom_comm_call *k) {
    staged *s = c->impl;
    staged_plan p;
    loom_comm_call hk;
    int b = -1;
    LOOM_TRY(alltoallv_in(c, k, &b, &p, &hk));
    loom_status st = c->host->ops->run(c->host, &hk);
    if (st == LOOM_OK) st = alltoallv_out(c, s->stage.b[b].p, &p, k->recv_bytes, k->recv_displ);
    loom_comm_pool_give(&s->stage, b);
    return st;
}

static loom_status staged_run(loom_comm *c, const loom_comm_call *k) {
    if (k->op == LOOM_OP_BARRIER) return c->host->ops->run(c->host, k);
    if (k->op == LOOM_OP_ALLTOALLV) return run_alltoallv(c, k);
    staged *s = c->impl;
    staged_plan p;
    plan_call(c, k, &p);
    int b = loom_comm_pool_take(&s->stage, p.total);
    if (b < 0) return LOOM_EOS;
    char *h = s->stage.b[b].p;
    loom_comm_call hk = host_call(k, h, &p);
    loom_status st = copy_in(c, h, &p);
    if (st == LOOM_OK) st = c->host->ops->run(c->host, &hk);
    if (st == LOOM_OK) st = copy_out(c, h, &p);
    loom_comm_pool_give(&s->stage, b);
    return st;
}

static loom_status staged_start(loom_comm *c, const loom_comm_call *k, void *req) {
    staged *s = c->impl;
    staged_req *r = req;
    r->recv_bytes = r->recv_displ = NULL;
    if (k->op == LOOM_OP_ALLTOALLV) {
        loom_comm_call hk;
        LOOM_TRY(alltoallv_in(c, k, &r->buf, &r->plan, &hk));
        r->recv_bytes = k->recv_bytes, r->recv_displ = k->recv_displ;
        loom_status st = c->host->ops->start(c->host, &hk, r->host_req);
        if (st != LOOM_OK) loom_comm_pool_give(&s->stage, r->buf);
        return st;
    }
    plan_call(c, k, &r->plan);
    r->buf = loom_comm_pool_take(&s->stage, r->plan.total);
    if (r->buf < 0) return LOOM_EOS;
    char *h = s->stage.b[r->buf].p;
    loom_comm_call hk = host_call(k, h, &r->plan);
    loom_status st = copy_in(c, h, &r->plan);
    if (st == LOOM_OK) st = c->host->ops->start(c->host, &hk, r->host_req);
    if (st != LOOM_OK) loom_comm_pool_give(&s->stage, r->buf);
    return st;
}

/* A completed host request: the result back, the buffer given back. */
static loom_status finish(loom_comm *c, staged_req *r, loom_status st) {
    staged *s = c->impl;
    const char *h = s->stage.b[r->buf].p;
    if (st == LOOM_OK)
        st = r->recv_bytes ? alltoallv_out(c, h, &r->plan, r->recv_bytes, r->recv_displ)
                           : copy_out(c, h, &r->plan);
    loom_comm_pool_give(&s->stage, r->buf);
    return st;
}

static loom_status staged_wait(loom_comm *c, void *req) {
    staged_req *r = req;
    return finish(c, r, c->host->ops->wait(c->host, r->host_req));
}

static loom_status staged_test(loom_comm *c, void *req, int *done) {
    staged_req *r = req;
    loom_status st = c->host->ops->test(c->host, r->host_req, done);
    return *done ? finish(c, r, st) : st;
}

static loom_status staged_reserve(loom_comm *c, size_t bytes, int buffers) {
    staged *s = c->impl;
    return loom_comm_pool_reserve(&s->stage, bytes, buffers);
}

static loom_status staged_split(loom_comm *parent, int color, int key, const char *name, loom_comm **out) {
    loom_comm *h = NULL;
    LOOM_TRY(loom_comm_split(parent->host, color, key, name, &h));
    if (!h) return LOOM_OK;
    loom_status st = loom_comm_wrap_staged(h, &parent->mem, out);
    if (st != LOOM_OK) loom_comm_free(h);
    return st;
}

static void staged_free(loom_comm *c) {
    staged *s = c->impl;
    if (!s) return;
    loom_comm_pool_free(&s->stage);
    free(s);
    c->impl = NULL;
}

static const loom_comm_ops staged_ops = {
    .name = "staged",
    .run = staged_run,
    .start = staged_start,
    .wait = staged_wait,
    .test = staged_test,
    .split = staged_split,
    .reserve = staged_reserve,
    .free = staged_free,
};

loom_status loom_comm_wrap_staged(loom_comm *host_group, const loom_comm_mem *mem, loom_comm **out) {
    *out = NULL;
    if (host_group->host) /* only an MPI group has none */
        return loom_fail(LOOM_EUSAGE,
                         "rank %d: group %s: host staging needs an MPI group on host "
                         "memory, not a %s one on %s memory",
                         host_group->world_rank, host_group->name, host_group->ops->name,
                         host_group->mem.name);
    staged *s = calloc(1, sizeof *s);
    if (!s)
        return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", host_group->world_rank,
                         host_group->name);
    s->stage = (loom_comm_pool){.alloc = loom_comm_mem_host.alloc, .free = loom_comm_mem_host.free};
    loom_comm *c = NULL;
    LOOM_TRY(loom_comm_create(&staged_ops, s, sizeof(staged_req) + host_group->req_size, mem,
                              host_group->rank, host_group->size, host_group->world_rank, host_group->name,
                              &c));
    loom_comm_adopt_host(c, host_group);
    *out = c;
    return LOOM_OK;
}
