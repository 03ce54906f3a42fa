/* test_cp_attention.c - context-parallel attention driven directly on P
 * ranks (the world is the cp group), ring and Ulysses:
 *   - each rank's output rows and dq/dk/dv rows equal those of the one-rank
 *     kernel on the whole sequence (the rows the causal split gives it);
 *   - under the causal load-balanced split every rank computes the same
 *     number of attention tiles (forward and backward);
 *   - the bytes each rank sends equal the documented formulas
 *     (docs/context-parallel.md), per layer forward + backward:
 *       ring     4 * B*T_l*2C * ((P-1) K/V forward + (P-1) K/V backward
 *                + P dK/dV accumulators) = 8 B T_l C (3P - 2) bytes
 *       ulysses  4 * B*T_l*C * (3 + 1 forward; 3 + 1 + 1 + 3 backward)
 *                = 48 B T_l C bytes (all-to-all: what a rank sends, its own
 *                block included).
 * Then again with grouped-query heads (2 key/value heads for 4 query heads)
 * and a sliding window of 37 positions, against the one-rank kernel on the
 * same view: the ring's blocks shrink to 2 Ckv columns (8 B T_l Ckv
 * (3P - 2) bytes) and Ulysses moves 4 B T_l (3 W + 3 C), W = C + 2 Ckv.
 * Chunks of 80 rows cross the kernel's 64-row tiles.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "loom/comm.h"
#include "loom/cp.h"
#include "loom/kernels.h"

enum { B = 2, TC = 80 };

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* rows (B,T_l) of this rank from x (B,T,w) */
static void local_rows(float *xl, const float *x, const loom_cp *cp, int T, int T_l, int w) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T_l; t++)
            memcpy(xl + ((size_t)b * T_l + t) * w, x + ((size_t)b * T + loom_cp_position(cp, t, T_l)) * w,
                   (size_t)w * sizeof *x);
}

static void run(loom_device *dev, loom_comm *world, loom_cp_impl impl, const loom_att_heads *h) {
    const int P = loom_comm_size(world), T_l = 2 * TC, T = P * T_l, NH = h->NH;
    const int C = NH * h->HS, K = h->NKV * h->HS, W = C + 2 * K;
    const char *name = loom_cp_impl_name(impl);
    const size_t nq = (size_t)B * T * W, no = (size_t)B * T * C;
    float *qkv = malloc(nq * sizeof *qkv), *dout = malloc(no * sizeof *dout);
    float *out = malloc(no * sizeof *out), *lse = malloc((size_t)B * NH * T * sizeof *lse);
    float *dqkv = calloc(nq, sizeof *dqkv);
    uint64_t seed = 11;
    for (size_t i = 0; i < nq; i++) qkv[i] = frand(&seed);
    for (size_t i = 0; i < no; i++) dout[i] = frand(&seed);
    loom_att_view whole = loom_att_packed(qkv, B, T, h);
    loom_attention_part_fwd(dev, &whole, out, (size_t)T * C, C, lse, 0);
    loom_attention_part_bwd(dev, &whole, dqkv, dqkv + C, dqkv + C + K, dout, out, (size_t)T * C, C, lse);

    loom_cp cp = {.dev = dev, .comm = world, .size = P, .rank = loom_comm_rank(world), .impl = impl};
    CHECK(loom_cp_alloc(&cp, B, T_l, h) == LOOM_OK, "alloc: %s", loom_errmsg());
    const size_t lq = (size_t)B * T_l * W, lo = (size_t)B * T_l * C;
    float *qkv_l = malloc(lq * sizeof *qkv_l), *dout_l = malloc(lo * sizeof *dout_l);
    float *out_l = malloc(lo * sizeof *out_l), *lse_l = malloc((size_t)B * NH * T_l * sizeof *lse_l);
    float *dqkv_l = calloc(lq, sizeof *dqkv_l), *want = malloc(lq * sizeof *want);
    local_rows(qkv_l, qkv, &cp, T, T_l, W);
    local_rows(dout_l, dout, &cp, T, T_l, C);
    loom_comm_reset_stats(world);
    CHECK(loom_cp_attention_fwd(&cp, out_l, lse_l, qkv_l, B, T_l, h) == LOOM_OK, "%s fwd: %s", name,
          loom_errmsg());
    long fwd_tiles = cp.tiles;
    CHECK(loom_cp_attention_bwd(&cp, dqkv_l, dout_l, qkv_l, out_l, lse_l, B, T_l, h) == LOOM_OK, "%s bwd: %s",
          name, loom_errmsg());

    local_rows(want, out, &cp, T, T_l, C);
    double e = rel_err(out_l, want, lo);
    CHECK(e <= 1e-5, "%s P=%d rank %d: out rel err %.3g", name, P, cp.rank, e);
    local_rows(want, dqkv, &cp, T, T_l, W);
    e = rel_err(dqkv_l, want, lq);
    CHECK(e <= 1e-5, "%s P=%d rank %d: dqkv rel err %.3g", name, P, cp.rank, e);

    long t[4] = {fwd_tiles, -fwd_tiles, cp.tiles, -cp.tiles}; /* max, -min */
    CHECK(loom_comm_allreduce(world, t, 4, LOOM_I64, LOOM_MAX) == LOOM_OK, "allreduce");
    /* balanced under the causal mask alone (a window cuts early chunks less than late ones) */
    CHECK(h->window > 0 || (t[0] == -t[1] && t[2] == -t[3] && t[0] > 0),
          "%s P=%d: attention tiles differ across ranks: forward %ld..%ld, total %ld..%ld", name, P, -t[1],
          t[0], -t[3], t[2]);
    const loom_comm_stats *st = loom_comm_get_stats(world);
    uint64_t sent = impl == LOOM_CP_RING ? st->bytes[LOOM_OP_SEND] : st->bytes[LOOM_OP_ALLTOALL];
    uint64_t formula =
        impl == LOOM_CP_RING ? 8ull * B * T_l * K * (3 * P - 2) : 4ull * B * T_l * (3 * W + 3 * C);
    CHECK(sent == formula, "%s P=%d: %llu bytes sent, formula %llu", name, P, (unsigned long long)sent,
          (unsigned long long)formula);
    if (cp.rank == 0)
        printf("%s P=%d: %ld tiles per rank (forward %ld), %llu bytes sent per rank\n", name, P, t[2], t[0],
               (unsigned long long)sent);
    loom_cp_release(&cp);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(qkv_l), free(dout_l);
    free(out_l), free(lse_l), free(dqkv_l), free(want);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_errmsg());
        return 1;
    }
    loom_device *dev = test_cpu_device(1, 0);
    const loom_att_heads mha = {4, 4, 4, 0}, gqa = {4, 2, 4, 37};
    if (loom_comm_size(world) > 1) {
        run(dev, world, LOOM_CP_RING, &mha);
        run(dev, world, LOOM_CP_ULYSSES, &mha);
        run(dev, world, LOOM_CP_RING, &gqa);
        if (loom_comm_size(world) <= 2)
            run(dev, world, LOOM_CP_ULYSSES, &gqa); /* cp must divide 2 kv heads */
    }
    loom_device_free(dev);
    int failed = check_failed_;
    loom_comm_allreduce(world, &failed, 1, LOOM_I32, LOOM_SUM);
    int local = check_done();
    loom_comm_finalize(world);
    return failed || local ? 1 : 0;
}
