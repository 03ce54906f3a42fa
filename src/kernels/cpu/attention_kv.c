/* attention_kv.c - causal attention of new query rows against a KV cache
 * (inference). For one sequence and head, the n new rows sit at positions
 * p0 .. p0+n-1 and attend to cached positions 0 .. p0+i: scores are one
 * sgemm q (n,HS) x k^T (HS, p0+n), a causal softmax per row, then one sgemm
 * with v (p0+n, HS). The same arithmetic as attention.c's training forward
 * for p0 = 0, so a prefill and a step-by-step decode agree within float
 * rounding of the summation order only. Grouped-query heads read their
 * key/value head of the narrower cache; a window masks the oldest keys. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kern_vec.h"
#include "loom/cpu.h"

size_t loom_attention_kv_scratch_floats(int threads, int n, int len) {
    return (size_t)n * (size_t)len * (size_t)threads;
}

void loom_cpu_attention_kv_fwd(void *ctx, float *out, const float *q, int ldq, const float *kc,
                               const float *vc, int p0, int n, int C, int NH, int NKV, int window,
                               float *scratch) {
    const int HS = C / NH, len = p0 + n, KC = NKV * HS, rep = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
    int nth = kern_threads(ctx);
    if (nth > NH) nth = NH;
    KERN_PARALLEL_FOR(nth)
    for (int h = 0; h < NH; h++) {
        float *s = scratch + (size_t)kern_thread_id() * n * len; /* (n, len) */
        const size_t kh = (size_t)(h / rep) * HS;                /* its key/value head */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, len, HS, scale, q + (size_t)h * HS, ldq,
                    kc + kh, KC, 0.0f, s, len);
        for (int i = 0; i < n; i++) {
            float *row = s + (size_t)i * len;
            int nk = p0 + i + 1, lo = window > 0 && nk - 1 - window > 0 ? nk - 1 - window : 0;
            float mx = kern_max(row + lo, nk - lo);
            kv_exp_shift(row + lo, nk - lo, mx);
            kern_scale_row(row + lo, nk - lo, 1.0f / kern_sum(row + lo, nk - lo));
            memset(row, 0, (size_t)lo * sizeof *row);
            memset(row + nk, 0, (size_t)(len - nk) * sizeof *row);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, HS, len, 1.0f, s, len, vc + kh, KC, 0.0f,
                    out + (size_t)h * HS, C);
    }
}
