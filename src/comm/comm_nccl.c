/* comm_nccl.c - the NCCL implementation of the communicator (comm.h:
 * loom_comm_wrap_nccl), on device buffers; the only file in loom that
 * includes nccl.h. Built into the CUDA backend's library (loom_cuda) only.
 * Not tied to a mesh axis; collective as the op.
 *
 * Set-up goes through the MPI group underneath (its calls count in this
 * group's stats): the device UUIDs are gathered (two ranks on one GPU are
 * refused before NCCL would fail obscurely), rank 0 makes the unique id and
 * broadcasts it, every rank joins with ncclCommInitRank. Each op is then
 * enqueued on the group's stream and followed by an event: a blocking call
 * waits for the event, a started one keeps it in its request for wait / test.
 * Statistics, trace and the watchdog are the entry points' (comm_call.c): a
 * call's seconds are host wall time, start to completed wait. Waiting polls
 * the event and NCCL's asynchronous error at most LOOM_COMM_TIMEOUT seconds
 * (0: forever), then aborts the NCCL communicator and names the op.
 *
 * Grouping: ops started between loom_comm_nccl_group_start and _end are
 * launched together by ncclGroupEnd (how a send and a receive that must
 * progress together are paired); their events are recorded there, and
 * blocking calls inside a group are refused. LOOM_BF16 sums use ncclBfloat16
 * (every partial sum stored as bf16, so rounded; NCCL's order of summation,
 * not MPI's). A barrier is the MPI group's.
 */
#include "loom/comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

#define NCCL_GROUP_MAX 256 /* started ops inside one group call */

typedef struct nccl_group {
    ncclComm_t nc; /* NULL once aborted */
    cudaStream_t stream;
    cudaEvent_t *ev; /* free events */
    int n_ev, cap_ev;
} nccl_group;

typedef struct nccl_req {
    cudaEvent_t ev;
    cudaStream_t stream;
    loom_comm_op op;
    int grouped; /* its event is recorded at group end */
} nccl_req;

/* Started ops waiting for ncclGroupEnd (this thread). */
static _Thread_local int g_group_depth;
static _Thread_local nccl_req *g_grouped[NCCL_GROUP_MAX];
static _Thread_local int g_ngrouped;

static const loom_comm_ops nccl_ops;

static loom_status fail_nccl(const loom_comm *c, const char *op, ncclResult_t r) {
    const nccl_group *g = c->impl;
    const char *last = ncclGetLastError(g ? g->nc : NULL);
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s failed: %s%s%s", c->world_rank, op, c->name,
                     ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

static loom_status fail_cuda(const loom_comm *c, const char *op, cudaError_t e) {
    cudaGetLastError();
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s failed: %s", c->world_rank, op, c->name,
                     cudaGetErrorString(e));
}

static int nccl_type(loom_dtype t, ncclDataType_t *out) {
    switch (t) {
    case LOOM_F32: *out = ncclFloat32; return 1;
    case LOOM_F64: *out = ncclFloat64; return 1;
    case LOOM_I32: *out = ncclInt32; return 1;
    case LOOM_I64: *out = ncclInt64; return 1;
    case LOOM_U8: *out = ncclUint8; return 1;
    case LOOM_BF16: *out = ncclBfloat16; return 1;
    }
    return 0;
}

static ncclRedOp_t nccl_op(loom_redop op) {
    switch (op) {
    case LOOM_SUM: return ncclSum;
    case LOOM_MAX: return ncclMax;
    case LOOM_MIN: return ncclMin;
    }
    return ncclSum;
}

/* ---- events ---------------------------------------------------------------------- */

static loom_status event_take(loom_comm *c, loom_comm_op op, cudaEvent_t *e) {
    nccl_group *g = c->impl;
    if (g->n_ev > 0) {
        *e = g->ev[--g->n_ev];
        return LOOM_OK;
    }
    cudaError_t err = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
    return err == cudaSuccess ? LOOM_OK : fail_cuda(c, loom_comm_op_name(op), err);
}

static void event_give(loom_comm *c, cudaEvent_t e) {
    nccl_group *g = c->impl;
    if (g->n_ev == g->cap_ev) {
        int cap = g->cap_ev ? 2 * g->cap_ev : 8;
        cudaEvent_t *p = realloc(g->ev, (size_t)cap * sizeof *p);
        if (!p) {
            cudaEventDestroy(e);
            return;
        }
        g->ev = p;
        g->cap_ev = cap;
    }
    g->ev[g->n_ev++] = e;
}

/* Wait for e (the op `op` and what came before it on the stream), polling
 * NCCL's asynchronous error; after LOOM_COMM_TIMEOUT seconds the NCCL
 * communicator is aborted. */
static loom_status await(loom_comm *c, cudaEvent_t e, loom_comm_op op) {
    nccl_group *g = c->impl;
    double t0 = loom_comm_wtime(), limit = loom_comm_timeout();
    struct timespec nap = {0, 100000}; /* 0.1 ms between polls */
    for (;;) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess) return LOOM_OK;
        if (q != cudaErrorNotReady) return fail_cuda(c, loom_comm_op_name(op), q);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(g->nc, &async);
        if (async != ncclSuccess && async != ncclInProgress)
            return fail_nccl(c, loom_comm_op_name(op), async);
        if (limit > 0 && loom_comm_wtime() - t0 > limit) {
            ncclCommAbort(g->nc);
            g->nc = NULL;
            return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s has not completed after %.0f s",
                             c->world_rank, loom_comm_op_name(op), c->name, limit);
        }
        nanosleep(&nap, NULL);
    }
}

/* ---- enqueueing one op ------------------------------------------------------------ */

/* One alltoall(v): every peer's send and receive in one NCCL group. */
static ncclResult_t exchange(loom_comm *c, const loom_comm_call *k) {
    nccl_group *g = c->impl;
    const size_t u = k->count; /* alltoall: bytes per rank */
    const char *send = k->send;
    char *recv = k->recv;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < c->size; p++) {
        const int v = k->op == LOOM_OP_ALLTOALLV;
        size_t sb = v ? k->send_bytes[p] : u, rb = v ? k->recv_bytes[p] : u;
        size_t so = v ? k->send_displ[p] : (size_t)p * u, ro = v ? k->recv_displ[p] : (size_t)p * u;
        if (sb) r = ncclSend(send + so, sb, ncclUint8, p, g->nc, g->stream);
        if (r == ncclSuccess && rb) r = ncclRecv(recv + ro, rb, ncclUint8, p, g->nc, g->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

/* reduce_scatter: NCCL's in-place form has recv at send + rank * count;
 * comm.h wants the result at the start, so it is reduced into its slice and
 * moved to the front after (on the same stream). */
static loom_status reduce_scatter(loom_comm *c, const loom_comm_call *k, ncclDataType_t dt) {
    nccl_group *g = c->impl;
    const size_t esz = loom_dtype_size(k->type);
    void *dst = k->send == k->recv ? (char *)k->recv + (size_t)c->rank * k->count * esz : k->recv;
    if (dst != k->recv && g_group_depth > 0) /* the move would run before the grouped op */
        return loom_fail(LOOM_EUSAGE, "rank %d: in-place reduce_scatter on group %s inside a group call",
                         c->world_rank, c->name);
    ncclResult_t r = ncclReduceScatter(k->send, dst, k->count, dt, nccl_op(k->redop), g->nc, g->stream);
    if (r != ncclSuccess) return fail_nccl(c, "reduce_scatter", r);
    if (dst != k->recv && c->rank != 0) {
        cudaError_t e = cudaMemcpyAsync(k->recv, dst, k->count * esz, cudaMemcpyDeviceToDevice, g->stream);
        if (e != cudaSuccess) return fail_cuda(c, "reduce_scatter", e);
    }
    return LOOM_OK;
}

static loom_status enqueue(loom_comm *c, const loom_comm_call *k) {
    nccl_group *g = c->impl;
    const char *name = loom_comm_op_name(k->op);
    if (!g->nc)
        return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s: the NCCL communicator was aborted",
                         c->world_rank, name, c->name);
    ncclDataType_t dt = ncclUint8;
    if (!nccl_type(k->type, &dt))
        return loom_fail(LOOM_EINTERNAL, "rank %d: %s on group %s: unknown dtype %d", c->world_rank, name,
                         c->name, (int)k->type);
    ncclResult_t r = ncclSuccess;
    switch (k->op) {
    case LOOM_OP_ALLREDUCE:
        r = ncclAllReduce(k->recv, k->recv, k->count, dt, nccl_op(k->redop), g->nc, g->stream);
        break;
    case LOOM_OP_REDUCE_SCATTER: return reduce_scatter(c, k, dt);
    case LOOM_OP_ALLGATHER: r = ncclAllGather(k->send, k->recv, k->count, ncclUint8, g->nc, g->stream); break;
    case LOOM_OP_ALLTOALL: {
        const char *a = k->send, *b = k->recv;
        size_t total = k->count * (size_t)c->size;
        if (total && a < b + total && b < a + total)
            return loom_fail(LOOM_EUSAGE, "rank %d: alltoall on group %s: send and recv overlap",
                             c->world_rank, c->name);
        r = exchange(c, k);
        break;
    }
    case LOOM_OP_ALLTOALLV: r = exchange(c, k); break;
    case LOOM_OP_BCAST:
        r = ncclBroadcast(k->recv, k->recv, k->count, ncclUint8, k->peer, g->nc, g->stream);
        break;
    case LOOM_OP_SEND: r = ncclSend(k->send, k->count, ncclUint8, k->peer, g->nc, g->stream); break;
    case LOOM_OP_RECV: r = ncclRecv(k->recv, k->count, ncclUint8, k->peer, g->nc, g->stream); break;
    default:
        return loom_fail(LOOM_EINTERNAL, "rank %d: %s on group %s: not an NCCL op", c->world_rank, name,
                         c->name);
    }
    return r == ncclSuccess ? LOOM_OK : fail_nccl(c, name, r);
}

/* ---- the table ------------------------------------------------------------------------ */

static loom_status nccl_run(loom_comm *c, const loom_comm_call *k) {
    nccl_group *g = c->impl;
    if (k->op == LOOM_OP_BARRIER) return c->host->ops->run(c->host, k);
    if (g_group_depth > 0)
        return loom_fail(LOOM_EUSAGE, "rank %d: blocking %s on group %s inside an NCCL group call",
                         c->world_rank, loom_comm_op_name(k->op), c->name);
    cudaEvent_t e = NULL;
    LOOM_TRY(event_take(c, k->op, &e));
    loom_status st = enqueue(c, k);
    if (st == LOOM_OK) {
        cudaError_t err = cudaEventRecord(e, g->stream);
        st = err == cudaSuccess ? await(c, e, k->op) : fail_cuda(c, loom_comm_op_name(k->op), err);
    }
    event_give(c, e);
    return st;
}

static loom_status nccl_start(loom_comm *c, const loom_comm_call *k, void *req) {
    nccl_group *g = c->impl;
    nccl_req *r = req;
    *r = (nccl_req){.stream = g->stream, .op = k->op};
    if (g_group_depth > 0 && g_ngrouped == NCCL_GROUP_MAX)
        return loom_fail(LOOM_EUSAGE, "rank %d: more than %d ops in one NCCL group call (group %s)",
                         c->world_rank, NCCL_GROUP_MAX, c->name);
    LOOM_TRY(event_take(c, k->op, &r->ev));
    loom_status st = enqueue(c, k);
    if (st == LOOM_OK && g_group_depth > 0) {
        r->grouped = 1;
        g_grouped[g_ngrouped++] = r;
    } else if (st == LOOM_OK) {
        cudaError_t err = cudaEventRecord(r->ev, g->stream);
        if (err != cudaSuccess) st = fail_cuda(c, loom_comm_op_name(k->op), err);
    }
    if (st != LOOM_OK) event_give(c, r->ev);
    return st;
}

static loom_status nccl_wait(loom_comm *c, void *req) {
    nccl_req *r = req;
    loom_status st = r->grouped ? loom_fail(LOOM_EUSAGE,
                                            "rank %d: wait for %s on group %s inside an "
                                            "unfinished NCCL group call",
                                            c->world_rank, loom_comm_op_name(r->op), c->name)
                                : await(c, r->ev, r->op);
    if (!r->grouped) event_give(c, r->ev);
    return st;
}

static loom_status nccl_test(loom_comm *c, void *req, int *done) {
    nccl_group *g = c->impl;
    nccl_req *r = req;
    *done = 0;
    if (r->grouped) return LOOM_OK;
    cudaError_t q = cudaEventQuery(r->ev);
    if (q == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        if (g->nc) ncclCommGetAsyncError(g->nc, &async);
        if (async == ncclSuccess || async == ncclInProgress) return LOOM_OK;
        *done = 1;
        event_give(c, r->ev);
        return fail_nccl(c, loom_comm_op_name(r->op), async);
    }
    *done = 1;
    event_give(c, r->ev);
    return q == cudaSuccess ? LOOM_OK : fail_cuda(c, loom_comm_op_name(r->op), q);
}

static loom_status nccl_split(loom_comm *parent, int color, int key, const char *name, loom_comm **out) {
    nccl_group *g = parent->impl;
    loom_comm *h = NULL;
    LOOM_TRY(loom_comm_split(parent->host, color, key, name, &h));
    if (!h) return LOOM_OK;
    loom_status st = loom_comm_wrap_nccl(h, &parent->mem, g->stream, out);
    if (st != LOOM_OK) loom_comm_free(h);
    return st;
}

static void nccl_free(loom_comm *c) {
    nccl_group *g = c->impl;
    if (!g) return;
    if (g->nc) ncclCommDestroy(g->nc);
    for (int i = 0; i < g->n_ev; i++) cudaEventDestroy(g->ev[i]);
    free(g->ev);
    free(g);
    c->impl = NULL;
}

static const loom_comm_ops nccl_ops = {
    .name = "nccl",
    .run = nccl_run,
    .start = nccl_start,
    .wait = nccl_wait,
    .test = nccl_test,
    .split = nccl_split,
    .reserve = NULL, /* NCCL reads the device buffers themselves */
    .free = nccl_free,
};

loom_status loom_comm_nccl_group_start(void) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return loom_fail(LOOM_EUNAVAIL, "ncclGroupStart failed: %s", ncclGetErrorString(r));
    g_group_depth++;
    return LOOM_OK;
}

loom_status loom_comm_nccl_group_end(void) {
    ncclResult_t r = ncclGroupEnd();
    if (g_group_depth > 0) g_group_depth--;
    loom_status st = LOOM_OK;
    if (g_group_depth == 0) {
        for (int i = 0; i < g_ngrouped; i++) {
            cudaError_t e = cudaEventRecord(g_grouped[i]->ev, g_grouped[i]->stream);
            g_grouped[i]->grouped = 0;
            if (e != cudaSuccess && st == LOOM_OK)
                st = loom_fail(LOOM_EUNAVAIL, "NCCL group end: event record failed: %s",
                               cudaGetErrorString(e));
        }
        g_ngrouped = 0;
    }
    if (r != ncclSuccess) return loom_fail(LOOM_EUNAVAIL, "ncclGroupEnd failed: %s", ncclGetErrorString(r));
    return st;
}

/* ---- set-up ---------------------------------------------------------------------------- */

/* Refuse two ranks of the group on one device (NCCL cannot run them). */
static loom_status check_devices(loom_comm *host) {
    const int me = host->rank, size = host->size;
    int dev = -1;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    loom_status local = e == cudaSuccess
                            ? LOOM_OK
                            : loom_fail(LOOM_EUNAVAIL, "rank %d: no usable CUDA device for group %s: %s",
                                        host->world_rank, host->name, cudaGetErrorString(e));
    LOOM_TRY(loom_comm_agree(host, local));
    unsigned char *ids = malloc((size_t)size * 16);
    local = ids ? LOOM_OK
                : loom_fail(LOOM_EOS, "rank %d: out of memory for %d device ids", host->world_rank, size);
    LOOM_TRY(loom_comm_agree(host, local));
    memcpy(ids + (size_t)me * 16, prop.uuid.bytes, 16);
    loom_status st = loom_comm_allgather(host, ids + (size_t)me * 16, ids, 16);
    for (int a = 0; st == LOOM_OK && a < size; a++)
        for (int b = a + 1; b < size; b++)
            if (!memcmp(ids + (size_t)a * 16, ids + (size_t)b * 16, 16)) {
                st = loom_fail(LOOM_EUSAGE,
                               "rank %d: ranks %d and %d of group %s share one GPU; NCCL cannot run two "
                               "ranks on one device (use the MPI communicator with host staging)",
                               host->world_rank, a, b, host->name);
                break;
            }
    free(ids);
    return st;
}

/* The NCCL communicator of g over host's ranks (collective over host). */
static loom_status join(loom_comm *host, nccl_group *g) {
    LOOM_TRY(check_devices(host));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    loom_status local = LOOM_OK;
    if (host->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            local = loom_fail(LOOM_EUNAVAIL, "rank %d: NCCL unique id for group %s failed: %s",
                              host->world_rank, host->name, ncclGetErrorString(r));
    }
    LOOM_TRY(loom_comm_agree(host, local));
    LOOM_TRY(loom_comm_bcast(host, &id, sizeof id, 0));
    ncclResult_t r = ncclCommInitRank(&g->nc, host->size, id, host->rank);
    if (r != ncclSuccess) {
        g->nc = NULL;
        local = loom_fail(LOOM_EUNAVAIL, "rank %d: ncclCommInitRank on group %s failed: %s", host->world_rank,
                          host->name, ncclGetErrorString(r));
    }
    loom_status st = loom_comm_agree(host, local);
    if (st != LOOM_OK && g->nc) { /* another rank failed: leave without a collective destroy */
        ncclCommAbort(g->nc);
        g->nc = NULL;
    }
    return st;
}

loom_status loom_comm_wrap_nccl(loom_comm *host_group, const loom_comm_mem *mem, void *stream,
                                loom_comm **out) {
    *out = NULL;
    if (host_group->host) /* only an MPI group has none */
        return loom_fail(LOOM_EUSAGE, "rank %d: group %s: NCCL needs an MPI group underneath, not a %s one",
                         host_group->world_rank, host_group->name, host_group->ops->name);
    nccl_group *g = calloc(1, sizeof *g);
    if (!g)
        return loom_fail(LOOM_EOS, "rank %d: out of memory for the NCCL communicator",
                         host_group->world_rank);
    g->stream = (cudaStream_t)stream;
    loom_comm *c = NULL;
    LOOM_TRY(loom_comm_create(&nccl_ops, g, sizeof(nccl_req), mem, host_group->rank, host_group->size,
                              host_group->world_rank, host_group->name, &c));
    loom_comm_adopt_host(c, host_group); /* the set-up's calls count in c's stats */
    loom_status st = join(host_group, g);
    if (st != LOOM_OK) {
        loom_comm_release_host(c);
        loom_comm_free(c);
        return st;
    }
    *out = c;
    return LOOM_OK;
}
