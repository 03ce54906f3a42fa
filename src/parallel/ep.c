/* ep.c - the expert-parallel dispatch / combine region (include/loom/ep.h):
 * the alltoall of the row counts, the alltoallv of the rows themselves
 * (blocking, or dispatch's started so that the local experts compute while
 * it flies) and the reordering between source-major (as received) and
 * expert-major (as the experts read them). Axis: ep. loom_ep_counts, loom_ep_dispatch and
 * loom_ep_combine are collective over the EP group; with no group they copy.
 */
#include "loom/ep.h"

#include <string.h>

#include "loom/device.h"

loom_status loom_ep_counts(const loom_ep *ep, const int32_t *start, loom_ep_routes *r, loom_ep_tally *t) {
    const int P = ep->size, El = ep->n_local, E = P * El;
    int32_t *sent = ep->sent; /* host: counts go to MPI as counts */
    r->start = start;
    for (int e = 0; e < E; e++) sent[e] = start[e + 1] - start[e];
    if (ep->comm) {
        double t0 = loom_comm_wtime();
        /* the counts are host memory: the group's host side */
        LOOM_TRY(loom_comm_alltoall(loom_comm_host(ep->comm), sent, r->rc, (size_t)El * sizeof(int32_t)));
        if (t) {
            t->seconds += loom_comm_wtime() - t0;
            t->bytes += (int64_t)P * El * (int64_t)sizeof(int32_t);
        }
    } else {
        memcpy(r->rc, sent, (size_t)E * sizeof(int32_t));
    }
    int32_t o = 0;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < El; j++) {
            r->soff[s * El + j] = o;
            o += r->rc[s * El + j];
        }
    o = 0;
    for (int j = 0; j < El; j++) {
        r->estart[j] = o;
        for (int s = 0; s < P; s++) {
            r->eoff[s * El + j] = o;
            o += r->rc[s * El + j];
        }
    }
    r->estart[El] = o;
    return LOOM_OK;
}

/* The byte counts and displacements (ep->a2a) of one alltoallv of rows of
 * `width` floats: to_experts sends each rank the rows of its experts
 * (destination-major) and receives its own experts' rows source-major;
 * !to_experts sends those back. Returns the bytes sent. */
static size_t plan_exchange(const loom_ep *ep, const loom_ep_routes *r, int width, int to_experts) {
    const int P = ep->size, El = ep->n_local;
    size_t *sb = ep->a2a, *sd = sb + P, *rb = sd + P, *rd = rb + P;
    size_t fl = (size_t)width * sizeof(float), so = 0, ro = 0;
    for (int q = 0; q < P; q++) {
        size_t mine = (size_t)(r->start[(q + 1) * El] - r->start[q * El]), theirs = 0;
        for (int j = 0; j < El; j++) theirs += (size_t)r->rc[q * El + j];
        sb[q] = (to_experts ? mine : theirs) * fl;
        rb[q] = (to_experts ? theirs : mine) * fl;
        sd[q] = so;
        rd[q] = ro;
        so += sb[q];
        ro += rb[q];
    }
    return so;
}

/* One alltoallv as plan_exchange describes it; with no group a copy. With
 * req, started (*req; NULL with no group) rather than run. */
static loom_status exchange(const loom_ep *ep, const loom_ep_routes *r, const float *send, float *recv,
                            int width, int to_experts, loom_ep_tally *t, loom_req **req) {
    const int P = ep->size;
    size_t *sb = ep->a2a, *sd = sb + P, *rb = sd + P, *rd = rb + P;
    size_t so = plan_exchange(ep, r, width, to_experts);
    if (req) *req = NULL;
    if (!ep->comm) {
        loom_tensor_copy(ep->dev, recv, send, so / sizeof(float));
        return LOOM_OK;
    }
    double t0 = loom_comm_wtime();
    if (req) LOOM_TRY(loom_comm_ialltoallv(ep->comm, send, sb, sd, recv, rb, rd, req));
    else LOOM_TRY(loom_comm_alltoallv(ep->comm, send, sb, sd, recv, rb, rd));
    if (t) {
        t->seconds += loom_comm_wtime() - t0;
        t->bytes += (int64_t)so;
    }
    return LOOM_OK;
}

/* Rows between source-major and expert-major order; the blocks of source
 * `skip` (-1: none) are left alone. */
static void permute(const loom_ep *ep, const loom_ep_routes *r, const float *src, float *dst, int width,
                    int to_expert_major, int skip) {
    const int P = ep->size, El = ep->n_local;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < El; j++) {
            if (s == skip) continue;
            size_t n = (size_t)r->rc[s * El + j], so = (size_t)r->soff[s * El + j],
                   eo = (size_t)r->eoff[s * El + j];
            size_t from = to_expert_major ? so : eo, to = to_expert_major ? eo : so;
            loom_tensor_copy(ep->dev, dst + to * width, src + from * width, n * width);
        }
}

loom_status loom_ep_dispatch(const loom_ep *ep, const loom_ep_routes *r, const float *rows, float *recv,
                             float *out, int width, loom_ep_tally *t) {
    LOOM_TRY(exchange(ep, r, rows, recv, width, 1, t, NULL));
    permute(ep, r, recv, out, width, 1, -1);
    return LOOM_OK;
}

loom_status loom_ep_dispatch_start(const loom_ep *ep, const loom_ep_routes *r, const float *rows, float *recv,
                                   float *out, int width, loom_ep_tally *t, loom_req **req) {
    const int El = ep->n_local, me = ep->rank;
    LOOM_TRY(exchange(ep, r, rows, recv, width, 1, t, req));
    if (!*req) { /* no group: copied already, every row is this rank's own */
        permute(ep, r, recv, out, width, 1, -1);
        return LOOM_OK;
    }
    if (t) t->overlapped++;
    /* this rank's own rows, straight from the sender's order (expert-major
     * over the global experts) to theirs in out */
    for (int j = 0; j < El; j++)
        loom_tensor_copy(ep->dev, out + (size_t)r->eoff[me * El + j] * width,
                         rows + (size_t)r->start[me * El + j] * width, (size_t)r->rc[me * El + j] * width);
    return LOOM_OK;
}

loom_status loom_ep_dispatch_finish(const loom_ep *ep, const loom_ep_routes *r, const float *recv, float *out,
                                    int width, loom_ep_tally *t, loom_req *req) {
    if (!req) return LOOM_OK; /* no group: _start did it all */
    double t0 = loom_comm_wtime();
    LOOM_TRY(loom_comm_wait(req));
    if (t) t->seconds += loom_comm_wtime() - t0;
    permute(ep, r, recv, out, width, 1, ep->rank);
    return LOOM_OK;
}

loom_status loom_ep_combine(const loom_ep *ep, const loom_ep_routes *r, const float *in, float *send,
                            float *rows, int width, loom_ep_tally *t) {
    permute(ep, r, in, send, width, 0, -1);
    return exchange(ep, r, send, rows, width, 0, t, NULL);
}
