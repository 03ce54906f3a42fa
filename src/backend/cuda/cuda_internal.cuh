/* cuda_internal.cuh - helpers shared by the CUDA backend's .cu files (private
 * to src/backend/cuda): the current stream, the cuBLAS handle, the sticky
 * error, scratch buffers and launch geometry. */
#ifndef LOOM_CUDA_INTERNAL_CUH
#define LOOM_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_backend.h"

/* The calling thread's current stream. */
cudaStream_t lc_stream(void);
/* The process's cuBLAS handle, bound to lc_stream() (created on first use;
 * NULL after a remembered failure to create it). */
cublasHandle_t lc_cublas(void);
/* Remember the first failure: after a launch, lc_launched("gelu_fwd") checks
 * cudaGetLastError; lc_cuda / lc_blas check a returned status. Each returns
 * 1 when all is well. */
int lc_launched(const char *what);
int lc_cuda(cudaError_t e, const char *what);
int lc_blas(cublasStatus_t s, const char *what);
/* A device scratch buffer of at least `bytes`, one per slot, grown (never
 * shrunk) on demand; NULL (failure remembered) when out of memory. */
enum { LC_SCRATCH_A, LC_SCRATCH_B, LC_SCRATCH_ROWS, LC_SCRATCH_RED, LC_SCRATCH_WS, LC_SCRATCH_N };
void *lc_scratch(int slot, size_t bytes);
void lc_scratch_free(void);
/* db (OC) += column sums of dout (N,OC), deterministic (cuda_gemm.cu). */
void lc_colsum_acc(float *db, const float *dout, int N, int OC);
/* Free the cuBLASLt handle, precision back to fp32 (cuda_gemm.cu). */
void lc_gemm_shutdown(void);

/* Blocks for a flat loop of n elements, 256 threads each, capped (grid-stride
 * loops cover the rest). */
#define LC_THREADS 256
static inline unsigned lc_blocks(size_t n) {
    size_t b = (n + LC_THREADS - 1) / LC_THREADS;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return b ? (unsigned)b : 1u;
}

/* A grid-stride loop: i runs over [0, n) shared out over every thread. */
#define LC_FOR(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

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
