/* gpu_mpi.c - start and end of the multi-rank GPU tests (gpu_mpi.h). */
#include "gpu_mpi.h"

#include <stdio.h>

#include "check.h"
#include "cuda_backend.h"

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
        fprintf(stderr, "rank %d: %s\n", rank, n ? loom_errmsg() : "no CUDA device while another rank has one");
        return 1;
    }
    return 0;
}

int gpu_mpi_finish(loom_comm *world) {
    loom_cuda_shutdown();
    int rc = check_done();
    loom_comm_finalize(world);
    return rc;
}
