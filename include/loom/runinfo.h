/* runinfo.h - the software and machine a run used: loom's version, commit
 * and compiler, the MPI library, the GEMM libraries found (OpenBLAS, oneDNN,
 * oneMKL), the CUDA backend, the host and CPU. `loom --version` prints it;
 * the first row of a run's metrics (train/report.c) records it. Local; MPI
 * need not be started.
 */
#ifndef LOOM_RUNINFO_H
#define LOOM_RUNINFO_H

#include <stddef.h>

typedef struct loom_runinfo {
    char version[32];    /* "0.1.0" */
    char commit[48];     /* git commit of the build, "+dirty" for a changed tree */
    char compiler[96];   /* "GNU 12.2.0 (Release)" */
    char mpi[256];       /* "Open MPI v4.1.4 (MPI 3.1)" */
    char blas[512];      /* the fp32 GEMM: OpenBLAS version and kernels, oneDNN when it takes products */
    char bf16_gemm[512]; /* the bf16 GEMM provider (oneDNN, oneMKL) or why none */
    char cuda[160];      /* the CUDA backend in this binary, or that it has none */
    char host[256];      /* host name */
    char cpu[64];        /* CPU model name */
} loom_runinfo;

void loom_runinfo_get(loom_runinfo *ri);
/* `loom --version`: one "name: value" line per field after the first
 * "loom 0.1.0 (commit ...)". Returns what snprintf would have. */
int loom_runinfo_format(const loom_runinfo *ri, char *buf, size_t cap);

#endif
