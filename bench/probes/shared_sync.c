/* shared_sync.c - what one synchronisation costs when ranks share cores.
 *
 * Ranks 0 and 1 repeat: `work_us` of small sgemms, then a 256 KiB
 * all-reduce between the two of them (a tensor-parallel pair). The other
 * ranks either wait in MPI (others_busy 0) or compute sgemms throughout
 * (others_busy 1), as the rest of a job's ranks do. Prints the wall time of
 * one all-reduce call, waiting for the partner included: on a machine with
 * more ranks than cores that is mostly the partner being descheduled, a
 * cost the planner's replay of ideal processor sharing does not have
 * (docs/planning.md, "Measured here").
 *
 * Not part of the build (it needs nothing of loom):
 *   mpicc -O2 -isystem /usr/include/x86_64-linux-gnu/openblas-pthread \
 *       bench/probes/shared_sync.c -o /tmp/shared_sync -lopenblas
 *   scripts/loomrun -np 8 /tmp/shared_sync 1 500   # others_busy work_us
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { GEMM_N = 64, REPS = 200, COUNT = 64 * 1024 };

static void gemm_for(double us, const float *a, const float *b, float *c) {
    const double t0 = MPI_Wtime();
    while ((MPI_Wtime() - t0) * 1e6 < us)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GEMM_N, GEMM_N, GEMM_N, 1, a, GEMM_N, b,
                    GEMM_N, 0, c, GEMM_N);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int r, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 3 || n < 2) {
        if (r == 0) fprintf(stderr, "usage: mpirun -np N shared_sync OTHERS_BUSY(0|1) WORK_US  (N >= 2)\n");
        MPI_Finalize();
        return 64;
    }
    const int others_busy = atoi(argv[1]);
    const double work = atof(argv[2]);
    float *a = calloc(GEMM_N * GEMM_N, sizeof *a), *b = calloc(GEMM_N * GEMM_N, sizeof *b);
    float *c = calloc(GEMM_N * GEMM_N, sizeof *c), *x = calloc(COUNT, sizeof *x);
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, r < 2 ? 0 : 1, r, &pair);
    MPI_Barrier(MPI_COMM_WORLD);
    if (r < 2) {
        double comm = 0;
        for (int i = 0; i < REPS; i++) {
            gemm_for(work, a, b, c);
            const double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, x, COUNT, MPI_FLOAT, MPI_SUM, pair);
            comm += MPI_Wtime() - t0;
        }
        if (r == 0)
            printf("np=%d others_busy=%d work=%.0f us: %.1f us per 256 KiB all-reduce of the pair\n", n,
                   others_busy, work, comm / REPS * 1e6);
        int stop = 1;
        if (r == 0)
            for (int q = 2; q < n; q++) MPI_Send(&stop, 1, MPI_INT, q, 9, MPI_COMM_WORLD);
    } else {
        int stop = 0, flag = 0;
        MPI_Request q;
        MPI_Irecv(&stop, 1, MPI_INT, 0, 9, MPI_COMM_WORLD, &q);
        if (others_busy)
            while (!flag) {
                gemm_for(500, a, b, c);
                MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
            }
        else MPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&pair);
    free(a), free(b), free(c), free(x);
    MPI_Finalize();
    return 0;
}
