/* cuda_internal.cuh - helpers shared by the CUDA backend's .cu files (private
 * to src/backend/cuda): the context, the current stream, the cuBLAS handle,
 * the sticky error, scratch buffers and launch geometry. */
#ifndef LOOM_CUDA_INTERNAL_CUH
#define LOOM_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_backend.h"

/* Device scratch slots of a context: GEMM operand copies (A, B), attention
 * backward's per-row D, reduction partials, the cuBLASLt workspace. */
enum { LC_SCRATCH_A, LC_SCRATCH_B, LC_SCRATCH_ROWS, LC_SCRATCH_RED, LC_SCRATCH_WS, LC_SCRATCH_N };

struct loom_cuda_ctx {
    int precision;       /* LOOM_CUDA_FP32 / _BF16 / _TF32 */
    cublasHandle_t blas; /* made with the context */
    cublasLtHandle_t lt; /* made at the first fused-bias forward (cuda_gemm.cu) */
    int lt_failed;
    void *scr[LC_SCRATCH_N]; /* grown (never shrunk) on demand */
    size_t scr_cap[LC_SCRATCH_N];
    float *host; /* loom_cuda_host_scratch */
    size_t host_n;
};

/* A kernel's context, as the table passes it. */
static inline loom_cuda_ctx *lc_ctx(void *ctx) { return (loom_cuda_ctx *)ctx; }

/* The calling thread's current stream. */
cudaStream_t lc_stream(void);
/* c's cuBLAS handle, bound to lc_stream(). */
cublasHandle_t lc_cublas(loom_cuda_ctx *c);
/* Remember the first failure: after a launch, lc_launched("gelu_fwd") checks
 * cudaGetLastError; lc_cuda / lc_blas check a returned status. Each returns
 * 1 when all is well. */
int lc_launched(const char *what);
int lc_cuda(cudaError_t e, const char *what);
int lc_blas(cublasStatus_t s, const char *what);
/* c's device scratch buffer `slot` of at least `bytes`, grown (never
 * shrunk) on demand; NULL (failure remembered) when out of memory. */
void *lc_scratch(loom_cuda_ctx *c, int slot, size_t bytes);
/* db (OC) += column sums of dout (N,OC), deterministic (cuda_gemm.cu). */
void lc_colsum_acc(float *db, const float *dout, int N, int OC);

/* Blocks for a flat loop of n elements, 256 threads each, capped (grid-stride
 * loops cover the rest). */
#define LC_THREADS 256
static inline unsigned lc_blocks(size_t n) {
    size_t b = (n + LC_THREADS - 1) / LC_THREADS;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return b ? (unsigned)b : 1u;
}

/* A grid-stride loop: i runs over [0, n) shared out over every thread. */
#define LC_FOR(i, n)                                                                                         \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                                  \
         i += (size_t)gridDim.x * blockDim.x)

/* Warp reductions over all 32 lanes. */
__device__ static inline float lc_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ static inline float lc_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

#endif
