/* test_comm_staged.c - the host-staged communicator (loom_comm_wrap_staged,
 * src/comm/comm_staged.c) on the CPU, over memory ops that simulate a
 * device: "device" buffers hold every byte complemented, so a device pointer
 * handed to MPI as it is gives wrong results, and every copy and bf16
 * conversion is counted. Every op - allreduce, reduce_scatter and allgather
 * (in and out of place; blocking, started + wait, started + test),
 * alltoall, alltoallv and ialltoallv (gaps kept), bcast, blocking and non-blocking rings of
 * send/recv, barrier - and the bf16 wire format must give on the staged
 * group, bit for bit, what the MPI group gives on host copies, count the
 * same calls and bytes op by op, and copy exactly what the op needs (one
 * copy in, one out). Also: a split of a staged group is staged, agree and
 * the host side work, a staged group over a staged group is refused.
 * Collective over the world: run under scripts/loomrun -np N.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_test.h"
#include "loom/bf16.h"
#include "loom/comm.h"
#include "loom/kernels.h"

static loom_comm *W, *hg, *sg; /* world; MPI group; staged group (same ranks) */
static int rank, n;

/* ---- simulated device memory --------------------------------------------- */

typedef struct sim {
    size_t d2h, d2h_bytes, h2d, h2d_bytes, packs, unpacks;
} sim;
static sim S;

static void flip(void *dst, const void *src, size_t bytes) {
    const unsigned char *s = src;
    unsigned char *d = dst;
    for (size_t i = 0; i < bytes; i++) d[i] = (unsigned char)~s[i];
}
static void *sim_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return malloc(bytes ? bytes : 1);
}
static void sim_free(void *ctx, void *p, size_t bytes) {
    (void)ctx, (void)bytes;
    free(p);
}
static loom_status sim_d2h(void *ctx, void *host, const void *dev, size_t bytes) {
    sim *s = ctx;
    s->d2h++, s->d2h_bytes += bytes;
    flip(host, dev, bytes);
    return LOOM_OK;
}
static loom_status sim_h2d(void *ctx, void *dev, const void *host, size_t bytes) {
    sim *s = ctx;
    s->h2d++, s->h2d_bytes += bytes;
    flip(dev, host, bytes);
    return LOOM_OK;
}
static void sim_pack(void *ctx, uint16_t *dst, const float *src, size_t count) {
    ((sim *)ctx)->packs++;
    for (size_t i = 0; i < count; i++) {
        float x;
        flip(&x, src + i, sizeof x);
        uint16_t h = loom_bf16_from_f32(x);
        flip(dst + i, &h, sizeof h);
    }
}
static void sim_unpack(void *ctx, float *dst, const uint16_t *src, size_t count) {
    ((sim *)ctx)->unpacks++;
    for (size_t i = 0; i < count; i++) {
        uint16_t h;
        flip(&h, src + i, sizeof h);
        float x = loom_bf16_to_f32(h);
        flip(dst + i, &x, sizeof x);
    }
}
static const loom_comm_mem sim_mem = {.name = "sim",
                                      .ctx = &S,
                                      .alloc = sim_alloc,
                                      .free = sim_free,
                                      .copy_to_host = sim_d2h,
                                      .copy_from_host = sim_h2d,
                                      .pack_bf16 = sim_pack,
                                      .unpack_bf16 = sim_unpack};

/* A device buffer holding `bytes` of host data (not counted). */
static void *dev_of(const void *host, size_t bytes) {
    void *d = malloc(bytes ? bytes : 1);
    flip(d, host, bytes);
    return d;
}
/* The device buffer d equals the host buffer h. */
static void expect_same(const char *what, const void *d, const void *h, size_t bytes) {
    unsigned char *g = malloc(bytes ? bytes : 1);
    flip(g, d, bytes);
    CHECK(memcmp(g, h, bytes) == 0, "%s: the staged group's result differs from MPI's", what);
    free(g);
}

/* ---- checks ---------------------------------------------------------------- */

/* Since `before`: the staged group counted what the MPI group counted, op
 * by op, and the copies were `in` bytes to the host and `out` back, one each
 * (0 bytes: no copy). */
static void expect_counts(const char *what, const loom_comm_stats *sb, const loom_comm_stats *hb,
                          const sim *before, size_t in, size_t out) {
    const loom_comm_stats *s = loom_comm_get_stats(sg), *h = loom_comm_get_stats(hg);
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        CHECK(s->calls[op] - sb->calls[op] == h->calls[op] - hb->calls[op] &&
                  s->bytes[op] - sb->bytes[op] == h->bytes[op] - hb->bytes[op],
              "%s: %s counted %llu calls %llu bytes staged, %llu calls %llu bytes on MPI", what,
              loom_comm_op_name((loom_comm_op)op), (unsigned long long)(s->calls[op] - sb->calls[op]),
              (unsigned long long)(s->bytes[op] - sb->bytes[op]),
              (unsigned long long)(h->calls[op] - hb->calls[op]),
              (unsigned long long)(h->bytes[op] - hb->bytes[op]));
    CHECK(S.d2h - before->d2h == (in > 0) && S.d2h_bytes - before->d2h_bytes == in &&
              S.h2d - before->h2d == (out > 0) && S.h2d_bytes - before->h2d_bytes == out,
          "%s: copies %zu in (%zu bytes) %zu out (%zu bytes), want %zu and %zu bytes", what,
          S.d2h - before->d2h, S.d2h_bytes - before->d2h_bytes, S.h2d - before->h2d,
          S.h2d_bytes - before->h2d_bytes, in, out);
}

#define SNAP()                                                                                               \
    loom_comm_stats sb_ = *loom_comm_get_stats(sg), hb_ = *loom_comm_get_stats(hg);                          \
    sim before_ = S
#define COUNTS(what, in, out) expect_counts(what, &sb_, &hb_, &before_, in, out)

static void fill(float *x, size_t count, int salt) {
    uint32_t s = 2246822519u * (uint32_t)(rank * 97 + salt + 1);
    for (size_t i = 0; i < count; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + i % 5);
    }
}

/* Run the call *r just started (with status st) to completion: mode 1
 * wait, mode 2 test until done. (*r is read here, after the start set it.) */
static loom_status finish(loom_req **r, loom_status st, int mode) {
    if (st != LOOM_OK || mode == 1) return st == LOOM_OK ? loom_comm_wait(*r) : st;
    int done = 0;
    while (st == LOOM_OK && !done) st = loom_comm_test(*r, &done);
    return st;
}

enum { PER = 257 };

/* ---- the reductions and gathers ---------------------------------------------- */

static void test_allreduce(int mode) {
    float h[PER];
    fill(h, PER, 1);
    float *d = dev_of(h, sizeof h);
    SNAP();
    loom_req *r = NULL, *q = NULL;
    loom_status st = mode ? finish(&r, loom_comm_iallreduce(sg, d, PER, LOOM_F32, LOOM_SUM, &r), mode)
                          : loom_comm_allreduce(sg, d, PER, LOOM_F32, LOOM_SUM);
    CHECK(st == LOOM_OK, "staged allreduce mode %d: %s", mode, loom_errmsg());
    st = mode ? finish(&q, loom_comm_iallreduce(hg, h, PER, LOOM_F32, LOOM_SUM, &q), mode)
              : loom_comm_allreduce(hg, h, PER, LOOM_F32, LOOM_SUM);
    CHECK(st == LOOM_OK, "MPI allreduce: %s", loom_errmsg());
    expect_same("allreduce", d, h, sizeof h);
    COUNTS("allreduce", sizeof h, sizeof h);
    free(d);
}

static void test_reduce_scatter(int mode, int in_place) {
    const size_t total = PER * (size_t)n;
    float *h = malloc(total * sizeof *h), out[PER];
    fill(h, total, 2);
    float *d = dev_of(h, total * sizeof *h), *dout = in_place ? d : malloc(sizeof out),
          *hout = in_place ? h : out;
    SNAP();
    loom_req *r = NULL, *q = NULL;
    loom_status st =
        mode ? finish(&r, loom_comm_ireduce_scatter(sg, d, dout, PER, LOOM_F32, LOOM_MAX, &r), mode)
             : loom_comm_reduce_scatter(sg, d, dout, PER, LOOM_F32, LOOM_MAX);
    CHECK(st == LOOM_OK, "staged reduce_scatter mode %d: %s", mode, loom_errmsg());
    st = mode ? finish(&q, loom_comm_ireduce_scatter(hg, h, hout, PER, LOOM_F32, LOOM_MAX, &q), mode)
              : loom_comm_reduce_scatter(hg, h, hout, PER, LOOM_F32, LOOM_MAX);
    CHECK(st == LOOM_OK, "MPI reduce_scatter: %s", loom_errmsg());
    expect_same("reduce_scatter", dout, hout, sizeof out);
    COUNTS("reduce_scatter", total * sizeof *h, sizeof out);
    if (!in_place) free(dout);
    free(h), free(d);
}

static void test_allgather(int mode, int in_place) {
    const size_t total = PER * (size_t)n, mine = PER * (size_t)rank;
    float *h = calloc(total, sizeof *h), part[PER];
    fill(part, PER, 3);
    float *dpart = dev_of(part, sizeof part), *d = dev_of(h, total * sizeof *h);
    const float *src = part, *dsrc = dpart;
    if (in_place) {
        memcpy(h + mine, part, sizeof part);
        flip(d + mine, part, sizeof part);
        src = h + mine, dsrc = d + mine;
    }
    SNAP();
    loom_req *r = NULL, *q = NULL;
    loom_status st = mode ? finish(&r, loom_comm_iallgather(sg, dsrc, d, sizeof part, &r), mode)
                          : loom_comm_allgather(sg, dsrc, d, sizeof part);
    CHECK(st == LOOM_OK, "staged allgather mode %d: %s", mode, loom_errmsg());
    st = mode ? finish(&q, loom_comm_iallgather(hg, src, h, sizeof part, &q), mode)
              : loom_comm_allgather(hg, src, h, sizeof part);
    CHECK(st == LOOM_OK, "MPI allgather: %s", loom_errmsg());
    expect_same("allgather", d, h, total * sizeof *h);
    COUNTS("allgather", sizeof part, total * sizeof *h);
    free(h), free(d), free(dpart);
}

/* ---- byte ops ---------------------------------------------------------------------- */

static void test_alltoall_bcast(void) {
    const size_t per = 24, total = per * (size_t)n;
    unsigned char *h = malloc(total), *out = malloc(total);
    for (size_t i = 0; i < total; i++) h[i] = (unsigned char)(rank * 31 + i * 7);
    unsigned char *d = dev_of(h, total), *dout = malloc(total);
    SNAP();
    CHECK(loom_comm_alltoall(sg, d, dout, per) == LOOM_OK, "staged alltoall: %s", loom_errmsg());
    CHECK(loom_comm_alltoall(hg, h, out, per) == LOOM_OK, "MPI alltoall");
    expect_same("alltoall", dout, out, total);
    COUNTS("alltoall", total, total);
    sim b2 = S;
    loom_comm_stats s2 = *loom_comm_get_stats(sg), h2 = *loom_comm_get_stats(hg);
    const int root = n - 1;
    CHECK(loom_comm_bcast(sg, d, total, root) == LOOM_OK, "staged bcast: %s", loom_errmsg());
    CHECK(loom_comm_bcast(hg, h, total, root) == LOOM_OK, "MPI bcast");
    expect_same("bcast", d, h, total);
    expect_counts("bcast", &s2, &h2, &b2, rank == root ? total : 0, total);
    free(h), free(out), free(d), free(dout);
}

/* rank src sends ((src + 2 dst) % 3 + 1) * 5 bytes to dst; 3-byte gaps kept */
static void test_alltoallv(void) {
    size_t sb[64], sd[64], rb[64], rd[64], so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        sb[p] = (size_t)((rank + 2 * p) % 3 + 1) * 5, rb[p] = (size_t)((p + 2 * rank) % 3 + 1) * 5;
        sd[p] = so + 3, rd[p] = ro + 3;
        so = sd[p] + sb[p], ro = rd[p] + rb[p];
    }
    unsigned char *hs = calloc(so, 1), *hr = calloc(ro, 1);
    for (size_t i = 0; i < so; i++) hs[i] = (unsigned char)(rank * 13 + i);
    memset(hr, 0x5a, ro);
    unsigned char *ds = dev_of(hs, so), *dr = dev_of(hr, ro);
    size_t sent = 0, recvd = 0;
    for (int p = 0; p < n; p++) sent += sb[p], recvd += rb[p];
    loom_comm_stats s0 = *loom_comm_get_stats(sg), h0 = *loom_comm_get_stats(hg);
    sim b0 = S;
    CHECK(loom_comm_alltoallv(sg, ds, sb, sd, dr, rb, rd) == LOOM_OK, "staged alltoallv: %s", loom_errmsg());
    CHECK(loom_comm_alltoallv(hg, hs, sb, sd, hr, rb, rd) == LOOM_OK, "MPI alltoallv");
    expect_same("alltoallv (gaps kept)", dr, hr, ro);
    const loom_comm_stats *s = loom_comm_get_stats(sg), *h = loom_comm_get_stats(hg);
    CHECK(s->bytes[LOOM_OP_ALLTOALLV] - s0.bytes[LOOM_OP_ALLTOALLV] ==
              h->bytes[LOOM_OP_ALLTOALLV] - h0.bytes[LOOM_OP_ALLTOALLV],
          "alltoallv bytes");
    CHECK(S.d2h - b0.d2h == 1 && S.d2h_bytes - b0.d2h_bytes == so && S.h2d - b0.h2d == (size_t)n &&
              S.h2d_bytes - b0.h2d_bytes == recvd,
          "alltoallv copies: %zu in (%zu bytes), %zu out (%zu bytes)", S.d2h - b0.d2h,
          S.d2h_bytes - b0.d2h_bytes, S.h2d - b0.h2d, S.h2d_bytes - b0.h2d_bytes);
    /* started: the same bytes once wait completes it (the gaps kept) */
    unsigned char *h5 = malloc(ro);
    memset(h5, 0x5a, ro);
    unsigned char *dr2 = dev_of(h5, ro);
    loom_req *req = NULL;
    CHECK(loom_comm_ialltoallv(sg, ds, sb, sd, dr2, rb, rd, &req) == LOOM_OK && req, "staged ialltoallv: %s",
          loom_errmsg());
    CHECK(loom_comm_wait(req) == LOOM_OK, "staged ialltoallv wait: %s", loom_errmsg());
    expect_same("ialltoallv (gaps kept)", dr2, hr, ro);
    free(hs), free(hr), free(ds), free(dr), free(h5), free(dr2);
}

/* A ring: blocking (even ranks send first) and non-blocking (every rank
 * posts its receive first: staged starts must not block). */
static void test_ring(int nonblocking) {
    if (n < 2) return;
    float out[PER], in[PER] = {0}, ref[PER];
    fill(out, PER, 5);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    float *dout = dev_of(out, sizeof out), *din = dev_of(in, sizeof in);
    SNAP();
    loom_status st = LOOM_OK;
    if (nonblocking) {
        loom_req *rr = NULL, *sr = NULL;
        st = loom_comm_irecv(sg, din, sizeof in, prev, 4, &rr);
        if (st == LOOM_OK) st = loom_comm_isend(sg, dout, sizeof out, next, 4, &sr);
        if (st == LOOM_OK) st = finish(&sr, st, 2);
        if (st == LOOM_OK) st = loom_comm_wait(rr);
    } else if (rank % 2 == 0) {
        st = loom_comm_send(sg, dout, sizeof out, next, 4);
        if (st == LOOM_OK) st = loom_comm_recv(sg, din, sizeof in, prev, 4);
    } else {
        st = loom_comm_recv(sg, din, sizeof in, prev, 4);
        if (st == LOOM_OK) st = loom_comm_send(sg, dout, sizeof out, next, 4);
    }
    CHECK(st == LOOM_OK, "staged ring %d: %s", nonblocking, loom_errmsg());
    loom_req *rr = NULL;
    CHECK(loom_comm_irecv(hg, ref, sizeof ref, prev, 4, &rr) == LOOM_OK, "MPI irecv");
    CHECK(loom_comm_send(hg, out, sizeof out, next, 4) == LOOM_OK && loom_comm_wait(rr) == LOOM_OK,
          "MPI ring");
    expect_same("ring", din, ref, sizeof ref);
    COUNTS("ring", sizeof out, sizeof in);
    free(dout), free(din);
}

/* ---- the wire format ---------------------------------------------------------------- */

/* allreduce, in-place reduce_scatter, allgather as bf16: bit for bit MPI's,
 * half the bytes copied, one pack and one unpack each. */
static void test_wire(int nonblocking) {
    const size_t total = PER * (size_t)n;
    float *h = malloc(total * sizeof *h);
    fill(h, total, 6);
    float *d = dev_of(h, total * sizeof *h);
    SNAP();
    loom_req *r = NULL;
    loom_status st = nonblocking
                         ? finish(&r, loom_comm_iallreduce_as(sg, d, total, LOOM_BF16, LOOM_SUM, &r), 1)
                         : loom_comm_allreduce_as(sg, d, total, LOOM_BF16, LOOM_SUM);
    CHECK(st == LOOM_OK, "staged allreduce_as: %s", loom_errmsg());
    CHECK(loom_comm_allreduce_as(hg, h, total, LOOM_BF16, LOOM_SUM) == LOOM_OK, "MPI allreduce_as");
    expect_same("allreduce_as", d, h, total * sizeof *h);
    COUNTS("allreduce_as", total * 2, total * 2);
    CHECK(S.packs - before_.packs == 1 && S.unpacks - before_.unpacks == 1,
          "allreduce_as: %zu packs %zu unpacks", S.packs - before_.packs, S.unpacks - before_.unpacks);
    st = nonblocking ? finish(&r, loom_comm_ireduce_scatter_as(sg, d, d, PER, LOOM_BF16, LOOM_SUM, &r), 2)
                     : loom_comm_reduce_scatter_as(sg, d, d, PER, LOOM_BF16, LOOM_SUM);
    CHECK(st == LOOM_OK, "staged reduce_scatter_as: %s", loom_errmsg());
    CHECK(loom_comm_reduce_scatter_as(hg, h, h, PER, LOOM_BF16, LOOM_SUM) == LOOM_OK,
          "MPI reduce_scatter_as");
    expect_same("reduce_scatter_as", d, h, PER * sizeof *h);
    const size_t mine = PER * (size_t)rank;
    st = nonblocking ? finish(&r, loom_comm_iallgather_as(sg, d, d, PER, LOOM_BF16, &r), 1)
                     : loom_comm_allgather_as(sg, d, d, PER, LOOM_BF16);
    CHECK(st == LOOM_OK, "staged allgather_as: %s", loom_errmsg());
    memmove(h + mine, h, PER * sizeof *h);
    CHECK(loom_comm_allgather_as(hg, h + mine, h, PER, LOOM_BF16) == LOOM_OK, "MPI allgather_as");
    expect_same("allgather_as", d, h, total * sizeof *h);
    free(h), free(d);
}

/* ---- groups ---------------------------------------------------------------------------- */

static void test_groups(void) {
    loom_comm *half = NULL, *bad = NULL;
    CHECK(loom_comm_split(sg, rank % 2, rank, "half", &half) == LOOM_OK && half, "split: %s", loom_errmsg());
    if (half) {
        CHECK(strcmp(loom_comm_memory(half)->name, "sim") == 0 && loom_comm_host(half) != half,
              "a split of a staged group is staged");
        float h[8], ref[8];
        fill(h, 8, 7);
        memcpy(ref, h, sizeof h);
        float *d = dev_of(h, sizeof h);
        sim b = S;
        CHECK(loom_comm_allreduce(half, d, 8, LOOM_F32, LOOM_SUM) == LOOM_OK, "half allreduce");
        CHECK(loom_comm_allreduce(loom_comm_host(half), ref, 8, LOOM_F32, LOOM_SUM) == LOOM_OK, "host side");
        expect_same("split allreduce", d, ref, sizeof ref);
        CHECK(S.d2h == b.d2h + 1, "the split group stages");
        CHECK(loom_comm_get_stats(half)->calls[LOOM_OP_ALLREDUCE] == 2,
              "the host side counts in the group's stats");
        free(d);
        loom_comm_free(half);
    }
    loom_status local = rank == n - 1 ? loom_fail(LOOM_EUSAGE, "only the last rank fails") : LOOM_OK;
    loom_status st = loom_comm_agree(sg, local);
    CHECK(n == 1 || st == LOOM_EUSAGE, "agree on the staged group: %d", st);
    CHECK(loom_comm_wrap_staged(sg, &sim_mem, &bad) == LOOM_EUSAGE && !bad, "staged over staged is refused");
    CHECK(loom_comm_barrier(sg) == LOOM_OK, "barrier: %s", loom_errmsg());
}

int main(int argc, char **argv) {
    if (!(W = comm_test_start(&argc, &argv))) return 1;
    rank = loom_comm_rank(W), n = loom_comm_size(W);
    loom_comm *under = NULL;
    CHECK(loom_comm_split(W, 0, rank, "host", &hg) == LOOM_OK, "split");
    CHECK(loom_comm_split(W, 0, rank, "staged", &under) == LOOM_OK, "split");
    CHECK(loom_comm_wrap_staged(under, &sim_mem, &sg) == LOOM_OK, "wrap: %s", loom_errmsg());
    if (sg && n <= 64) {
        for (int mode = 0; mode < 3; mode++) {
            test_allreduce(mode);
            for (int in_place = 0; in_place < 2; in_place++) {
                test_reduce_scatter(mode, in_place);
                test_allgather(mode, in_place);
            }
        }
        test_alltoall_bcast();
        test_alltoallv();
        test_ring(0);
        test_ring(1);
        test_wire(0);
        test_wire(1);
        test_groups();
    }
    loom_comm_free(sg);
    loom_comm_free(hg);
    return comm_test_end(W);
}
