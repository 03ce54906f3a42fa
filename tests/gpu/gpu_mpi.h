/* gpu_mpi.h - start and end of the multi-rank GPU tests. */
#ifndef LOOM_TESTS_GPU_MPI_H
#define LOOM_TESTS_GPU_MPI_H

#include <stddef.h>

#include "loom/comm.h"

/* MPI up, then rank r on CUDA device r % count. Returns 0 when ready
 * (*world, *ndev set), 77 (ctest's skip, MPI finalized) when no rank sees a
 * device, 1 (message printed) on failure. */
int gpu_mpi_start(int *argc, char ***argv, loom_comm **world, int *ndev);
/* Shut the device down, finalize MPI; the checks' exit code. */
int gpu_mpi_finish(loom_comm *world);

/* h[i] = a small pattern of i and salt, plus 10 * rank. */
void gpu_fill(float *h, size_t n, int rank, int salt);

/* An alltoallv case for rank `rank` of `size` (at most 64 ranks): rank src
 * sends ((src + 2 dst) % 3 + 1) * 100 floats to dst, blocks packed with a
 * 16-byte gap before each; send data filled on host and device, the receive
 * buffers on both filled with the same values (the gaps must keep them). */
typedef struct {
    size_t sb[64], sd[64], rb[64], rd[64]; /* send/recv bytes and displacements */
    size_t ss, rs;                         /* bytes spanned by each side */
    float *hs, *hr, *ds, *dr;              /* host and device send/recv */
} gpu_v_case;
void gpu_v_init(gpu_v_case *v, int rank, int size);
void gpu_v_free(gpu_v_case *v);

/* CUDA device memory as the communicator's memory ops (loom_comm_mem):
 * loom_cuda_alloc/free and memcpy; bf16 pack/unpack through host copies. */
extern const loom_comm_mem gpu_cuda_mem;

#endif
