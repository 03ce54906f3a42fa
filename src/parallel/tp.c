/* tp.c - tensor- and sequence-parallel regions (see parallel.h). Axis: tp.
 * Every function is collective over the TP group, and the identity (or a
 * copy) when the group has one rank.
 *
 * With tp->comm_bf16 the activation collectives go through one bf16 host
 * buffer (tp16), which grows to the largest message seen - the first step
 * allocates it, later steps reuse it; the collectives are blocking and made
 * by the compute thread one at a time, so one buffer serves every part.
 */
#include "loom/parallel.h"

#include <stdlib.h>

#include "loom/device.h"

static uint16_t *tp16;
static size_t tp16_cap;

static int alone(const loom_tp *tp) { return tp->size == 1 || !tp->comm; }

/* tp16 holding at least n values, or NULL with the failure set. */
static uint16_t *bf16_buffer(size_t n) {
    if (n > tp16_cap) {
        uint16_t *p = realloc(tp16, n * sizeof *p);
        if (!p) {
            loom_fail(LOOM_EOS, "out of memory for a %zu-value bf16 TP buffer", n);
            return NULL;
        }
        tp16 = p;
        tp16_cap = n;
    }
    return tp16;
}

/* x (n floats) summed over tp in place: fp32, or through bf16. */
static loom_status sum_all(const loom_tp *tp, float *x, size_t n) {
    if (alone(tp)) return LOOM_OK;
    if (!tp->comm_bf16) return loom_comm_allreduce(tp->comm, x, n, LOOM_F32, LOOM_SUM);
    uint16_t *h = bf16_buffer(n);
    if (!h) return LOOM_EOS;
    loom_bf16_pack(tp->dev, h, x, n);
    LOOM_TRY(loom_comm_allreduce(tp->comm, h, n, LOOM_BF16, LOOM_SUM));
    loom_bf16_unpack(tp->dev, x, h, n);
    return LOOM_OK;
}

loom_status loom_tp_copy_bwd(const loom_tp *tp, float *dx, size_t n) { return sum_all(tp, dx, n); }

loom_status loom_tp_reduce_fwd(const loom_tp *tp, float *x, size_t n) { return sum_all(tp, x, n); }

loom_status loom_tp_grad_allreduce(const loom_tp *tp, float *g, size_t n) {
    return alone(tp) ? LOOM_OK : loom_comm_allreduce(tp->comm, g, n, LOOM_F32, LOOM_SUM);
}

static loom_status gather_rows(const loom_tp *tp, const float *x_l, float *x, size_t n_l) {
    if (alone(tp)) {
        if (x != x_l) loom_tensor_copy(tp->dev, x, x_l, n_l);
        return LOOM_OK;
    }
    if (!tp->comm_bf16) return loom_comm_allgather(tp->comm, x_l, x, n_l * sizeof(float));
    const size_t n = n_l * (size_t)tp->size, mine = n_l * (size_t)tp->rank;
    uint16_t *h = bf16_buffer(n);
    if (!h) return LOOM_EOS;
    loom_bf16_pack(tp->dev, h + mine, x_l, n_l);
    LOOM_TRY(loom_comm_allgather(tp->comm, h + mine, h, n_l * sizeof *h));
    loom_bf16_unpack(tp->dev, x, h, n);
    return LOOM_OK;
}

static loom_status scatter_sum(const loom_tp *tp, const float *x, float *x_l, size_t n_l) {
    if (alone(tp)) {
        if (x != x_l) loom_tensor_copy(tp->dev, x_l, x, n_l);
        return LOOM_OK;
    }
    if (!tp->comm_bf16) return loom_comm_reduce_scatter(tp->comm, x, x_l, n_l, LOOM_F32, LOOM_SUM);
    const size_t n = n_l * (size_t)tp->size;
    uint16_t *h = bf16_buffer(n);
    if (!h) return LOOM_EOS;
    loom_bf16_pack(tp->dev, h, x, n);
    LOOM_TRY(loom_comm_reduce_scatter(tp->comm, h, h, n_l, LOOM_BF16, LOOM_SUM));
    loom_bf16_unpack(tp->dev, x_l, h, n_l);
    return LOOM_OK;
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
