/* cublas_v2.h (emulation): the handle calls and cublasGemmEx, written from
 * cuBLAS's documented semantics - column-major C (m,n) = alpha op(A) op(B)
 * + beta C, op(A) (m,k), op(B) (k,n), element (i,j) of a matrix at
 * [i + j*ld] - with fp32 or bf16 A/B, fp32 C, accumulation in double (a
 * reference, not a model of the GPU's rounding). */
#ifndef LOOM_EMU_CUBLAS_H
#define LOOM_EMU_CUBLAS_H
#include "cuda_bf16.h"
#include "cuda_runtime.h"
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef struct emu_blas *cublasHandle_t;
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)1; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
static inline const char *cublasGetStatusString(cublasStatus_t) { return "cublas (emulated)"; }

static inline double emu_elem(const void *p, cudaDataType_t t, size_t i) {
    return t == CUDA_R_16BF ? (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]) : (double)((const float *)p)[i];
}
/* element (i, j) of op(X), X stored column-major with leading dimension ld */
static inline double emu_op(const void *X, cudaDataType_t t, cublasOperation_t op, int ld, int i, int j) {
    return op == CUBLAS_OP_N ? emu_elem(X, t, (size_t)i + (size_t)j * ld) : emu_elem(X, t, (size_t)j + (size_t)i * ld);
}
static inline void emu_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                            const void *A, cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb,
                            float beta, float *C, int ldc, const float *bias) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int l = 0; l < k; l++) s += emu_op(A, at, ta, lda, i, l) * emu_op(B, bt, tb, ldb, l, j);
            float *c = C + (size_t)i + (size_t)j * ldc;
            double r = alpha * s + (beta != 0.0f ? beta * (double)*c : 0.0);
            *c = (float)(bias ? r + bias[i] : r);
        }
}
static inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
    if (ct != CUDA_R_32F || at != bt || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) ||
        ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    emu_gemm(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, (float *)C, ldc,
             NULL);
    return CUBLAS_STATUS_SUCCESS;
}
#endif
