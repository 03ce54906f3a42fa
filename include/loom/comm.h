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
 *   send / recv      bytes sent / bytes posted to receive (the `bytes` argument)
 *   bcast            bytes of the buffer
 *
 * Every function here is collective over its group except send/recv and
 * the stats getters. Failures return LOOM_EUNAVAIL with a message naming the
 * rank, the op and the group ("rank 3: allreduce on group tp failed: ...").
 * A size that does not fit MPI's int counts (count, bytes_per_rank, each
 * alltoallv entry) is refused with LOOM_EUNAVAIL before any communication.
 * A blocking call counts its stats when it succeeds; a non-blocking one counts
 * calls and bytes when it starts and its seconds when wait/test completes it.
 *
 * Progress: with MPI_THREAD_MULTIPLE (Open MPI 4.1 and MPICH provide it) a
 * helper thread drives MPI while a non-blocking request is in flight, so
 * non-blocking collectives and sends complete while the caller computes; it
 * sleeps when nothing is in flight. LOOM_COMM_PROGRESS=0 turns it off; with a
 * lower thread level it is off with a warning (work then moves only inside
 * loom_comm calls).
 *
 * Hang watchdog, on by default: a call (blocking, or non-blocking from start
 * to completion) in flight longer than LOOM_COMM_TIMEOUT seconds (default
 * 600; 0 turns it off) prints "rank R: <op> on group <g> (call #N on that
 * group) has not completed after S s" and aborts the job. N counts the calls
 * started on that group on this rank, from 1.
 * The watch thread also makes the starts of queued non-blocking collectives;
 * a caller waiting for such a start checks the ages itself, so a start that
 * never returns inside MPI is reported the same way (test hook:
 * LOOM_COMM_FAULT=stall-start makes the watch stop at its first start).
 * Only src/comm/comm_mpi.c includes mpi.h.
 */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "loom/status.h"

typedef struct loom_comm loom_comm;
typedef struct loom_req loom_req;

/* LOOM_BF16: bfloat16 values (uint16_t bits, loom/bf16.h), 2 bytes each;
 * reductions support LOOM_SUM only. Each hop of the reduction adds two bf16
 * values in fp32 and rounds the sum to bf16 (loom_bf16_sum), so every partial
 * sum is rounded: over n ranks a sum carries n - 1 roundings of at most
 * 2^-8 (bf16's unit roundoff) of the partial sum each, and its error grows with the group size.
 * The MPI communicator sums them with a user-defined op. */
typedef enum { LOOM_F32, LOOM_F64, LOOM_I32, LOOM_I64, LOOM_U8, LOOM_BF16 } loom_dtype;
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
    double call_seconds[LOOM_OP_COUNT]; /* wall time the calling thread spent inside
                                           loom_comm calls of this op: the whole blocking
                                           call; start + every test + wait otherwise */
} loom_comm_stats;

size_t loom_dtype_size(loom_dtype t);
const char *loom_comm_op_name(loom_comm_op op);

/* Start the runtime (MPI_Init_thread, MULTIPLE requested; an already initialised MPI
 * is reused and then left for its owner to finalize) and return the world
 * group, a duplicate of MPI_COMM_WORLD named "world". Safe to call outside
 * mpirun: the world is then one rank. Also tells log.h this process's rank.
 * LOOM_EUSAGE if LOOM_COMM_TIMEOUT is set but not a number. */
loom_status loom_comm_init(int *argc, char ***argv, loom_comm **world);
/* Free the world group and finalize the runtime (if loom started it). */
void loom_comm_finalize(loom_comm *world);
/* Abort every rank of the job with exit code `code` (after printing). Used when
 * a failure seen by one rank only would otherwise leave the others hanging. */
void loom_comm_abort(loom_comm *c, int code);

int loom_comm_rank(const loom_comm *c);
int loom_comm_size(const loom_comm *c);
const char *loom_comm_name(const loom_comm *c);

/* Split `parent` into groups by `color`, ordered by `key` (collective over
 * parent). `name` is copied, e.g. "tp"; the new group has its own stats.
 * color < 0: this rank joins no group and *out is NULL. */
loom_status loom_comm_split(loom_comm *parent, int color, int key, const char *name,
                            loom_comm **out);
void loom_comm_free(loom_comm *c);

/* Blocking collectives. allreduce works in place. reduce_scatter reduces
 * send (size * count_per_rank elements) into recv (count_per_rank); with
 * send == recv it is in place and the result lands at the start of the buffer.
 * allgather with send == recv + rank * bytes_per_rank is in place. */
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
 * stay valid until then, and the group must not be freed before. On a failed
 * start *req is NULL. wait(NULL) and test(NULL) succeed at once. */
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
/* *done = 1 and req released when complete (or failed: then the status says
 * why); *done = 0 otherwise. */
loom_status loom_comm_test(loom_req *req, int *done);

/* Statistics of this group on this rank. */
const loom_comm_stats *loom_comm_get_stats(const loom_comm *c);
void loom_comm_reset_stats(loom_comm *c);
/* 1 when the progress thread drives MPI (see the header comment). */
int loom_comm_progress_thread(void);
/* The watchdog's limit in seconds (0: off), read by loom_comm_init. */
double loom_comm_timeout(void);

/* Agree on failure before going on: the lowest rank whose `local` status is
 * not LOOM_OK speaks for all - every rank returns its status, and the other
 * ranks' messages are cleared so the error is printed once. Collective over
 * c; use it wherever a check could fail on some ranks only, so no rank is
 * left waiting in a later collective. */
loom_status loom_comm_agree(loom_comm *c, loom_status local);

/* Tracing: when on, every completed call of every group of this process is
 * kept as an event (op, group, bytes, start, end) in a ring of `capacity`
 * events (the oldest dropped first). Local; capacity 0 turns it off. */
typedef struct loom_comm_event {
    loom_comm_op op;
    char group[16];
    uint64_t bytes;
    double t0, t1; /* loom_comm_wtime at start and at completion */
} loom_comm_event;
void loom_comm_trace(size_t capacity);
/* Events oldest first: *n of them; the pointer is valid until the next call
 * into the communicator. */
const loom_comm_event *loom_comm_trace_events(size_t *n);
void loom_comm_trace_clear(void);

/* Seconds since an arbitrary epoch (a monotonic clock), for timing; works
 * before loom_comm_init too. */
double loom_comm_wtime(void);

#endif
