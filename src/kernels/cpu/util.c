/* util.c - the CPU context, thread control, sgemm calibration and
 * flat-vector helpers.
 *
 * The context's thread count drives every kernel it is passed to. Built
 * with OpenMP, loom keeps a single pool: OpenMP threads split the
 * elementwise loops and the rows of every sgemm (gemm.c) while OpenBLAS
 * itself runs on one thread; without OpenMP the count goes to OpenBLAS. A
 * context made for 0 threads takes one per online CPU. Also here: the
 * residual add and the whole-buffer helpers the trainer uses for gradient
 * norms, clipping and blow-up detection. Nothing here is collective;
 * callers reduce across ranks.
 */
#include <cblas.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef LOOM_HAVE_OPENMP
#include <omp.h>
#endif

#include "kern_internal.h"
#include "loom/cpu.h"

int kern_threads_setup(int n) {
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
#ifdef LOOM_HAVE_OPENMP
    openblas_set_num_threads(1);
    omp_set_num_threads(n);
#else
    openblas_set_num_threads(n);
#endif
    return n;
}

void *kern_buf_grow(kern_buf *b, size_t bytes) {
    if (bytes <= b->cap && b->p) return b->p;
    void *p = realloc(b->p, bytes ? bytes : 1);
    if (!p) return NULL;
    b->p = p;
    b->cap = bytes;
    return p;
}

void kern_buf_free(kern_buf *b) {
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

loom_cpu_ctx *loom_cpu_ctx_create(int threads, int bf16) {
    loom_cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->threads = kern_threads_setup(threads);
    c->bf16 = bf16 != 0;
    return c;
}

void loom_cpu_ctx_free(loom_cpu_ctx *c) {
    if (!c) return;
    for (int i = 0; i < KERN_KEEP; i++) kern_buf_free(&c->keep[i].buf);
    for (int i = 0; i < 2; i++) kern_buf_free(&c->round[i]), kern_buf_free(&c->bits[i]);
    kern_buf_free(&c->k_parts);
    kern_buf_free(&c->xent_rows);
    kern_buf_free(&c->head_b);
    kern_buf_free(&c->head_a);
    free(c);
}

int kern_thread_id(void) {
#ifdef LOOM_HAVE_OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

double kern_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double kern_time_gemm(loom_cpu_ctx *c, const kern_gemm *g, int reps) {
    double best = 1e30;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        double t0 = kern_now();
        kern_sgemm(c, g);
        double dt = kern_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

/* The calibration's GEMM shapes (M, N, K), smallest first: two squares and
 * the shape of a transformer's GEMMs at 2048 tokens (K = 768 inner), which
 * ran 3-4 % above either square with OpenBLAS's AVX-512 kernels on a Zen 4
 * (104-105 against 101 GFLOP/s on one thread): a peak below what a training
 * step's GEMMs reach made MFU read 103 % for GPT-2 124M at B8 T256. */
const int kern_cal_shapes[KERN_CAL_SHAPES][3] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {2048, 2304, 768}};

size_t kern_cal_elems(void) {
    size_t most = 0;
    for (int i = 0; i < KERN_CAL_SHAPES; i++) {
        const size_t m = (size_t)kern_cal_shapes[i][0], n = (size_t)kern_cal_shapes[i][1],
                     k = (size_t)kern_cal_shapes[i][2];
        most = m * k > most ? m * k : most;
        most = k * n > most ? k * n : most;
        most = m * n > most ? m * n : most;
    }
    return most;
}

void kern_cal_fill(float *a, float *b, size_t na, size_t nb) {
    for (size_t i = 0; i < na; i++) a[i] = (float)(i % 17) * 0.0625f - 0.5f;
    for (size_t i = 0; i < nb; i++) b[i] = (float)(i % 13) * 0.0625f - 0.375f;
}

kern_gemm kern_cal_gemm(int m, int n, int k, const float *a, const float *b, float *c) {
    return (kern_gemm){.ta = CblasNoTrans,
                       .tb = CblasNoTrans,
                       .M = m,
                       .N = n,
                       .K = k,
                       .alpha = 1.0f,
                       .A = a,
                       .lda = k,
                       .B = b,
                       .ldb = n,
                       .beta = 0.0f,
                       .C = c,
                       .ldc = n};
}

/* The best sgemm rate, in FLOP/s, over kern_cal_shapes, best of `trials`
 * each after a warm-up; a shape is tried only while the previous one took
 * under 0.1 s (512^3 alone if a 1024^3 takes over 0.25 s). Allocates its
 * own buffers and context (a set-up call, not a step kernel); returns 0 if
 * that fails. */
double loom_kernels_calibrate_sgemm(int threads, int trials) {
    const size_t big = kern_cal_elems();
    float *buf = malloc(3 * big * sizeof *buf);
    loom_cpu_ctx *ctx = loom_cpu_ctx_create(threads, 0);
    if (!buf || !ctx) {
        free(buf);
        loom_cpu_ctx_free(ctx);
        return 0.0;
    }
    float *a = buf, *b = buf + big, *c = buf + 2 * big;
    double best = 0.0;
    for (int i = 0; i < KERN_CAL_SHAPES; i++) {
        int m = kern_cal_shapes[i][0], n = kern_cal_shapes[i][1], k = kern_cal_shapes[i][2];
        kern_cal_fill(a, b, (size_t)m * k, (size_t)k * n);
        kern_gemm g = kern_cal_gemm(m, n, k, a, b, c);
        double t = kern_time_gemm(ctx, &g, 1); /* warm-up: threads, pages */
        if (i == 0 && t > 0.25) {              /* a slow CPU: 512^3 alone */
            m = n = k = 512;
            g.M = g.N = g.K = g.lda = g.ldb = g.ldc = 512;
        }
        t = kern_time_gemm(ctx, &g, trials);
        double rate = 2.0 * (double)m * n * k / (t > 0 ? t : 1e-9);
        if (rate > best) best = rate;
        if (m == 512 || t > 0.1) break;
    }
    free(buf);
    loom_cpu_ctx_free(ctx);
    return best;
}

/* ---- residual ---------------------------------------------------------- */

void loom_cpu_residual_fwd(void *ctx, float *out, const float *a, const float *b, size_t n) {
    /* out (n), a (n), b (n); out may alias a or b (elementwise, same index) */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, hi = lo + KERN_BLOCK < n ? lo + KERN_BLOCK : n;
        for (size_t i = lo; i < hi; i++) out[i] = a[i] + b[i];
    }
}

void loom_cpu_residual_bwd(void *ctx, float *da, float *db, const float *dout, size_t n) {
    /* da (n) +=, db (n) +=, dout (n) */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        kern_add_row(da + lo, dout + lo, (int)len);
        kern_add_row(db + lo, dout + lo, (int)len);
    }
}

/* ---- whole-buffer helpers --------------------------------------------- */

/* Sum of squares of one block, KERN_LANES double accumulators. */
static double kern_sumsq_block(const float *x, size_t n) {
    double acc[KERN_LANES] = {0};
    size_t i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) acc[l] += (double)x[i + l] * (double)x[i + l];
    double s = 0.0;
    for (; i < n; i++) s += (double)x[i] * (double)x[i];
    for (int l = 0; l < KERN_LANES; l++) s += acc[l];
    return s;
}

/* Blocks whose partial sums one window of loom_cpu_sumsq keeps (on the stack). */
#define SUMSQ_WINDOW 512

/* The blocks' partial sums are computed in parallel, a window at a time,
 * then added in block order on one thread: the same double, bit for bit,
 * whatever the thread count (an OpenMP reduction would add the threads'
 * partials in an order that depends on the count). */
double loom_cpu_sumsq(void *ctx, const float *x, size_t n) {
    /* x (n) */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    double total = 0.0, part[SUMSQ_WINDOW];
    for (size_t w0 = 0; w0 < nblk; w0 += SUMSQ_WINDOW) {
        size_t nw = nblk - w0 < SUMSQ_WINDOW ? nblk - w0 : SUMSQ_WINDOW;
        KERN_PARALLEL_FOR(nth)
        for (size_t k = 0; k < nw; k++) {
            size_t lo = (w0 + k) * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
            part[k] = kern_sumsq_block(x + lo, len);
        }
        for (size_t k = 0; k < nw; k++) total += part[k];
    }
    return total;
}

void loom_cpu_scale(void *ctx, float *x, size_t n, float s) {
    /* x (n) *= s */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        kern_scale_row(x + lo, (int)len, s);
    }
}

/* A float is inf or NaN exactly when its exponent bits are all ones; testing
 * the bits keeps the loop integer-only and vectorizable. */
static uint32_t kern_nonfinite_block(const float *x, size_t n) {
    const uint32_t expo = 0x7f800000u;
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (uint32_t)((u & expo) == expo);
    }
    return bad;
}

int loom_cpu_all_finite(void *ctx, const float *x, size_t n) {
    /* x (n); blocks over the threads, their flags OR-ed */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    uint32_t bad = 0;
#ifdef LOOM_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1) reduction(| : bad)
#else
    (void)nth;
#endif
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        bad |= kern_nonfinite_block(x + lo, len);
    }
    return bad == 0;
}

void loom_cpu_zero(void *ctx, float *x, size_t n) {
    /* x (n) = 0, shared out over the threads (the CPU backend's memset to 0) */
    size_t nblk = (n + KERN_BLOCK - 1) / KERN_BLOCK;
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (size_t k = 0; k < nblk; k++) {
        size_t lo = k * KERN_BLOCK, len = lo + KERN_BLOCK < n ? KERN_BLOCK : n - lo;
        memset(x + lo, 0, len * sizeof *x);
    }
}
