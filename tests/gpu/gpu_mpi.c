/* gpu_mpi.c - start and end of the multi-rank GPU tests (gpu_mpi.h). */
#include "gpu_mpi.h"
#include "loom/bf16.h"

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "cuda_backend.h"
#include "loom/kernels.h"

int gpu_mpi_start(int *argc, char ***argv, loom_comm **world, int *ndev) {
    if (loom_comm_init(argc, argv, world) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_errmsg());
        return 1;
    }
    int rank = loom_comm_rank(*world);
    int n = loom_cuda_device_count(), most = n;
    if (loom_comm_allreduce(*world, &most, 1, LOOM_I32, LOOM_MAX) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_errmsg());
        return 1;
    }
    if (most == 0) {
        if (rank == 0) printf("no CUDA device: skipped (exit 77)\n");
        loom_comm_finalize(*world);
        return 77;
    }
    *ndev = n;
    if (n == 0 || loom_cuda_init(rank % n) != LOOM_OK) {
        fprintf(stderr, "rank %d: %s\n", rank,
                n ? loom_errmsg() : "no CUDA device while another rank has one");
        return 1;
    }
    return 0;
}

int gpu_mpi_finish(loom_comm *world) {
    int rc = check_done();
    loom_comm_finalize(world);
    return rc;
}

void gpu_fill(float *h, size_t n, int rank, int salt) {
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((int)((i * 7 + (size_t)salt) % 23) - 11) * 0.25f + 10.0f * (float)rank;
}

static size_t v_bytes(int src, int dst) { return (size_t)((src + 2 * dst) % 3 + 1) * 100 * 4; }

void gpu_v_init(gpu_v_case *v, int rank, int size) {
    size_t so = 0, ro = 0;
    for (int p = 0; p < size; p++) {
        v->sb[p] = v_bytes(rank, p), v->rb[p] = v_bytes(p, rank);
        v->sd[p] = so + 16, v->rd[p] = ro + 16;
        so = v->sd[p] + v->sb[p], ro = v->rd[p] + v->rb[p];
    }
    v->ss = so, v->rs = ro;
    v->hs = malloc(so), v->hr = malloc(ro), v->ds = loom_cuda_alloc(so), v->dr = loom_cuda_alloc(ro);
    gpu_fill(v->hs, so / 4, rank, 8);
    gpu_fill(v->hr, ro / 4, -1, 9);
    CHECK(loom_cuda_memcpy_h2d(v->ds, v->hs, so) == LOOM_OK &&
              loom_cuda_memcpy_h2d(v->dr, v->hr, ro) == LOOM_OK,
          "alltoallv case h2d: %s", loom_errmsg());
}

void gpu_v_free(gpu_v_case *v) {
    free(v->hs), free(v->hr);
    loom_cuda_free(v->ds), loom_cuda_free(v->dr);
}

/* ---- CUDA memory for the communicator (until the device object brings its own) ---- */

static void *cu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return loom_cuda_alloc(bytes);
}
static void cu_free(void *ctx, void *p, size_t bytes) {
    (void)ctx, (void)bytes;
    loom_cuda_free(p);
}
static loom_status cu_d2h(void *ctx, void *host, const void *src, size_t bytes) {
    (void)ctx;
    return loom_cuda_memcpy_d2h(host, src, bytes);
}
static loom_status cu_h2d(void *ctx, void *dst, const void *host, size_t bytes) {
    (void)ctx;
    return loom_cuda_memcpy_h2d(dst, host, bytes);
}
/* bf16 conversion through the host (no device kernel for it yet): slow, exact */
static void cu_pack(void *ctx, uint16_t *dst, const float *src, size_t n) {
    (void)ctx;
    float *f = malloc(n * sizeof *f + 1);
    uint16_t *h = malloc(n * sizeof *h + 1);
    CHECK(f && h && loom_cuda_memcpy_d2h(f, src, n * sizeof *f) == LOOM_OK, "pack d2h");
    for (size_t i = 0; f && h && i < n; i++) h[i] = loom_bf16_from_f32(f[i]);
    CHECK(h && loom_cuda_memcpy_h2d(dst, h, n * sizeof *h) == LOOM_OK, "pack h2d");
    free(f), free(h);
}
static void cu_unpack(void *ctx, float *dst, const uint16_t *src, size_t n) {
    (void)ctx;
    float *f = malloc(n * sizeof *f + 1);
    uint16_t *h = malloc(n * sizeof *h + 1);
    CHECK(f && h && loom_cuda_memcpy_d2h(h, src, n * sizeof *h) == LOOM_OK, "unpack d2h");
    for (size_t i = 0; f && h && i < n; i++) f[i] = loom_bf16_to_f32(h[i]);
    CHECK(f && loom_cuda_memcpy_h2d(dst, f, n * sizeof *f) == LOOM_OK, "unpack h2d");
    free(f), free(h);
}

const loom_comm_mem gpu_cuda_mem = {.name = "cuda",
                                    .alloc = cu_alloc,
                                    .free = cu_free,
                                    .copy_to_host = cu_d2h,
                                    .copy_from_host = cu_h2d,
                                    .pack_bf16 = cu_pack,
                                    .unpack_bf16 = cu_unpack};
