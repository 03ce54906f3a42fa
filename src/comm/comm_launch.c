/* comm_launch.c - how many ranks the launcher says the job has, read from
 * the variables launchers give each process: Open MPI's mpirun
 * (OMPI_COMM_WORLD_SIZE/_RANK), MPICH's and Intel MPI's Hydra (PMI_SIZE,
 * PMI_RANK), PMIx launchers (PMIX_RANK), MVAPICH (MV2_COMM_WORLD_SIZE) and
 * Slurm's srun (SLURM_STEP_NUM_TASKS, SLURM_PROCID). comm_mpi.c compares it
 * with the world MPI made: a loom built against one MPI and started by
 * another MPI's launcher comes up as N one-rank jobs. Local; no MPI here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"

/* The variable's value as a count, or -1 when unset or not a number. */
static long env_long(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 0 ? -1 : x;
}

int loom_comm_launcher_ranks(char *why, size_t cap) {
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE",
                                        "SLURM_STEP_NUM_TASKS"};
    static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    long best = 1;
    if (cap) why[0] = '\0';
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        long n = env_long(sizes[i]);
        if (n > best) {
            best = n;
            snprintf(why, cap, "%s=%ld", sizes[i], n);
        }
    }
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
        long r = env_long(ranks[i]); /* rank r: at least r + 1 ranks */
        if (r >= best) {
            best = r + 1;
            snprintf(why, cap, "%s=%ld", ranks[i], r);
        }
    }
    return best > 1 << 30 ? 1 << 30 : (int)best;
}
