/* comm_impl.h - what a communicator implementation provides (the table of
 * operations), and the state every group carries whatever implements it
 * (src/comm only; the public side is loom/comm.h).
 *
 * An implementation fills one `const loom_comm_ops` with designated
 * initializers (comm_mpi.c, comm_staged.c, comm_nccl.c) and makes its groups
 * with loom_comm_create. The entry points (comm_call.c) check arguments,
 * count statistics, keep trace events and watch for hangs, then hand the
 * implementation one loom_comm_call: every size in it already fits an int,
 * a bf16 reduction is a sum, and buffers are in the group's memory (c->mem).
 * Implementations report failures with loom_fail, naming the world rank
 * (c->world_rank), the op and the group ("rank R: <op> on group <g>
 * failed: <reason>").
 */
#ifndef LOOM_COMM_IMPL_H
#define LOOM_COMM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm_watch.h"
#include "loom/comm.h"

/* One call of any op. */
typedef struct loom_comm_call {
    loom_comm_op op;
    /* allreduce: send == recv (in place); reduce_scatter: send == recv in
     * place (result at the start); allgather: send == recv + rank * count
     * in place; bcast, recv: send NULL; send: recv NULL; barrier: both NULL */
    const void *send;
    void *recv;
    /* reductions: elements (reduce_scatter: per rank) of `type`; every other
     * op: bytes (allgather, alltoall: per rank) */
    size_t count;
    loom_dtype type; /* LOOM_U8 for the byte ops */
    loom_redop redop;
    int peer, tag; /* send/recv: the peer; bcast: the root */
    const size_t *send_bytes, *send_displ, *recv_bytes, *recv_displ; /* alltoallv */
} loom_comm_call;

typedef struct loom_comm_ops {
    const char *name; /* "mpi", "staged", "nccl" */
    /* Run k to completion (blocking; barrier included). */
    loom_status (*run)(loom_comm *c, const loom_comm_call *k);
    /* Start k (allreduce, reduce_scatter, allgather, alltoallv, send, recv)
     * into `req`, c->req_size bytes the caller keeps until wait, or test
     * reporting done, has completed it (alltoallv: its four arrays too). On
     * failure nothing is left in flight. */
    loom_status (*start)(loom_comm *c, const loom_comm_call *k, void *req);
    loom_status (*wait)(loom_comm *c, void *req);
    /* *done = 1 when complete or failed (the status says which). */
    loom_status (*test)(loom_comm *c, void *req, int *done);
    /* Collective over parent: a group of this implementation over the ranks
     * of the same color (NULL for color < 0). */
    loom_status (*split)(loom_comm *parent, int color, int key, const char *name, loom_comm **out);
    /* Optional: room for `buffers` calls of up to `bytes` in flight at once
     * in the implementation's own buffers (host staging). */
    loom_status (*reserve)(loom_comm *c, size_t bytes, int buffers);
    /* Release c->impl (every request completed). */
    void (*free)(loom_comm *c);
} loom_comm_ops;

/* Reusable buffers of one memory: taken by a call, given back when it
 * completes; the smallest free one that fits is taken, and one is allocated
 * (and kept) only when none fits. */
typedef struct loom_comm_buf {
    void *p;
    size_t cap; /* bytes */
    int busy;
} loom_comm_buf;
typedef struct loom_comm_pool {
    loom_comm_buf *b;
    int n, cap;
    size_t grown; /* buffers a call had to allocate */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p, size_t bytes);
    void *ctx;
} loom_comm_pool;

/* Index of a buffer of at least `bytes` now busy, or -1 (LOOM_EOS set). */
int loom_comm_pool_take(loom_comm_pool *pl, size_t bytes);
void loom_comm_pool_give(loom_comm_pool *pl, int i);
/* At least `buffers` buffers of at least `bytes` (comm.h's reserve_wire). */
loom_status loom_comm_pool_reserve(loom_comm_pool *pl, size_t bytes, int buffers);
void loom_comm_pool_free(loom_comm_pool *pl);

struct loom_comm {
    const loom_comm_ops *ops;
    void *impl;                 /* the implementation's context */
    size_t req_size;            /* bytes of its part of a request */
    loom_comm_mem mem;          /* where the buffers live */
    loom_comm *host;            /* staged, NCCL: the MPI group underneath (owned) */
    int rank, size, world_rank; /* world_rank: for messages */
    char name[64];
    loom_comm_stats *stats; /* own_stats, or those of the group wrapping this one */
    uint64_t *seq;          /* calls started (the watchdog's #N), likewise */
    loom_comm_stats own_stats;
    uint64_t own_seq;
    struct loom_req *spare; /* completed requests, reused by the next start */
    loom_comm_pool wire;    /* bf16 wire buffers in `mem` (comm_wire.c) */
};

struct loom_req {
    loom_comm *c;
    loom_comm_op op;
    double t0; /* when the call started */
    size_t bytes;
    loom_watch_node node; /* on the watch's list while in flight */
    int wire;             /* the wire buffer to convert from and give back, or -1 */
    float *unpack_to;
    size_t unpack_n;
    struct loom_req *next;
    max_align_t impl[]; /* the implementation's part (c->req_size bytes) */
};

/* A new group of implementation `ops` (impl: its context, freed through
 * ops->free from now on, also when this fails), with its own stats. */
loom_status loom_comm_create(const loom_comm_ops *ops, void *impl, size_t req_size, const loom_comm_mem *mem,
                             int rank, int size, int world_rank, const char *name, loom_comm **out);
/* c owns host from now on; host's calls count in c's stats and call
 * numbers. loom_comm_release_host undoes it (before freeing c on a failed
 * set-up that leaves host to the caller). */
void loom_comm_adopt_host(loom_comm *c, loom_comm *host);
void loom_comm_release_host(loom_comm *c);

/* comm_call.c: size_t -> int count check, the message naming the value
 * (`index` >= 0: an entry of a per-rank array). */
loom_status loom_comm_check_count(const loom_comm *c, loom_comm_op op, const char *what, int index, size_t n);
/* comm_wire.c: convert a completed request's wire buffer back (when ok) and
 * give the buffer back. */
void loom_comm_wire_finish(loom_req *r, int ok);
/* comm.c: keep one completed call as a trace event (no-op while tracing is off). */
void loom_comm_trace_record(loom_comm_op op, const char *group, uint64_t bytes, double t0, double t1);

#endif
