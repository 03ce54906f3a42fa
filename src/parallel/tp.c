/* tp.c - tensor- and sequence-parallel regions (see parallel.h). Axis: tp.
 * Every function is collective over the TP group, and the identity (or a
 * copy) when the group has one rank. */
#include "loom/parallel.h"

#include "loom/backend.h"

static int alone(const loom_tp *tp) { return tp->size == 1 || !tp->comm; }

loom_status loom_tp_copy_bwd(const loom_tp *tp, float *dx, size_t n) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce(tp->comm, dx, n, LOOM_F32, LOOM_SUM);
}

loom_status loom_tp_reduce_fwd(const loom_tp *tp, float *x, size_t n) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce(tp->comm, x, n, LOOM_F32, LOOM_SUM);
}

loom_status loom_tp_grad_allreduce(const loom_tp *tp, float *g, size_t n) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce(tp->comm, g, n, LOOM_F32, LOOM_SUM);
}

static loom_status gather_rows(const loom_tp *tp, const float *x_l, float *x, size_t n_l) {
    if (alone(tp)) {
        if (x != x_l) loom_tensor_copy(x, x_l, n_l);
        return LOOM_OK;
    }
    return loom_comm_allgather(tp->comm, x_l, x, n_l * sizeof(float));
}

static loom_status scatter_sum(const loom_tp *tp, const float *x, float *x_l, size_t n_l) {
    if (alone(tp)) {
        if (x != x_l) loom_tensor_copy(x_l, x, n_l);
        return LOOM_OK;
    }
    return loom_comm_reduce_scatter(tp->comm, x, x_l, n_l, LOOM_F32, LOOM_SUM);
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
