/* runinfo.c - the software and machine of a run (runinfo.h). Local. */
#include "loom/runinfo.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/cpu.h"
#include "loom/version.h"
#include "loom_build_info.h" /* LOOM_BUILD_CUDA */

/* src/backend/cuda_table.c: linked into loom-cuda only (device.c says the same) */
extern const loom_backend loom_backend_cuda __attribute__((weak));

void loom_runinfo_get(loom_runinfo *ri) {
    memset(ri, 0, sizeof *ri);
    snprintf(ri->version, sizeof ri->version, "%s", loom_version());
    snprintf(ri->commit, sizeof ri->commit, "%s", loom_version_commit());
    snprintf(ri->compiler, sizeof ri->compiler, "%s", loom_version_compiler());
    loom_comm_library(ri->mpi, sizeof ri->mpi);
    loom_blas_describe(ri->blas, sizeof ri->blas);
    loom_bf16_gemm_describe(ri->bf16_gemm, sizeof ri->bf16_gemm);
    if (&loom_backend_cuda != NULL)
        snprintf(ri->cuda, sizeof ri->cuda, "backend in this binary (%s): --device cuda", LOOM_BUILD_CUDA);
    else if (LOOM_BUILD_CUDA[0])
        snprintf(ri->cuda, sizeof ri->cuda, "not in this binary; loom-cuda has it (%s)", LOOM_BUILD_CUDA);
    else snprintf(ri->cuda, sizeof ri->cuda, "not built (no CUDA compiler when configured)");
    if (gethostname(ri->host, sizeof ri->host - 1) != 0) snprintf(ri->host, sizeof ri->host, "unknown");
    snprintf(ri->cpu, sizeof ri->cpu, "%s", loom_cpu_name());
}

int loom_runinfo_format(const loom_runinfo *ri, char *buf, size_t cap) {
    return snprintf(buf, cap,
                    "loom %s (commit %s)\n"
                    "compiler:  %s\n"
                    "MPI:       %s\n"
                    "BLAS:      %s\n"
                    "bf16 GEMM: %s\n"
                    "CUDA:      %s\n"
                    "host:      %s (%s)\n",
                    ri->version, ri->commit, ri->compiler, ri->mpi, ri->blas, ri->bf16_gemm, ri->cuda,
                    ri->host, ri->cpu);
}
