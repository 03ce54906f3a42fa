/* gemm.c - cblas_sgemm with its output rows shared out over the kernel
 * threads.
 *
 * With OpenMP, loom runs one pool of threads: OpenBLAS is kept on one thread
 * (loom_kernels_set_threads) and each OpenMP thread calls sgemm on its own
 * slice of the rows of C. Two pools (OpenBLAS's pthreads and OpenMP's) spin
 * against each other after every switch and measured slower on two threads
 * than on one. Each output element is still the same K-long sum, so the
 * split does not change results. Without OpenMP, or on one thread, this is
 * one plain sgemm call (OpenBLAS then threads it itself).
 */
#include <cblas.h>
#include <stdlib.h>

#include "kern_internal.h"

/* Rows per slice are a multiple of this, so that slices keep whole
 * register blocks of the sgemm micro-kernel. */
#define GEMM_ROW_ALIGN 16

static void gemm_call(const kern_gemm *g, int m0, int m) {
    /* op(A) rows m0.. : with A not transposed they are rows of A, with A
     * transposed they are columns of A. */
    const float *a = g->ta == CblasNoTrans ? g->A + (size_t)m0 * g->lda : g->A + m0;
    if (g->bias) /* the thread that multiplies these rows fills them: no serial pass */
        for (int i = m0; i < m0 + m; i++) memcpy(g->C + (size_t)i * g->ldc, g->bias, (size_t)g->N * sizeof *g->bias);
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, m, g->N, g->K, g->alpha, a, g->lda, g->B, g->ldb,
                g->beta, g->C + (size_t)m0 * g->ldc, g->ldc);
}

void kern_sgemm(const kern_gemm *g_in) {
    kern_gemm gb = *g_in;
    const kern_gemm *g = &gb;
    if (!kern_gemm_bf16_operands(&gb)) abort(); /* out of memory for the bf16 copies */
    int nth = loom_kernels_get_threads();
    int per = (g->M + nth - 1) / nth;
    per = (per + GEMM_ROW_ALIGN - 1) / GEMM_ROW_ALIGN * GEMM_ROW_ALIGN;
    int ntask = per > 0 ? (g->M + per - 1) / per : 0;
    if (ntask <= 1) {
        if (g->M > 0) gemm_call(g, 0, g->M);
        return;
    }
    KERN_PARALLEL_FOR(nth)
    for (int t = 0; t < ntask; t++) {
        int m0 = t * per;
        gemm_call(g, m0, g->M - m0 < per ? g->M - m0 : per);
    }
}
