/* test_ep_region.c - the expert-parallel dispatch / combine region (ep.h)
 * driven directly on P ranks (the world is the EP group; one rank: no group,
 * the copies of the single-device run). Every source sends every expert a
 * different number of rows (some none), each row naming its source, expert
 * and place, so that:
 *   - loom_ep_counts gives each owner the counts every source sent each of
 *     its experts, and the expert-major layout (estart) they sit in;
 *   - after loom_ep_dispatch each local expert's rows are contiguous,
 *     sources in rank order, each source's rows in its sending order;
 *   - loom_ep_dispatch_start / _finish give bitwise the same out, this
 *     rank's own rows already in place when the start returns;
 *   - loom_ep_combine of (rows + 0.5) brings every row back to its sender,
 *     in its sending order;
 *   - the tally counts what comm.h counts: the alltoall of P El int32 and
 *     the two alltoallv of A and R rows (this rank's own included); nothing
 *     without a group.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "loom/comm.h"
#include "loom/device.h"
#include "loom/ep.h"

enum { EL = 3, W = 5 };

/* Rows source s sends expert e: 0..3, some experts none. */
static int count(int s, int e) { return (s * 7 + e * 3) % 4; }

/* Column c of row i of (source s, expert e): exact in a float. */
static float cell(int s, int e, int i, int c) { return (float)(s * 100000 + e * 1000 + i * 10 + c); }

static void run(loom_device *dev, loom_comm *world) {
    const int P = loom_comm_size(world), r = loom_comm_rank(world), E = P * EL;
    size_t a2a_bytes, sent_bytes;
    loom_ep_scratch_bytes(P, EL, &a2a_bytes, &sent_bytes);
    loom_ep ep = {.dev = dev,
                  .comm = P > 1 ? world : NULL,
                  .size = P,
                  .rank = r,
                  .n_local = EL,
                  .a2a = malloc(a2a_bytes),
                  .sent = malloc(sent_bytes)};
    int32_t *start = malloc((size_t)(E + 1) * sizeof *start);
    start[0] = 0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + count(r, e);
    const int A = start[E];
    int R = 0;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < EL; j++) R += count(s, r * EL + j);
    float *rows = malloc(((size_t)A + 1) * W * sizeof *rows), *back = calloc((size_t)A + 1, W * sizeof *back);
    float *recv = malloc(((size_t)R + 1) * W * sizeof *recv),
          *out = malloc(((size_t)R + 1) * W * sizeof *out);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < count(r, e); i++)
            for (int c = 0; c < W; c++) rows[(size_t)(start[e] + i) * W + c] = cell(r, e, i, c);
    int32_t rc[64], soff[64], eoff[64], estart[EL + 1];
    loom_ep_routes rt = {.rc = rc, .soff = soff, .eoff = eoff, .estart = estart};
    loom_ep_tally t = {0, 0, 0};
    CHECK(loom_ep_counts(&ep, start, &rt, &t) == LOOM_OK, "counts: %s", loom_errmsg());
    CHECK(rt.estart[EL] == R, "rank %d receives %d rows, expected %d", r, rt.estart[EL], R);
    for (int s = 0; s < P; s++)
        for (int j = 0; j < EL; j++)
            CHECK(rt.rc[s * EL + j] == count(s, r * EL + j), "rank %d: rc[%d][%d] = %d, sent %d", r, s, j,
                  rt.rc[s * EL + j], count(s, r * EL + j));
    CHECK(loom_ep_dispatch(&ep, &rt, rows, recv, out, W, &t) == LOOM_OK, "dispatch: %s", loom_errmsg());
    int bad = 0;
    for (int j = 0, q = 0; j < EL; j++) {
        CHECK(rt.estart[j] == q, "rank %d: expert %d starts at row %d, expected %d", r, j, rt.estart[j], q);
        for (int s = 0; s < P; s++)
            for (int i = 0; i < count(s, r * EL + j); i++, q++)
                for (int c = 0; c < W; c++) bad += out[(size_t)q * W + c] != cell(s, r * EL + j, i, c);
    }
    CHECK(bad == 0, "rank %d: %d dispatched values out of place", r, bad);
    /* the same dispatch in two halves: this rank's own rows in place when
     * the start returns, all of out bitwise the same after the finish */
    float *out2 = malloc(((size_t)R + 1) * W * sizeof *out2);
    for (size_t i = 0; i < ((size_t)R + 1) * W; i++) out2[i] = -1.0f;
    loom_ep_tally t2 = {0, 0, 0};
    loom_req *req = NULL;
    CHECK(loom_ep_dispatch_start(&ep, &rt, rows, recv, out2, W, &t2, &req) == LOOM_OK, "dispatch_start: %s",
          loom_errmsg());
    CHECK((req != NULL) == (P > 1), "rank %d: request %p on %d ranks", r, (void *)req, P);
    bad = 0;
    for (int j = 0; j < EL; j++) {
        const size_t own = (size_t)rt.eoff[r * EL + j], n = (size_t)rt.rc[r * EL + j];
        bad += memcmp(out2 + own * W, out + own * W, n * W * sizeof *out) != 0;
    }
    CHECK(bad == 0, "rank %d: %d experts' own rows not in place at the start", r, bad);
    CHECK(loom_ep_dispatch_finish(&ep, &rt, recv, out2, W, &t2, req) == LOOM_OK, "dispatch_finish: %s",
          loom_errmsg());
    CHECK(memcmp(out2, out, (size_t)R * W * sizeof *out) == 0 && out2[(size_t)R * W] == -1.0f,
          "rank %d: the started dispatch differs from the blocking one", r);
    CHECK(t2.bytes == (P > 1 ? (int64_t)A * W * 4 : 0) && t2.overlapped == (P > 1),
          "rank %d: started dispatch tally %lld bytes, %lld overlapped", r, (long long)t2.bytes,
          (long long)t2.overlapped);
    free(out2);
    for (size_t i = 0; i < (size_t)R * W; i++) out[i] += 0.5f;
    CHECK(loom_ep_combine(&ep, &rt, out, recv, back, W, &t) == LOOM_OK, "combine: %s", loom_errmsg());
    bad = 0;
    for (size_t i = 0; i < (size_t)A * W; i++) bad += back[i] != rows[i] + 0.5f;
    CHECK(bad == 0, "rank %d: %d combined values not back in place", r, bad);
    const int64_t want = P > 1 ? (int64_t)P * EL * 4 + (int64_t)(A + R) * W * 4 : 0;
    CHECK(t.bytes == want, "rank %d: tally %lld bytes, comm.h's count %lld", r, (long long)t.bytes,
          (long long)want);
    if (P > 1) {
        const loom_comm_stats *st = loom_comm_get_stats(world);
        CHECK((int64_t)(st->bytes[LOOM_OP_ALLTOALL] + st->bytes[LOOM_OP_ALLTOALLV]) == want + t2.bytes,
              "rank %d: the communicator counted %llu bytes, the tallies %lld", r,
              (unsigned long long)(st->bytes[LOOM_OP_ALLTOALL] + st->bytes[LOOM_OP_ALLTOALLV]),
              (long long)(want + t2.bytes));
    }
    free(ep.a2a), free(ep.sent), free(start), free(rows), free(back), free(recv), free(out);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_errmsg());
        return 1;
    }
    loom_device *dev = test_cpu_device(1, 0);
    run(dev, world);
    loom_device_free(dev);
    int failed = check_failed_;
    loom_comm_allreduce(world, &failed, 1, LOOM_I32, LOOM_SUM);
    int local = check_done();
    loom_comm_finalize(world);
    return failed || local ? 1 : 0;
}
