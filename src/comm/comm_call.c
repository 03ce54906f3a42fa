/* comm_call.c - the entry points of every call (comm.h), above the
 * implementations: each call is described once as a loom_comm_call, checked
 * (int counts, bf16 sums only), counted and traced here, watched from start
 * to completion (comm_watch.c), and run or started by the group's
 * implementation (c->ops). Collective as comm.h says: every function but
 * send / recv, their non-blocking forms, wait and test. Non-blocking:
 * iallreduce, ireduce_scatter, iallgather, ialltoallv, isend, irecv.
 *
 * Statistics follow comm.h's byte convention: a blocking call counts its
 * calls, bytes and seconds when it returns successfully; a non-blocking call
 * counts calls and bytes when it starts and its seconds (start to
 * completion) in wait / test. call_seconds is the wall time the calling
 * thread spent inside these functions for that op (the whole blocking call;
 * the start, every test and the wait of a non-blocking one), so compute
 * overlapped with communication shows as seconds > call_seconds.
 *
 * Argument checks are local to the rank, like any argument check in MPI:
 * callers pass consistent sizes on all ranks, so all ranks refuse alike and
 * none is left waiting.
 */
#include "loom/comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm_impl.h"

/* ---- checks ------------------------------------------------------------------ */

loom_status loom_comm_check_count(const loom_comm *c, loom_comm_op op, const char *what, int index,
                                  size_t n) {
    if (n <= (size_t)INT_MAX) return LOOM_OK;
    char name[48];
    if (index >= 0) snprintf(name, sizeof name, "%s[%d]", what, index);
    else snprintf(name, sizeof name, "%s", what);
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s: %s=%zu does not fit MPI's int count (max %d)",
                     c->world_rank, loom_comm_op_name(op), c->name, name, n, INT_MAX);
}

static int is_reduction(loom_comm_op op) { return op == LOOM_OP_ALLREDUCE || op == LOOM_OP_REDUCE_SCATTER; }

/* k checked; *bytes what it counts (comm.h's convention). */
static loom_status check_call(const loom_comm *c, const loom_comm_call *k, size_t *bytes) {
    LOOM_TRY(loom_comm_check_count(c, k->op, "count", -1, k->count));
    const size_t n = (size_t)c->size;
    switch (k->op) {
    case LOOM_OP_ALLREDUCE: *bytes = k->count * loom_dtype_size(k->type); break;
    case LOOM_OP_REDUCE_SCATTER: *bytes = k->count * loom_dtype_size(k->type) * n; break;
    case LOOM_OP_ALLGATHER:
    case LOOM_OP_ALLTOALL: *bytes = k->count * n; break;
    case LOOM_OP_ALLTOALLV:
        *bytes = 0;
        for (int i = 0; i < c->size; i++) {
            LOOM_TRY(loom_comm_check_count(c, k->op, "send_bytes", i, k->send_bytes[i]));
            LOOM_TRY(loom_comm_check_count(c, k->op, "send_displ", i, k->send_displ[i]));
            LOOM_TRY(loom_comm_check_count(c, k->op, "recv_bytes", i, k->recv_bytes[i]));
            LOOM_TRY(loom_comm_check_count(c, k->op, "recv_displ", i, k->recv_displ[i]));
            *bytes += k->send_bytes[i];
        }
        break;
    default: *bytes = k->count; break; /* send, recv, bcast; barrier: 0 */
    }
    if (is_reduction(k->op) && k->type == LOOM_BF16 && k->redop != LOOM_SUM)
        return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s: bf16 reductions support only the sum",
                         c->world_rank, loom_comm_op_name(k->op), c->name);
    return LOOM_OK;
}

/* ---- running a call ------------------------------------------------------------ */

static void account(loom_comm *c, loom_comm_op op, size_t bytes, double seconds) {
    c->stats->calls[op]++;
    c->stats->bytes[op] += bytes;
    c->stats->seconds[op] += seconds;
    c->stats->call_seconds[op] += seconds;
}

static loom_status run_blocking(loom_comm *c, const loom_comm_call *k) {
    size_t bytes = 0;
    LOOM_TRY(check_call(c, k, &bytes));
    loom_watch_node n;
    loom_watch_add(&n, k->op, c->name, c->seq, 0);
    loom_status st = c->ops->run(c, k);
    loom_watch_remove(&n);
    if (st != LOOM_OK) return st;
    double t1 = loom_comm_wtime();
    account(c, k->op, bytes, t1 - n.t0);
    loom_comm_trace_record(k->op, c->name, bytes, n.t0, t1);
    return LOOM_OK;
}

static loom_req *req_take(loom_comm *c) {
    loom_req *r = c->spare;
    if (r) c->spare = r->next;
    else r = malloc(sizeof *r + c->req_size);
    return r;
}

static void req_release(loom_req *r) {
    r->next = r->c->spare;
    r->c->spare = r;
}

/* Start k on c as *out; count calls and bytes now, seconds at completion. */
static loom_status run_started(loom_comm *c, const loom_comm_call *k, loom_req **out) {
    *out = NULL;
    size_t bytes = 0;
    LOOM_TRY(check_call(c, k, &bytes));
    loom_req *r = req_take(c);
    if (!r)
        return loom_fail(LOOM_EOS, "rank %d: %s on group %s: out of memory for a request", c->world_rank,
                         loom_comm_op_name(k->op), c->name);
    *r = (loom_req){.c = c, .op = k->op, .bytes = bytes, .wire = -1};
    loom_watch_add(&r->node, k->op, c->name, c->seq, 1);
    r->t0 = r->node.t0;
    loom_status st = c->ops->start(c, k, r->impl);
    if (st != LOOM_OK) {
        loom_watch_remove(&r->node);
        req_release(r);
        return st;
    }
    account(c, k->op, bytes, 0.0);
    c->stats->call_seconds[k->op] += loom_comm_wtime() - r->t0;
    *out = r;
    return LOOM_OK;
}

/* Count the seconds of a finished request (and convert its wire buffer
 * back) or pass its failure on, then release it. */
static loom_status req_finish(loom_req *r, loom_status st, double t_call) {
    loom_comm *c = r->c;
    loom_comm_op op = r->op;
    loom_watch_remove(&r->node);
    c->stats->call_seconds[op] += loom_comm_wtime() - t_call;
    if (st == LOOM_OK) {
        double t1 = loom_comm_wtime();
        c->stats->seconds[op] += t1 - r->t0;
        loom_comm_trace_record(op, c->name, r->bytes, r->t0, t1);
    }
    if (r->wire >= 0) loom_comm_wire_finish(r, st == LOOM_OK);
    req_release(r);
    return st;
}

loom_status loom_comm_wait(loom_req *req) {
    if (!req) return LOOM_OK;
    double t = loom_comm_wtime();
    return req_finish(req, req->c->ops->wait(req->c, req->impl), t);
}

loom_status loom_comm_test(loom_req *req, int *done) {
    *done = 1;
    if (!req) return LOOM_OK;
    double t = loom_comm_wtime();
    loom_status st = req->c->ops->test(req->c, req->impl, done);
    if (!*done) {
        req->c->stats->call_seconds[req->op] += loom_comm_wtime() - t;
        return st;
    }
    return req_finish(req, st, t);
}

/* ---- the calls -------------------------------------------------------------------- */

static loom_comm_call reduce_call(loom_comm_op op, const void *send, void *recv, size_t count, loom_dtype t,
                                  loom_redop rop) {
    return (loom_comm_call){.op = op, .send = send, .recv = recv, .count = count, .type = t, .redop = rop};
}

static loom_comm_call byte_call(loom_comm_op op, const void *send, void *recv, size_t bytes) {
    return (loom_comm_call){.op = op, .send = send, .recv = recv, .count = bytes, .type = LOOM_U8};
}

loom_status loom_comm_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype t, loom_redop op) {
    loom_comm_call k = reduce_call(LOOM_OP_ALLREDUCE, buf, buf, count, t, op);
    return run_blocking(c, &k);
}

loom_status loom_comm_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t count_per_rank,
                                     loom_dtype t, loom_redop op) {
    loom_comm_call k = reduce_call(LOOM_OP_REDUCE_SCATTER, send, recv, count_per_rank, t, op);
    return run_blocking(c, &k);
}

loom_status loom_comm_allgather(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank) {
    loom_comm_call k = byte_call(LOOM_OP_ALLGATHER, send, recv, bytes_per_rank);
    return run_blocking(c, &k);
}

loom_status loom_comm_alltoall(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank) {
    loom_comm_call k = byte_call(LOOM_OP_ALLTOALL, send, recv, bytes_per_rank);
    return run_blocking(c, &k);
}

static loom_comm_call alltoallv_call(const void *send, const size_t *send_bytes, const size_t *send_displ,
                                     void *recv, const size_t *recv_bytes, const size_t *recv_displ) {
    loom_comm_call k = byte_call(LOOM_OP_ALLTOALLV, send, recv, 0);
    k.send_bytes = send_bytes, k.send_displ = send_displ;
    k.recv_bytes = recv_bytes, k.recv_displ = recv_displ;
    return k;
}

loom_status loom_comm_alltoallv(loom_comm *c, const void *send, const size_t *send_bytes,
                                const size_t *send_displ, void *recv, const size_t *recv_bytes,
                                const size_t *recv_displ) {
    loom_comm_call k = alltoallv_call(send, send_bytes, send_displ, recv, recv_bytes, recv_displ);
    return run_blocking(c, &k);
}

loom_status loom_comm_bcast(loom_comm *c, void *buf, size_t bytes, int root) {
    loom_comm_call k = byte_call(LOOM_OP_BCAST, NULL, buf, bytes);
    k.peer = root;
    return run_blocking(c, &k);
}

loom_status loom_comm_barrier(loom_comm *c) {
    loom_comm_call k = byte_call(LOOM_OP_BARRIER, NULL, NULL, 0);
    return run_blocking(c, &k);
}

loom_status loom_comm_send(loom_comm *c, const void *buf, size_t bytes, int peer, int tag) {
    loom_comm_call k = byte_call(LOOM_OP_SEND, buf, NULL, bytes);
    k.peer = peer, k.tag = tag;
    return run_blocking(c, &k);
}

loom_status loom_comm_recv(loom_comm *c, void *buf, size_t bytes, int peer, int tag) {
    loom_comm_call k = byte_call(LOOM_OP_RECV, NULL, buf, bytes);
    k.peer = peer, k.tag = tag;
    return run_blocking(c, &k);
}

loom_status loom_comm_iallreduce(loom_comm *c, void *buf, size_t count, loom_dtype t, loom_redop op,
                                 loom_req **req) {
    loom_comm_call k = reduce_call(LOOM_OP_ALLREDUCE, buf, buf, count, t, op);
    return run_started(c, &k, req);
}

loom_status loom_comm_ireduce_scatter(loom_comm *c, const void *send, void *recv, size_t count_per_rank,
                                      loom_dtype t, loom_redop op, loom_req **req) {
    loom_comm_call k = reduce_call(LOOM_OP_REDUCE_SCATTER, send, recv, count_per_rank, t, op);
    return run_started(c, &k, req);
}

loom_status loom_comm_iallgather(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                                 loom_req **req) {
    loom_comm_call k = byte_call(LOOM_OP_ALLGATHER, send, recv, bytes_per_rank);
    return run_started(c, &k, req);
}

loom_status loom_comm_isend(loom_comm *c, const void *buf, size_t bytes, int peer, int tag, loom_req **req) {
    loom_comm_call k = byte_call(LOOM_OP_SEND, buf, NULL, bytes);
    k.peer = peer, k.tag = tag;
    return run_started(c, &k, req);
}

loom_status loom_comm_irecv(loom_comm *c, void *buf, size_t bytes, int peer, int tag, loom_req **req) {
    loom_comm_call k = byte_call(LOOM_OP_RECV, NULL, buf, bytes);
    k.peer = peer, k.tag = tag;
    return run_started(c, &k, req);
}

loom_status loom_comm_ialltoallv(loom_comm *c, const void *send, const size_t *send_bytes,
                                 const size_t *send_displ, void *recv, const size_t *recv_bytes,
                                 const size_t *recv_displ, loom_req **req) {
    loom_comm_call k = alltoallv_call(send, send_bytes, send_displ, recv, recv_bytes, recv_displ);
    return run_started(c, &k, req);
}
