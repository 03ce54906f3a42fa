/* comm_nccl.h - NCCL collectives on device buffers for one mesh group.
 *
 * A loom_nccl mirrors one loom_comm group (the same ranks in the same order):
 * loom_nccl_create makes the NCCL communicator from a unique id that the
 * group's rank 0 broadcasts through that loom_comm (so even the set-up bytes
 * are counted, invariant 4). Operations are enqueued on a CUDA stream and
 * return at once; the caller orders compute against them with events
 * (loom_cuda_event_record / loom_cuda_stream_wait_event), which is how DP
 * buckets, ZeRO gathers, TP/SP and PP transfers overlap compute.
 *
 * Byte accounting is comm.h's convention, per call on each rank:
 *   allreduce count*elem; reduce_scatter count_per_rank*elem*size (the full
 *   input); allgather bytes_per_rank*size (the full output); alltoall(v) the
 *   bytes this rank sends; send/recv the bytes argument; bcast the buffer.
 * calls and bytes count when an op is enqueued. seconds is the op's time on
 * its stream (a CUDA event before and after it: waiting for peers included),
 * added once the op has completed and loom_nccl_sync or loom_nccl_get_stats
 * has seen it (ops inside one loom_nccl_group_start/_end are launched
 * together at the end, so each is charged the group's time). call_seconds
 * is the host time spent inside these calls (enqueueing, and waiting in
 * loom_nccl_sync).
 *
 * NCCL cannot run two ranks of one communicator on the same GPU:
 * loom_nccl_create checks the device UUIDs of the group first and refuses
 * with LOOM_EUSAGE, naming both ranks. Tests that put several ranks on one
 * GPU use the MPI communicator with host staging instead (copy d2h, the
 * loom_comm op, copy h2d), see docs/backends.md.
 *
 * Failures return LOOM_EUNAVAIL, "rank R: <op> on group <g> failed: <NCCL's
 * reason>". loom_nccl_sync waits at most LOOM_COMM_TIMEOUT seconds (the
 * communicator's watchdog limit; 0: forever), then aborts the NCCL
 * communicator and names the op that did not complete.
 */
#ifndef LOOM_COMM_NCCL_H
#define LOOM_COMM_NCCL_H

#include <stddef.h>

#include "cuda_backend.h"
#include "loom/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_nccl loom_nccl;

/* Collective over `group`; every rank has selected its CUDA device. */
loom_status loom_nccl_create(loom_comm *group, loom_nccl **out);
/* Waits for the ops in flight, then destroys the communicator. */
void loom_nccl_free(loom_nccl *n);
int loom_nccl_rank(const loom_nccl *n);
int loom_nccl_size(const loom_nccl *n);

loom_status loom_nccl_allreduce(loom_nccl *n, void *buf, size_t count, loom_dtype t, loom_redop op,
                                loom_cuda_stream s);
/* send holds size * count_per_rank elements; send == recv: in place, the
 * result at the start of the buffer (comm.h's convention). */
loom_status loom_nccl_reduce_scatter(loom_nccl *n, const void *send, void *recv, size_t count_per_rank,
                                     loom_dtype t, loom_redop op, loom_cuda_stream s);
/* send == recv + rank * bytes_per_rank: in place. */
loom_status loom_nccl_allgather(loom_nccl *n, const void *send, void *recv, size_t bytes_per_rank,
                                loom_cuda_stream s);
/* Block p of send (bytes_per_rank) goes to rank p, block p of recv comes
 * from it (send and recv must not overlap). Grouped ncclSend/ncclRecv. */
loom_status loom_nccl_alltoall(loom_nccl *n, const void *send, void *recv, size_t bytes_per_rank,
                               loom_cuda_stream s);
/* Byte counts and displacements per rank, as loom_comm_alltoallv. */
loom_status loom_nccl_alltoallv(loom_nccl *n, const void *send, const size_t *send_bytes, const size_t *send_displ,
                                void *recv, const size_t *recv_bytes, const size_t *recv_displ, loom_cuda_stream s);
loom_status loom_nccl_bcast(loom_nccl *n, void *buf, size_t bytes, int root, loom_cuda_stream s);
/* Point to point (NCCL has no tags: messages between two ranks match in
 * order). Pair sends and receives that must progress together between
 * loom_nccl_group_start and _end. */
loom_status loom_nccl_send(loom_nccl *n, const void *buf, size_t bytes, int peer, loom_cuda_stream s);
loom_status loom_nccl_recv(loom_nccl *n, void *buf, size_t bytes, int peer, loom_cuda_stream s);
loom_status loom_nccl_group_start(void);
loom_status loom_nccl_group_end(void);

/* Wait until every op enqueued through n has completed (or failed). */
loom_status loom_nccl_sync(loom_nccl *n);
/* Stats of this group's NCCL ops (completed ops' seconds folded in first). */
const loom_comm_stats *loom_nccl_get_stats(loom_nccl *n);
void loom_nccl_reset_stats(loom_nccl *n);

#ifdef __cplusplus
}
#endif

#endif
