/* test_comm_wire.c - the bf16 wire format (comm.h: loom_comm_*_as) against
 * packing by hand: for allreduce, reduce_scatter (in and out of place) and
 * allgather (in and out of place), blocking, started + wait and started +
 * test, the fp32 result must equal bit for bit loom_bf16_pack -> the same
 * call on LOOM_BF16 (blocking or started alike: MPI may order the partial
 * sums of the two differently) -> loom_bf16_unpack (what tp.c and dp.c did
 * before the communicator did it), and the call must count exactly what the hand-packed
 * call counts (its bf16 bytes). A LOOM_F32 wire is the plain fp32 call. The
 * wire buffers: reserved ones are reused (no call allocates), calls in
 * flight at once hold one each, a call that finds none free allocates one
 * that is kept. Refusals: a bf16 max, an unknown wire type - the destination
 * untouched. Collective over the world: run under scripts/loomrun -np N.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_test.h"
#include "loom/bf16.h"
#include "loom/comm.h"
#include "cpu_device.h"
#include "loom/kernels.h"

/* the reference packing: the CPU device's kernels, as tp.c and dp.c packed */
static loom_device *ref_dev;

static loom_comm *W;
static int rank, n;

/* values with every mantissa bit in play, so rounding to bf16 matters */
static void fill(float *x, size_t count, int salt) {
    uint32_t s = 2654435761u * (uint32_t)(rank * 131 + salt + 1);
    for (size_t i = 0; i < count; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + (i % 7));
    }
}

/* The calls and bytes of op since `before` equal those of `want`. */
static void same_counts(const loom_comm_stats *before, const loom_comm_stats *mid, loom_comm_op op,
                        const char *what) {
    const loom_comm_stats *s = loom_comm_get_stats(W);
    CHECK(s->calls[op] - mid->calls[op] == mid->calls[op] - before->calls[op] &&
              s->bytes[op] - mid->bytes[op] == mid->bytes[op] - before->bytes[op],
          "%s: the wire call counted %llu calls %llu bytes, the hand-packed one %llu calls %llu bytes", what,
          (unsigned long long)(s->calls[op] - mid->calls[op]),
          (unsigned long long)(s->bytes[op] - mid->bytes[op]),
          (unsigned long long)(mid->calls[op] - before->calls[op]),
          (unsigned long long)(mid->bytes[op] - before->bytes[op]));
}

/* Finish a started call: wait (mode 1) or test until done (mode 2). */
static loom_status finish(loom_req *r, int mode) {
    if (mode == 1) return loom_comm_wait(r);
    int done = 0;
    loom_status st = LOOM_OK;
    while (st == LOOM_OK && !done) st = loom_comm_test(r, &done);
    return st;
}

enum { PER = 333 };

/* allreduce of PER values: mode 0 blocking, 1 start + wait, 2 start + test */
static void test_allreduce(int mode) {
    float *x = malloc(PER * sizeof *x), *ref = malloc(PER * sizeof *ref);
    uint16_t *h = malloc(PER * sizeof *h);
    fill(x, PER, 1);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_bf16_pack(ref_dev, h, x, PER);
    loom_req *hr = NULL; /* blocking or started as the wire call: MPI may sum them in another order */
    CHECK((mode ? loom_comm_iallreduce(W, h, PER, LOOM_BF16, LOOM_SUM, &hr)
                : loom_comm_allreduce(W, h, PER, LOOM_BF16, LOOM_SUM)) == LOOM_OK &&
              loom_comm_wait(hr) == LOOM_OK,
          "hand allreduce");
    loom_bf16_unpack(ref_dev, ref, h, PER);
    loom_comm_stats mid = *loom_comm_get_stats(W);
    loom_status st;
    if (mode == 0) {
        st = loom_comm_allreduce_as(W, x, PER, LOOM_BF16, LOOM_SUM);
    } else {
        loom_req *r = NULL;
        st = loom_comm_iallreduce_as(W, x, PER, LOOM_BF16, LOOM_SUM, &r);
        if (st == LOOM_OK) st = finish(r, mode);
    }
    CHECK(st == LOOM_OK, "allreduce_as mode %d: %s", mode, loom_errmsg());
    CHECK(memcmp(x, ref, PER * sizeof *x) == 0, "allreduce_as mode %d differs from packing by hand", mode);
    same_counts(&before, &mid, LOOM_OP_ALLREDUCE, "allreduce_as");
    free(x), free(ref), free(h);
}

/* reduce_scatter: send n * PER values, PER results; in place or not */
static void test_reduce_scatter(int mode, int in_place) {
    const size_t total = PER * (size_t)n;
    float *x = malloc(total * sizeof *x), *out = malloc(PER * sizeof *out), *ref = malloc(PER * sizeof *ref);
    uint16_t *h = malloc(total * sizeof *h);
    fill(x, total, 2);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_bf16_pack(ref_dev, h, x, total);
    loom_req *hr = NULL;
    CHECK((mode ? loom_comm_ireduce_scatter(W, h, h, PER, LOOM_BF16, LOOM_SUM, &hr)
                : loom_comm_reduce_scatter(W, h, h, PER, LOOM_BF16, LOOM_SUM)) == LOOM_OK &&
              loom_comm_wait(hr) == LOOM_OK,
          "hand reduce_scatter");
    loom_bf16_unpack(ref_dev, ref, h, PER);
    loom_comm_stats mid = *loom_comm_get_stats(W);
    float *dst = in_place ? x : out;
    loom_status st;
    if (mode == 0) {
        st = loom_comm_reduce_scatter_as(W, x, dst, PER, LOOM_BF16, LOOM_SUM);
    } else {
        loom_req *r = NULL;
        st = loom_comm_ireduce_scatter_as(W, x, dst, PER, LOOM_BF16, LOOM_SUM, &r);
        if (st == LOOM_OK) st = finish(r, mode);
    }
    CHECK(st == LOOM_OK, "reduce_scatter_as mode %d: %s", mode, loom_errmsg());
    CHECK(memcmp(dst, ref, PER * sizeof *x) == 0,
          "reduce_scatter_as mode %d in place %d differs from packing by hand", mode, in_place);
    same_counts(&before, &mid, LOOM_OP_REDUCE_SCATTER, "reduce_scatter_as");
    free(x), free(out), free(ref), free(h);
}

/* allgather: PER values per rank; in place (send at recv + rank * PER) or not */
static void test_allgather(int mode, int in_place) {
    const size_t total = PER * (size_t)n, mine = PER * (size_t)rank;
    float *mine_x = malloc(PER * sizeof *mine_x), *all = calloc(total, sizeof *all),
          *ref = malloc(total * sizeof *ref);
    uint16_t *h = malloc(total * sizeof *h);
    fill(mine_x, PER, 3);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_bf16_pack(ref_dev, h + mine, mine_x, PER);
    CHECK(loom_comm_allgather(W, h + mine, h, PER * sizeof *h) == LOOM_OK, "hand allgather");
    loom_bf16_unpack(ref_dev, ref, h, total);
    loom_comm_stats mid = *loom_comm_get_stats(W);
    const float *src = mine_x;
    if (in_place) {
        memcpy(all + mine, mine_x, PER * sizeof *all);
        src = all + mine;
    }
    loom_status st;
    if (mode == 0) {
        st = loom_comm_allgather_as(W, src, all, PER, LOOM_BF16);
    } else {
        loom_req *r = NULL;
        st = loom_comm_iallgather_as(W, src, all, PER, LOOM_BF16, &r);
        if (st == LOOM_OK) st = finish(r, mode);
    }
    CHECK(st == LOOM_OK, "allgather_as mode %d: %s", mode, loom_errmsg());
    CHECK(memcmp(all, ref, total * sizeof *all) == 0,
          "allgather_as mode %d in place %d differs from packing by hand", mode, in_place);
    same_counts(&before, &mid, LOOM_OP_ALLGATHER, "allgather_as");
    free(mine_x), free(all), free(ref), free(h);
}

/* A LOOM_F32 wire is the plain call: same result, same bytes. */
static void test_f32_wire(void) {
    float *x = malloc(PER * sizeof *x), *ref = malloc(PER * sizeof *ref);
    fill(x, PER, 4);
    memcpy(ref, x, PER * sizeof *x);
    loom_comm_stats before = *loom_comm_get_stats(W);
    CHECK(loom_comm_allreduce(W, ref, PER, LOOM_F32, LOOM_SUM) == LOOM_OK, "plain allreduce");
    loom_comm_stats mid = *loom_comm_get_stats(W);
    CHECK(loom_comm_allreduce_as(W, x, PER, LOOM_F32, LOOM_SUM) == LOOM_OK, "f32 allreduce_as");
    CHECK(memcmp(x, ref, PER * sizeof *x) == 0, "f32 wire differs from the plain call");
    same_counts(&before, &mid, LOOM_OP_ALLREDUCE, "f32 allreduce_as");
    before = *loom_comm_get_stats(W);
    CHECK(loom_comm_allgather(W, x, ref, 0) == LOOM_OK, "empty allgather");
    mid = *loom_comm_get_stats(W);
    CHECK(loom_comm_allgather_as(W, x, ref, 0, LOOM_F32) == LOOM_OK, "empty f32 allgather_as");
    same_counts(&before, &mid, LOOM_OP_ALLGATHER, "f32 allgather_as");
    free(x), free(ref);
}

/* Reserved buffers serve calls in flight at once; a call that finds none
 * allocates one, which later calls reuse. */
static void test_reserve(void) {
    loom_comm *c = NULL;
    CHECK(loom_comm_split(W, 0, rank, "wire", &c) == LOOM_OK && c, "split: %s", loom_errmsg());
    if (!c) return;
    CHECK(loom_comm_reserve_wire(c, PER, 2) == LOOM_OK, "reserve: %s", loom_errmsg());
    CHECK(loom_comm_reserve_wire(c, PER / 2, 2) == LOOM_OK, "reserve again: %s", loom_errmsg());
    CHECK(loom_comm_wire_bytes(c) == 2 * PER * 2, "reserved %zu bytes, want %d", loom_comm_wire_bytes(c),
          4 * PER);
    float *x = malloc(3 * PER * sizeof *x);
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 3; k++) fill(x + k * PER, PER, 10 + k);
        loom_req *r[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++)
            CHECK(loom_comm_iallreduce_as(c, x + k * PER, PER, LOOM_BF16, LOOM_SUM, &r[k]) == LOOM_OK,
                  "start");
        CHECK(loom_comm_wire_grown(c) == (size_t)round, "round %d, two calls in flight: %zu buffers grown",
              round, loom_comm_wire_grown(c));
        /* a third in flight: no reserved buffer is free */
        CHECK(loom_comm_allreduce_as(c, x + 2 * PER, PER, LOOM_BF16, LOOM_SUM) == LOOM_OK, "third");
        CHECK(loom_comm_wire_grown(c) == 1, "round %d: %zu buffers grown, want 1 (then kept)", round,
              loom_comm_wire_grown(c));
        for (int k = 0; k < 2; k++) CHECK(loom_comm_wait(r[k]) == LOOM_OK, "wait: %s", loom_errmsg());
    }
    CHECK(loom_comm_wire_bytes(c) == 3 * PER * 2, "%zu bytes of wire buffers, want %d",
          loom_comm_wire_bytes(c), 6 * PER);
    free(x);
    loom_comm_free(c);
}

static void test_refusals(void) {
    float x[64], keep[64]; /* room for a reduce_scatter of 1 per rank */
    for (int i = 0; i < 64; i++) x[i] = 1.5f + (float)i;
    memcpy(keep, x, sizeof x);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status st = loom_comm_allreduce_as(W, x, 4, LOOM_BF16, LOOM_MAX);
    CHECK(st == LOOM_EUNAVAIL && strstr(loom_errmsg(), "bf16 reductions support only the sum"),
          "bf16 max: %d %s", st, loom_errmsg());
    loom_req *r = (loom_req *)x;
    st = loom_comm_ireduce_scatter_as(W, x, x, 1, LOOM_BF16, LOOM_MIN, &r);
    CHECK(st == LOOM_EUNAVAIL && r == NULL, "started bf16 min: %d, request %p", st, (void *)r);
    st = loom_comm_allreduce_as(W, x, 4, LOOM_F64, LOOM_SUM);
    CHECK(st == LOOM_EINTERNAL && strstr(loom_errmsg(), "wire format"), "f64 wire: %d %s", st, loom_errmsg());
    CHECK(memcmp(x, keep, sizeof x) == 0, "a refused call changed its destination");
    const loom_comm_stats *s = loom_comm_get_stats(W);
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        CHECK(s->calls[op] == before.calls[op], "a refused call counted");
}

int main(int argc, char **argv) {
    ref_dev = test_cpu_device(1, 0);
    if (!(W = comm_test_start(&argc, &argv))) return 1;
    rank = loom_comm_rank(W), n = loom_comm_size(W);
    for (int mode = 0; mode < 3; mode++) {
        test_allreduce(mode);
        for (int in_place = 0; in_place < 2; in_place++) {
            test_reduce_scatter(mode, in_place);
            test_allgather(mode, in_place);
        }
    }
    test_f32_wire();
    test_reserve();
    test_refusals();
    loom_device_free(ref_dev);
    return comm_test_end(W);
}
