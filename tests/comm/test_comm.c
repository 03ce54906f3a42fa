/* test_comm.c - every communicator call on any number of ranks, checked
 * against values computed locally from closed forms, plus the byte and call
 * accounting of comm.h, split groups, and MPI errors turned into messages.
 * Collective over the world: run it under scripts/loomrun -np N (or alone, as
 * a one-rank world). Exit code 1 if any rank saw a failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_test.h"
#include "loom/bf16.h"
#include "loom/comm.h"

static loom_comm *W;
static int rank, n;

/* ---- accounting ------------------------------------------------------- */

/* After one call of `op`: exactly `calls` more calls and `bytes` more bytes
 * for that op, and no other op touched. */
static void check_delta(const loom_comm *c, const loom_comm_stats *before, loom_comm_op op, uint64_t calls,
                        uint64_t bytes, const char *what) {
    const loom_comm_stats *s = loom_comm_get_stats(c);
    for (int o = 0; o < LOOM_OP_COUNT; o++) {
        uint64_t want_calls = o == (int)op ? calls : 0, want_bytes = o == (int)op ? bytes : 0;
        CHECK(s->calls[o] - before->calls[o] == want_calls, "%s: %s calls +%llu, expected +%llu", what,
              loom_comm_op_name((loom_comm_op)o), (unsigned long long)(s->calls[o] - before->calls[o]),
              (unsigned long long)want_calls);
        CHECK(s->bytes[o] - before->bytes[o] == want_bytes, "%s: %s bytes +%llu, expected +%llu", what,
              loom_comm_op_name((loom_comm_op)o), (unsigned long long)(s->bytes[o] - before->bytes[o]),
              (unsigned long long)want_bytes);
        CHECK(s->seconds[o] >= before->seconds[o], "%s: seconds went down", what);
    }
}

/* ---- allreduce -------------------------------------------------------- */

/* the value rank r contributes at index i: small integers, exact in float */
static double contrib(int r, size_t i) { return (double)((r * 7 + (int)i * 3) % 11) - 5.0 + r; }

static double expect_reduce(loom_redop op, size_t i) {
    double acc = contrib(0, i);
    for (int r = 1; r < n; r++) {
        double v = contrib(r, i);
        if (op == LOOM_SUM) acc += v;
        else if (op == LOOM_MAX) acc = v > acc ? v : acc;
        else acc = v < acc ? v : acc;
    }
    return acc;
}

static void fill(void *buf, loom_dtype t, size_t count, size_t first) {
    for (size_t i = 0; i < count; i++) {
        double v = contrib(rank, first + i);
        if (t == LOOM_F32) ((float *)buf)[i] = (float)v;
        else if (t == LOOM_F64) ((double *)buf)[i] = v;
        else if (t == LOOM_I32) ((int32_t *)buf)[i] = (int32_t)v;
        else ((int64_t *)buf)[i] = (int64_t)v;
    }
}

static double get(const void *buf, loom_dtype t, size_t i) {
    if (t == LOOM_F32) return ((const float *)buf)[i];
    if (t == LOOM_F64) return ((const double *)buf)[i];
    if (t == LOOM_I32) return ((const int32_t *)buf)[i];
    return (double)((const int64_t *)buf)[i];
}

static const char *dtype_name(loom_dtype t) {
    return t == LOOM_F32 ? "f32" : t == LOOM_F64 ? "f64" : t == LOOM_I32 ? "i32" : "i64";
}

static void test_allreduce(loom_dtype t, loom_redop op, int nonblocking) {
    enum { COUNT = 37 };
    double buf[COUNT]; /* big enough for any dtype */
    fill(buf, t, COUNT, 0);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status st;
    if (nonblocking) {
        loom_req *req = NULL;
        st = loom_comm_iallreduce(W, buf, COUNT, t, op, &req);
        check_delta(W, &before, LOOM_OP_ALLREDUCE, 1, COUNT * loom_dtype_size(t), "iallreduce start");
        if (st == LOOM_OK) st = loom_comm_wait(req);
    } else {
        st = loom_comm_allreduce(W, buf, COUNT, t, op);
    }
    CHECK(st == LOOM_OK, "allreduce %s op %d: %s", dtype_name(t), op, loom_errmsg());
    int bad = 0;
    for (size_t i = 0; i < COUNT; i++) bad += get(buf, t, i) != expect_reduce(op, i);
    CHECK(bad == 0, "allreduce %s op %d nb %d: %d wrong values", dtype_name(t), op, nonblocking, bad);
    check_delta(W, &before, LOOM_OP_ALLREDUCE, 1, COUNT * loom_dtype_size(t), "allreduce");
}

/* ---- reduce_scatter --------------------------------------------------- */

static void test_reduce_scatter(loom_dtype t, int mode /* 0 blocking, 1 in place, 2 nb */) {
    enum { PER = 5 };
    size_t total = PER * (size_t)n;
    double *send = malloc(total * sizeof(double)), recv[PER];
    fill(send, t, total, 0);
    void *out = mode == 1 ? (void *)send : (void *)recv;
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status st;
    if (mode == 2) {
        loom_req *req = NULL;
        st = loom_comm_ireduce_scatter(W, send, out, PER, t, LOOM_SUM, &req);
        int done = 0;
        while (st == LOOM_OK && !done) st = loom_comm_test(req, &done);
    } else {
        st = loom_comm_reduce_scatter(W, send, out, PER, t, LOOM_SUM);
    }
    CHECK(st == LOOM_OK, "reduce_scatter mode %d: %s", mode, loom_errmsg());
    int bad = 0;
    for (size_t i = 0; i < PER; i++) bad += get(out, t, i) != expect_reduce(LOOM_SUM, (size_t)rank * PER + i);
    CHECK(bad == 0, "reduce_scatter %s mode %d: %d wrong values", dtype_name(t), mode, bad);
    check_delta(W, &before, LOOM_OP_REDUCE_SCATTER, 1, total * loom_dtype_size(t), "reduce_scatter");
    free(send);
}

/* ---- bf16 sums ---------------------------------------------------------- */

/* LOOM_BF16 sums (comm.h): 2 bytes an element in the stats; integers whose
 * every partial sum is below 256 add exactly whatever order MPI takes, so
 * they must equal the exact sum; values with all 8 significant bits set are
 * rounded at each hop: one hop (2 ranks) is exactly loom_bf16_sum of the two
 * (test_bf16_sum.c checks that against a reference), and on n ranks the
 * result stays within (n - 1) roundings of at most 2^-8 (bf16's unit
 * roundoff: 8 significant bits) of the sum of |x|. */
static uint16_t rough(int r, size_t i) {
    double v = 1.0 + (double)((r * 37 + (int)i * 11) % 128) / 128; /* 8 significant bits */
    return loom_bf16_from_f32((float)((r + (int)i) % 3 ? v : -v));
}

static void
test_bf16(int mode /* 0 allreduce, 1 iallreduce, 2 reduce_scatter in place, 3 ireduce_scatter */) {
    enum { PER = 9 };
    const size_t total = PER * (size_t)n, count = mode < 2 ? PER : total;
    uint16_t *x = malloc(2 * total * sizeof *x), *y = x + total;
    for (size_t i = 0; i < count; i++) {
        x[i] = loom_bf16_from_f32((float)contrib(rank, i));
        y[i] = rough(rank, i);
    }
    for (int which = 0; which < 2; which++) {
        uint16_t *buf = which ? y : x;
        loom_comm_stats before = *loom_comm_get_stats(W);
        loom_status st;
        loom_req *req = NULL;
        if (mode == 0) st = loom_comm_allreduce(W, buf, PER, LOOM_BF16, LOOM_SUM);
        else if (mode == 1) st = loom_comm_iallreduce(W, buf, PER, LOOM_BF16, LOOM_SUM, &req);
        else if (mode == 2) st = loom_comm_reduce_scatter(W, buf, buf, PER, LOOM_BF16, LOOM_SUM);
        else st = loom_comm_ireduce_scatter(W, buf, buf, PER, LOOM_BF16, LOOM_SUM, &req);
        if (st == LOOM_OK) st = loom_comm_wait(req);
        CHECK(st == LOOM_OK, "bf16 mode %d: %s", mode, loom_errmsg());
        check_delta(W, &before, mode < 2 ? LOOM_OP_ALLREDUCE : LOOM_OP_REDUCE_SCATTER, 1, count * 2, "bf16");
        int bad = 0;
        for (size_t k = 0; k < PER; k++) {
            size_t i = mode < 2 ? k : (size_t)rank * PER + k; /* reduce-scatter: my slice, at the start */
            double got = loom_bf16_to_f32(buf[k]);
            if (!which) {
                bad += got != expect_reduce(LOOM_SUM, i);
                continue;
            }
            double exact = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                exact += loom_bf16_to_f32(rough(r, i));
                mag += fabs(loom_bf16_to_f32(rough(r, i)));
            }
            uint16_t one = rough(0, i);
            if (n == 2) loom_bf16_sum(&one, &(uint16_t){rough(1, i)}, 1);
            bad += n == 2 ? buf[k] != one : fabs(got - exact) > (n - 1) * ldexp(1.0, -8) * mag * 1.01;
        }
        CHECK(bad == 0, "bf16 mode %d %s: %d wrong sums", mode, which ? "rounded" : "exact", bad);
    }
    uint16_t one = 0;
    CHECK(loom_comm_allreduce(W, &one, 1, LOOM_BF16, LOOM_MAX) == LOOM_EUNAVAIL &&
              strstr(loom_errmsg(), "bf16 reductions support only the sum"),
          "bf16 max refused: %s", loom_errmsg());
    free(x);
}

/* ---- byte-moving collectives ------------------------------------------ */

static unsigned char byte_of(int src, int dst, size_t k) {
    return (unsigned char)((src * 13 + dst * 5 + (int)k * 3 + 1) & 0xff);
}

static void test_allgather(int mode /* 0 blocking, 1 in place, 2 nb */) {
    enum { PER = 3 };
    unsigned char send[PER], *recv = calloc((size_t)n * PER, 1);
    for (size_t k = 0; k < PER; k++) send[k] = byte_of(rank, 0, k);
    const void *src = send;
    if (mode == 1) {
        memcpy(recv + (size_t)rank * PER, send, PER);
        src = recv + (size_t)rank * PER;
    }
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status st;
    if (mode == 2) {
        loom_req *req = NULL;
        st = loom_comm_iallgather(W, src, recv, PER, &req);
        if (st == LOOM_OK) st = loom_comm_wait(req);
    } else {
        st = loom_comm_allgather(W, src, recv, PER);
    }
    CHECK(st == LOOM_OK, "allgather mode %d: %s", mode, loom_errmsg());
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t k = 0; k < PER; k++) bad += recv[(size_t)r * PER + k] != byte_of(r, 0, k);
    CHECK(bad == 0, "allgather mode %d: %d wrong bytes", mode, bad);
    check_delta(W, &before, LOOM_OP_ALLGATHER, 1, PER * (size_t)n, "allgather");
    free(recv);
}

static void test_alltoall(void) {
    enum { PER = 4 };
    unsigned char *send = malloc((size_t)n * PER), *recv = calloc((size_t)n * PER, 1);
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < PER; k++) send[(size_t)j * PER + k] = byte_of(rank, j, k);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status st = loom_comm_alltoall(W, send, recv, PER);
    CHECK(st == LOOM_OK, "alltoall: %s", loom_errmsg());
    int bad = 0;
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < PER; k++) bad += recv[(size_t)j * PER + k] != byte_of(j, rank, k);
    CHECK(bad == 0, "alltoall: %d wrong bytes", bad);
    check_delta(W, &before, LOOM_OP_ALLTOALL, 1, PER * (size_t)n, "alltoall");
    free(send);
    free(recv);
}

/* uneven sizes, zeros included; receive blocks separated by a 2-byte gap */
static size_t v_bytes(int src, int dst) { return (size_t)((src + 2 * dst) % 4) * 3; }

/* One alltoallv case: pattern `shift` (v_bytes of src + shift); receive
 * blocks separated by a 2-byte gap. */
typedef struct v_case {
    size_t *sb, *sd, *rb, *rd, send_total, recv_total;
    unsigned char *send, *recv;
    int shift;
} v_case;

static void v_case_make(v_case *v, int shift) {
    *v = (v_case){.shift = shift};
    v->sb = calloc((size_t)n, sizeof *v->sb), v->sd = calloc((size_t)n, sizeof *v->sd);
    v->rb = calloc((size_t)n, sizeof *v->rb), v->rd = calloc((size_t)n, sizeof *v->rd);
    for (int j = 0; j < n; j++) {
        v->sb[j] = v_bytes(rank + shift, j), v->sd[j] = v->send_total, v->send_total += v->sb[j];
        v->rb[j] = v_bytes(j + shift, rank), v->rd[j] = v->recv_total, v->recv_total += v->rb[j] + 2;
    }
    v->send = malloc(v->send_total + 1), v->recv = malloc(v->recv_total + 1);
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < v->sb[j]; k++) v->send[v->sd[j] + k] = byte_of(rank + shift, j, k);
    memset(v->recv, 0xAB, v->recv_total + 1);
}

/* wrong bytes in v->recv (the gaps included: they stay 0xAB) */
static int v_case_bad(const v_case *v) {
    int bad = 0;
    for (int j = 0; j < n; j++) {
        for (size_t k = 0; k < v->rb[j]; k++) bad += v->recv[v->rd[j] + k] != byte_of(j + v->shift, rank, k);
        bad += v->recv[v->rd[j] + v->rb[j]] != 0xAB;
    }
    return bad;
}

static void v_case_free(v_case *v) {
    free(v->sb), free(v->sd), free(v->rb), free(v->rd), free(v->send), free(v->recv);
}

static void test_alltoallv(void) {
    v_case v;
    v_case_make(&v, 0);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status st = loom_comm_alltoallv(W, v.send, v.sb, v.sd, v.recv, v.rb, v.rd);
    CHECK(st == LOOM_OK, "alltoallv: %s", loom_errmsg());
    CHECK(v_case_bad(&v) == 0, "alltoallv: %d wrong bytes", v_case_bad(&v));
    check_delta(W, &before, LOOM_OP_ALLTOALLV, 1, v.send_total, "alltoallv");
    v_case_free(&v);
}

/* ialltoallv against the blocking call: the same bytes (gaps kept), the
 * same statistics; completed by wait (mode 0) or by test polling (1); two
 * of different patterns in flight at once, completed in reverse order, so
 * each request keeps its own counts (the group's scratch is not shared). */
static void test_ialltoallv(int mode) {
    v_case ref, a, b;
    v_case_make(&ref, 1), v_case_make(&a, 1), v_case_make(&b, 2);
    CHECK(loom_comm_alltoallv(W, ref.send, ref.sb, ref.sd, ref.recv, ref.rb, ref.rd) == LOOM_OK,
          "alltoallv: %s", loom_errmsg());
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_req *ra = NULL, *rb = NULL;
    loom_status st = loom_comm_ialltoallv(W, a.send, a.sb, a.sd, a.recv, a.rb, a.rd, &ra);
    CHECK(st == LOOM_OK && ra, "ialltoallv a: %s", loom_errmsg());
    st = loom_comm_ialltoallv(W, b.send, b.sb, b.sd, b.recv, b.rb, b.rd, &rb);
    CHECK(st == LOOM_OK && rb, "ialltoallv b: %s", loom_errmsg());
    check_delta(W, &before, LOOM_OP_ALLTOALLV, 2, a.send_total + b.send_total, "ialltoallv start");
    loom_req *order[2] = {rb, ra};
    for (int i = 0; i < 2; i++) {
        if (mode == 0) {
            st = loom_comm_wait(order[i]);
        } else {
            int done = 0;
            while (!done && (st = loom_comm_test(order[i], &done)) == LOOM_OK) {}
        }
        CHECK(st == LOOM_OK, "ialltoallv %s: %s", mode ? "test" : "wait", loom_errmsg());
    }
    CHECK(memcmp(a.recv, ref.recv, ref.recv_total + 1) == 0, "ialltoallv a differs from alltoallv");
    CHECK(v_case_bad(&a) == 0 && v_case_bad(&b) == 0, "ialltoallv: %d, %d wrong bytes", v_case_bad(&a),
          v_case_bad(&b));
    check_delta(W, &before, LOOM_OP_ALLTOALLV, 2, a.send_total + b.send_total, "ialltoallv");
    v_case_free(&ref), v_case_free(&a), v_case_free(&b);
}

static void test_bcast_barrier(void) {
    int root = n - 1; /* non-zero whenever n > 1 */
    double buf[10];
    for (int i = 0; i < 10; i++) buf[i] = rank == root ? 1.5 * i + root : -1.0;
    loom_comm_stats before = *loom_comm_get_stats(W);
    CHECK(loom_comm_bcast(W, buf, sizeof buf, root) == LOOM_OK, "bcast: %s", loom_errmsg());
    int bad = 0;
    for (int i = 0; i < 10; i++) bad += buf[i] != 1.5 * i + root;
    CHECK(bad == 0, "bcast from %d: %d wrong values", root, bad);
    check_delta(W, &before, LOOM_OP_BCAST, 1, sizeof buf, "bcast");
    before = *loom_comm_get_stats(W);
    CHECK(loom_comm_barrier(W) == LOOM_OK, "barrier: %s", loom_errmsg());
    check_delta(W, &before, LOOM_OP_BARRIER, 1, 0, "barrier");
}

/* ---- point to point --------------------------------------------------- */

static void fill_msg(int32_t *msg, int from, int count) {
    for (int i = 0; i < count; i++) msg[i] = from * 1000 + i;
}

static int msg_errors(const int32_t *msg, int from, int count) {
    int bad = 0;
    for (int i = 0; i < count; i++) bad += msg[i] != from * 1000 + i;
    return bad;
}

/* Even ranks send first and odd ranks receive first, so a ring of blocking
 * sends cannot deadlock. Needs two ranks at least. */
static void test_ring_blocking(void) {
    if (n < 2) return;
    enum { COUNT = 100 };
    int32_t out[COUNT], in[COUNT] = {0};
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    fill_msg(out, rank, COUNT);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_status s1, s2;
    if (rank % 2 == 0) {
        s1 = loom_comm_send(W, out, sizeof out, next, 7);
        s2 = loom_comm_recv(W, in, sizeof in, prev, 7);
    } else {
        s2 = loom_comm_recv(W, in, sizeof in, prev, 7);
        s1 = loom_comm_send(W, out, sizeof out, next, 7);
    }
    CHECK(s1 == LOOM_OK && s2 == LOOM_OK, "ring: %s", loom_errmsg());
    CHECK(msg_errors(in, prev, COUNT) == 0, "ring: wrong message from %d", prev);
    const loom_comm_stats *s = loom_comm_get_stats(W);
    CHECK(s->calls[LOOM_OP_SEND] - before.calls[LOOM_OP_SEND] == 1, "ring: send calls");
    CHECK(s->bytes[LOOM_OP_SEND] - before.bytes[LOOM_OP_SEND] == sizeof out, "ring: send bytes");
    CHECK(s->calls[LOOM_OP_RECV] - before.calls[LOOM_OP_RECV] == 1, "ring: recv calls");
    CHECK(s->bytes[LOOM_OP_RECV] - before.bytes[LOOM_OP_RECV] == sizeof in, "ring: recv bytes");
}

static void test_ring_nonblocking(void) {
    enum { COUNT = 64 };
    int32_t out[COUNT], in[COUNT] = {0};
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    fill_msg(out, rank, COUNT);
    loom_comm_stats before = *loom_comm_get_stats(W);
    loom_req *rr = NULL, *sr = NULL;
    loom_status st = loom_comm_irecv(W, in, sizeof in, prev, 9, &rr);
    if (st == LOOM_OK) st = loom_comm_isend(W, out, sizeof out, next, 9, &sr);
    /* bytes are counted at the start, seconds at completion */
    const loom_comm_stats *s = loom_comm_get_stats(W);
    CHECK(s->bytes[LOOM_OP_SEND] - before.bytes[LOOM_OP_SEND] == sizeof out, "isend bytes at start");
    CHECK(s->bytes[LOOM_OP_RECV] - before.bytes[LOOM_OP_RECV] == sizeof in, "irecv bytes at start");
    CHECK(s->seconds[LOOM_OP_RECV] == before.seconds[LOOM_OP_RECV], "irecv seconds before wait");
    if (st == LOOM_OK) st = loom_comm_wait(sr);
    if (st == LOOM_OK) st = loom_comm_wait(rr);
    CHECK(st == LOOM_OK, "nonblocking ring: %s", loom_errmsg());
    CHECK(msg_errors(in, prev, COUNT) == 0, "nonblocking ring: wrong message from %d", prev);
    CHECK(s->seconds[LOOM_OP_RECV] > before.seconds[LOOM_OP_RECV], "irecv seconds after wait");
    CHECK(s->calls[LOOM_OP_RECV] - before.calls[LOOM_OP_RECV] == 1, "irecv calls");
    CHECK(loom_comm_wait(NULL) == LOOM_OK, "wait(NULL)");
}

/* ---- groups ----------------------------------------------------------- */

static void test_split(void) {
    loom_comm *half = NULL;
    /* parity groups, ordered by decreasing world rank */
    loom_status st = loom_comm_split(W, rank % 2, -rank, "half", &half);
    CHECK(st == LOOM_OK && half, "split: %s", loom_errmsg());
    if (!half) return;
    int members = (n + 1 - rank % 2) / 2, above = 0;
    for (int r = rank + 2; r < n; r += 2) above++;
    CHECK(loom_comm_size(half) == members, "split size %d, expected %d", loom_comm_size(half), members);
    CHECK(loom_comm_rank(half) == above, "split rank %d, expected %d", loom_comm_rank(half), above);
    CHECK(strcmp(loom_comm_name(half), "half") == 0, "split name '%s'", loom_comm_name(half));
    loom_comm_stats world_before = *loom_comm_get_stats(W);
    int64_t v = rank, want = 0;
    for (int r = rank % 2; r < n; r += 2) want += r;
    CHECK(loom_comm_allreduce(half, &v, 1, LOOM_I64, LOOM_SUM) == LOOM_OK, "split allreduce");
    CHECK(v == want, "split allreduce %lld, expected %lld", (long long)v, (long long)want);
    check_delta(half, &(loom_comm_stats){0}, LOOM_OP_ALLREDUCE, 1, 8, "split stats");
    check_delta(W, &world_before, LOOM_OP_ALLREDUCE, 0, 0, "world stats untouched by split");
    loom_comm_reset_stats(half);
    CHECK(loom_comm_get_stats(half)->calls[LOOM_OP_ALLREDUCE] == 0, "reset_stats");
    loom_comm_free(half);

    loom_comm *none = W;
    st = loom_comm_split(W, rank % 2 ? -1 : 0, rank, "evens", &none);
    CHECK(st == LOOM_OK && (rank % 2 ? none == NULL : none != NULL), "split with color < 0");
    loom_comm_free(none);
}

/* ---- errors ----------------------------------------------------------- */

static void check_error_message(loom_status st, const char *op) {
    char want[64];
    snprintf(want, sizeof want, "rank %d: %s on group world", rank, op);
    CHECK(st == LOOM_EUNAVAIL, "%s to a bad peer returned %d", op, st);
    CHECK(strstr(loom_errmsg(), want) != NULL, "message '%s' lacks '%s'", loom_errmsg(), want);
}

static void test_errors(void) {
    int32_t x = 1;
    loom_comm_stats before = *loom_comm_get_stats(W);
    check_error_message(loom_comm_send(W, &x, sizeof x, n, 0), "send");
    check_error_message(loom_comm_recv(W, &x, sizeof x, n + 3, 0), "recv");
    loom_req *req = (loom_req *)&x; /* any non-NULL value: the call must clear it */
    check_error_message(loom_comm_isend(W, &x, sizeof x, -5, 0, &req), "send");
    CHECK(req == NULL, "failed isend leaves *req NULL");
    /* collective and seen by every rank alike: no rank is left waiting */
    check_error_message(loom_comm_bcast(W, &x, sizeof x, n), "bcast");
    check_delta(W, &before, LOOM_OP_SEND, 0, 0, "failed calls are not counted");
    loom_status st = loom_comm_allreduce(W, &x, (size_t)INT32_MAX + 1, LOOM_F32, LOOM_SUM);
    CHECK(st == LOOM_EUNAVAIL && strstr(loom_errmsg(), "does not fit"), "huge count: %s", loom_errmsg());
    size_t *huge = calloc((size_t)n, sizeof *huge);
    huge[n - 1] = (size_t)INT32_MAX + 1; /* on every rank alike, so none is left waiting */
    st = loom_comm_alltoallv(W, &x, huge, huge, &x, huge, huge);
    char want[64];
    snprintf(want, sizeof want, "send_bytes[%d]=2147483648", n - 1);
    CHECK(st == LOOM_EUNAVAIL && strstr(loom_errmsg(), want), "huge alltoallv: %s", loom_errmsg());
    free(huge);
    CHECK(loom_comm_barrier(W) == LOOM_OK, "group still usable after errors: %s", loom_errmsg());
}

static void test_basics(void) {
    CHECK(loom_dtype_size(LOOM_F32) == 4 && loom_dtype_size(LOOM_F64) == 8 &&
              loom_dtype_size(LOOM_I32) == 4 && loom_dtype_size(LOOM_I64) == 8 &&
              loom_dtype_size(LOOM_U8) == 1 && loom_dtype_size(LOOM_BF16) == 2,
          "dtype sizes");
    CHECK(strcmp(loom_comm_op_name(LOOM_OP_REDUCE_SCATTER), "reduce_scatter") == 0, "op name");
    CHECK(strcmp(loom_comm_name(W), "world") == 0, "world name '%s'", loom_comm_name(W));
    CHECK(rank >= 0 && rank < n, "rank %d of %d", rank, n);
    double t0 = loom_comm_wtime();
    CHECK(loom_comm_wtime() >= t0, "wtime is monotonic");
}

int main(int argc, char **argv) {
    if (!(W = comm_test_start(&argc, &argv))) return 1;
    rank = loom_comm_rank(W), n = loom_comm_size(W);
    test_basics();
    const loom_dtype types[] = {LOOM_F32, LOOM_F64, LOOM_I32, LOOM_I64};
    const loom_redop ops[] = {LOOM_SUM, LOOM_MAX, LOOM_MIN};
    for (int t = 0; t < 4; t++)
        for (int o = 0; o < 3; o++)
            for (int nb = 0; nb < 2; nb++) test_allreduce(types[t], ops[o], nb);
    for (int mode = 0; mode < 3; mode++) test_reduce_scatter(types[mode % 4], mode), test_allgather(mode);
    test_reduce_scatter(LOOM_I64, 0);
    for (int mode = 0; mode < 4; mode++) test_bf16(mode);
    test_alltoall();
    test_alltoallv();
    test_ialltoallv(0);
    test_ialltoallv(1);
    test_bcast_barrier();
    test_ring_blocking();
    test_ring_nonblocking();
    test_split();
    test_errors();
    return comm_test_end(W);
}
