/* cublasLt.h (emulation): descriptors keep the attributes cuda_gemm.cu sets;
 * cublasLtMatmul computes D = alpha op(A) op(B) + beta C (+ bias per row of
 * D with CUBLASLT_EPILOGUE_BIAS) with the reference in cublas_v2.h. The
 * heuristic offers one algorithm. */
#ifndef LOOM_EMU_CUBLASLT_H
#define LOOM_EMU_CUBLASLT_H
#include <stdlib.h>
#include "cublas_v2.h"
typedef struct emu_lt *cublasLtHandle_t;
struct emu_lt_desc {
    cublasOperation_t ta, tb;
    int epilogue;
    const float *bias;
};
struct emu_lt_layout {
    cudaDataType_t t;
    uint64_t rows, cols;
    int64_t ld;
};
typedef emu_lt_desc *cublasLtMatmulDesc_t;
typedef emu_lt_layout *cublasLtMatrixLayout_t;
typedef struct emu_lt_pref *cublasLtMatmulPreference_t;
typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 } cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;
typedef struct {
    int id;
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
} cublasLtMatmulHeuristicResult_t;
static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (cublasLtHandle_t)1; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t, cudaDataType_t) {
    *d = (emu_lt_desc *)calloc(1, sizeof(emu_lt_desc));
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { free(d); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                            const void *v, size_t n) {
    if (a == CUBLASLT_MATMUL_DESC_TRANSA) memcpy(&d->ta, v, n);
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB) memcpy(&d->tb, v, n);
    else if (a == CUBLASLT_MATMUL_DESC_EPILOGUE) memcpy(&d->epilogue, v, n);
    else if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER) memcpy(&d->bias, v, n);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    *l = (emu_lt_layout *)malloc(sizeof(emu_lt_layout));
    (*l)->t = t, (*l)->rows = rows, (*l)->cols = cols, (*l)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { free(l); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t)malloc(1);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { free(p); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                                  cublasLtMatmulPreferenceAttributes_t, const void *,
                                                                  size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                                            cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                            cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                                            cublasLtMatmulHeuristicResult_t *r, int *n) {
    r->algo.id = 1, r->workspaceSize = 0, r->state = CUBLAS_STATUS_SUCCESS;
    *n = 1;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                            cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                                            const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D,
                                            cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *, void *, size_t,
                                            cudaStream_t) {
    /* op(A) is (m, k): A stored (m, k) for N, (k, m) for T */
    int m = (int)ld->rows, n = (int)ld->cols, k = (int)(d->ta == CUBLAS_OP_N ? la->cols : la->rows);
    int kb = (int)(d->tb == CUBLAS_OP_N ? lb->rows : lb->cols);
    if (k != kb || C != D || lc->rows != ld->rows || lc->cols != ld->cols) return CUBLAS_STATUS_INVALID_VALUE;
    emu_gemm(d->ta, d->tb, m, n, k, *(const float *)alpha, A, la->t, (int)la->ld, B, lb->t, (int)lb->ld,
             *(const float *)beta, (float *)D, (int)ld->ld, d->epilogue == CUBLASLT_EPILOGUE_BIAS ? d->bias : NULL);
    return CUBLAS_STATUS_SUCCESS;
}
#endif
