/* dp.c - plain data parallelism: the gradient all-reduce over the DP group.
 * Axis: dp. Collective over dp: loom_dp_grad_sync. At degree 1 it is the
 * identity and issues no communication, so the single-device run is the same
 * code path. */
#include "loom/comm.h"
#include "loom/train.h"

loom_status loom_dp_grad_sync(loom_comm *dp, float *grads, size_t n) {
    if (loom_comm_size(dp) == 1) return LOOM_OK;
    return loom_comm_allreduce(dp, grads, n, LOOM_F32, LOOM_SUM);
}

loom_status loom_comm_agree(loom_comm *world, loom_status local) {
    int worst = (int)local;
    loom_status st = loom_comm_allreduce(world, &worst, 1, LOOM_I32, LOOM_MAX);
    if (st != LOOM_OK) return st;
    if (worst == LOOM_OK) return LOOM_OK;
    /* the lowest failing rank keeps its message; the others stay quiet */
    int me = local != LOOM_OK ? loom_comm_rank(world) : 1 << 30;
    int first = me;
    st = loom_comm_allreduce(world, &first, 1, LOOM_I32, LOOM_MIN);
    if (st != LOOM_OK) return st;
    if (me != first) loom_fail((loom_status)worst, "%s", "");
    return (loom_status)worst;
}
