/* comm.c - the implementation-independent part of the communicator that is
 * not a call: element sizes and op names, host memory, making and freeing
 * groups, accessors and statistics, the trace ring, and agreeing on failure.
 * Not tied to a mesh axis. Collective: loom_comm_split (through the parent's
 * implementation), loom_comm_free as the implementation's free is, and
 * loom_comm_agree; nothing here talks to MPI (comm_mpi.c does). The calls
 * themselves are comm_call.c, the bf16 wire format comm_wire.c, the
 * watchdog comm_watch.c.
 */
#include "loom/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "comm/comm_job.h"
#include "loom/bf16.h"

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

double loom_comm_wtime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- host memory ------------------------------------------------------------ */

static void *host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return malloc(bytes ? bytes : 1);
}
static void host_free(void *ctx, void *p, size_t bytes) {
    (void)ctx, (void)bytes;
    free(p);
}
static loom_status host_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes && dst != src) memcpy(dst, src, bytes);
    return LOOM_OK;
}
/* Plain loops (the communicator sits below the kernels): a device's own
 * memory ops (loom_device_comm_mem) bring its vector kernels, with the
 * same rounding. */
static void host_pack(void *ctx, uint16_t *dst, const float *src, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_from_f32(src[i]);
}
static void host_unpack(void *ctx, float *dst, const uint16_t *src, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_to_f32(src[i]);
}

const loom_comm_mem loom_comm_mem_host = {.name = "host",
                                          .alloc = host_alloc,
                                          .free = host_free,
                                          .copy_to_host = host_copy,
                                          .copy_from_host = host_copy,
                                          .pack_bf16 = host_pack,
                                          .unpack_bf16 = host_unpack};

/* ---- groups ----------------------------------------------------------------- */

loom_status loom_comm_create(const loom_comm_ops *ops, void *impl, size_t req_size, const loom_comm_mem *mem,
                             int rank, int size, int world_rank, const char *name, loom_comm **out) {
    *out = NULL;
    loom_comm *c = calloc(1, sizeof *c);
    if (!c) {
        loom_comm tmp = {.ops = ops, .impl = impl};
        ops->free(&tmp);
        return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", world_rank, name);
    }
    /* requests are allocated with their implementation part after them */
    const size_t align = sizeof(max_align_t);
    *c = (loom_comm){.ops = ops,
                     .impl = impl,
                     .req_size = (req_size + align - 1) / align * align,
                     .mem = *mem,
                     .rank = rank,
                     .size = size,
                     .world_rank = world_rank};
    snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
    c->stats = &c->own_stats;
    c->seq = &c->own_seq;
    c->wire = (loom_comm_pool){.alloc = c->mem.alloc, .free = c->mem.free, .ctx = c->mem.ctx};
    *out = c;
    return LOOM_OK;
}

void loom_comm_note_stop_signal(int sig) { loom_job_note_stop(sig); }

void loom_comm_adopt_host(loom_comm *c, loom_comm *host) {
    c->host = host;
    host->stats = c->stats;
    loom_job_group_rekey(host->seq, c->seq); /* the host's calls count as c's on the progress board */
    host->seq = c->seq;
}

void loom_comm_release_host(loom_comm *c) {
    if (!c->host) return;
    c->host->stats = &c->host->own_stats;
    c->host->seq = &c->host->own_seq;
    c->host = NULL;
}

loom_status loom_comm_set_memory(loom_comm *c, const loom_comm_mem *mem) {
    if (c->host) /* only an MPI group has no group underneath */
        return loom_fail(LOOM_EUSAGE,
                         "rank %d: group %s: only an MPI group takes a memory of its own, "
                         "not a %s one",
                         c->world_rank, c->name, c->ops->name);
    if (c->wire.n)
        return loom_fail(LOOM_EUSAGE,
                         "rank %d: group %s: its memory cannot change once it holds wire buffers",
                         c->world_rank, c->name);
    c->mem = *mem;
    c->wire = (loom_comm_pool){.alloc = c->mem.alloc, .free = c->mem.free, .ctx = c->mem.ctx};
    return LOOM_OK;
}

loom_status loom_comm_split(loom_comm *parent, int color, int key, const char *name, loom_comm **out) {
    *out = NULL;
    return parent->ops->split(parent, color, key, name, out);
}

void loom_comm_free(loom_comm *c) {
    if (!c) return;
    c->ops->free(c);
    while (c->spare) {
        loom_req *r = c->spare;
        c->spare = r->next;
        free(r);
    }
    loom_comm_pool_free(&c->wire);
    loom_comm_free(c->host);
    free(c);
}

int loom_comm_rank(const loom_comm *c) { return c->rank; }
int loom_comm_size(const loom_comm *c) { return c->size; }
const char *loom_comm_name(const loom_comm *c) { return c->name; }
loom_comm *loom_comm_host(loom_comm *c) { return c->host ? c->host : c; }
const loom_comm_mem *loom_comm_memory(const loom_comm *c) { return &c->mem; }

const loom_comm_stats *loom_comm_get_stats(const loom_comm *c) { return c->stats; }
void loom_comm_reset_stats(loom_comm *c) { memset(c->stats, 0, sizeof *c->stats); }

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

loom_status loom_comm_agree(loom_comm *c, loom_status local) {
    /* the lowest failing rank speaks for all: its status, its message; host
     * ints, so on the group's host side */
    loom_comm *world = loom_comm_host(c);
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
