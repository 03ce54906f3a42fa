/* comm_wire.c - the bf16 wire format (comm.h: loom_comm_*_as), above the
 * implementations, and the buffer pools it and the staged implementation
 * keep. Collective as the calls it makes; reserve is local.
 *
 * An fp32 tensor sent as bf16: packed (round to nearest even, the group's
 * memory ops) into a wire buffer of the group, the op run on LOOM_BF16 in
 * that buffer - so the implementation sums it as LOOM_BF16 always is, every
 * partial sum rounded - and unpacked into the fp32 destination when the op
 * completes (at once for a blocking call, in wait / test for a started one).
 * The wire buffers belong to the group: reserved up front
 * (loom_comm_reserve_wire), each held by one call from its start to its
 * completion, so calls in flight at once never share one. The bytes counted
 * are those of the bf16 call (half the fp32 ones); packing is not
 * communication and is not timed.
 */
#include "loom/comm.h"

#include <stdlib.h>

#include "comm/comm_impl.h"

/* ---- pools ------------------------------------------------------------------------- */

/* The smallest free buffer of at least `bytes`, or -1. */
static int best_free(const loom_comm_pool *pl, size_t bytes) {
    int best = -1;
    for (int i = 0; i < pl->n; i++)
        if (!pl->b[i].busy && pl->b[i].cap >= bytes && (best < 0 || pl->b[i].cap < pl->b[best].cap)) best = i;
    return best;
}

/* A new free buffer of `bytes` at the end, or -1 (LOOM_EOS set). */
static int pool_add(loom_comm_pool *pl, size_t bytes) {
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 4;
        loom_comm_buf *b = realloc(pl->b, (size_t)cap * sizeof *b);
        if (!b) {
            loom_fail(LOOM_EOS, "out of memory for a buffer table");
            return -1;
        }
        pl->b = b;
        pl->cap = cap;
    }
    void *p = pl->alloc(pl->ctx, bytes ? bytes : 1);
    if (!p) {
        loom_fail(LOOM_EOS, "no memory for a %zu-byte communication buffer", bytes);
        return -1;
    }
    pl->b[pl->n] = (loom_comm_buf){.p = p, .cap = bytes};
    return pl->n++;
}

int loom_comm_pool_take(loom_comm_pool *pl, size_t bytes) {
    int i = best_free(pl, bytes);
    if (i < 0) {
        i = pool_add(pl, bytes);
        if (i < 0) return -1;
        pl->grown++;
    }
    pl->b[i].busy = 1;
    return i;
}

void loom_comm_pool_give(loom_comm_pool *pl, int i) { pl->b[i].busy = 0; }

loom_status loom_comm_pool_reserve(loom_comm_pool *pl, size_t bytes, int buffers) {
    int have = 0;
    for (int i = 0; i < pl->n; i++) have += pl->b[i].cap >= bytes;
    for (; have < buffers; have++)
        if (pool_add(pl, bytes) < 0) return LOOM_EOS;
    return LOOM_OK;
}

void loom_comm_pool_free(loom_comm_pool *pl) {
    for (int i = 0; i < pl->n; i++) pl->free(pl->ctx, pl->b[i].p, pl->b[i].cap);
    free(pl->b);
    *pl = (loom_comm_pool){.alloc = pl->alloc, .free = pl->free, .ctx = pl->ctx};
}

/* ---- reserving ------------------------------------------------------------------------ */

loom_status loom_comm_reserve_wire(loom_comm *c, size_t count, int buffers) {
    const size_t bytes = count * loom_dtype_size(LOOM_BF16);
    LOOM_TRY(loom_comm_pool_reserve(&c->wire, bytes, buffers));
    return c->ops->reserve ? c->ops->reserve(c, bytes, buffers) : LOOM_OK;
}

size_t loom_comm_wire_grown(const loom_comm *c) { return c->wire.grown; }

size_t loom_comm_wire_bytes(const loom_comm *c) {
    size_t s = 0;
    for (int i = 0; i < c->wire.n; i++) s += c->wire.b[i].cap;
    return s;
}

/* ---- the calls ---------------------------------------------------------------------------- */

/* wire must be LOOM_F32 or LOOM_BF16, and a bf16 reduction a sum (the
 * plain call's message; refused before anything is packed). */
static loom_status check_wire(const loom_comm *c, loom_comm_op op, loom_dtype wire, loom_redop rop) {
    if (wire != LOOM_F32 && wire != LOOM_BF16)
        return loom_fail(LOOM_EINTERNAL, "rank %d: %s on group %s: wire format %d is not f32 or bf16",
                         c->world_rank, loom_comm_op_name(op), c->name, (int)wire);
    if (wire == LOOM_BF16 && op != LOOM_OP_ALLGATHER && rop != LOOM_SUM)
        return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s: bf16 reductions support only the sum",
                         c->world_rank, loom_comm_op_name(op), c->name);
    return LOOM_OK;
}

/* A wire buffer of n bf16 values for a call of `count` (checked first, as
 * the plain call would: nothing is allocated for a call it refuses): *i its
 * index, *h the buffer. */
static loom_status wire_take(loom_comm *c, loom_comm_op op, size_t count, size_t n, int *i, uint16_t **h) {
    LOOM_TRY(loom_comm_check_count(c, op, "count", -1, count));
    *i = loom_comm_pool_take(&c->wire, n * sizeof **h);
    if (*i < 0) return LOOM_EOS;
    *h = c->wire.b[*i].p;
    return LOOM_OK;
}

/* After a blocking call on wire buffer i: the result back into dst (n
 * values) when it succeeded; the buffer given back. */
static loom_status wire_done(loom_comm *c, int i, loom_status st, float *dst, size_t n) {
    if (st == LOOM_OK) c->mem.unpack_bf16(c->mem.ctx, dst, c->wire.b[i].p, n);
    loom_comm_pool_give(&c->wire, i);
    return st;
}

/* After a start on wire buffer i: the request converts back at completion. */
static loom_status wire_started(loom_comm *c, int i, loom_status st, loom_req *r, float *dst, size_t n) {
    if (st != LOOM_OK) {
        loom_comm_pool_give(&c->wire, i);
        return st;
    }
    r->wire = i;
    r->unpack_to = dst;
    r->unpack_n = n;
    return LOOM_OK;
}

void loom_comm_wire_finish(loom_req *r, int ok) {
    loom_comm *c = r->c;
    if (ok) c->mem.unpack_bf16(c->mem.ctx, r->unpack_to, c->wire.b[r->wire].p, r->unpack_n);
    loom_comm_pool_give(&c->wire, r->wire);
    r->wire = -1;
}

loom_status loom_comm_allreduce_as(loom_comm *c, float *x, size_t count, loom_dtype wire, loom_redop op) {
    LOOM_TRY(check_wire(c, LOOM_OP_ALLREDUCE, wire, op));
    if (wire == LOOM_F32) return loom_comm_allreduce(c, x, count, LOOM_F32, op);
    int i = -1;
    uint16_t *h = NULL;
    LOOM_TRY(wire_take(c, LOOM_OP_ALLREDUCE, count, count, &i, &h));
    c->mem.pack_bf16(c->mem.ctx, h, x, count);
    return wire_done(c, i, loom_comm_allreduce(c, h, count, LOOM_BF16, op), x, count);
}

loom_status loom_comm_iallreduce_as(loom_comm *c, float *x, size_t count, loom_dtype wire, loom_redop op,
                                    loom_req **req) {
    *req = NULL;
    LOOM_TRY(check_wire(c, LOOM_OP_ALLREDUCE, wire, op));
    if (wire == LOOM_F32) return loom_comm_iallreduce(c, x, count, LOOM_F32, op, req);
    int i = -1;
    uint16_t *h = NULL;
    LOOM_TRY(wire_take(c, LOOM_OP_ALLREDUCE, count, count, &i, &h));
    c->mem.pack_bf16(c->mem.ctx, h, x, count);
    loom_status st = loom_comm_iallreduce(c, h, count, LOOM_BF16, op, req);
    return wire_started(c, i, st, *req, x, count);
}

/* reduce_scatter: send's size * count_per_rank values packed, reduced in
 * place in the wire buffer (the result at its start), count_per_rank
 * values unpacked into recv. */
loom_status loom_comm_reduce_scatter_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                        loom_dtype wire, loom_redop op) {
    LOOM_TRY(check_wire(c, LOOM_OP_REDUCE_SCATTER, wire, op));
    if (wire == LOOM_F32) return loom_comm_reduce_scatter(c, send, recv, count_per_rank, LOOM_F32, op);
    const size_t n = count_per_rank * (size_t)c->size;
    int i = -1;
    uint16_t *h = NULL;
    LOOM_TRY(wire_take(c, LOOM_OP_REDUCE_SCATTER, count_per_rank, n, &i, &h));
    c->mem.pack_bf16(c->mem.ctx, h, send, n);
    loom_status st = loom_comm_reduce_scatter(c, h, h, count_per_rank, LOOM_BF16, op);
    return wire_done(c, i, st, recv, count_per_rank);
}

loom_status loom_comm_ireduce_scatter_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                         loom_dtype wire, loom_redop op, loom_req **req) {
    *req = NULL;
    LOOM_TRY(check_wire(c, LOOM_OP_REDUCE_SCATTER, wire, op));
    if (wire == LOOM_F32) return loom_comm_ireduce_scatter(c, send, recv, count_per_rank, LOOM_F32, op, req);
    const size_t n = count_per_rank * (size_t)c->size;
    int i = -1;
    uint16_t *h = NULL;
    LOOM_TRY(wire_take(c, LOOM_OP_REDUCE_SCATTER, count_per_rank, n, &i, &h));
    c->mem.pack_bf16(c->mem.ctx, h, send, n);
    loom_status st = loom_comm_ireduce_scatter(c, h, h, count_per_rank, LOOM_BF16, op, req);
    return wire_started(c, i, st, *req, recv, count_per_rank);
}

/* allgather: this rank's count_per_rank values packed at its block of the
 * wire buffer, gathered in place there, every rank's block unpacked into recv. */
loom_status loom_comm_allgather_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                   loom_dtype wire) {
    LOOM_TRY(check_wire(c, LOOM_OP_ALLGATHER, wire, LOOM_SUM));
    if (wire == LOOM_F32) return loom_comm_allgather(c, send, recv, count_per_rank * sizeof(float));
    const size_t n = count_per_rank * (size_t)c->size, mine = count_per_rank * (size_t)c->rank;
    int i = -1;
    uint16_t *h = NULL;
    LOOM_TRY(wire_take(c, LOOM_OP_ALLGATHER, count_per_rank * sizeof *h, n, &i, &h));
    c->mem.pack_bf16(c->mem.ctx, h + mine, send, count_per_rank);
    loom_status st = loom_comm_allgather(c, h + mine, h, count_per_rank * sizeof *h);
    return wire_done(c, i, st, recv, n);
}

loom_status loom_comm_iallgather_as(loom_comm *c, const float *send, float *recv, size_t count_per_rank,
                                    loom_dtype wire, loom_req **req) {
    *req = NULL;
    LOOM_TRY(check_wire(c, LOOM_OP_ALLGATHER, wire, LOOM_SUM));
    if (wire == LOOM_F32) return loom_comm_iallgather(c, send, recv, count_per_rank * sizeof(float), req);
    const size_t n = count_per_rank * (size_t)c->size, mine = count_per_rank * (size_t)c->rank;
    int i = -1;
    uint16_t *h = NULL;
    LOOM_TRY(wire_take(c, LOOM_OP_ALLGATHER, count_per_rank * sizeof *h, n, &i, &h));
    c->mem.pack_bf16(c->mem.ctx, h + mine, send, count_per_rank);
    loom_status st = loom_comm_iallgather(c, h + mine, h, count_per_rank * sizeof *h, req);
    return wire_started(c, i, st, *req, recv, n);
}
