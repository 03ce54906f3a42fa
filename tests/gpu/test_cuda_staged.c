/* test_cuda_staged.c - device-buffer collectives through MPI with host
 * staging (the staged communicator, src/comm/comm_staged.c, over CUDA
 * memory: loom_comm_wrap_staged with gpu_cuda_mem), on 2 ranks that may
 * share one GPU (rank r uses device r % count): allreduce (blocking and
 * started), reduce_scatter, allgather, bcast, send/recv, alltoall, alltoallv
 * and the bf16 wire format on device buffers must equal the same loom_comm
 * ops on host copies of the same data, and the staged group's calls and
 * bytes must equal the host group's op by op (staging adds no
 * communication). Exits 77 only when no rank sees a device. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_backend.h"
#include "gpu_mpi.h"

#define N 777

static void expect_dev(const char *what, const float *d, const float *h, size_t n) {
    float *g = malloc(n * sizeof *g);
    CHECK(loom_cuda_memcpy_d2h(g, d, n * sizeof *g) == LOOM_OK, "%s d2h: %s", what, loom_errmsg());
    CHECK(memcmp(g, h, n * sizeof *g) == 0, "%s: device result differs from the host op's", what);
    free(g);
}

static void run_alltoall(loom_comm *sg, loom_comm *hg, int rank, int size) {
    size_t full = (size_t)N * size;
    float *h = malloc(full * 4), *ref = malloc(full * 4), *d = loom_cuda_alloc(full * 4),
          *d2 = loom_cuda_alloc(full * 4);
    gpu_fill(h, full, rank, 7);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_comm_alltoall(sg, d, d2, N * 4) == LOOM_OK, "alltoall: %s", loom_errmsg());
    CHECK(loom_comm_alltoall(hg, h, ref, N * 4) == LOOM_OK, "host alltoall");
    expect_dev("alltoall", d2, ref, full);
    free(h), free(ref), loom_cuda_free(d), loom_cuda_free(d2);
    gpu_v_case v;
    gpu_v_init(&v, rank, size);
    CHECK(loom_comm_alltoallv(sg, v.ds, v.sb, v.sd, v.dr, v.rb, v.rd) == LOOM_OK, "alltoallv: %s",
          loom_errmsg());
    CHECK(loom_comm_alltoallv(hg, v.hs, v.sb, v.sd, v.hr, v.rb, v.rd) == LOOM_OK, "host alltoallv");
    expect_dev("alltoallv", v.dr, v.hr, v.rs / 4);
    gpu_v_free(&v);
}

/* A started allreduce, and the bf16 wire format (allreduce, in-place
 * reduce_scatter, allgather), on both groups: bit for bit the same. */
static void run_started_and_wire(loom_comm *sg, loom_comm *hg, int rank) {
    size_t full = (size_t)N * loom_comm_size(sg);
    float *h = malloc(full * 4), *ref = malloc(full * 4), *d = loom_cuda_alloc(full * 4);
    gpu_fill(h, N, rank, 10);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    loom_req *rq = NULL, *hq = NULL;
    CHECK(loom_comm_iallreduce(sg, d, N, LOOM_F32, LOOM_SUM, &rq) == LOOM_OK, "iallreduce: %s",
          loom_errmsg());
    CHECK(loom_comm_iallreduce(hg, ref, N, LOOM_F32, LOOM_SUM, &hq) == LOOM_OK, "host iallreduce");
    CHECK(loom_comm_wait(rq) == LOOM_OK && loom_comm_wait(hq) == LOOM_OK, "waits: %s", loom_errmsg());
    expect_dev("iallreduce", d, ref, N);
    gpu_fill(h, full, rank, 11);
    memcpy(ref, h, full * 4);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_comm_allreduce_as(sg, d, N, LOOM_BF16, LOOM_SUM) == LOOM_OK, "allreduce_as: %s",
          loom_errmsg());
    CHECK(loom_comm_allreduce_as(hg, ref, N, LOOM_BF16, LOOM_SUM) == LOOM_OK, "host allreduce_as");
    expect_dev("allreduce_as bf16", d, ref, N);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    memcpy(ref, h, full * 4);
    CHECK(loom_comm_reduce_scatter_as(sg, d, d, N, LOOM_BF16, LOOM_SUM) == LOOM_OK, "reduce_scatter_as: %s",
          loom_errmsg());
    CHECK(loom_comm_reduce_scatter_as(hg, ref, ref, N, LOOM_BF16, LOOM_SUM) == LOOM_OK,
          "host reduce_scatter_as");
    expect_dev("reduce_scatter_as bf16", d, ref, N);
    gpu_fill(h, N, rank, 12);
    loom_cuda_memcpy_h2d(d + (size_t)rank * N, h, N * 4);
    memcpy(ref + (size_t)rank * N, h, N * 4);
    CHECK(loom_comm_allgather_as(sg, d + (size_t)rank * N, d, N, LOOM_BF16) == LOOM_OK, "allgather_as: %s",
          loom_errmsg());
    CHECK(loom_comm_allgather_as(hg, ref + (size_t)rank * N, ref, N, LOOM_BF16) == LOOM_OK,
          "host allgather_as");
    expect_dev("allgather_as bf16", d, ref, full);
    free(h), free(ref), loom_cuda_free(d);
}

static void run(loom_comm *sg, loom_comm *hg, int rank, int size) {
    size_t full = (size_t)N * size;
    float *h = malloc(full * 4), *ref = malloc(full * 4);
    float *d = loom_cuda_alloc(full * 4), *d2 = loom_cuda_alloc(full * 4);
    gpu_fill(h, N, rank, 1);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_comm_allreduce(sg, d, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "allreduce: %s", loom_errmsg());
    CHECK(loom_comm_allreduce(hg, ref, N, LOOM_F32, LOOM_SUM) == LOOM_OK, "host allreduce");
    expect_dev("allreduce", d, ref, N);
    gpu_fill(h, full, rank, 2);
    memcpy(ref, h, full * 4);
    loom_cuda_memcpy_h2d(d, h, full * 4);
    CHECK(loom_comm_reduce_scatter(sg, d, d2, N, LOOM_F32, LOOM_MAX) == LOOM_OK, "reduce_scatter: %s",
          loom_errmsg());
    CHECK(loom_comm_reduce_scatter(hg, ref, ref, N, LOOM_F32, LOOM_MAX) == LOOM_OK, "host reduce_scatter");
    expect_dev("reduce_scatter", d2, ref, N);
    gpu_fill(h, N, rank, 3);
    loom_cuda_memcpy_h2d(d2, h, N * 4);
    memcpy(ref + (size_t)rank * N, h, N * 4);
    CHECK(loom_comm_allgather(sg, d2, d, N * 4) == LOOM_OK, "allgather: %s", loom_errmsg());
    CHECK(loom_comm_allgather(hg, ref + (size_t)rank * N, ref, N * 4) == LOOM_OK, "host allgather");
    expect_dev("allgather", d, ref, full);
    gpu_fill(h, N, rank, 4);
    memcpy(ref, h, N * 4);
    loom_cuda_memcpy_h2d(d, h, N * 4);
    CHECK(loom_comm_bcast(sg, d, N * 4, size - 1) == LOOM_OK, "bcast: %s", loom_errmsg());
    CHECK(loom_comm_bcast(hg, ref, N * 4, size - 1) == LOOM_OK, "host bcast");
    expect_dev("bcast", d, ref, N);
    if (rank < 2) { /* rank 0 sends to 1 on both groups */
        gpu_fill(h, N, 0, 5);
        if (rank == 0) {
            loom_cuda_memcpy_h2d(d, h, N * 4);
            CHECK(loom_comm_send(sg, d, N * 4, 1, 3) == LOOM_OK, "send: %s", loom_errmsg());
            CHECK(loom_comm_send(hg, h, N * 4, 1, 3) == LOOM_OK, "host send");
        } else {
            CHECK(loom_comm_recv(sg, d, N * 4, 0, 3) == LOOM_OK, "recv: %s", loom_errmsg());
            CHECK(loom_comm_recv(hg, ref, N * 4, 0, 3) == LOOM_OK, "host recv");
            CHECK(memcmp(ref, h, N * 4) == 0, "host recv got other data");
            expect_dev("recv", d, ref, N);
        }
    }
    if (size <= 64) run_alltoall(sg, hg, rank, size);
    run_started_and_wire(sg, hg, rank);
    const loom_comm_stats *a = loom_comm_get_stats(sg), *b = loom_comm_get_stats(hg);
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        CHECK(a->calls[op] == b->calls[op] && a->bytes[op] == b->bytes[op],
              "%s: staged %llu calls %llu bytes, host %llu calls %llu bytes",
              loom_comm_op_name((loom_comm_op)op), (unsigned long long)a->calls[op],
              (unsigned long long)a->bytes[op], (unsigned long long)b->calls[op],
              (unsigned long long)b->bytes[op]);
    /* allreduce, iallreduce (fp32), allreduce_as (bf16: 2 bytes a value) */
    CHECK(a->bytes[LOOM_OP_ALLREDUCE] == N * (4 + 4 + 2), "allreduce bytes %llu",
          (unsigned long long)a->bytes[LOOM_OP_ALLREDUCE]);
    loom_cuda_free(d), loom_cuda_free(d2);
    free(h), free(ref);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    int ndev = 0, rc = gpu_mpi_start(&argc, &argv, &world, &ndev);
    if (rc) return rc;
    int rank = loom_comm_rank(world), size = loom_comm_size(world);
    loom_comm *sh = NULL, *sg = NULL, *hg = NULL;
    CHECK(loom_comm_split(world, 0, rank, "staged", &sh) == LOOM_OK, "split");
    CHECK(loom_comm_wrap_staged(sh, &gpu_cuda_mem, &sg) == LOOM_OK, "wrap: %s", loom_errmsg());
    CHECK(loom_comm_split(world, 0, rank, "host", &hg) == LOOM_OK, "split");
    run(sg, hg, rank, size);
    loom_comm_free(sg), loom_comm_free(hg);
    return gpu_mpi_finish(world);
}
