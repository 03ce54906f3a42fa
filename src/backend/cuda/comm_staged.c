/* comm_staged.c - device-buffer collectives through MPI with host staging
 * (comm_staged.h). Each op: one d2h copy of what this rank contributes, the
 * loom_comm op on the host copy (in place where comm.h allows it), one h2d
 * copy of the result. Nothing else is communicated, so the group's stats
 * hold exactly the op's bytes. A failed copy returns its status before the
 * collective, on that rank only: as for any failure not agreed, the caller
 * aborts the job (the trainer calls loom_comm_abort), so no rank waits. */
#include "comm_staged.h"

#include <stdlib.h>

#include "cuda_backend.h"

static _Thread_local void *g_host;
static _Thread_local size_t g_cap;

/* This thread's staging buffer of at least `bytes`, or NULL (message set). */
static void *stage(loom_comm *c, size_t bytes) {
    if (bytes > g_cap || !g_host) {
        void *p = realloc(g_host, bytes ? bytes : 1);
        if (!p) {
            loom_fail(LOOM_EOS, "rank %d: no memory for a %zu-byte staging buffer (group %s)", loom_comm_rank(c),
                      bytes, loom_comm_name(c));
            return NULL;
        }
        g_host = p;
        g_cap = bytes;
    }
    return g_host;
}

void loom_staged_release(void) {
    free(g_host);
    g_host = NULL;
    g_cap = 0;
}

/* d2h of `bytes` from dsrc into the staging buffer (`total` bytes) at `off`. */
static loom_status copy_in(loom_comm *c, char **host, size_t total, size_t off, const void *dsrc, size_t bytes) {
    *host = stage(c, total);
    if (!*host) return LOOM_EOS;
    return loom_cuda_memcpy_d2h(*host + off, dsrc, bytes);
}

loom_status loom_staged_allreduce(loom_comm *c, void *dbuf, size_t count, loom_dtype t, loom_redop op) {
    size_t bytes = count * loom_dtype_size(t);
    char *h = NULL;
    LOOM_TRY(copy_in(c, &h, bytes, 0, dbuf, bytes));
    LOOM_TRY(loom_comm_allreduce(c, h, count, t, op));
    return loom_cuda_memcpy_h2d(dbuf, h, bytes);
}

loom_status loom_staged_reduce_scatter(loom_comm *c, const void *dsend, void *drecv, size_t count_per_rank,
                                       loom_dtype t, loom_redop op) {
    size_t part = count_per_rank * loom_dtype_size(t), total = part * (size_t)loom_comm_size(c);
    char *h = NULL;
    LOOM_TRY(copy_in(c, &h, total, 0, dsend, total));
    LOOM_TRY(loom_comm_reduce_scatter(c, h, h, count_per_rank, t, op)); /* in place: result at the start */
    return loom_cuda_memcpy_h2d(drecv, h, part);
}

loom_status loom_staged_allgather(loom_comm *c, const void *dsend, void *drecv, size_t bytes_per_rank) {
    size_t off = bytes_per_rank * (size_t)loom_comm_rank(c), total = bytes_per_rank * (size_t)loom_comm_size(c);
    char *h = NULL;
    LOOM_TRY(copy_in(c, &h, total, off, dsend, bytes_per_rank));
    LOOM_TRY(loom_comm_allgather(c, h + off, h, bytes_per_rank)); /* in place */
    return loom_cuda_memcpy_h2d(drecv, h, total);
}

loom_status loom_staged_alltoall(loom_comm *c, const void *dsend, void *drecv, size_t bytes_per_rank) {
    size_t total = bytes_per_rank * (size_t)loom_comm_size(c);
    char *h = NULL;
    LOOM_TRY(copy_in(c, &h, 2 * total, 0, dsend, total)); /* [send | recv] */
    LOOM_TRY(loom_comm_alltoall(c, h, h + total, bytes_per_rank));
    return loom_cuda_memcpy_h2d(drecv, h + total, total);
}

/* The bytes spanned by blocks (displ[p], bytes[p]). */
static size_t span(const size_t *bytes, const size_t *displ, int n) {
    size_t end = 0;
    for (int p = 0; p < n; p++)
        if (bytes[p] && displ[p] + bytes[p] > end) end = displ[p] + bytes[p];
    return end;
}

loom_status loom_staged_alltoallv(loom_comm *c, const void *dsend, const size_t *send_bytes,
                                  const size_t *send_displ, void *drecv, const size_t *recv_bytes,
                                  const size_t *recv_displ) {
    int n = loom_comm_size(c);
    size_t sspan = span(send_bytes, send_displ, n), rspan = span(recv_bytes, recv_displ, n);
    char *h = NULL;
    LOOM_TRY(copy_in(c, &h, sspan + rspan, 0, dsend, sspan)); /* [send span | recv span] */
    LOOM_TRY(loom_comm_alltoallv(c, h, send_bytes, send_displ, h + sspan, recv_bytes, recv_displ));
    /* only the received blocks: bytes between them in drecv stay as they were */
    for (int p = 0; p < n; p++)
        if (recv_bytes[p]) LOOM_TRY(loom_cuda_memcpy_h2d((char *)drecv + recv_displ[p], h + sspan + recv_displ[p], recv_bytes[p]));
    return LOOM_OK;
}

loom_status loom_staged_bcast(loom_comm *c, void *dbuf, size_t bytes, int root) {
    char *h = NULL;
    if (loom_comm_rank(c) == root) LOOM_TRY(copy_in(c, &h, bytes, 0, dbuf, bytes));
    else LOOM_TRY(copy_in(c, &h, bytes, 0, dbuf, 0));
    LOOM_TRY(loom_comm_bcast(c, h, bytes, root));
    return loom_cuda_memcpy_h2d(dbuf, h, bytes);
}

loom_status loom_staged_send(loom_comm *c, const void *dbuf, size_t bytes, int peer, int tag) {
    char *h = NULL;
    LOOM_TRY(copy_in(c, &h, bytes, 0, dbuf, bytes));
    return loom_comm_send(c, h, bytes, peer, tag);
}

loom_status loom_staged_recv(loom_comm *c, void *dbuf, size_t bytes, int peer, int tag) {
    char *h = stage(c, bytes);
    if (!h) return LOOM_EOS;
    LOOM_TRY(loom_comm_recv(c, h, bytes, peer, tag));
    return loom_cuda_memcpy_h2d(dbuf, h, bytes);
}
