/* comm.h - the communicator: every byte loom sends goes through here.
 *
 * A loom_comm is a group of ranks (the world, or one mesh axis such as the
 * TP group of this rank) with a name used in messages and statistics. It is
 * an interface: a table of operations and an implementation's context
 * (src/comm/comm_impl.h), filled once when the group is made:
 *   MPI         (comm_mpi.c)    buffers MPI reads directly: host memory (a
 *                               CPU device's, with its memory ops:
 *                               loom_comm_set_memory), or device memory under
 *                               a CUDA-aware MPI; loom_comm_init makes the
 *                               world, loom_comm_split every other group
 *   host-staged (comm_staged.c) buffers in another memory (a device's): each
 *                               op copies them to host memory, runs on the MPI
 *                               group underneath, and copies the result back
 *                               (loom_comm_wrap_staged)
 *   NCCL        (comm_nccl.c)   device buffers, ops on a CUDA stream; builds
 *                               with the CUDA backend only (loom_comm_wrap_nccl)
 * loom_comm_split of a group makes a group of the same implementation and
 * memory. Every caller uses the functions below, whatever runs them. Which
 * implementation a group of the device mesh has is the device's choice
 * (device.h: loom_device_comm_split); loom_comm_host(c) is the group to use
 * for host buffers (scalars, agreement) whatever c's implementation.
 *
 * Above the implementations, once for all (src/comm/comm.c, comm_call.c,
 * comm_wire.c, comm_watch.c): argument checks, statistics, trace events,
 * loom_comm_agree, the hang watchdog and the bf16 wire format. Each call
 * counts its calls, bytes and wall time per op in the group's stats
 * (invariant 4), so tests can compare measured volume with theory.
 *
 * Byte accounting convention (what `bytes` adds per call, on each rank):
 *   allreduce        count * elem          (the buffer size)
 *   reduce_scatter   count_per_rank * elem * size   (the full input)
 *   allgather        bytes_per_rank * size         (the full output)
 *   alltoall(v)      bytes this rank sends
 *   send / recv      bytes sent / bytes posted to receive (the `bytes` argument)
 *   bcast            bytes of the buffer
 * A call with a bf16 wire (loom_comm_*_as) counts the bf16 bytes it sends.
 *
 * Every function here is collective over its group except send/recv and
 * the stats getters. Failures return LOOM_EUNAVAIL with a message naming the
 * rank, the op and the group ("rank 3: allreduce on group tp failed: ...").
 * A size that does not fit an int count (count, bytes_per_rank, each
 * alltoallv entry) is refused with LOOM_EUNAVAIL before any communication,
 * whatever the implementation.
 * A blocking call counts its stats when it succeeds; a non-blocking one counts
 * calls and bytes when it starts and its seconds when wait/test completes it.
 *
 * Progress (MPI): with MPI_THREAD_MULTIPLE (Open MPI 4.1 and MPICH provide it) a
 * helper thread drives MPI while a non-blocking request is in flight, so
 * non-blocking collectives and sends complete while the caller computes; it
 * sleeps when nothing is in flight. LOOM_COMM_PROGRESS=0 turns it off; with a
 * lower thread level it is off with a warning (work then moves only inside
 * loom_comm calls).
 *
 * Hang watchdog, on by default, for every implementation: a call (blocking,
 * or non-blocking from start to completion) in flight longer than
 * LOOM_COMM_TIMEOUT seconds (default 600; 0 turns it off) prints "rank R:
 * <op> on group <g> (call #N on that group) has not completed after S s ... on host H"
 * and aborts the job. N counts the calls started on that group on this
 * rank, from 1.
 * The watch thread also makes the starts of queued non-blocking MPI
 * collectives; a caller waiting for such a start checks the ages itself, so
 * a start that never returns inside MPI is reported the same way (test hook:
 * LOOM_COMM_FAULT=stall-start makes the watch stop at its first start).
 * Only src/comm/comm_mpi.c includes mpi.h; only src/comm/comm_nccl.c nccl.h.
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
 * MPI sums them with a user-defined op (comm_mpi.c), NCCL as ncclBfloat16.
 * An fp32 tensor is sent as bf16 with the wire format below. */
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
    double seconds[LOOM_OP_COUNT];      /* wall time inside the call (blocking) or
                                      from start to completed wait (non-blocking) */
    double call_seconds[LOOM_OP_COUNT]; /* wall time the calling thread spent inside
                                           loom_comm calls of this op: the whole blocking
                                           call; start + every test + wait otherwise */
} loom_comm_stats;

size_t loom_dtype_size(loom_dtype t);
const char *loom_comm_op_name(loom_comm_op op);

/* Where a group's buffers live, as whoever makes the group says: how to
 * copy between that memory and the host, and how to convert fp32 to bf16
 * and back in it (the wire format below). Copies return when the data is
 * where it was sent (the host buffer usable); a failed copy returns its status
 * with a message. pack: dst[i] = the bf16 bits of src[i] rounded to nearest
 * even (loom/bf16.h); unpack: back, exactly; both pointers in this memory.
 * The group keeps a copy of the struct; ctx must outlive it. */
typedef struct loom_comm_mem {
    const char *name; /* "host", "cuda", ... */
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes); /* NULL when there is no memory */
    void (*free)(void *ctx, void *p, size_t bytes);
    loom_status (*copy_to_host)(void *ctx, void *host_dst, const void *src, size_t bytes);
    loom_status (*copy_from_host)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*pack_bf16)(void *ctx, uint16_t *dst, const float *src, size_t n);
    void (*unpack_bf16)(void *ctx, float *dst, const uint16_t *src, size_t n);
} loom_comm_mem;

/* Host memory: malloc, memcpy, and bf16 conversion in plain loops (the
 * communicator sits below the kernels). The memory of the world and of every
 * MPI group split from an MPI group on it. */
extern const loom_comm_mem loom_comm_mem_host;

/* ---- making groups -------------------------------------------------------- */

/* Start the runtime (MPI_Init_thread, MULTIPLE requested; an already initialised MPI
 * is reused and then left for its owner to finalize) and return the world
 * group, MPI_COMM_WORLD's ranks named "world", on host memory. Safe to call outside
 * mpirun: the world is then one rank. Also tells log.h this process's rank.
 * The world's ranks are placed host by host: the ranks sharing a host (MPI's
 * shared-memory split) are consecutive, hosts in the order of their lowest
 * launcher rank, the launcher's order inside a host - on one host, or when
 * the launcher already filled hosts in turn, the launcher's numbering itself.
 * So the mesh's innermost axes (tp first by default) stay inside a host
 * under any launcher mapping (docs/cluster.md). LOOM_PLACEMENT=launcher
 * keeps the launcher's numbering.
 * LOOM_EUSAGE if LOOM_COMM_TIMEOUT is set but not a number, or
 * LOOM_PLACEMENT is neither host nor launcher. */
loom_status loom_comm_init(int *argc, char ***argv, loom_comm **world);
/* The job size the launcher's environment gives this process (mpirun's,
 * Hydra's, PMIx's, Slurm's variables; comm_launch.c), 1 when none says more,
 * with the variable that said it in why ("PMI_SIZE=2"). loom_comm_init
 * fails with LOOM_EUSAGE ("launcher mismatch: ...", exit 64 on every rank)
 * when this is above 1 and MPI's world has one rank, or when
 * LOOM_EXPECT_WORLD is set (scripts/loomrun -np N sets N) and differs from
 * MPI's world size. Local. */
int loom_comm_launcher_ranks(char *why, size_t cap);
/* The MPI library this process runs: "Open MPI v4.1.4 (MPI 3.1)". Local;
 * callable before loom_comm_init. */
void loom_comm_library(char *buf, size_t cap);
/* Where the world's ranks run, as loom_comm_init learnt it (before it: one
 * host, launcher rank = rank): the number of hosts; for world rank r, its
 * host's index (hosts numbered from 0 by their lowest launcher rank), its
 * host's name (MPI_Get_processor_name) and its rank in MPI_COMM_WORLD. */
int loom_comm_hosts(void);
int loom_comm_host_of(int rank);
const char *loom_comm_host_name(int rank);
int loom_comm_launcher_rank(int rank);
/* Free the world group (or a group wrapping it) and finalize the runtime
 * (if loom started it and no other world is live). */
void loom_comm_finalize(loom_comm *world);

/* A group over the same ranks as `host_group` (an MPI group, on host
 * memory) whose buffers are in `mem`: each op copies what this rank
 * contributes to a host staging buffer (owned by the group, grown to the
 * largest message and then reused), runs the op on host_group's MPI
 * implementation and copies the result back. The bytes counted are the op's;
 * the copies are not communication. Not collective. On success the new group
 * owns host_group (freed with it; its calls count in the new group's stats);
 * on failure the caller still does. LOOM_EUSAGE if host_group is not on host
 * memory. */
loom_status loom_comm_wrap_staged(loom_comm *host_group, const loom_comm_mem *mem, loom_comm **out);

/* A group over flat's ranks (an MPI group on host memory) whose sum
 * all-reduce is host-aware: reduce-scatter among the members on this rank's
 * host (subgroup "<name>.host"), all-reduce of this rank's slice across the
 * hosts ("<name>.link"), all-gather on the host; blocking even when started
 * (measured faster here than chaining non-blocking stages: docs/cluster.md).
 * Every other op runs on flat. Collective over flat. *out is
 * NULL (LOOM_OK) unless flat spans >= 2 hosts (loom_comm_host_of) holding
 * the same number >= 2 of its members each. Does not own flat (free *out
 * first); its calls count in flat's stats. */
loom_status loom_comm_wrap_hier(loom_comm *flat, loom_comm **out);

/* NCCL (defined in the CUDA backend's library, loom_cuda, only): a group over
 * the same ranks as `host_group` (an MPI group) whose ops run on the CUDA
 * stream `stream` (a cudaStream_t; NULL: the default stream) on device
 * buffers of `mem`. A blocking call enqueues the op and waits for it (at most
 * LOOM_COMM_TIMEOUT seconds, then the NCCL communicator is aborted and the
 * op named); a non-blocking one enqueues it, wait/test look at an event after
 * it. Collective over host_group: the device UUIDs are gathered first and two
 * ranks of the group on one GPU are refused with LOOM_EUSAGE naming both
 * (NCCL cannot run them: use loom_comm_wrap_staged); rank 0 makes the
 * unique id and broadcasts it (counted in the new group's stats). Ownership
 * of host_group as loom_comm_wrap_staged. NCCL has no tags: messages
 * between two ranks match in order, and a send and a receive that must
 * progress together are started (isend / irecv) between
 * loom_comm_nccl_group_start and _end, where blocking calls are refused. */
loom_status loom_comm_wrap_nccl(loom_comm *host_group, const loom_comm_mem *mem, void *stream,
                                loom_comm **out);
loom_status loom_comm_nccl_group_start(void);
loom_status loom_comm_nccl_group_end(void);

/* An MPI group (the world, or one split from an MPI group) told that its
 * buffers live in `mem`, which MPI reads and writes directly: host memory
 * with a device's own ops (a CPU device: the bf16 wire format then packs
 * with that device's kernels), or a device's memory under an MPI built to
 * read it (CUDA-aware). Groups split from c afterwards carry mem too. Local.
 * LOOM_EUSAGE for a staged or NCCL group, and once c holds wire buffers
 * (loom_comm_reserve_wire). */
loom_status loom_comm_set_memory(loom_comm *c, const loom_comm_mem *mem);

/* The group on host memory with c's ranks, for host buffers (scalars,
 * agreement): c itself for an MPI group (whose memory MPI reads), the MPI
 * group under a staged or NCCL one. Its calls count in c's stats and call
 * numbers. */
loom_comm *loom_comm_host(loom_comm *c);
/* The memory c's buffers live in. */
const loom_comm_mem *loom_comm_memory(const loom_comm *c);
/* Abort every rank of the job with exit code `code` (after printing). Used when
 * a failure seen by one rank only would otherwise leave the others hanging. */
void loom_comm_abort(loom_comm *c, int code);

int loom_comm_rank(const loom_comm *c);
int loom_comm_size(const loom_comm *c);
const char *loom_comm_name(const loom_comm *c);

/* Split `parent` into groups by `color`, ordered by `key` (collective over
 * parent). `name` is copied, e.g. "tp"; the new group has its own stats and
 * parent's implementation and memory.
 * color < 0: this rank joins no group and *out is NULL. */
loom_status loom_comm_split(loom_comm *parent, int color, int key, const char *name, loom_comm **out);
void loom_comm_free(loom_comm *c);

/* Blocking collectives. allreduce works in place. reduce_scatter reduces
 * send (size * count_per_rank elements) into recv (count_per_rank); with
 * send == recv it is in place and the result lands at the start of the buffer.
 * allgather with send == recv + rank * bytes_per_rank is in place. */
loom_status loom_comm_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype t, loom_redop op);
loom_status loom_comm_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t count_per_rank,
                                     loom_dtype t, loom_redop op);
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
loom_status loom_comm_iallreduce(loom_comm *c, void *buf, size_t count, loom_dtype t, loom_redop op,
                                 loom_req **req);
loom_status loom_comm_ireduce_scatter(loom_comm *c, const void *send, void *recv, size_t count_per_rank,
                                      loom_dtype t, loom_redop op, loom_req **req);
loom_status loom_comm_iallgather(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                                 loom_req **req);
loom_status loom_comm_isend(loom_comm *c, const void *buf, size_t bytes, int peer, int tag, loom_req **req);
loom_status loom_comm_irecv(loom_comm *c, void *buf, size_t bytes, int peer, int tag, loom_req **req);
/* As loom_comm_alltoallv; the four arrays, like the buffers, must stay
 * unchanged until completion (MPI's rule for MPI_Ialltoallv). Not in place
 * (send and recv must not overlap). */
loom_status loom_comm_ialltoallv(loom_comm *c, const void *send, const size_t *send_bytes,
                                 const size_t *send_displ, void *recv, const size_t *recv_bytes,
                                 const size_t *recv_displ, loom_req **req);
loom_status loom_comm_wait(loom_req *req);
/* *done = 1 and req released when complete (or failed: then the status says
 * why); *done = 0 otherwise. */
loom_status loom_comm_test(loom_req *req, int *done);

/* ---- the wire format: fp32 tensors sent as `wire` ------------------------ */

/* fp32 buffers (in the group's memory) communicated as `wire`: LOOM_F32
 * (exactly the plain call on LOOM_F32; allgather's bytes_per_rank is
 * count_per_rank * 4) or LOOM_BF16: each value rounded to bf16 into a wire
 * buffer of the group (pack_bf16 of its memory), the op run on LOOM_BF16
 * (sums only; every partial sum rounded, as LOOM_BF16 above), the result
 * converted back (unpack_bf16) into the fp32 destination - half the bytes.
 * In-place rules and counts (elements) as the plain calls: reduce_scatter's
 * result lands at the start of recv (send == recv allowed); allgather with
 * send == recv + rank * count_per_rank is in place. The non-blocking forms
 * convert back when wait, or test reporting completion, completes them; the
 * destination holds the result only then. A failure leaves the destination
 * unchanged. */
loom_status loom_comm_allreduce_as(loom_comm *c, float *x, size_t count, loom_dtype wire, loom_redop op);
loom_status loom_comm_reduce_scatter_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                        loom_dtype wire, loom_redop op);
loom_status loom_comm_allgather_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                   loom_dtype wire);
loom_status loom_comm_iallreduce_as(loom_comm *c, float *x, size_t count, loom_dtype wire, loom_redop op,
                                    loom_req **req);
loom_status loom_comm_ireduce_scatter_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                         loom_dtype wire, loom_redop op, loom_req **req);
loom_status loom_comm_iallgather_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                    loom_dtype wire, loom_req **req);

/* Make room up front, so that no call in a step allocates: afterwards c
 * holds at least `buffers` wire buffers of at least `count` bf16 values each
 * (the largest message's values: allreduce's count, reduce_scatter's input,
 * allgather's output), allocated now in the group's memory (and, for a staged
 * group, host staging for them). Calls in flight at once each hold one
 * buffer (the smallest free one that fits) until they complete; a call that
 * finds none allocates one, kept for later calls. Calling it again with
 * the same arguments adds nothing. Local; LOOM_EOS without memory. */
loom_status loom_comm_reserve_wire(loom_comm *c, size_t count, int buffers);
/* Wire buffers calls had to allocate because no reserved one was free
 * (0 when loom_comm_reserve_wire covered them); bytes of all of c's wire
 * buffers. */
size_t loom_comm_wire_grown(const loom_comm *c);
size_t loom_comm_wire_bytes(const loom_comm *c);

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
