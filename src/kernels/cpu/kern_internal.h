/* kern_internal.h - helpers shared by the CPU kernels (private to src/kernels/cpu).
 *
 * gcc does not vectorize a plain float reduction (sum += x[i]) without
 * -ffast-math, because that reorders additions, nor a loop that calls expf.
 * So this header provides an inline, branch-free expf (and a sqrtf, which
 * gcc keeps scalar under -fmath-errno) and reductions that keep
 * KERN_LANES independent partial results; both compile to SIMD code under
 * -O3 -march=native. It also provides KERN_PARALLEL_FOR, the one OpenMP
 * construct the kernels use, which is a no-op without OpenMP or with one
 * thread, and kern_sgemm, the threaded sgemm every matmul goes through.
 */
#ifndef LOOM_KERN_INTERNAL_H
#define LOOM_KERN_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/kernel_types.h"
#include "kernels/cpu/cpu_kernels.h"

/* Independent accumulators in the lane-parallel reductions: two AVX2 or one
 * AVX-512 register of floats. */
#define KERN_LANES 16

/* Flat elementwise kernels are split into blocks of this many elements, the
 * unit of work one OpenMP thread takes. */
#define KERN_BLOCK 16384

#ifdef LOOM_HAVE_OPENMP
#define KERN_PRAGMA_(x) _Pragma(#x)
/* The next for-loop runs on nth OpenMP threads when nth > 1. Use it at
 * statement level (it expands to a statement without OpenMP). */
#define KERN_PARALLEL_FOR(nth)                                                                               \
    KERN_PRAGMA_(omp parallel for schedule(static) num_threads(nth) if ((nth) > 1))
#else
#define KERN_PARALLEL_FOR(nth) (void)(nth);
#endif

/* One row-major sgemm, C (M,N) = alpha op(A) op(B) + beta C, as plain data
 * so that kern_sgemm can split it. ta, tb: CblasNoTrans or CblasTrans. */
typedef struct {
    int ta, tb;
    int M, N, K;
    float alpha;
    const float *A;
    int lda;
    const float *B;
    int ldb;
    float beta;
    float *C;
    int ldc;
    const float *bias; /* (N) or NULL: each row of C is set to it first (beta 1 then adds the product) */
    const uint16_t *A16, *B16; /* bf16 copies of A and B (same layout) for the bf16 provider, or NULL */
    int head_dw;               /* the tied LM head's weight gradient (gemm_head.c takes it in bf16) */
    int head_dx;               /* the tied LM head's input gradient, K = the vocabulary (gemm.c) */
} kern_gemm;

/* The GEMM calibration's shapes {M, N, K} (util.c), the most elements any
 * of their operands or results holds, and its operand fill. */
#define KERN_CAL_SHAPES 3
extern const int kern_cal_shapes[KERN_CAL_SHAPES][3];
size_t kern_cal_elems(void);
void kern_cal_fill(float *a, float *b, size_t na, size_t nb);
/* The calibration's product C (m x n) = A (m x k) B (k x n), row-major, no
 * transposes, alpha 1 and beta 0: the descriptor both calibrations time. */
kern_gemm kern_cal_gemm(int m, int n, int k, const float *a, const float *b, float *c);
/* Best wall time of `reps` (at least 1) runs of g through kern_sgemm. */
double kern_time_gemm(loom_cpu_ctx *c, const kern_gemm *g, int reps);

/* The context's kernel threads (ctx: a loom_cpu_ctx, as kernels get it). */
static inline int kern_threads(const void *ctx) { return ((const loom_cpu_ctx *)ctx)->threads; }
/* b grown to at least `bytes` (contents kept); NULL without memory (b unchanged). */
void *kern_buf_grow(kern_buf *b, size_t bytes);
void kern_buf_free(kern_buf *b);

/* Runs g with the rows of C shared out over c's threads (gemm.c). */
void kern_sgemm(loom_cpu_ctx *c, const kern_gemm *g);
/* In c's bf16 mode, points g->A and g->B at bf16-rounded copies (bf16.c), or,
 * with the bf16 GEMM provider, sets g->A16 and g->B16 to bf16 copies;
 * returns 0 when the copies cannot be allocated (g unchanged). */
int kern_gemm_bf16_operands(loom_cpu_ctx *c, kern_gemm *g);
/* With the bf16 GEMM provider: [src, src + n) kept (loom_cpu_gemm_keep) with
 * its bf16 copy marked converted, and that copy's n elements returned for
 * the caller to fill with the bf16 bits of what src stands for; the GEMMs
 * then read the copy and never src. NULL (nothing kept) without bf16 mode,
 * the provider, a free keep slot or memory. */
uint16_t *kern_bf16_keep_filled(loom_cpu_ctx *c, const float *src, size_t n);
/* Threads: set the threading libraries for n (cpu_kernels.h's
 * loom_cpu_ctx_create says how); returns n, or the online CPUs for 0. */
int kern_threads_setup(int n);

/* The bf16 GEMM provider (gemm_mkl.c), decided at the first call from the
 * CPU flags: KERN_BF16_NONE (bf16-rounded floats on the fp32 kernels),
 * KERN_BF16_SLICES (oneMKL, called by each thread on its block of C:
 * kern_bf16_gemm_call) or KERN_BF16_WHOLE (oneDNN, called once for all of C,
 * threading itself: kern_dnnl_gemm). Both run the row-major
 * C = alpha op(A) op(B) + beta C on bf16 operands. */
enum { KERN_BF16_NONE = 0, KERN_BF16_SLICES = 1, KERN_BF16_WHOLE = 2 };
int kern_bf16_gemm_ready(void);
void kern_bf16_gemm_call(int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                         const uint16_t *b, int ldb, float beta, float *c, int ldc);
/* gemm_dnnl.c: load oneDNN and check it has a native bf16 matmul here
 * (1, with its description in why) or not (0, with the reason); run one
 * GEMM on nth threads (1), or 0 if oneDNN refused it. a == NULL only
 * creates the primitive. */
int kern_dnnl_open(char *why, size_t n);
int kern_dnnl_gemm(int nth, int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                   const uint16_t *b, int ldb, float beta, float *c, int ldc);
/* The fp32 products gemm.c sends to oneDNN (whole C, threading itself):
 * whether oneDNN takes them here (decided once, from the CPU flags and
 * LOOM_FP32_GEMM), the line saying so, and one product (1, or 0 if oneDNN
 * refused the shape). */
int kern_dnnl_f32_ready(void);
void kern_dnnl_f32_describe(char *buf, size_t n);
int kern_dnnl_sgemm(int nth, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc);

/* gemm_head.c: loom's AVX512-BF16 kernel for the LM head's bf16 weight
 * gradient (C (M,N) = A^T B + beta C, A (K,M), B (K,N)): whether it is chosen here
 * (CPU flags, LOOM_BF16_HEAD), the words saying so ("" when not), and one
 * product, threaded over the kernel threads (1, or 0 out of memory with C
 * untouched). */
int kern_bf16_head_ready(void);
void kern_bf16_head_describe(char *buf, size_t n);
int kern_bf16_head_dw(loom_cpu_ctx *c, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                      int ldb, float beta, float *C, int ldc);

/* Monotonic seconds (for the calibrations). */
double kern_now(void);

/* Index of the calling thread inside a KERN_PARALLEL_FOR loop (0 outside). */
int kern_thread_id(void);

/* a * b + c with one rounding where the CPU has FMA (-march=native gives
 * __FMA__ there), else two; kv_fma (kern_vec.h) decides the same way, so
 * the scalar and vector kernels give the same floats. */
static inline float kern_fma(float a, float b, float c) {
#if defined(__FMA__)
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* exp(a) for float a, within ~2 ulp for results in the normal range.
 * a < -87.3365 (result below FLT_MIN) gives 0, a > 88.72 gives +inf, NaN
 * gives NaN; results for 88 < a <= 88.72 saturate at exp(88). Method: round
 * a/ln2 to an integer k with the 1.5*2^23 trick, reduce r = a - k ln2 in two
 * steps (Cody-Waite; ln2_hi has 16 significant bits so k*ln2_hi is exact),
 * evaluate the degree-7 Taylor polynomial of exp(r) on |r| <= ln2/2
 * (truncation < 1e-8 relative) and scale by 2^k built in the exponent bits.
 * Each multiply-add is one fused rounding (kern_fma) where the CPU has FMA:
 * ISO C mode keeps gcc from fusing them itself, and the chain of separate
 * roundings made the cross-entropy's exponentials 1.4x slower on a Zen 4. */
static inline float kern_expf(float a) {
    const float lo = -87.33654f, hi = 88.0f;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const uint32_t magic_bits = 0x4B400000u;
    float x = a < lo ? lo : (a > hi ? hi : a);
    float t = kern_fma(x, 1.44269504088896341f, magic);
    float kf = t - magic;
    float r = kern_fma(kf, -0.693145751953125f, x);
    r = kern_fma(kf, -1.428606820309417232e-6f, r);
    float p = 1.0f / 5040.0f;
    p = kern_fma(p, r, 1.0f / 720.0f);
    p = kern_fma(p, r, 1.0f / 120.0f);
    p = kern_fma(p, r, 1.0f / 24.0f);
    p = kern_fma(p, r, 1.0f / 6.0f);
    p = kern_fma(p, r, 0.5f);
    p = kern_fma(p, r, 1.0f);
    p = kern_fma(p, r, 1.0f);
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t sb = (tb - magic_bits + 127u) << 23; /* bits of 2^k */
    float s;
    memcpy(&s, &sb, sizeof s);
    float y = p * s;
    y = a < lo ? 0.0f : y;
    y = a > 88.72283f ? INFINITY : y;
    return y;
}

/* sqrt(x), correctly rounded (equal to sqrtf for every float: checked over
 * all mantissas of [1,4) and all subnormals), but written without libm:
 * gcc keeps sqrtf scalar unless built with -fno-math-errno. Method: the
 * classic bit-trick estimate of 1/sqrt(x), two float Newton steps (~1e-7),
 * then two Heron steps in double (error ~1e-27, so the final rounding to
 * float is exact). Subnormals are scaled by 2^24 first. 0, +inf and NaN
 * return themselves, x < 0 gives NaN. */
static inline float kern_sqrtf(float x) {
    const float tiny = 0x1p-126f; /* FLT_MIN */
    float xs = x < tiny ? x * 0x1p24f : x;
    uint32_t u;
    memcpy(&u, &xs, sizeof u);
    u = 0x5f375a86u - (u >> 1);
    float r;
    memcpy(&r, &u, sizeof r);
    r = r * (1.5f - 0.5f * xs * r * r);
    r = r * (1.5f - 0.5f * xs * r * r);
    double d = xs, s = d * r;
    s = 0.5 * (s + d / s);
    s = 0.5 * (s + d / s);
    float y = (float)s * (x < tiny ? 0x1p-12f : 1.0f);
    y = x > 0.0f && x < INFINITY ? y : x;
    return x < 0.0f ? NAN : y;
}

/* sum of x[0..n) */
static inline float kern_sum(const float *x, int n) {
    float acc[KERN_LANES] = {0};
    int i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) acc[l] += x[i + l];
    float s = 0.0f;
    for (; i < n; i++) s += x[i];
    for (int l = 0; l < KERN_LANES; l++) s += acc[l];
    return s;
}

/* sum of x[i]*y[i] over [0..n) */
static inline float kern_dot(const float *x, const float *y, int n) {
    float acc[KERN_LANES] = {0};
    int i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) acc[l] += x[i + l] * y[i + l];
    float s = 0.0f;
    for (; i < n; i++) s += x[i] * y[i];
    for (int l = 0; l < KERN_LANES; l++) s += acc[l];
    return s;
}

/* max of x[0..n), n >= 1. NaNs are skipped here; callers see them again in
 * the exp pass, so they still propagate to the result. */
static inline float kern_max(const float *x, int n) {
    float acc[KERN_LANES];
    for (int l = 0; l < KERN_LANES; l++) acc[l] = -INFINITY;
    int i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES)
        for (int l = 0; l < KERN_LANES; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int l = 0; l < KERN_LANES; l++) m = acc[l] > m ? acc[l] : m;
    return m;
}

/* x[i] = exp(x[i] - m) over [0..n) */
static inline void kern_exp_shift(float *x, int n, float m) {
    for (int i = 0; i < n; i++) x[i] = kern_expf(x[i] - m);
}

/* x[i] *= s over [0..n) */
static inline void kern_scale_row(float *x, int n, float s) {
    for (int i = 0; i < n; i++) x[i] *= s;
}

/* y[i] += x[i] over [0..n) */
static inline void kern_add_row(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

#endif
