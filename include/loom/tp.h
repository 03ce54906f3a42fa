/* tp.h - the tensor- and sequence-parallel regions the model calls, as
 * conjugate forward/backward pairs (Megatron's f and g operators); the
 * other regions are cp.h (context) and ep.h (expert dispatch / combine).
 *
 * Tensor parallelism (axis tp):
 *   loom_tp_copy      forward: identity          backward: all-reduce
 *   loom_tp_reduce    forward: all-reduce        backward: identity
 * Sequence parallelism (axis tp, rows of the (B*T, C) activations split into
 * tp contiguous blocks):
 *   loom_sp_gather          forward: all-gather rows   backward: reduce-scatter
 *   loom_sp_reduce_scatter  forward: reduce-scatter    backward: all-gather rows
 * A layer calls the forward half where the math needs it and the backward
 * half at the mirrored point of its backward, so a reader sees every
 * collective. Each is the identity (a copy at most) at degree 1, so the
 * single-device run is the same code. All are collective over tp.
 */
#ifndef LOOM_TP_H
#define LOOM_TP_H

#include <stddef.h>
#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/status.h"

typedef struct loom_tp {
    loom_device *dev; /* where the region's tensors live (its part's device) */
    loom_comm *comm;  /* NULL when tp_size == 1 */
    int size, rank;
    int sp; /* sequence parallelism on */
    /* 1: the activation and activation-gradient collectives above (copy,
     * reduce, SP gather / reduce-scatter) carry bf16 (--comm-precision bf16):
     * the communicator's bf16 wire format (comm.h, loom_comm_*_as: rounded
     * to bf16, sums as LOOM_BF16 with every partial sum rounded, converted
     * back). loom_tp_grad_allreduce and loom_tp_allreduce stay fp32
     * (parameter gradients, softmax statistics). */
    int comm_bf16;
} loom_tp;

/* Set aside the TP group's bf16 wire buffer for regions of up to n floats
 * (with comm_bf16 and more than one rank; otherwise nothing), so no step
 * allocates it. Local; LOOM_EOS without memory. */
loom_status loom_tp_reserve(const loom_tp *tp, size_t n);

/* f: forward identity; backward sums the partial input gradients, in place. */
static inline loom_status loom_tp_copy_fwd(const loom_tp *tp, float *x, size_t n) {
    (void)tp;
    (void)x;
    (void)n;
    return LOOM_OK;
}
loom_status loom_tp_copy_bwd(const loom_tp *tp, float *dx, size_t n);
/* g: forward sums the partial outputs, in place; backward identity. */
loom_status loom_tp_reduce_fwd(const loom_tp *tp, float *x, size_t n);
static inline loom_status loom_tp_reduce_bwd(const loom_tp *tp, float *dx, size_t n) {
    (void)tp;
    (void)dx;
    (void)n;
    return LOOM_OK;
}
/* x_l (n_l floats, this rank's rows) -> x (tp * n_l floats, all rows in rank order). */
loom_status loom_sp_gather_fwd(const loom_tp *tp, const float *x_l, float *x, size_t n_l);
/* dx (tp * n_l, partial on each rank) -> dx_l (n_l) summed over the group. */
loom_status loom_sp_gather_bwd(const loom_tp *tp, const float *dx, float *dx_l, size_t n_l);
/* x (tp * n_l, partial) -> x_l (n_l) summed. */
loom_status loom_sp_reduce_scatter_fwd(const loom_tp *tp, const float *x, float *x_l, size_t n_l);
/* dx_l (n_l) -> dx (tp * n_l) gathered. */
loom_status loom_sp_reduce_scatter_bwd(const loom_tp *tp, const float *dx_l, float *dx, size_t n_l);

/* Sum a replicated parameter's partial gradient over tp (SP makes the
 * gradients of norms, row-parallel biases and wpe partial). In place. */
loom_status loom_tp_grad_allreduce(const loom_tp *tp, float *g, size_t n);

/* Sum the partial gradient g (n floats) of a tensor whose slice is
 * replicated on `rep` consecutive tp ranks (key/value heads when tp
 * exceeds their number) over those ranks, in place: all-gathered into
 * scratch (tp * n floats), then added in rank order, so every replica
 * holds the same bits. */
loom_status loom_tp_grad_replica_sum(const loom_tp *tp, float *g, float *scratch, size_t n, int rep);

/* Element-wise reduction of n floats over the TP group, in place (the
 * vocab-parallel softmax statistics). */
loom_status loom_tp_allreduce(const loom_tp *tp, float *x, size_t n, loom_redop op);

#endif
