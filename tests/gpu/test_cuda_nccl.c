/* test_cuda_nccl.c - the NCCL communicator (src/backend/cuda/comm_nccl.c)
 * against the MPI communicator, on 2 ranks.
 *
 * With a GPU per rank: allreduce, reduce_scatter (out of place and in place),
 * allgather (in place), bcast, a send/recv pair, alltoall and alltoallv run through NCCL on device
 * buffers and through loom_comm (MPI) on the same host data; results must
 * agree, and the byte and call counts of the two communicators must be equal
 * op by op (one convention, comm.h). With fewer GPUs than ranks: creating the
 * NCCL communicator must be refused with LOOM_EUSAGE naming the shared GPU,
 * and the MPI path with host staging (d2h, loom_comm, h2d) must give the
 * collective's result. Exits 77 (skip) only when no rank sees a device.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_nccl.h"
#include "comm_staged.h"
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
static void test_nccl_alltoall(loom_comm *mpi, loom_nccl *nc, int rank, int size, loom_cuda_stream s) {
    size_t full = (size_t)N * size;
    float *h = malloc(full * 4), *ref = malloc(full * 4), *d = loom_cuda_alloc(full * 4), *d2 = loom_cuda_alloc(full * 4);
    gpu_fill(h, full, rank, 7);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_nccl_alltoall(nc, d, d2, N * 4, s) == LOOM_OK, "alltoall: %s", loom_errmsg());
    CHECK(loom_comm_alltoall(mpi, h, ref, N * 4) == LOOM_OK, "mpi alltoall");
    CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
    expect_equal("alltoall", d2, ref, full);
    free(h), free(ref), loom_cuda_free(d), loom_cuda_free(d2);
    gpu_v_case v;
    gpu_v_init(&v, rank, size);
    CHECK(loom_nccl_alltoallv(nc, v.ds, v.sb, v.sd, v.dr, v.rb, v.rd, s) == LOOM_OK, "alltoallv: %s", loom_errmsg());
    CHECK(loom_comm_alltoallv(mpi, v.hs, v.sb, v.sd, v.hr, v.rb, v.rd) == LOOM_OK, "mpi alltoallv");
    CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
    expect_equal("alltoallv", v.dr, v.hr, v.rs / 4);
    gpu_v_free(&v);
}

static void test_nccl(loom_comm *mpi, loom_nccl *nc, int rank, int size) {
    loom_cuda_stream s = NULL;
    CHECK(loom_cuda_stream_create(&s) == LOOM_OK, "stream: %s", loom_errmsg());
    size_t full = (size_t)N * size;
    float *h = malloc(full * 4), *ref = malloc(full * 4), *d = loom_cuda_alloc(full * 4), *d2 = loom_cuda_alloc(N * 4);
    /* allreduce */
    gpu_fill(h, N, rank, 1);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_nccl_allreduce(nc, d, N, LOOM_F32, LOOM_SUM, s) == LOOM_OK, "allreduce: %s", loom_errmsg());
    CHECK(loom_comm_allreduce(mpi, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "mpi allreduce");
    CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
    expect_equal("allreduce", d, ref, N);
    /* reduce_scatter, out of place then in place */
    gpu_fill(h, full, rank, 2);
    memcpy(ref, h, full * 4);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_nccl_reduce_scatter(nc, d, d2, N, LOOM_F32, LOOM_SUM, s) == LOOM_OK, "reduce_scatter: %s",
          loom_errmsg());
    CHECK(loom_nccl_reduce_scatter(nc, d, d, N, LOOM_F32, LOOM_SUM, s) == LOOM_OK, "reduce_scatter in place: %s",
          loom_errmsg());
    CHECK(loom_comm_reduce_scatter(mpi, ref, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "mpi reduce_scatter");
    CHECK(loom_comm_reduce_scatter(mpi, h, h, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "mpi reduce_scatter 2");
    CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
    expect_equal("reduce_scatter", d2, ref, N);
    expect_equal("reduce_scatter in place", d, h, N);
    /* allgather in place: this rank's block at rank * N */
    gpu_fill(h, full, rank, 3);
    memcpy(ref, h, full * 4);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_nccl_allgather(nc, d + (size_t)rank * N, d, N * 4, s) == LOOM_OK, "allgather: %s", loom_errmsg());
    CHECK(loom_comm_allgather(mpi, ref + (size_t)rank * N, ref, N * 4) == LOOM_OK, "mpi allgather");
    CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
    expect_equal("allgather", d, ref, full);
    /* bcast from the last rank */
    gpu_fill(h, N, rank, 4);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_nccl_bcast(nc, d, N * 4, size - 1, s) == LOOM_OK, "bcast: %s", loom_errmsg());
    CHECK(loom_comm_bcast(mpi, ref, N * 4, size - 1) == LOOM_OK, "mpi bcast");
    CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
    expect_equal("bcast", d, ref, N);
    /* send/recv: ranks 0 and 1 swap, paired in one group call */
    if (rank < 2) {
        int peer = 1 - rank;
        gpu_fill(h, N, rank, 5);
        gpu_fill(ref, N, peer, 5);
        loom_cuda_memcpy_h2d(d, h, N * 4);
        CHECK(loom_nccl_group_start() == LOOM_OK, "group start");
        CHECK(loom_nccl_send(nc, d, N * 4, peer, s) == LOOM_OK, "send: %s", loom_errmsg());
        CHECK(loom_nccl_recv(nc, d2, N * 4, peer, s) == LOOM_OK, "recv: %s", loom_errmsg());
        CHECK(loom_nccl_group_end() == LOOM_OK, "group end: %s", loom_errmsg());
        CHECK(loom_nccl_sync(nc) == LOOM_OK, "sync: %s", loom_errmsg());
        expect_equal("send/recv", d2, ref, N);
        /* the MPI counterpart, for the byte counts */
        float *tmp = malloc(N * 4);
        loom_req *rq = NULL;
        CHECK(loom_comm_irecv(mpi, tmp, N * 4, peer, 7, &rq) == LOOM_OK, "mpi irecv");
        CHECK(loom_comm_send(mpi, h, N * 4, peer, 7) == LOOM_OK, "mpi send");
        CHECK(loom_comm_wait(rq) == LOOM_OK, "mpi wait");
        free(tmp);
    }
    if (size <= 64) test_nccl_alltoall(mpi, nc, rank, size, s);
    /* one accounting: the same ops, the same calls and bytes per op */
    const loom_comm_stats *a = loom_nccl_get_stats(nc), *b = loom_comm_get_stats(mpi);
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        if (op == LOOM_OP_BARRIER) continue;
        CHECK(a->bytes[op] == b->bytes[op] && a->calls[op] == b->calls[op],
              "%s: nccl %llu calls %llu bytes, mpi %llu calls %llu bytes", loom_comm_op_name((loom_comm_op)op),
              (unsigned long long)a->calls[op], (unsigned long long)a->bytes[op],
              (unsigned long long)b->calls[op], (unsigned long long)b->bytes[op]);
        if (a->calls[op]) CHECK(a->seconds[op] > 0.0, "%s: no device time counted", loom_comm_op_name((loom_comm_op)op));
    }
    loom_cuda_free(d), loom_cuda_free(d2);
    loom_cuda_stream_destroy(s);
    free(h), free(ref);
}

/* Ranks sharing a GPU: NCCL refused, the host-staged MPI path works. */
static void test_shared_gpu(loom_comm *world, loom_status st, int rank) {
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "share one GPU"), "create on a shared GPU: status %d '%s'",
          (int)st, loom_errmsg());
    float h[N], ref[N], *d = loom_cuda_alloc(sizeof h);
    gpu_fill(h, N, rank, 6);
    memcpy(ref, h, sizeof h);
    CHECK(loom_comm_allreduce(world, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "reference allreduce");
    loom_cuda_memcpy_h2d(d, h, sizeof h);
    CHECK(loom_staged_allreduce(world, d, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "staged allreduce: %s", loom_errmsg());
    expect_equal("host-staged allreduce", d, ref, N);
    loom_cuda_free(d);
    loom_staged_release();
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    int ndev = 0, rc = gpu_mpi_start(&argc, &argv, &world, &ndev);
    if (rc) return rc;
    int rank = loom_comm_rank(world), size = loom_comm_size(world);
    loom_comm *mpi = NULL;
    CHECK(loom_comm_split(world, 0, rank, "nccltest", &mpi) == LOOM_OK, "split");
    loom_nccl *nc = NULL;
    loom_status st = loom_nccl_create(mpi, &nc);
    if (ndev >= size) {
        CHECK(st == LOOM_OK, "nccl create: %s", loom_errmsg());
        loom_comm_reset_stats(mpi); /* the set-up's id broadcast is not one of the compared ops */
        if (st == LOOM_OK) test_nccl(mpi, nc, rank, size);
    } else {
        test_shared_gpu(world, st, rank);
    }
    loom_nccl_free(nc);
    loom_comm_free(mpi);
    return gpu_mpi_finish(world);
}
