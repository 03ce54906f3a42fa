/* tp.c - tensor- and sequence-parallel regions (see tp.h). Axis: tp.
 * Every function is collective over the TP group, and the identity (or a
 * copy) when the group has one rank.
 *
 * With tp->comm_bf16 the activation collectives carry bf16: the
 * communicator's wire format (comm.h, loom_comm_*_as) rounds them into the
 * TP group's wire buffer, which loom_tp_reserve sets aside before the first
 * step.
 */
#include "loom/tp.h"

#include "loom/device.h"

static int alone(const loom_tp *tp) { return tp->size == 1 || !tp->comm; }

/* What the activation collectives carry. */
static loom_dtype wire(const loom_tp *tp) { return tp->comm_bf16 ? LOOM_BF16 : LOOM_F32; }

loom_status loom_tp_reserve(const loom_tp *tp, size_t n) {
    return alone(tp) || !tp->comm_bf16 ? LOOM_OK : loom_comm_reserve_wire(tp->comm, n, 1);
}

/* x (n floats) summed over tp in place. */
static loom_status sum_all(const loom_tp *tp, float *x, size_t n) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce_as(tp->comm, x, n, wire(tp), LOOM_SUM);
}

loom_status loom_tp_copy_bwd(const loom_tp *tp, float *dx, size_t n) { return sum_all(tp, dx, n); }

loom_status loom_tp_reduce_fwd(const loom_tp *tp, float *x, size_t n) { return sum_all(tp, x, n); }

loom_status loom_tp_grad_allreduce(const loom_tp *tp, float *g, size_t n) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce(tp->comm, g, n, LOOM_F32, LOOM_SUM);
}

loom_status loom_tp_grad_replica_sum(const loom_tp *tp, float *g, float *scratch, size_t n, int rep) {
    if (alone(tp) || rep < 2) return LOOM_OK;
    LOOM_TRY(loom_comm_allgather_as(tp->comm, g, scratch, n, LOOM_F32));
    const int first = tp->rank / rep * rep;
    loom_tensor_copy(tp->dev, g, scratch + (size_t)first * n, n);
    for (int r = first + 1; r < first + rep; r++) loom_tensor_add(tp->dev, g, scratch + (size_t)r * n, n);
    return LOOM_OK;
}

static loom_status gather_rows(const loom_tp *tp, const float *x_l, float *x, size_t n_l) {
    if (alone(tp)) {
        if (x != x_l) loom_tensor_copy(tp->dev, x, x_l, n_l);
        return LOOM_OK;
    }
    return loom_comm_allgather_as(tp->comm, x_l, x, n_l, wire(tp));
}

static loom_status scatter_sum(const loom_tp *tp, const float *x, float *x_l, size_t n_l) {
    if (alone(tp)) {
        if (x != x_l) loom_tensor_copy(tp->dev, x_l, x, n_l);
        return LOOM_OK;
    }
    return loom_comm_reduce_scatter_as(tp->comm, x, x_l, n_l, wire(tp), LOOM_SUM);
}

loom_status loom_sp_gather_fwd(const loom_tp *tp, const float *x_l, float *x, size_t n_l) {
    return gather_rows(tp, x_l, x, n_l);
}
loom_status loom_sp_gather_bwd(const loom_tp *tp, const float *dx, float *dx_l, size_t n_l) {
    return scatter_sum(tp, dx, dx_l, n_l);
}
loom_status loom_sp_reduce_scatter_fwd(const loom_tp *tp, const float *x, float *x_l, size_t n_l) {
    return scatter_sum(tp, x, x_l, n_l);
}
loom_status loom_sp_reduce_scatter_bwd(const loom_tp *tp, const float *dx_l, float *dx, size_t n_l) {
    return gather_rows(tp, dx_l, dx, n_l);
}

loom_status loom_tp_allreduce(const loom_tp *tp, float *x, size_t n, loom_redop op) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce(tp->comm, x, n, LOOM_F32, op);
}
