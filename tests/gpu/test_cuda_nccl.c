/* test_cuda_nccl.c - the NCCL communicator (src/comm/comm_nccl.c,
 * loom_comm_wrap_nccl) against the MPI communicator, on 2 ranks.
 *
 * With a GPU per rank: allreduce, reduce_scatter (out of place and in place),
 * allgather (in place), bcast, a send/recv pair (started inside an NCCL
 * group call), alltoall, alltoallv and a bf16 wire allreduce run through
 * NCCL on device buffers and through MPI on the same host data; results must
 * agree, and the byte and call counts of the two groups must be equal op by
 * op (one convention, comm.h). With fewer GPUs than ranks: wrapping must be
 * refused with LOOM_EUSAGE naming the shared GPU, and the host-staged group
 * (loom_comm_wrap_staged: d2h, MPI, h2d) must give the collective's result.
 * Exits 77 (skip) only when no rank sees a device.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_backend.h"
#include "gpu_mpi.h"

#define N 1000 /* floats per rank in the collectives */

/* The device buffer d (n floats) equals the host reference h. */
static void expect_equal(const char *what, const float *d, const float *h, size_t n) {
    float *g = malloc(n * sizeof *g);
    CHECK(loom_cuda_memcpy_d2h(g, d, n * sizeof *g) == LOOM_OK, "%s d2h: %s", what, loom_errmsg());
    double e = check_max_rel_err(g, h, n);
    CHECK(e <= 1e-6, "%s: max rel err %.3g", what, e);
    free(g);
}

/* alltoall and alltoallv: NCCL on device buffers vs MPI on host copies. */
static void test_nccl_alltoall(loom_comm *mpi, loom_comm *nc, int rank, int size) {
    size_t full = (size_t)N * size;
    float *h = malloc(full * 4), *ref = malloc(full * 4), *d = loom_cuda_alloc(full * 4),
          *d2 = loom_cuda_alloc(full * 4);
    gpu_fill(h, full, rank, 7);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_comm_alltoall(nc, d, d2, N * 4) == LOOM_OK, "alltoall: %s", loom_errmsg());
    CHECK(loom_comm_alltoall(mpi, h, ref, N * 4) == LOOM_OK, "mpi alltoall");
    expect_equal("alltoall", d2, ref, full);
    free(h), free(ref), loom_cuda_free(d), loom_cuda_free(d2);
    gpu_v_case v;
    gpu_v_init(&v, rank, size);
    CHECK(loom_comm_alltoallv(nc, v.ds, v.sb, v.sd, v.dr, v.rb, v.rd) == LOOM_OK, "alltoallv: %s",
          loom_errmsg());
    CHECK(loom_comm_alltoallv(mpi, v.hs, v.sb, v.sd, v.hr, v.rb, v.rd) == LOOM_OK, "mpi alltoallv");
    expect_equal("alltoallv", v.dr, v.hr, v.rs / 4);
    gpu_v_free(&v);
}

static void test_nccl(loom_comm *mpi, loom_comm *nc, int rank, int size) {
    size_t full = (size_t)N * size;
    float *h = malloc(full * 4), *ref = malloc(full * 4), *d = loom_cuda_alloc(full * 4),
          *d2 = loom_cuda_alloc(N * 4);
    /* allreduce */
    gpu_fill(h, N, rank, 1);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_comm_allreduce(nc, d, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "allreduce: %s", loom_errmsg());
    CHECK(loom_comm_allreduce(mpi, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "mpi allreduce");
    expect_equal("allreduce", d, ref, N);
    /* reduce_scatter, out of place then in place */
    gpu_fill(h, full, rank, 2);
    memcpy(ref, h, full * 4);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_comm_reduce_scatter(nc, d, d2, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "reduce_scatter: %s",
          loom_errmsg());
    CHECK(loom_comm_reduce_scatter(nc, d, d, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "reduce_scatter in place: %s",
          loom_errmsg());
    CHECK(loom_comm_reduce_scatter(mpi, ref, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "mpi reduce_scatter");
    CHECK(loom_comm_reduce_scatter(mpi, h, h, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "mpi reduce_scatter 2");
    expect_equal("reduce_scatter", d2, ref, N);
    expect_equal("reduce_scatter in place", d, h, N);
    /* allgather in place: this rank's block at rank * N */
    gpu_fill(h, full, rank, 3);
    memcpy(ref, h, full * 4);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_comm_allgather(nc, d + (size_t)rank * N, d, N * 4) == LOOM_OK, "allgather: %s", loom_errmsg());
    CHECK(loom_comm_allgather(mpi, ref + (size_t)rank * N, ref, N * 4) == LOOM_OK, "mpi allgather");
    expect_equal("allgather", d, ref, full);
    /* bcast from the last rank */
    gpu_fill(h, N, rank, 4);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_comm_bcast(nc, d, N * 4, size - 1) == LOOM_OK, "bcast: %s", loom_errmsg());
    CHECK(loom_comm_bcast(mpi, ref, N * 4, size - 1) == LOOM_OK, "mpi bcast");
    expect_equal("bcast", d, ref, N);
    /* send/recv: ranks 0 and 1 swap, paired in one group call */
    if (rank < 2) {
        int peer = 1 - rank;
        gpu_fill(h, N, rank, 5);
        gpu_fill(ref, N, peer, 5);
        loom_cuda_memcpy_h2d(d, h, N * 4);
        loom_req *sq = NULL, *rq2 = NULL;
        CHECK(loom_comm_nccl_group_start() == LOOM_OK, "group start");
        CHECK(loom_comm_isend(nc, d, N * 4, peer, 0, &sq) == LOOM_OK, "send: %s", loom_errmsg());
        CHECK(loom_comm_irecv(nc, d2, N * 4, peer, 0, &rq2) == LOOM_OK, "recv: %s", loom_errmsg());
        CHECK(loom_comm_nccl_group_end() == LOOM_OK, "group end: %s", loom_errmsg());
        CHECK(loom_comm_wait(sq) == LOOM_OK && loom_comm_wait(rq2) == LOOM_OK, "p2p wait: %s", loom_errmsg());
        expect_equal("send/recv", d2, ref, N);
        /* the MPI counterpart, for the byte counts */
        float *tmp = malloc(N * 4);
        loom_req *rq = NULL;
        CHECK(loom_comm_irecv(mpi, tmp, N * 4, peer, 7, &rq) == LOOM_OK, "mpi irecv");
        CHECK(loom_comm_send(mpi, h, N * 4, peer, 7) == LOOM_OK, "mpi send");
        CHECK(loom_comm_wait(rq) == LOOM_OK, "mpi wait");
        free(tmp);
    }
    if (size <= 64) test_nccl_alltoall(mpi, nc, rank, size);
    /* the bf16 wire: NCCL sums bf16 in its own order, so within bf16 rounding */
    gpu_fill(h, N, rank, 9);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_comm_allreduce_as(nc, d, N, LOOM_BF16, LOOM_SUM) == LOOM_OK, "allreduce_as: %s",
          loom_errmsg());
    CHECK(loom_comm_allreduce_as(mpi, ref, N, LOOM_BF16, LOOM_SUM) == LOOM_OK, "mpi allreduce_as");
    float *g = malloc(N * 4);
    CHECK(loom_cuda_memcpy_d2h(g, d, N * 4) == LOOM_OK, "d2h");
    CHECK(check_max_rel_err(g, ref, N) <= 1.0 / 64, "bf16 allreduce: max rel err %.3g",
          check_max_rel_err(g, ref, N));
    free(g);
    /* one accounting: the same ops, the same calls and bytes per op */
    const loom_comm_stats *a = loom_comm_get_stats(nc), *b = loom_comm_get_stats(mpi);
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        if (op == LOOM_OP_BARRIER) continue;
        CHECK(a->bytes[op] == b->bytes[op] && a->calls[op] == b->calls[op],
              "%s: nccl %llu calls %llu bytes, mpi %llu calls %llu bytes",
              loom_comm_op_name((loom_comm_op)op), (unsigned long long)a->calls[op],
              (unsigned long long)a->bytes[op], (unsigned long long)b->calls[op],
              (unsigned long long)b->bytes[op]);
        if (a->calls[op])
            CHECK(a->seconds[op] > 0.0, "%s: no device time counted", loom_comm_op_name((loom_comm_op)op));
    }
    loom_cuda_free(d), loom_cuda_free(d2);
    free(h), free(ref);
}

/* Ranks sharing a GPU: NCCL refused, the host-staged MPI path works. */
static void test_shared_gpu(loom_comm *world, loom_comm *group, loom_status st, int rank) {
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "share one GPU"),
          "create on a shared GPU: status %d '%s'", (int)st, loom_errmsg());
    float h[N], ref[N], *d = loom_cuda_alloc(sizeof h);
    gpu_fill(h, N, rank, 6);
    memcpy(ref, h, sizeof h);
    CHECK(loom_comm_allreduce(world, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "reference allreduce");
    loom_cuda_memcpy_h2d(d, h, sizeof h);
    loom_comm *sg = NULL;
    CHECK(loom_comm_wrap_staged(group, &gpu_cuda_mem, &sg) == LOOM_OK, "wrap staged: %s", loom_errmsg());
    CHECK(loom_comm_allreduce(sg, d, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "staged allreduce: %s",
          loom_errmsg());
    expect_equal("host-staged allreduce", d, ref, N);
    loom_cuda_free(d);
    loom_comm_free(sg); /* and group with it */
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    int ndev = 0, rc = gpu_mpi_start(&argc, &argv, &world, &ndev);
    if (rc) return rc;
    int rank = loom_comm_rank(world), size = loom_comm_size(world);
    loom_comm *under = NULL, *mpi = NULL, *nc = NULL;
    CHECK(loom_comm_split(world, 0, rank, "nccltest", &under) == LOOM_OK, "split");
    CHECK(loom_comm_split(world, 0, rank, "mpiref", &mpi) == LOOM_OK, "split");
    loom_cuda_stream s = NULL;
    CHECK(loom_cuda_stream_create(&s) == LOOM_OK, "stream: %s", loom_errmsg());
    loom_status st = loom_comm_wrap_nccl(under, &gpu_cuda_mem, s, &nc);
    if (ndev >= size) {
        CHECK(st == LOOM_OK, "nccl create: %s", loom_errmsg());
        if (st == LOOM_OK) {
            loom_comm_reset_stats(nc); /* the set-up's id broadcast is not one of the compared ops */
            test_nccl(mpi, nc, rank, size);
        }
        loom_comm_free(nc); /* and under with it */
        if (st != LOOM_OK) loom_comm_free(under);
    } else {
        test_shared_gpu(world, under, st, rank);
    }
    loom_cuda_stream_destroy(s);
    loom_comm_free(mpi);
    return gpu_mpi_finish(world);
}
