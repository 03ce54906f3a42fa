/* attention.c - causal multi-head self-attention, forward and backward.
 *
 * For each (batch b, head h), q, k and v are (T, HS) views into qkv (B,T,3C)
 * with leading dimension 3C, and the head's output is a (T, HS) view into out
 * (B,T,C) with leading dimension C, so every product is one cblas_sgemm on the
 * strided views with no copies. Work goes in blocks of ATT_BLK query rows:
 * rows [i0, i0+m) attend only to keys [0, i0+m), so the sgemms skip the
 * blocks above the diagonal (about half the work for long T); the causal mask
 * inside the diagonal block is applied by the softmax, which also writes the
 * zeros above the diagonal of att. Backward mirrors this by row blocks (dq)
 * and column blocks (dk, dv). (b, h) pairs are independent and are shared
 * out over OpenMP threads, each calling the one-thread OpenBLAS.
 */
#include <cblas.h>

#include "kern_internal.h"

/* Query rows per block. The backward relies on row and column blocks being
 * aligned to the same multiple. */
#define ATT_BLK 64

size_t loom_attention_scratch_floats(int T) {
    return (size_t)T * (size_t)T * (size_t)loom_kernels_get_threads();
}

/* Causal softmax of rows [i0, i0+m) of s (T,T), in place: row i keeps
 * columns 0..i (already scaled scores), columns i+1..T-1 become 0. */
static void att_softmax_rows(float *s, int i0, int m, int T) {
    for (int i = i0; i < i0 + m; i++) {
        float *row = s + (size_t)i * T; /* (T) */
        float mx = kern_max(row, i + 1);
        kern_exp_shift(row, i + 1, mx);
        kern_scale_row(row, i + 1, 1.0f / kern_sum(row, i + 1));
        memset(row + i + 1, 0, (size_t)(T - i - 1) * sizeof *row);
    }
}

/* Forward for one (b, h). q, k, v: (T,HS) with row stride 3C; out: (T,HS)
 * with row stride C; att: (T,T). */
static void att_fwd_head(float *out, float *att, const float *q, const float *k,
                         const float *v, int T, int C, int HS, float scale) {
    int ld = 3 * C;
    for (int i0 = 0; i0 < T; i0 += ATT_BLK) {
        int m = T - i0 < ATT_BLK ? T - i0 : ATT_BLK;
        int nk = i0 + m; /* keys visible to this block */
        float *s = att + (size_t)i0 * T; /* (m, T) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, HS, scale,
                    q + (size_t)i0 * ld, ld, k, ld, 0.0f, s, T);
        att_softmax_rows(att, i0, m, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, nk, 1.0f, s, T, v, ld,
                    0.0f, out + (size_t)i0 * C, C);
    }
}

void loom_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    /* out (B,T,C), att (B,NH,T,T), qkv (B,T,3C) */
    int HS = C / NH;
    float scale = 1.0f / sqrtf((float)HS);
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * HS; /* (T,HS) ld 3C */
        att_fwd_head(out + (size_t)b * T * C + (size_t)h * HS, att + (size_t)bh * T * T, q,
                     q + C, q + 2 * C, T, C, HS, scale);
    }
}

/* Softmax backward of rows [i0, i0+m) in place on d (T,T), which holds
 * d att on entry and d scores * scale on exit:
 *   dpre[i,j] = scale * p[i,j] (d[i,j] - sum_k p[i,k] d[i,k])  for j <= i,
 * and 0 for i < j < nk (the rest of the row is never read). */
static void att_softmax_bwd_rows(float *d, const float *p, int i0, int m, int nk, int T,
                                 float scale) {
    for (int i = i0; i < i0 + m; i++) {
        float *dr = d + (size_t)i * T;        /* (T) */
        const float *pr = p + (size_t)i * T;  /* (T) */
        float dot = kern_dot(pr, dr, i + 1);
        for (int j = 0; j <= i; j++) dr[j] = scale * pr[j] * (dr[j] - dot);
        for (int j = i + 1; j < nk; j++) dr[j] = 0.0f;
    }
}

/* Backward for one (b, h). Pointers as in att_fwd_head, plus the gradient
 * views dq, dk, dv (T,HS) with row stride 3C, dout (T,HS) with row stride C
 * and the (T,T) scratch d. */
static void att_bwd_head(float *dq, float *dk, float *dv, float *d, const float *dout,
                         const float *q, const float *k, const float *v, const float *att,
                         int T, int C, int HS, float scale) {
    int ld = 3 * C;
    /* row blocks: d att = dout v^T, softmax backward, dq += dpre k */
    for (int i0 = 0; i0 < T; i0 += ATT_BLK) {
        int m = T - i0 < ATT_BLK ? T - i0 : ATT_BLK;
        int nk = i0 + m;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, HS, 1.0f,
                    dout + (size_t)i0 * C, C, v, ld, 0.0f, d + (size_t)i0 * T, T);
        att_softmax_bwd_rows(d, att, i0, m, nk, T, scale);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, nk, 1.0f,
                    d + (size_t)i0 * T, T, k, ld, 1.0f, dq + (size_t)i0 * ld, ld);
    }
    /* column blocks: keys [j0, j0+m) are seen by queries [j0, T) */
    for (int j0 = 0; j0 < T; j0 += ATT_BLK) {
        int m = T - j0 < ATT_BLK ? T - j0 : ATT_BLK;
        int nq = T - j0;
        size_t off = (size_t)j0 * T + (size_t)j0; /* block (j0.., j0..) of (T,T) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, HS, nq, 1.0f, att + off, T,
                    dout + (size_t)j0 * C, C, 1.0f, dv + (size_t)j0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, HS, nq, 1.0f, d + off, T,
                    q + (size_t)j0 * ld, ld, 1.0f, dk + (size_t)j0 * ld, ld);
    }
}

void loom_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH) {
    /* dqkv (B,T,3C) +=, scratch (threads,T,T), dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) */
    int HS = C / NH;
    float scale = 1.0f / sqrtf((float)HS);
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t qoff = (size_t)b * T * 3 * C + (size_t)h * HS; /* head h of q in (B,T,3C) */
        float *d = scratch + (size_t)kern_thread_id() * T * T; /* (T,T) */
        att_bwd_head(dqkv + qoff, dqkv + qoff + C, dqkv + qoff + 2 * C, d,
                     dout + (size_t)b * T * C + (size_t)h * HS, qkv + qoff, qkv + qoff + C,
                     qkv + qoff + 2 * C, att + (size_t)bh * T * T, T, C, HS, scale);
    }
}
