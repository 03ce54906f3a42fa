/* test_hier.c - the host-aware all-reduce (comm.h: loom_comm_wrap_hier)
 * against the flat group's, on the world and on half of it.
 *
 * Alone or on one host: there is nothing to split, so the wrapper must not be
 * made. On 2 emulated hosts with 2 ranks each (tests/cluster/test_cluster.py
 * runs it through scripts/cluster run -np 4): sums of integers (exact) and
 * of floats for counts 1..17 (every remainder, and counts under the ranks of
 * a host) equal what every rank computes by hand, blocking and started, and
 * so do several started at once with a blocking one among them, completed
 * newest first; other ops run on the flat group. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/comm.h"

/* Rank r's element i: small integers, so float sums of 4 are exact. */
static float value(int r, int i) { return (float)((r + 1) * 100 + i % 7); }

static void sums(loom_comm *g, loom_comm *flat, int started) {
    const int n = loom_comm_size(flat), me = loom_comm_rank(flat);
    for (int count = 1; count <= 17; count++) {
        float x[17], want[17];
        int ix[17], iwant[17];
        for (int i = 0; i < count; i++) {
            x[i] = value(me, i);
            ix[i] = me * 1000 + i;
            want[i] = 0;
            iwant[i] = 0;
            for (int r = 0; r < n; r++) want[i] += value(r, i), iwant[i] += r * 1000 + i;
        }
        loom_status st;
        if (started) {
            loom_req *req = NULL;
            st = loom_comm_iallreduce(g, x, (size_t)count, LOOM_F32, LOOM_SUM, &req);
            if (st == LOOM_OK) st = loom_comm_wait(req);
        } else st = loom_comm_allreduce(g, x, (size_t)count, LOOM_F32, LOOM_SUM);
        CHECK(st == LOOM_OK, "allreduce of %d floats: %s", count, loom_errmsg());
        CHECK(memcmp(x, want, (size_t)count * sizeof *x) == 0, "%s sum of %d floats differs",
              started ? "started" : "blocking", count);
        st = loom_comm_allreduce(g, ix, (size_t)count, LOOM_I32, LOOM_SUM);
        CHECK(st == LOOM_OK && memcmp(ix, iwant, (size_t)count * sizeof *ix) == 0, "sum of %d ints differs",
              count);
    }
}

/* Several started at once, a blocking one among them, completed newest
 * first: each stage must still meet the same request on every rank. */
static void in_flight(loom_comm *g, loom_comm *flat) {
    enum { K = 4, N = 1001 };
    const int n = loom_comm_size(flat), me = loom_comm_rank(flat);
    static float x[K][N];
    loom_req *req[K] = {NULL};
    loom_status st = LOOM_OK;
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N - k; i++) x[k][i] = value(me, i + k);
        if (k == 2) { /* blocking, while 0 and 1 are in flight */
            st = loom_comm_allreduce(g, x[k], N - k, LOOM_F32, LOOM_SUM);
            CHECK(st == LOOM_OK, "blocking allreduce among started ones: %s", loom_errmsg());
        } else {
            st = loom_comm_iallreduce(g, x[k], N - k, LOOM_F32, LOOM_SUM, &req[k]);
            CHECK(st == LOOM_OK, "start %d: %s", k, loom_errmsg());
        }
    }
    int done = 0;
    CHECK(loom_comm_test(req[3], &done) == LOOM_OK, "test 3: %s", loom_errmsg());
    for (int k = K - 1; k >= 0; k--)
        if (req[k] && !(k == 3 && done))
            CHECK(loom_comm_wait(req[k]) == LOOM_OK, "wait %d: %s", k, loom_errmsg());
    for (int k = 0; k < K; k++) {
        int bad = 0;
        for (int i = 0; i < N - k; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += value(r, i + k);
            bad += x[k][i] != want;
        }
        CHECK(bad == 0, "all-reduce %d of %d (%s): %d elements wrong", k, N - k,
              k == 2 ? "blocking" : "started", bad);
    }
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_errmsg());
        return 1;
    }
    const int n = loom_comm_size(world), hosts = loom_comm_hosts();
    loom_comm *h = NULL;
    loom_status st = loom_comm_wrap_hier(world, &h);
    CHECK(st == LOOM_OK, "wrap: %s", loom_errmsg());
    if (hosts < 2 || n / hosts < 2) {
        CHECK(h == NULL, "%d ranks on %d host(s): no hierarchical group expected", n, hosts);
    } else {
        CHECK(h != NULL, "%d ranks on %d hosts: a hierarchical group expected", n, hosts);
        if (h) {
            sums(h, world, 0);
            sums(h, world, 1);
            in_flight(h, world);
            /* a broadcast goes to the flat group unchanged */
            int v = loom_comm_rank(world) == 1 ? 42 : 0;
            CHECK(loom_comm_bcast(h, &v, sizeof v, 1) == LOOM_OK && v == 42, "bcast through the wrapper");
            /* the flat group's stats hold the wrapper's calls: 17 x 2 float + 17 x 2 int
             * all-reduces (blocking and started), the 4 in flight, and the broadcast */
            const loom_comm_stats *s = loom_comm_get_stats(world);
            CHECK(s->calls[LOOM_OP_ALLREDUCE] == 72, "world counts %lld all-reduces, expected 72",
                  (long long)s->calls[LOOM_OP_ALLREDUCE]);
            loom_comm_free(h);
            /* half the world, one rank a host: nothing to split */
            loom_comm *pairs = NULL, *ph = NULL;
            st = loom_comm_split(world, loom_comm_rank(world) % 2, loom_comm_rank(world), "pair", &pairs);
            CHECK(st == LOOM_OK, "split: %s", loom_errmsg());
            if (pairs) {
                CHECK(loom_comm_wrap_hier(pairs, &ph) == LOOM_OK && ph == NULL,
                      "one rank a host: no hierarchical group expected");
                loom_comm_free(pairs);
            }
        }
    }
    int rc = check_done();
    loom_comm_finalize(world);
    return rc;
}
