/* comm.c - the backend-independent part of the communicator: element sizes
 * and op names used in statistics and messages. Nothing here is collective
 * and nothing here talks to MPI (see comm_mpi.c for the MPI backend). */
#include "loom/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

size_t loom_dtype_size(loom_dtype t) {
    switch (t) {
    case LOOM_F32: return 4;
    case LOOM_F64: return 8;
    case LOOM_I32: return 4;
    case LOOM_I64: return 8;
    case LOOM_U8: return 1;
    case LOOM_BF16: return 2;
    }
    return 0;
}

const char *loom_comm_op_name(loom_comm_op op) {
    switch (op) {
    case LOOM_OP_ALLREDUCE: return "allreduce";
    case LOOM_OP_REDUCE_SCATTER: return "reduce_scatter";
    case LOOM_OP_ALLGATHER: return "allgather";
    case LOOM_OP_ALLTOALL: return "alltoall";
    case LOOM_OP_ALLTOALLV: return "alltoallv";
    case LOOM_OP_SEND: return "send";
    case LOOM_OP_RECV: return "recv";
    case LOOM_OP_BCAST: return "bcast";
    case LOOM_OP_BARRIER: return "barrier";
    case LOOM_OP_COUNT: break;
    }
    return "unknown";
}

/* ---- tracing: a ring of the last events ---------------------------------- */

static loom_comm_event *g_ring, *g_linear;
static size_t g_cap, g_head, g_count;

void loom_comm_trace(size_t capacity) {
    free(g_ring);
    free(g_linear);
    g_ring = capacity ? calloc(capacity, sizeof *g_ring) : NULL;
    g_linear = capacity ? calloc(capacity, sizeof *g_linear) : NULL;
    g_cap = g_ring && g_linear ? capacity : 0;
    g_head = g_count = 0;
}

void loom_comm_trace_clear(void) { g_head = g_count = 0; }

void loom_comm_trace_record(loom_comm_op op, const char *group, uint64_t bytes, double t0, double t1) {
    if (!g_cap) return;
    loom_comm_event *e = &g_ring[(g_head + g_count) % g_cap];
    if (g_count < g_cap) g_count++;
    else g_head = (g_head + 1) % g_cap;
    e->op = op;
    snprintf(e->group, sizeof e->group, "%s", group);
    e->bytes = bytes;
    e->t0 = t0;
    e->t1 = t1;
}

const loom_comm_event *loom_comm_trace_events(size_t *n) {
    for (size_t i = 0; i < g_count; i++) g_linear[i] = g_ring[(g_head + i) % g_cap];
    *n = g_count;
    return g_linear;
}

/* ---- agreeing on failure ------------------------------------------------ */

loom_status loom_comm_agree(loom_comm *world, loom_status local) {
    /* the lowest failing rank speaks for all: its status, its message */
    const int none = 1 << 30;
    int me = local != LOOM_OK ? loom_comm_rank(world) : none, first = me;
    loom_status st = loom_comm_allreduce(world, &first, 1, LOOM_I32, LOOM_MIN);
    if (st != LOOM_OK) return st;
    if (first == none) return LOOM_OK;
    int code = (int)local;
    st = loom_comm_bcast(world, &code, sizeof code, first);
    if (st != LOOM_OK) return st;
    if (me != first) loom_fail((loom_status)code, "%s", "");
    return (loom_status)code;
}
