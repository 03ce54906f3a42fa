/* comm_nccl.c - the NCCL communicator of one mesh group (comm_nccl.h).
 *
 * Set-up goes through the group's loom_comm: the device UUIDs are gathered
 * (two ranks on one GPU are refused before NCCL would fail obscurely), rank 0
 * makes the unique id and broadcasts it, every rank joins with
 * ncclCommInitRank. Each op then goes on the caller's stream between two
 * CUDA events; the events of ops in flight wait in a small ring until
 * loom_nccl_sync or loom_nccl_get_stats finds them complete and adds the time
 * between them to the op's seconds. Ops inside loom_nccl_group_start/_end are
 * only launched by ncclGroupEnd, so their closing events are recorded there.
 */
#include "comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Ops whose events are still pending; the oldest is waited for when full. */
#define NCCL_RING 64

typedef struct {
    cudaEvent_t e0, e1;
    loom_comm_op op;
    cudaStream_t stream; /* for a grouped op whose e1 is recorded at group end */
    int e1_pending;
} nccl_slot;

struct loom_nccl {
    ncclComm_t nc;
    int rank, size;
    char name[64];
    loom_comm_stats stats;
    nccl_slot ring[NCCL_RING];
    int head, count;
};

/* Grouped ops waiting for ncclGroupEnd (this thread). */
static _Thread_local int g_group_depth;
static _Thread_local nccl_slot *g_grouped[NCCL_RING];
static _Thread_local int g_ngrouped;

static loom_status fail_nccl(const loom_nccl *n, const char *op, ncclResult_t r) {
    const char *last = ncclGetLastError(n ? n->nc : NULL);
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s failed: %s%s%s", n ? n->rank : -1, op,
                     n ? n->name : "?", ncclGetErrorString(r), last && *last ? ": " : "",
                     last ? last : "");
}

static loom_status fail_cuda(const loom_nccl *n, const char *op, cudaError_t e) {
    cudaGetLastError();
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s failed: %s", n->rank, op, n->name,
                     cudaGetErrorString(e));
}

static int nccl_type(loom_dtype t, ncclDataType_t *out) {
    switch (t) {
    case LOOM_F32: *out = ncclFloat32; return 1;
    case LOOM_F64: *out = ncclFloat64; return 1;
    case LOOM_I32: *out = ncclInt32; return 1;
    case LOOM_I64: *out = ncclInt64; return 1;
    case LOOM_U8: *out = ncclUint8; return 1;
    case LOOM_BF16: return 0; /* bf16 reductions run on host memory (comm_mpi.c) only */
    }
    return 0;
}

static int nccl_op(loom_redop op, ncclRedOp_t *out) {
    switch (op) {
    case LOOM_SUM: *out = ncclSum; return 1;
    case LOOM_MAX: *out = ncclMax; return 1;
    case LOOM_MIN: *out = ncclMin; return 1;
    }
    return 0;
}

/* ---- set-up ---------------------------------------------------------------- */

/* Refuse two ranks of the group on one device (NCCL cannot run them). */
static loom_status check_devices(loom_comm *group, int me, int size) {
    int dev = -1;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    loom_status local = e == cudaSuccess ? LOOM_OK
                                         : loom_fail(LOOM_EUNAVAIL, "rank %d: no usable CUDA device for group %s: %s",
                                                     me, loom_comm_name(group), cudaGetErrorString(e));
    LOOM_TRY(loom_comm_agree(group, local));
    unsigned char *ids = malloc((size_t)size * 16);
    if (!ids) return loom_fail(LOOM_EOS, "rank %d: out of memory for %d device ids", me, size);
    memcpy(ids + (size_t)me * 16, prop.uuid.bytes, 16);
    loom_status st = loom_comm_allgather(group, ids + (size_t)me * 16, ids, 16);
    for (int a = 0; st == LOOM_OK && a < size; a++)
        for (int b = a + 1; b < size; b++)
            if (!memcmp(ids + (size_t)a * 16, ids + (size_t)b * 16, 16)) {
                st = loom_fail(LOOM_EUSAGE,
                               "rank %d: ranks %d and %d of group %s share one GPU; NCCL cannot run two "
                               "ranks on one device (use the MPI communicator with host staging)",
                               me, a, b, loom_comm_name(group));
                break;
            }
    free(ids);
    return st;
}

loom_status loom_nccl_create(loom_comm *group, loom_nccl **out) {
    *out = NULL;
    int me = loom_comm_rank(group), size = loom_comm_size(group);
    LOOM_TRY(check_devices(group, me, size));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    loom_status local = LOOM_OK;
    if (me == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            local = loom_fail(LOOM_EUNAVAIL, "rank 0: NCCL unique id for group %s failed: %s",
                              loom_comm_name(group), ncclGetErrorString(r));
    }
    LOOM_TRY(loom_comm_agree(group, local));
    LOOM_TRY(loom_comm_bcast(group, &id, sizeof id, 0));
    loom_nccl *n = calloc(1, sizeof *n);
    if (!n) local = loom_fail(LOOM_EOS, "rank %d: out of memory for the NCCL communicator", me);
    if (n) {
        n->rank = me;
        n->size = size;
        snprintf(n->name, sizeof n->name, "%s", loom_comm_name(group));
        ncclResult_t r = ncclCommInitRank(&n->nc, size, id, me);
        if (r != ncclSuccess) {
            local = fail_nccl(n, "ncclCommInitRank", r);
            free(n);
            n = NULL;
        }
    }
    loom_status st = loom_comm_agree(group, local);
    if (st != LOOM_OK) { /* another rank failed: leave without a collective destroy */
        if (n) ncclCommAbort(n->nc);
        free(n);
        return st;
    }
    *out = n;
    return LOOM_OK;
}

void loom_nccl_free(loom_nccl *n) {
    if (!n) return;
    loom_nccl_sync(n);
    for (int i = 0; i < NCCL_RING; i++) {
        if (n->ring[i].e0) cudaEventDestroy(n->ring[i].e0);
        if (n->ring[i].e1) cudaEventDestroy(n->ring[i].e1);
    }
    if (n->nc) ncclCommDestroy(n->nc);
    free(n);
}

int loom_nccl_rank(const loom_nccl *n) { return n->rank; }
int loom_nccl_size(const loom_nccl *n) { return n->size; }

/* ---- timing ring ------------------------------------------------------------- */

static double now_s(void) { return loom_comm_wtime(); }

/* Fold completed ops at the head of the ring into the stats; with `wait`,
 * wait for the oldest first. */
static loom_status fold(loom_nccl *n, int wait) {
    while (n->count > 0) {
        nccl_slot *s = &n->ring[n->head];
        if (s->e1_pending) break; /* its group has not ended yet */
        cudaError_t e = wait ? cudaEventSynchronize(s->e1) : cudaEventQuery(s->e1);
        if (e == cudaErrorNotReady) break;
        if (e != cudaSuccess) return fail_cuda(n, loom_comm_op_name(s->op), e);
        float ms = 0.0f;
        e = cudaEventElapsedTime(&ms, s->e0, s->e1);
        if (e != cudaSuccess) return fail_cuda(n, loom_comm_op_name(s->op), e);
        n->stats.seconds[s->op] += 1e-3 * ms;
        n->head = (n->head + 1) % NCCL_RING;
        n->count--;
        wait = 0;
    }
    return LOOM_OK;
}

/* A ring slot for a new op, its opening event recorded on `st`. */
static loom_status open_slot(loom_nccl *n, loom_comm_op op, cudaStream_t st, nccl_slot **out) {
    if (n->count == NCCL_RING) LOOM_TRY(fold(n, 1));
    if (n->count == NCCL_RING)
        return loom_fail(LOOM_EUSAGE, "rank %d: more than %d NCCL ops of group %s in one group call",
                         n->rank, NCCL_RING, n->name);
    nccl_slot *s = &n->ring[(n->head + n->count) % NCCL_RING];
    cudaError_t e = cudaSuccess;
    if (!s->e0) e = cudaEventCreate(&s->e0);
    if (e == cudaSuccess && !s->e1) e = cudaEventCreate(&s->e1);
    if (e == cudaSuccess) e = cudaEventRecord(s->e0, st);
    if (e != cudaSuccess) return fail_cuda(n, loom_comm_op_name(op), e);
    s->op = op;
    s->stream = st;
    s->e1_pending = 0;
    *out = s;
    return LOOM_OK;
}

/* After the NCCL call: count it, close its slot (or leave that to group end). */
static loom_status close_slot(loom_nccl *n, nccl_slot *s, uint64_t bytes, ncclResult_t r, double t0) {
    if (r != ncclSuccess) {
        n->stats.call_seconds[s->op] += now_s() - t0;
        return fail_nccl(n, loom_comm_op_name(s->op), r);
    }
    n->count++;
    n->stats.calls[s->op]++;
    n->stats.bytes[s->op] += bytes;
    if (g_group_depth > 0 && g_ngrouped < NCCL_RING) {
        s->e1_pending = 1;
        g_grouped[g_ngrouped++] = s;
    } else {
        cudaError_t e = cudaEventRecord(s->e1, s->stream);
        if (e != cudaSuccess) return fail_cuda(n, loom_comm_op_name(s->op), e);
    }
    n->stats.call_seconds[s->op] += now_s() - t0;
    return fold(n, 0);
}

loom_status loom_nccl_group_start(void) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return loom_fail(LOOM_EUNAVAIL, "ncclGroupStart failed: %s", ncclGetErrorString(r));
    g_group_depth++;
    return LOOM_OK;
}

loom_status loom_nccl_group_end(void) {
    ncclResult_t r = ncclGroupEnd();
    if (g_group_depth > 0) g_group_depth--;
    loom_status st = LOOM_OK;
    if (g_group_depth == 0) {
        for (int i = 0; i < g_ngrouped; i++) {
            cudaError_t e = cudaEventRecord(g_grouped[i]->e1, g_grouped[i]->stream);
            g_grouped[i]->e1_pending = 0;
            if (e != cudaSuccess && st == LOOM_OK)
                st = loom_fail(LOOM_EUNAVAIL, "NCCL group end: event record failed: %s", cudaGetErrorString(e));
        }
        g_ngrouped = 0;
    }
    if (r != ncclSuccess) return loom_fail(LOOM_EUNAVAIL, "ncclGroupEnd failed: %s", ncclGetErrorString(r));
    return st;
}

/* ---- operations --------------------------------------------------------------- */

static loom_status typed(const loom_nccl *n, const char *op, loom_dtype t, loom_redop ro, ncclDataType_t *dt,
                         ncclRedOp_t *rop) {
    if (!nccl_type(t, dt) || (rop && !nccl_op(ro, rop)))
        return loom_fail(LOOM_EINTERNAL, "rank %d: %s on group %s: unknown dtype %d or op %d", n->rank, op,
                         n->name, (int)t, (int)ro);
    return LOOM_OK;
}

loom_status loom_nccl_allreduce(loom_nccl *n, void *buf, size_t count, loom_dtype t, loom_redop op,
                                loom_cuda_stream s) {
    double t0 = now_s();
    ncclDataType_t dt = ncclFloat32;
    ncclRedOp_t rop = ncclSum;
    nccl_slot *sl = NULL;
    LOOM_TRY(typed(n, "allreduce", t, op, &dt, &rop));
    LOOM_TRY(open_slot(n, LOOM_OP_ALLREDUCE, (cudaStream_t)s, &sl));
    ncclResult_t r = ncclAllReduce(buf, buf, count, dt, rop, n->nc, (cudaStream_t)s);
    return close_slot(n, sl, (uint64_t)count * loom_dtype_size(t), r, t0);
}

loom_status loom_nccl_reduce_scatter(loom_nccl *n, const void *send, void *recv, size_t count_per_rank,
                                     loom_dtype t, loom_redop op, loom_cuda_stream s) {
    double t0 = now_s();
    ncclDataType_t dt = ncclFloat32;
    ncclRedOp_t rop = ncclSum;
    nccl_slot *sl = NULL;
    LOOM_TRY(typed(n, "reduce_scatter", t, op, &dt, &rop));
    if (send == recv && g_group_depth > 0) /* the move below would run before the grouped op */
        return loom_fail(LOOM_EUSAGE, "rank %d: in-place reduce_scatter on group %s inside a group call",
                         n->rank, n->name);
    LOOM_TRY(open_slot(n, LOOM_OP_REDUCE_SCATTER, (cudaStream_t)s, &sl));
    /* in place (send == recv): NCCL's in-place form has recv at send + rank * count;
     * comm.h wants the result at the start, so it is reduced into its slice
     * and moved to the front after (on the same stream). */
    size_t esz = loom_dtype_size(t);
    void *dst = send == recv ? (char *)recv + (size_t)n->rank * count_per_rank * esz : recv;
    ncclResult_t r = ncclReduceScatter(send, dst, count_per_rank, dt, rop, n->nc, (cudaStream_t)s);
    if (r == ncclSuccess && dst != recv && n->rank != 0) {
        cudaError_t e = cudaMemcpyAsync(recv, dst, count_per_rank * esz, cudaMemcpyDeviceToDevice, (cudaStream_t)s);
        if (e != cudaSuccess) return fail_cuda(n, "reduce_scatter", e);
    }
    return close_slot(n, sl, (uint64_t)count_per_rank * esz * (uint64_t)n->size, r, t0);
}

loom_status loom_nccl_allgather(loom_nccl *n, const void *send, void *recv, size_t bytes_per_rank,
                                loom_cuda_stream s) {
    double t0 = now_s();
    nccl_slot *sl = NULL;
    LOOM_TRY(open_slot(n, LOOM_OP_ALLGATHER, (cudaStream_t)s, &sl));
    ncclResult_t r = ncclAllGather(send, recv, bytes_per_rank, ncclUint8, n->nc, (cudaStream_t)s);
    return close_slot(n, sl, (uint64_t)bytes_per_rank * (uint64_t)n->size, r, t0);
}

/* One alltoall(v): every peer's send and receive in one NCCL group. */
static ncclResult_t exchange(loom_nccl *n, const char *send, const size_t *sb, const size_t *sd, char *recv,
                             const size_t *rb, const size_t *rd, size_t uniform, cudaStream_t st) {
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < n->size; p++) {
        size_t sbytes = sb ? sb[p] : uniform, rbytes = rb ? rb[p] : uniform;
        size_t soff = sd ? sd[p] : (size_t)p * uniform, roff = rd ? rd[p] : (size_t)p * uniform;
        if (sbytes) r = ncclSend(send + soff, sbytes, ncclUint8, p, n->nc, st);
        if (r == ncclSuccess && rbytes) r = ncclRecv(recv + roff, rbytes, ncclUint8, p, n->nc, st);
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

loom_status loom_nccl_alltoall(loom_nccl *n, const void *send, void *recv, size_t bytes_per_rank,
                               loom_cuda_stream s) {
    double t0 = now_s();
    nccl_slot *sl = NULL;
    size_t total = bytes_per_rank * (size_t)n->size;
    const char *a = send, *b = recv;
    if (total && a < b + total && b < a + total)
        return loom_fail(LOOM_EUSAGE, "rank %d: alltoall on group %s: send and recv overlap", n->rank, n->name);
    LOOM_TRY(open_slot(n, LOOM_OP_ALLTOALL, (cudaStream_t)s, &sl));
    ncclResult_t r = exchange(n, send, NULL, NULL, recv, NULL, NULL, bytes_per_rank, (cudaStream_t)s);
    return close_slot(n, sl, total, r, t0);
}

loom_status loom_nccl_alltoallv(loom_nccl *n, const void *send, const size_t *send_bytes, const size_t *send_displ,
                                void *recv, const size_t *recv_bytes, const size_t *recv_displ, loom_cuda_stream s) {
    double t0 = now_s();
    nccl_slot *sl = NULL;
    uint64_t sent = 0;
    for (int p = 0; p < n->size; p++) sent += send_bytes[p];
    LOOM_TRY(open_slot(n, LOOM_OP_ALLTOALLV, (cudaStream_t)s, &sl));
    ncclResult_t r = exchange(n, send, send_bytes, send_displ, recv, recv_bytes, recv_displ, 0, (cudaStream_t)s);
    return close_slot(n, sl, sent, r, t0);
}

loom_status loom_nccl_bcast(loom_nccl *n, void *buf, size_t bytes, int root, loom_cuda_stream s) {
    double t0 = now_s();
    nccl_slot *sl = NULL;
    LOOM_TRY(open_slot(n, LOOM_OP_BCAST, (cudaStream_t)s, &sl));
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->nc, (cudaStream_t)s);
    return close_slot(n, sl, bytes, r, t0);
}

loom_status loom_nccl_send(loom_nccl *n, const void *buf, size_t bytes, int peer, loom_cuda_stream s) {
    double t0 = now_s();
    nccl_slot *sl = NULL;
    LOOM_TRY(open_slot(n, LOOM_OP_SEND, (cudaStream_t)s, &sl));
    ncclResult_t r = ncclSend(buf, bytes, ncclUint8, peer, n->nc, (cudaStream_t)s);
    return close_slot(n, sl, bytes, r, t0);
}

loom_status loom_nccl_recv(loom_nccl *n, void *buf, size_t bytes, int peer, loom_cuda_stream s) {
    double t0 = now_s();
    nccl_slot *sl = NULL;
    LOOM_TRY(open_slot(n, LOOM_OP_RECV, (cudaStream_t)s, &sl));
    ncclResult_t r = ncclRecv(buf, bytes, ncclUint8, peer, n->nc, (cudaStream_t)s);
    return close_slot(n, sl, bytes, r, t0);
}

/* ---- completion ------------------------------------------------------------------ */

loom_status loom_nccl_sync(loom_nccl *n) {
    if (n->count == 0) return LOOM_OK;
    double t0 = now_s(), limit = loom_comm_timeout();
    struct timespec nap = {0, 100000}; /* 0.1 ms between polls */
    loom_comm_op last_op = n->ring[(n->head + n->count - 1) % NCCL_RING].op; /* waited for last */
    loom_status st = LOOM_OK;
    while (n->count > 0) {
        st = fold(n, 0);
        if (st != LOOM_OK || n->count == 0) break;
        if (n->ring[n->head].e1_pending) {
            st = loom_fail(LOOM_EUSAGE, "rank %d: NCCL sync on group %s inside an unfinished group call",
                           n->rank, n->name);
            break;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(n->nc, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            st = fail_nccl(n, loom_comm_op_name(n->ring[n->head].op), async);
            break;
        }
        if (limit > 0 && now_s() - t0 > limit) {
            st = loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s has not completed after %.0f s", n->rank,
                           loom_comm_op_name(n->ring[n->head].op), n->name, limit);
            ncclCommAbort(n->nc);
            n->nc = NULL;
            n->count = 0;
            break;
        }
        nanosleep(&nap, NULL);
    }
    n->stats.call_seconds[last_op] += now_s() - t0;
    return st;
}

const loom_comm_stats *loom_nccl_get_stats(loom_nccl *n) {
    fold(n, 0);
    return &n->stats;
}

void loom_nccl_reset_stats(loom_nccl *n) { memset(&n->stats, 0, sizeof n->stats); }
