/* gpu_mpi.h - start and end of the multi-rank GPU tests. */
#ifndef LOOM_TESTS_GPU_MPI_H
#define LOOM_TESTS_GPU_MPI_H

#include "loom/comm.h"

/* MPI up, then rank r on CUDA device r % count. Returns 0 when ready
 * (*world, *ndev set), 77 (ctest's skip, MPI finalized) when no rank sees a
 * device, 1 (message printed) on failure. */
int gpu_mpi_start(int *argc, char ***argv, loom_comm **world, int *ndev);
/* Shut the device down, finalize MPI; the checks' exit code. */
int gpu_mpi_finish(loom_comm *world);

#endif
