/* cuda_gemm.cu - linear layers and the tied LM head through cuBLAS, with
 * loom's row-major layout: weights [in, out] (C, OC), out = inp @ w + b, and
 * the head out = inp @ wte^T. Backward calls accumulate (beta = 1) into every
 * gradient they are given, as matmul.c does.
 *
 * cuBLAS is column-major; a row-major X (r, c) with leading dimension ld is
 * the column-major X^T with the same ld, so the row-major product
 * C = op(A) op(B) is issued as the column-major C^T = op(B)^T op(A)^T: the
 * operands swap places and keep their transpose flags (lc_gemm_rm).
 *
 * Precision (the context's, loom_cuda_set_precision): FP32 computes in fp32 with TF32 off
 * (CUBLAS_COMPUTE_32F, pedantic enough that no tensor-core TF32 is used);
 * TF32 allows it (CUBLAS_COMPUTE_32F_FAST_TF32); BF16 rounds both operands
 * to bf16 into scratch buffers (nearest even, as the CPU's bf16 mode rounds
 * them) and multiplies bf16 x bf16 with fp32 accumulation and fp32 output.
 * The forward with a bias goes through cuBLASLt with the bias fused as an
 * epilogue (out = fl(sum + b), the CPU's rounding); when cuBLASLt offers no
 * algorithm for the shapes and alignments, the bias is written into out first
 * and the cuBLAS product added (beta = 1), as the CPU does.
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_internal.cuh"

__global__ static void k_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n) {
    LC_FOR(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

/* A bf16 copy of the n floats at src in c's scratch `slot`, or NULL. */
static const void *lc_bf16_copy(loom_cuda_ctx *c, int slot, const float *src, size_t n) {
    __nv_bfloat16 *d = (__nv_bfloat16 *)lc_scratch(c, slot, n * sizeof *d);
    if (!d) return NULL;
    if (n) k_to_bf16<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(d, src, n);
    return lc_launched("bf16 operand copy") ? d : NULL;
}

/* Floats a row-major operand spans: rows of its stored layout x ld. */
static size_t lc_span(bool trans, int rows_nt, int cols_nt, int ld) {
    size_t rows = (size_t)(trans ? cols_nt : rows_nt), cols = (size_t)(trans ? rows_nt : cols_nt);
    return rows ? (rows - 1) * (size_t)ld + cols : 0;
}

/* Row-major C (M,N) = alpha op(A) op(B) + beta C; op(A) is (M,K), op(B) (K,N). */
static void lc_gemm_rm(loom_cuda_ctx *c, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc, const char *what) {
    if (M <= 0 || N <= 0) return;
    cublasHandle_t h = lc_cublas(c);
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const void *a = A, *b = B;
    cudaDataType_t type = CUDA_R_32F;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (c->precision == LOOM_CUDA_TF32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    if (c->precision == LOOM_CUDA_BF16 && K > 0) {
        /* A is stored (M,K) or, transposed, (K,M); B (K,N) or (N,K) */
        a = lc_bf16_copy(c, LC_SCRATCH_A, A, lc_span(ta, M, K, lda));
        b = lc_bf16_copy(c, LC_SCRATCH_B, B, lc_span(tb, K, N, ldb));
        if (!a || !b) return;
        type = CUDA_R_16BF;
    }
    lc_blas(cublasGemmEx(h, opb, opa, N, M, K, &alpha, b, type, ldb, a, type, lda, &beta, C, CUDA_R_32F, ldc,
                         compute, CUBLAS_GEMM_DEFAULT),
            what);
}

/* ---- cuBLASLt: the forward with its bias fused ------------------------------ */

#define LT_WORKSPACE ((size_t)32 << 20)

/* Largest power of two (<= 256) dividing the address: cuBLASLt's heuristics
 * otherwise assume 256-byte aligned operands, and slices of larger buffers
 * are not. */
static uint32_t lc_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

/* out (N,OC) = inp (N,C) @ w (C,OC) + b through one cublasLtMatmul; 0 when
 * cuBLASLt cannot (then nothing was launched and the caller falls back). */
static int lc_lt_bias_fwd(loom_cuda_ctx *c, float *out, const float *inp, const float *w, const float *b,
                          int N, int C, int OC) {
    if (!c->lt && !c->lt_failed && cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) c->lt_failed = 1;
    /* the bias's alignment is not part of the heuristic query: only 16-byte aligned biases go here */
    if (c->lt_failed || N <= 0 || OC <= 0 || C <= 0 || lc_align(b) < 16) return 0;
    const void *a = w, *bb = inp; /* column-major: out^T (OC,N) = w^T (OC,C) inp^T (C,N) */
    cudaDataType_t type = CUDA_R_32F;
    cublasComputeType_t compute =
        c->precision == LOOM_CUDA_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (c->precision == LOOM_CUDA_BF16) {
        a = lc_bf16_copy(c, LC_SCRATCH_B, w, (size_t)C * OC);
        bb = lc_bf16_copy(c, LC_SCRATCH_A, inp, (size_t)N * C);
        if (!a || !bb) return 0;
        type = CUDA_R_16BF;
    }
    void *ws = lc_scratch(c, LC_SCRATCH_WS, LT_WORKSPACE);
    if (!ws) return 0;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasOperation_t nt = CUBLAS_OP_N;
    size_t wsz = LT_WORKSPACE;
    uint32_t al_a = lc_align(a), al_b = lc_align(bb), al_c = lc_align(out);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0, done = 0;
    if (cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &nt, sizeof nt) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&la, type, OC, C, OC) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&lb, type, C, N, C) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, OC, N, OC) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz,
                                             sizeof wsz) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                             sizeof al_a) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                             sizeof al_b) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                             sizeof al_c) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                             sizeof al_c) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, lc, lc, pref, 1, &heur, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        const float one = 1.0f, zero = 0.0f;
        done = cublasLtMatmul(c->lt, op, &one, a, la, bb, lb, &zero, out, lc, out, lc, &heur.algo, ws, wsz,
                              lc_stream()) == CUBLAS_STATUS_SUCCESS;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return done;
}

/* out (N,OC) = b broadcast over rows */
__global__ static void k_bias_rows(float *out, const float *b, int N, int OC) {
    size_t n = (size_t)N * OC;
    LC_FOR(i, n) out[i] = b[i % (size_t)OC];
}

/* db (OC) += column sums of dout (N,OC): a block takes 32 columns, its 8
 * warps rows y, y+8, ... in order, then the 8 partials add in a fixed order
 * (deterministic; coalesced reads along a row). */
__global__ static void k_colsum_acc(float *db, const float *dout, int N, int OC) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < OC)
        for (int i = threadIdx.y; i < N; i += 8) s += dout[(size_t)i * OC + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += part[y][threadIdx.x];
        db[c] += t;
    }
}

void lc_colsum_acc(float *db, const float *dout, int N, int OC) {
    if (OC <= 0) return;
    k_colsum_acc<<<(OC + 31) / 32, dim3(32, 8), 0, lc_stream()>>>(db, dout, N, OC);
    lc_launched("bias gradient");
}

/* out (N,OC) = inp (N,C) @ the weight + b: w (C,OC) [in, out], or with
 * out_in (OC,C) [out, in], used transposed. */
static void lc_mm_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int N, int C,
                      int OC, bool out_in) {
    loom_cuda_ctx *c = lc_ctx(ctx);
    float beta = 0.0f;
    if (b && !out_in && lc_lt_bias_fwd(c, out, inp, w, b, N, C, OC)) {
        lc_launched("matmul_fwd (cuBLASLt)");
        return;
    }
    if (b && N > 0 && OC > 0) { /* the bias first, the product added: the CPU's rounding */
        k_bias_rows<<<lc_blocks((size_t)N * OC), LC_THREADS, 0, lc_stream()>>>(out, b, N, OC);
        if (!lc_launched("matmul_fwd bias")) return;
        beta = 1.0f;
    }
    lc_gemm_rm(c, false, out_in, N, OC, C, 1.0f, inp, C, w, out_in ? C : OC, beta, out, OC, "matmul_fwd");
}

/* lc_mm_fwd's backward: dinp (N,C) +=, dw +=, db (OC) += (each may be NULL). */
static void lc_mm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int C, int OC, bool out_in) {
    loom_cuda_ctx *c = lc_ctx(ctx);
    if (dinp)
        lc_gemm_rm(c, false, !out_in, N, C, OC, 1.0f, dout, OC, w, out_in ? C : OC, 1.0f, dinp, C,
                   "matmul_bwd dinp");
    if (dw && out_in)
        lc_gemm_rm(c, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C, "linear_bwd dw");
    if (dw && !out_in)
        lc_gemm_rm(c, true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, OC, "matmul_bwd dw");
    if (db) lc_colsum_acc(db, dout, N, OC);
}

void loom_cuda_matmul_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int N,
                          int C, int OC) {
    lc_mm_fwd(ctx, out, inp, w, b, N, C, OC, false);
}

void loom_cuda_matmul_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, int N, int C, int OC) {
    lc_mm_bwd(ctx, dinp, dw, db, dout, inp, w, N, C, OC, false);
}

void loom_cuda_matmul_nt_fwd(void *ctx, float *out, const float *inp, const float *wte, int N, int C, int V) {
    lc_gemm_rm(lc_ctx(ctx), false, true, N, V, C, 1.0f, inp, C, wte, C, 0.0f, out, V, "matmul_nt_fwd");
}

void loom_cuda_matmul_nt_bwd(void *ctx, float *dinp, float *dwte, const float *dout, const float *inp,
                             const float *wte, int N, int C, int V) {
    loom_cuda_ctx *c = lc_ctx(ctx);
    if (dinp)
        lc_gemm_rm(c, false, false, N, C, V, 1.0f, dout, V, wte, C, 1.0f, dinp, C, "matmul_nt_bwd dinp");
    if (dwte) lc_gemm_rm(c, true, false, V, C, N, 1.0f, dout, V, inp, C, 1.0f, dwte, C, "matmul_nt_bwd dwte");
}

/* ---- calibration ---------------------------------------------------------------- */

double loom_cuda_calibrate_gemm(loom_cuda_ctx *ctx, int n, int trials) {
    if (n <= 0) n = 4096;
    if (trials <= 0) trials = 1;
    size_t nn = (size_t)n * n;
    float *a = (float *)loom_cuda_alloc(3 * nn * sizeof(float));
    if (!a) return 0.0;
    float *b = a + nn, *c = b + nn;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0.0;
    /* every float 0x3c3c3c3c (~0.0115): finite products, no denormals */
    if (lc_cuda(cudaMemsetAsync(a, 0x3c, 2 * nn * sizeof(float), lc_stream()), "calibrate memset") &&
        lc_cuda(cudaEventCreate(&e0), "calibrate event") &&
        lc_cuda(cudaEventCreate(&e1), "calibrate event")) {
        lc_gemm_rm(ctx, false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, "calibrate gemm"); /* warm-up */
        for (int t = 0; t < trials; t++) {
            float ms = 0.0f;
            cudaEventRecord(e0, lc_stream());
            lc_gemm_rm(ctx, false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, "calibrate gemm");
            cudaEventRecord(e1, lc_stream());
            if (!lc_cuda(cudaEventSynchronize(e1), "calibrate synchronize") ||
                !lc_cuda(cudaEventElapsedTime(&ms, e0, e1), "calibrate elapsed"))
                break;
            double f = ms > 0.0f ? 2.0 * (double)n * n * n / (1e-3 * ms) : 0.0;
            if (f > best) best = f;
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    loom_cuda_free(a);
    return best;
}

/* ---- torch.nn.Linear weights [out, in] (the Llama family) --------------------- */

void loom_cuda_linear_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int N,
                          int C, int OC) {
    lc_mm_fwd(ctx, out, inp, w, b, N, C, OC, true);
}

void loom_cuda_linear_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, int N, int C, int OC) {
    lc_mm_bwd(ctx, dinp, dw, db, dout, inp, w, N, C, OC, true);
}
