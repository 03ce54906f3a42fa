/* comm.h - the communicator: every byte loom sends goes through here.
 *
 * A loom_comm is a group of ranks (the world, or one mesh axis such as the
 * TP group of this rank) with a name used in messages and statistics. Each
 * call counts its calls, bytes and wall time per op in the group's stats
 * (invariant 4), so tests can compare measured volume with theory.
 *
 * Byte accounting convention (what `bytes` adds per call, on each rank):
 *   allreduce        count * elem          (the buffer size)
 *   reduce_scatter   count_per_rank * elem * size   (the full input)
 *   allgather        bytes_per_rank * size         (the full output)
 *   alltoall(v)      bytes this rank sends
 *   send / recv      bytes sent / received
 *   bcast            bytes of the buffer
 *
 * Every function here is collective over its group except send/recv and
 * the stats getters. Failures return LOOM_EUNAVAIL with a message naming the
 * rank, the op and the group ("rank 3: allreduce on group tp(0) failed: ...").
 * Only src/comm/comm_mpi.c includes mpi.h.
 */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "loom/status.h"

typedef struct loom_comm loom_comm;
typedef struct loom_req loom_req;

typedef enum { LOOM_F32, LOOM_F64, LOOM_I32, LOOM_I64, LOOM_U8 } loom_dtype;
typedef enum { LOOM_SUM, LOOM_MAX, LOOM_MIN } loom_redop;

typedef enum {
    LOOM_OP_ALLREDUCE,
    LOOM_OP_REDUCE_SCATTER,
    LOOM_OP_ALLGATHER,
    LOOM_OP_ALLTOALL,
    LOOM_OP_ALLTOALLV,
    LOOM_OP_SEND,
    LOOM_OP_RECV,
    LOOM_OP_BCAST,
    LOOM_OP_BARRIER,
    LOOM_OP_COUNT
} loom_comm_op;

typedef struct loom_comm_stats {
    uint64_t calls[LOOM_OP_COUNT];
    uint64_t bytes[LOOM_OP_COUNT];
    double seconds[LOOM_OP_COUNT]; /* wall time inside the call (blocking) or
                                      from start to completed wait (non-blocking) */
} loom_comm_stats;

size_t loom_dtype_size(loom_dtype t);
const char *loom_comm_op_name(loom_comm_op op);

/* Start the runtime (MPI_Init_thread) and return the world group. Safe to call
 * outside mpirun: the world is then one rank. */
loom_status loom_comm_init(int *argc, char ***argv, loom_comm **world);
/* Free the world group and finalize the runtime. */
void loom_comm_finalize(loom_comm *world);
/* Abort every rank of the job with exit code `code` (after printing). Used when
 * a failure seen by one rank only would otherwise leave the others hanging. */
void loom_comm_abort(loom_comm *c, int code);

int loom_comm_rank(const loom_comm *c);
int loom_comm_size(const loom_comm *c);
const char *loom_comm_name(const loom_comm *c);

/* Split `parent` into groups by `color`, ordered by `key` (collective over
 * parent). `name` is copied, e.g. "tp". */
loom_status loom_comm_split(loom_comm *parent, int color, int key, const char *name,
                            loom_comm **out);
void loom_comm_free(loom_comm *c);

/* Blocking collectives. */
loom_status loom_comm_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype t, loom_redop op);
loom_status loom_comm_reduce_scatter(loom_comm *c, const void *send, void *recv,
                                     size_t count_per_rank, loom_dtype t, loom_redop op);
loom_status loom_comm_allgather(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank);
loom_status loom_comm_alltoall(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank);
/* Byte counts and displacements, one per rank of the group. */
loom_status loom_comm_alltoallv(loom_comm *c, const void *send, const size_t *send_bytes,
                                const size_t *send_displ, void *recv, const size_t *recv_bytes,
                                const size_t *recv_displ);
loom_status loom_comm_bcast(loom_comm *c, void *buf, size_t bytes, int root);
loom_status loom_comm_barrier(loom_comm *c);
/* Point to point; `peer` is a rank in the group. */
loom_status loom_comm_send(loom_comm *c, const void *buf, size_t bytes, int peer, int tag);
loom_status loom_comm_recv(loom_comm *c, void *buf, size_t bytes, int peer, int tag);

/* Non-blocking variants. *req is allocated by the call and released by
 * loom_comm_wait (or loom_comm_test when it reports completion). Buffers must
 * stay valid until then. */
loom_status loom_comm_iallreduce(loom_comm *c, void *buf, size_t count, loom_dtype t,
                                 loom_redop op, loom_req **req);
loom_status loom_comm_ireduce_scatter(loom_comm *c, const void *send, void *recv,
                                      size_t count_per_rank, loom_dtype t, loom_redop op,
                                      loom_req **req);
loom_status loom_comm_iallgather(loom_comm *c, const void *send, void *recv,
                                 size_t bytes_per_rank, loom_req **req);
loom_status loom_comm_isend(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
                            loom_req **req);
loom_status loom_comm_irecv(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
                            loom_req **req);
loom_status loom_comm_wait(loom_req *req);
/* *done = 1 and req released when complete; *done = 0 otherwise. */
loom_status loom_comm_test(loom_req *req, int *done);

/* Statistics of this group on this rank. */
const loom_comm_stats *loom_comm_get_stats(const loom_comm *c);
void loom_comm_reset_stats(loom_comm *c);

/* Seconds since an arbitrary epoch (MPI_Wtime), for timing. */
double loom_comm_wtime(void);

#endif
