/* ep.h - expert parallelism: the dispatch / combine region a Mixture-of-
 * Experts layer calls (moe.h), over plain row arrays. Axis: ep (a group of
 * P ranks inside dp x cp, mesh.h); it knows nothing of the model.
 *
 * E = P x El experts; rank r of the group owns experts [r El, (r+1) El).
 * A sender has A rows to send, already packed expert by expert (expert-major
 * over the global experts, which is destination-major): start (E+1) gives
 * the first row of each expert, so rank q's rows are
 * [start[q El], start[(q+1) El]). An owner receives R rows.
 *
 *   loom_ep_counts    each owner learns how many rows every source sends
 *                     each of its experts (one alltoall of E/P int32 per
 *                     destination) and where they will sit
 *   loom_ep_dispatch  rows (A, width) to the owners: one alltoallv, then
 *                     source-major -> expert-major, so each local expert's
 *                     rows are contiguous
 *   loom_ep_combine   its mirror: expert-major -> source-major, one
 *                     alltoallv back to the senders, rows in their sending
 *                     order again
 *
 * Dispatch's backward is combine's movement (the output gradients go to the
 * experts as their rows did) and combine's backward is dispatch's, so a
 * layer's backward calls the pair again, swapped. Each function is
 * collective over the group; with no group (comm NULL, P = 1) the
 * exchanges are plain copies, so the single-device run is the same code.
 * Bytes follow comm.h's convention (alltoallv: what this rank sends, the
 * rows it keeps for itself included).
 *
 * Memory: row buffers are the device's (ep.dev); the counts and offsets
 * (loom_ep_routes) and the group's scratch are host memory (counts go to MPI
 * as counts).
 */
#ifndef LOOM_EP_H
#define LOOM_EP_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/status.h"

typedef struct loom_ep {
    loom_device *dev; /* where the rows live (its part's device) */
    loom_comm *comm;  /* the EP group; NULL: one rank, every expert local */
    int size, rank;   /* P and this rank's place in the group */
    int n_local;      /* El: experts per rank */
    int overlap;      /* the MoE layers use dispatch_start / _finish (LOOM_EP_OVERLAP=0: off) */
    /* host scratch, loom_ep_scratch_bytes of it, set by the group's owner
     * (the MoE blocks carve it with their own bookkeeping) */
    size_t *a2a;   /* (4 P) alltoallv byte counts and displacements */
    int32_t *sent; /* (E) rows this rank sends to each expert */
} loom_ep;

/* Where one dispatch's rows go and sit: filled by loom_ep_counts, read by
 * the dispatch and combine of the same rows. Arrays are the caller's host
 * memory. */
typedef struct loom_ep_routes {
    const int32_t *start; /* (E+1) the sender's rows per expert (loom_ep_counts' argument) */
    int32_t *rc;          /* (P,El) rows received from source s for local expert j */
    int32_t *soff;        /* (P,El) their first row, source-major (as received) */
    int32_t *eoff;        /* (P,El) their first row, expert-major (as the experts read them) */
    int32_t *estart;      /* (El+1) first expert-major row of each local expert; estart[El] = R */
} loom_ep_routes;

/* What the exchanges cost this rank: bytes it sent and seconds inside the
 * calls, added to by every function below (a NULL tally counts nothing). */
typedef struct loom_ep_tally {
    int64_t bytes;
    double seconds;
    int64_t overlapped; /* dispatches started non-blocking (loom_ep_dispatch_start over a group) */
} loom_ep_tally;

/* Host bytes of scratch (a2a, sent) a group of P ranks with El experts each needs. */
static inline void loom_ep_scratch_bytes(int P, int El, size_t *a2a, size_t *sent) {
    *a2a = 4 * (size_t)P * sizeof(size_t);
    *sent = (size_t)P * (size_t)El * sizeof(int32_t);
}

/* r->rc, soff, eoff, estart from every sender's start (E+1); keeps start in
 * r->start for the dispatch and combine that follow. Collective over ep. */
loom_status loom_ep_counts(const loom_ep *ep, const int32_t *start, loom_ep_routes *r, loom_ep_tally *t);
/* rows (A, width), expert-major -> out (R, width), expert-major over the
 * local experts; recv (R, width) is scratch (the rows as received,
 * source-major). Collective over ep. */
loom_status loom_ep_dispatch(const loom_ep *ep, const loom_ep_routes *r, const float *rows, float *recv,
                             float *out, int width, loom_ep_tally *t);
/* loom_ep_dispatch in two halves, so that the local experts can compute
 * while the other ranks' rows are in flight: _start starts the alltoallv
 * (non-blocking) and puts this rank's own rows (source = ep->rank) in out
 * at once, expert-major as dispatch would: rows [eoff[me El + j], + rc[me El
 * + j]) of each local expert j are ready on return; _finish waits and puts
 * the other sources' rows in out. Between the two, rows, recv, ep->a2a and
 * r must stay as they are, and no other exchange of ep may run (one
 * dispatch in flight per group). out ends bit-identical to
 * loom_ep_dispatch's; bytes are the same, seconds count the start and the
 * wait only. With no group, _start does the whole dispatch (every row is
 * this rank's own; *req NULL) and _finish nothing. Both collective over ep. */
loom_status loom_ep_dispatch_start(const loom_ep *ep, const loom_ep_routes *r, const float *rows, float *recv,
                                   float *out, int width, loom_ep_tally *t, loom_req **req);
loom_status loom_ep_dispatch_finish(const loom_ep *ep, const loom_ep_routes *r, const float *recv, float *out,
                                    int width, loom_ep_tally *t, loom_req *req);
/* in (R, width), expert-major -> rows (A, width) back on their senders, in
 * their dispatch order; send (R, width) is scratch (source-major).
 * Collective over ep. */
loom_status loom_ep_combine(const loom_ep *ep, const loom_ep_routes *r, const float *in, float *send,
                            float *rows, int width, loom_ep_tally *t);

#endif
