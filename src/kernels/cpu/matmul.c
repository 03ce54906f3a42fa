/* matmul.c - linear layers and the tied LM head, forward and backward.
 *
 * Every product is one row-major sgemm through kern_sgemm (gemm.c), which
 * shares the output rows out over the kernel threads. Linear weights are [in, out] (C, OC) as in Hugging
 * Face's GPT-2 Conv1D; the LM head multiplies by the embedding wte (V, C)
 * transposed; the Llama family's linear_* take torch.nn.Linear's [out, in]
 * (OC, C) weights. Backward passes accumulate (beta = 1) into every gradient they
 * are given. The bias gradient is a column sum, split over threads by column
 * slices so that no two threads write the same float.
 */
#include <cblas.h>

#include "kern_internal.h"

/* Columns per thread task in the bias-gradient column sum. */
#define MM_BIAS_COLS 64

/* out (N,OC) = inp (N,C) @ the weight + b: w (C,OC) [in, out], or with
 * out_in (OC,C) [out, in], used transposed. b (OC) or NULL. */
static void mm_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int N, int C,
                   int OC, int out_in) {
    /* with a bias, each thread's rows of out start as b and the product adds to them */
    kern_gemm g = {.ta = CblasNoTrans,
                   .tb = out_in ? CblasTrans : CblasNoTrans,
                   .M = N,
                   .N = OC,
                   .K = C,
                   .alpha = 1.0f,
                   .A = inp,
                   .lda = C,
                   .B = w,
                   .ldb = out_in ? C : OC,
                   .beta = b ? 1.0f : 0.0f,
                   .C = out,
                   .ldc = OC,
                   .bias = b};
    kern_sgemm(ctx, &g);
}

/* db (OC) += sum over rows of dout (N,OC). */
static void mm_bias_bwd(void *ctx, float *db, const float *dout, int N, int OC) {
    int nth = kern_threads(ctx);
    int cols = nth > 1 ? MM_BIAS_COLS : OC;
    int ntask = (OC + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols;
        int nc = OC - c0 < cols ? OC - c0 : cols;
        for (int i = 0; i < N; i++) kern_add_row(db + c0, dout + (size_t)i * OC + c0, nc);
    }
}

/* mm_fwd's backward: dinp (N,C) +=, dw +=, db (OC) += (each may be NULL). */
static void mm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, int N, int C, int OC, int out_in) {
    /* in bf16, dout is converted once for both products (no caller keeps
     * an output gradient itself, so the unkeep below drops only this keep) */
    const int keep = dinp && dw && loom_cpu_gemm_keeps_bf16(ctx);
    if (keep) loom_cpu_gemm_keep(ctx, dout, (size_t)N * OC);
    if (dinp) { /* dout @ w^T (dout @ w for [out, in]) */
        kern_gemm g = {.ta = CblasNoTrans,
                       .tb = out_in ? CblasNoTrans : CblasTrans,
                       .M = N,
                       .N = C,
                       .K = OC,
                       .alpha = 1.0f,
                       .A = dout,
                       .lda = OC,
                       .B = w,
                       .ldb = out_in ? C : OC,
                       .beta = 1.0f,
                       .C = dinp,
                       .ldc = C};
        kern_sgemm(ctx, &g);
    }
    if (dw) { /* inp^T @ dout (C,OC), or dout^T @ inp (OC,C) for [out, in] */
        kern_gemm g = {.ta = CblasTrans,
                       .tb = CblasNoTrans,
                       .M = out_in ? OC : C,
                       .N = out_in ? C : OC,
                       .K = N,
                       .alpha = 1.0f,
                       .A = out_in ? dout : inp,
                       .lda = out_in ? OC : C,
                       .B = out_in ? inp : dout,
                       .ldb = out_in ? C : OC,
                       .beta = 1.0f,
                       .C = dw,
                       .ldc = out_in ? C : OC};
        kern_sgemm(ctx, &g);
    }
    if (keep) loom_cpu_gemm_unkeep(ctx, dout);
    if (db) mm_bias_bwd(ctx, db, dout, N, OC);
}

void loom_cpu_matmul_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int N,
                         int C, int OC) {
    /* out (N,OC), inp (N,C), w (C,OC), b (OC) or NULL */
    mm_fwd(ctx, out, inp, w, b, N, C, OC, 0);
}

void loom_cpu_matmul_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC) {
    /* dinp (N,C) +=, dw (C,OC) +=, db (OC) +=; dout (N,OC), inp (N,C), w (C,OC) */
    mm_bwd(ctx, dinp, dw, db, dout, inp, w, N, C, OC, 0);
}

void loom_cpu_matmul_nt_fwd(void *ctx, float *out, const float *inp, const float *wte, int N, int C, int V) {
    /* out (N,V), inp (N,C), wte (V,C) */
    kern_gemm g = {.ta = CblasNoTrans,
                   .tb = CblasTrans,
                   .M = N,
                   .N = V,
                   .K = C,
                   .alpha = 1.0f,
                   .A = inp,
                   .lda = C,
                   .B = wte,
                   .ldb = C,
                   .beta = 0.0f,
                   .C = out,
                   .ldc = V};
    kern_sgemm(ctx, &g);
}

void loom_cpu_matmul_nt_bwd(void *ctx, float *dinp, float *dwte, const float *dout, const float *inp,
                            const float *wte, int N, int C, int V) {
    /* dinp (N,C) +=, dwte (V,C) +=; dout (N,V), inp (N,C), wte (V,C) */
    if (dinp) { /* dout @ wte */
        kern_gemm g = {.ta = CblasNoTrans,
                       .tb = CblasNoTrans,
                       .M = N,
                       .N = C,
                       .K = V,
                       .alpha = 1.0f,
                       .A = dout,
                       .lda = V,
                       .B = wte,
                       .ldb = C,
                       .beta = 1.0f,
                       .C = dinp,
                       .ldc = C,
                       .head_dx = 1};
        kern_sgemm(ctx, &g);
    }
    if (dwte) { /* dout^T @ inp */
        kern_gemm g = {.ta = CblasTrans,
                       .tb = CblasNoTrans,
                       .M = V,
                       .N = C,
                       .K = N,
                       .alpha = 1.0f,
                       .A = dout,
                       .lda = V,
                       .B = inp,
                       .ldb = C,
                       .beta = 1.0f,
                       .C = dwte,
                       .ldc = C,
                       .head_dw = 1};
        kern_sgemm(ctx, &g);
    }
}

void loom_cpu_linear_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int N,
                         int C, int OC) {
    /* out (N,OC), inp (N,C), w (OC,C) [out, in], b (OC) or NULL */
    mm_fwd(ctx, out, inp, w, b, N, C, OC, 1);
}

void loom_cpu_linear_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC) {
    /* dinp (N,C) +=, dw (OC,C) +=, db (OC) +=; dout (N,OC), inp (N,C), w (OC,C) */
    mm_bwd(ctx, dinp, dw, db, dout, inp, w, N, C, OC, 1);
}
