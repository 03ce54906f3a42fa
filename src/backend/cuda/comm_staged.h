/* comm_staged.h - collectives on DEVICE buffers through the MPI communicator
 * with host staging: copy device -> host, the loom_comm op, host -> device.
 *
 * The path for ranks that share a GPU (NCCL refuses two ranks of one
 * communicator on one device, comm_nccl.h) and for any group without NCCL.
 * Bytes, calls and time are counted by the loom_comm op itself, so they
 * follow comm.h exactly; the copies are not communication and are not
 * counted. Every call is blocking: it waits for the current CUDA stream
 * (loom_cuda_stream_set) before reading the device buffer, and the result is
 * on the device when it returns. The host staging buffer belongs to the
 * calling thread and grows to the largest message (freed by
 * loom_staged_release).
 *
 * Arguments and in-place rules are those of the loom_comm function of the
 * same name (comm.h), with device pointers. A failed device copy returns
 * its status on that rank before the op (the caller aborts the job, as for
 * any failure the ranks did not agree on).
 */
#ifndef LOOM_COMM_STAGED_H
#define LOOM_COMM_STAGED_H

#include <stddef.h>

#include "loom/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

loom_status loom_staged_allreduce(loom_comm *c, void *dbuf, size_t count, loom_dtype t, loom_redop op);
loom_status loom_staged_reduce_scatter(loom_comm *c, const void *dsend, void *drecv, size_t count_per_rank,
                                       loom_dtype t, loom_redop op);
loom_status loom_staged_allgather(loom_comm *c, const void *dsend, void *drecv, size_t bytes_per_rank);
loom_status loom_staged_alltoall(loom_comm *c, const void *dsend, void *drecv, size_t bytes_per_rank);
loom_status loom_staged_alltoallv(loom_comm *c, const void *dsend, const size_t *send_bytes,
                                  const size_t *send_displ, void *drecv, const size_t *recv_bytes,
                                  const size_t *recv_displ);
loom_status loom_staged_bcast(loom_comm *c, void *dbuf, size_t bytes, int root);
loom_status loom_staged_send(loom_comm *c, const void *dbuf, size_t bytes, int peer, int tag);
loom_status loom_staged_recv(loom_comm *c, void *dbuf, size_t bytes, int peer, int tag);
/* Free this thread's staging buffer. */
void loom_staged_release(void);

#ifdef __cplusplus
}
#endif

#endif
