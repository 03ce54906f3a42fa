/* gemm.c - cblas_sgemm shared out over the kernel threads.
 *
 * With OpenMP, loom runs one pool of threads: OpenBLAS is kept on one thread
 * (loom_cpu_ctx_create) and each OpenMP thread calls sgemm on its own
 * block of C. Two pools (OpenBLAS's pthreads and OpenMP's) spin against each
 * other after every switch and measured slower on two threads than on one.
 * Each output element is still the same K-long sum, so the split changes
 * results only as far as the kernel orders a sum differently at the edge of
 * a block. Without OpenMP, or on one thread, this is one plain sgemm call
 * (OpenBLAS then threads it itself).
 *
 * Which way C is cut: every thread packs the whole of the operand it does
 * not split. Cutting the rows of C (the usual choice) makes each thread pack
 * all of op(B) (K x N); cutting the columns makes each pack all of op(A)
 * (M x K). So C is cut along its longer side: the LM head's (256, 50257)
 * logits by vocabulary columns (each thread packs the 256 rows of
 * activations, not all of wte), a (50257, 768) weight gradient by rows.
 *
 * Not every product goes to OpenBLAS: the bf16 ones go to the bf16 provider,
 * and, on CPUs where oneDNN's fp32 matmul is chosen (gemm_dnnl.c), the fp32
 * forward and input-gradient products (op(A) not transposed, K at most
 * GEMM_DNNL_MAX_K) go to it as one call for all of C. The choice depends on
 * the operation, not on M or N, so cutting a batch over ranks, or a weight's
 * columns over tensor-parallel ranks, keeps each product on one kernel.
 * The LM head's bf16 weight gradient goes to loom's own kernel (gemm_head.c)
 * on CPUs with AVX512-BF16 and no AMX.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "kern_internal.h"

/* Rows or columns per slice are a multiple of this, so that slices keep whole
 * register blocks of the sgemm micro-kernel. */
#define GEMM_ALIGN 16

/* c (m x n, ldc) = beta c + alpha op(A)[m0:m0+m, k0:k0+kk] op(B)[k0:k0+kk,
 * n0:n0+n]: op(A) rows m0.. are rows of A (columns when A is transposed),
 * its columns k0.. columns of A (rows); likewise op(B). The bf16 copies, for
 * the bf16 provider, at the same offsets. */
static void gemm_block(const kern_gemm *g, int m0, int m, int n0, int n, int k0, int kk, float beta, float *c,
                       int ldc) {
    const size_t ao = g->ta == CblasNoTrans ? (size_t)m0 * g->lda + k0 : (size_t)k0 * g->lda + m0;
    const size_t bo = g->tb == CblasNoTrans ? (size_t)k0 * g->ldb + n0 : (size_t)n0 * g->ldb + k0;
    if (g->A16) {
        kern_bf16_gemm_call(g->ta, g->tb, m, n, kk, g->alpha, g->A16 + ao, g->lda, g->B16 + bo, g->ldb, beta,
                            c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, m, n, kk, g->alpha, g->A + ao, g->lda, g->B + bo, g->ldb, beta,
                c, ldc);
}

/* C's rows [m0, m0+m) x columns [n0, n0+n), the whole of K. */
static void gemm_call(const kern_gemm *g, int m0, int m, int n0, int n) {
    float *c = g->C + (size_t)m0 * g->ldc + n0;
    if (g->bias) /* the thread that multiplies this block fills it: no serial pass */
        for (int i = 0; i < m; i++) memcpy(c + (size_t)i * g->ldc, g->bias + n0, (size_t)n * sizeof *g->bias);
    gemm_block(g, m0, m, n0, n, 0, g->K, g->beta, c, g->ldc);
}

/* Long sums into a small C - the LM head's input gradient, (tokens x C)
 * summed over the 50257-long vocabulary - are cut along K: cut by rows or
 * columns, every thread would pack the whole of one operand (wte, 154 MB
 * for GPT-2), where cut along K each packs its part of both. Thread 0 adds
 * its part into C, the others into scratch, and the parts are added to C
 * in thread order afterwards: the same floats for a given thread count. */
#define GEMM_K_ALIGN 256
/* The scratch for the parts (the context's, grown to fit), or NULL: no K
 * cut for this product (or no memory: a row or column cut instead). */
static float *gemm_split_k(loom_cpu_ctx *c, const kern_gemm *g, int nth) {
    const int mn = g->M > g->N ? g->M : g->N;
    if (nth < 2 || g->bias || g->K < 16 * mn || (size_t)g->M * g->N > ((size_t)1 << 20)) return NULL;
    return kern_buf_grow(&c->k_parts, (size_t)(nth - 1) * g->M * g->N * sizeof(float));
}

static void gemm_k_parts(const kern_gemm *g, int nth, float *parts) {
    int per = (g->K + nth - 1) / nth;
    per = (per + GEMM_K_ALIGN - 1) / GEMM_K_ALIGN * GEMM_K_ALIGN;
    const int nparts = (g->K + per - 1) / per;
    const size_t mn = (size_t)g->M * g->N;
    KERN_PARALLEL_FOR(nth)
    for (int t = 0; t < nparts; t++) {
        int k0 = t * per, kk = g->K - k0 < per ? g->K - k0 : per;
        if (t == 0) gemm_block(g, 0, g->M, 0, g->N, k0, kk, g->beta, g->C, g->ldc);
        else gemm_block(g, 0, g->M, 0, g->N, k0, kk, 0.0f, parts + (size_t)(t - 1) * mn, g->N);
    }
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < g->M; i++)
        for (int t = 1; t < nparts; t++)
            kern_add_row(g->C + (size_t)i * g->ldc, parts + (size_t)(t - 1) * mn + (size_t)i * g->N, g->N);
}

/* Measured on 2 threads of a Zen 3 (per-thread CPU time, best of 7): the
 * LM head's (256 x 50257, K 768) product scaled 1.51-1.67x cut by rows,
 * 1.96x by columns; a (50257 x 768, K 256) weight gradient 1.81x by rows,
 * 1.56x by columns. */
static int gemm_split_cols(const kern_gemm *g) { return g->N > g->M; }

/* oneDNN's fp32 matmul beat OpenBLAS's AVX-512 sgemm on the forward and
 * input-gradient products of GPT-2 steps on a Zen 4 (5-17 %), but not on
 * weight gradients (op(A) transposed). On the LM head's input gradient,
 * K = the 50257-long vocabulary, it won only for a narrow model: 1-25 %
 * faster than OpenBLAS cut along K over the threads (gemm_k_parts) for
 * C = 128..512, 1-10 % slower on one thread for C = 640..1024 (GPT-2 124M's
 * 768 the worst). C is the model's width, the same for every layout, so the
 * choice is the model's. docs/performance.md has the tables. */
#define GEMM_DNNL_MAX_K 4096
#define GEMM_DNNL_HEAD_DX_MAX_N 512
static int gemm_fp32_to_dnnl(const kern_gemm *g) {
    if (g->A16 || g->ta != CblasNoTrans || !kern_dnnl_f32_ready()) return 0;
    return g->K <= GEMM_DNNL_MAX_K || (g->head_dx && g->N <= GEMM_DNNL_HEAD_DX_MAX_N);
}

/* All of C in one oneDNN call, threaded by oneDNN: 1, or 0 if it refused the
 * shape (C untouched then, bias rows aside, which the caller refills). */
static int gemm_whole(const kern_gemm *g, int nth) {
    if (g->bias) {
        KERN_PARALLEL_FOR(nth)
        for (int i = 0; i < g->M; i++)
            memcpy(g->C + (size_t)i * g->ldc, g->bias, (size_t)g->N * sizeof *g->bias);
    }
    if (g->A16)
        return kern_dnnl_gemm(nth, g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A16, g->lda, g->B16, g->ldb,
                              g->beta, g->C, g->ldc);
    return kern_dnnl_sgemm(nth, g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta,
                           g->C, g->ldc);
}

/* The LM head's bf16 weight gradient goes to loom's own kernel where it is
 * chosen (gemm_head.c): by the operation, never by M, N or K. */
static int gemm_bf16_to_head_dw(const kern_gemm *g) {
    return g->head_dw && g->A16 && g->ta == CblasTrans && g->tb == CblasNoTrans && g->alpha == 1.0f &&
           !g->bias && g->K > 0 && kern_bf16_head_ready();
}

void kern_sgemm(loom_cpu_ctx *c, const kern_gemm *g_in) {
    kern_gemm gb = *g_in;
    const kern_gemm *g = &gb;
    if (!kern_gemm_bf16_operands(c, &gb)) abort(); /* out of memory for the bf16 copies */
    int nth = c->threads;
    if (gemm_bf16_to_head_dw(g) &&
        kern_bf16_head_dw(c, g->M, g->N, g->K, g->A16, g->lda, g->B16, g->ldb, g->beta, g->C, g->ldc))
        return;
    if (g->A16 && kern_bf16_gemm_ready() == KERN_BF16_WHOLE) { /* oneDNN threads the product itself */
        if (g->M <= 0 || g->N <= 0) return;
        if (!gemm_whole(g, nth)) {
            fprintf(stderr, "loom: oneDNN refused a bf16 GEMM (%d x %d x %d); LOOM_BF16_GEMM=off avoids it\n",
                    g->M, g->N, g->K);
            abort();
        }
        return;
    }
    if (g->M > 0 && g->N > 0 && gemm_fp32_to_dnnl(g)) {
        if (gemm_whole(g, nth)) return;
        /* refused (not seen on a supported shape): OpenBLAS below, with the same bias rows */
    }
    float *parts = g->M > 0 && g->N > 0 ? gemm_split_k(c, g, nth) : NULL;
    if (parts) {
        gemm_k_parts(g, nth, parts);
        return;
    }
    int cols = nth > 1 && gemm_split_cols(g);
    int len = cols ? g->N : g->M;
    int per = (len + nth - 1) / nth;
    per = (per + GEMM_ALIGN - 1) / GEMM_ALIGN * GEMM_ALIGN;
    int ntask = per > 0 ? (len + per - 1) / per : 0;
    if (ntask <= 1) {
        if (g->M > 0 && g->N > 0) gemm_call(g, 0, g->M, 0, g->N);
        return;
    }
    KERN_PARALLEL_FOR(nth)
    for (int t = 0; t < ntask; t++) {
        int s0 = t * per, n = len - s0 < per ? len - s0 : per;
        if (cols) gemm_call(g, 0, g->M, s0, n);
        else gemm_call(g, s0, n, 0, g->N);
    }
}
