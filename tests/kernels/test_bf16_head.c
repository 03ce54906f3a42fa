/* test_bf16_head.c - the LM head's bf16 weight gradient (gemm_head.c):
 * dwte (V,C) += dlogits^T (V x tokens) x (tokens x C), in bf16 mode.
 *
 * argv[1] "auto": on a CPU with AVX512-BF16 and no AMX-BF16, loom's own
 * kernel must take the product - loom_matmul_nt_bwd's weight gradient is
 * exactly the bits of a direct call of kern_bf16_head_dw, and those differ
 * from oneDNN's on the same operands (so the check can fail) - elsewhere
 * it must not be chosen. argv[1] "dnnl" runs with LOOM_BF16_HEAD=dnnl (set
 * by ctest): never chosen, the product oneDNN's bits.
 *
 * Wherever it runs, the kernel is checked on shapes that reach every edge:
 * a vocabulary that is not a multiple of the 4-row panels or the 256-row
 * tasks, C not a multiple of the 64-column micro-tile, tokens odd (the last
 * pair half empty) and longer than one 512-token block of K, lda wider than
 * the vocabulary, and C accumulated onto (beta 1) and overwritten (beta 0,
 * over NaN: the old C must not be read). Each result is within fp32
 * accumulation error of a double product of the bf16-rounded operands, and
 * clearly away from the product of the unrounded ones. Then the properties
 * layouts lean on: the first rows alone (a vocabulary shard of a tensor-
 * parallel rank), the first columns alone, and one or two threads give the
 * same bits as the whole product.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kernels/cpu/kern_internal.h"
#include "kref.h"
#include "loom/bf16.h"
#include "loom/cpu.h"
#include "loom/kernels.h"

enum { V = 701, LDA = 709, C = 200, K = 1101 }; /* vocabulary, its padded stride, channels, tokens */

static loom_device *dev; /* the CPU in bf16, one thread */

/* C0 + A^T B in double, A (K, lda) x (M columns), B (K, N). */
static double *ref_tn(const float *a, int lda, const float *b, const float *c0, int M, int N) {
    double *c = kr_doubles((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) s += (double)a[(size_t)k * lda + i] * b[(size_t)k * N + j];
            c[(size_t)i * N + j] = (c0 ? c0[(size_t)i * N + j] : 0.0) + s;
        }
    return c;
}

static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    CHECK(h != NULL, "out of memory");
    loom_bf16_pack(dev, h, x, n);
    return h;
}

/* kern_bf16_head_dw on rows [0, m) and columns [0, n) of the whole product,
 * on nth threads (a context of its own), starting from c0 (beta 1) into an
 * m x n buffer. */
static float *direct_part(const uint16_t *a16, const uint16_t *b16, const float *c0, int m, int n, int nth) {
    float *c = kr_floats((size_t)m * n);
    for (int i = 0; i < m; i++) memcpy(c + (size_t)i * n, c0 + (size_t)i * C, (size_t)n * sizeof *c);
    loom_cpu_ctx *ctx = loom_cpu_ctx_create(nth, 1);
    CHECK(ctx && kern_bf16_head_dw(ctx, m, n, K, a16, LDA, b16, C, 1.0f, c, n),
          "kern_bf16_head_dw ran out of memory");
    loom_cpu_ctx_free(ctx);
    return c;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "auto";
    kr_seed(29);
    dev = test_cpu_device(1, 1);
    const loom_cpu_features *f = loom_cpu_features_get();
    const int units = f->avx512_bf16 && f->os_avx512 && f->avx512bw && f->avx512vl;
    const int amx = f->amx_bf16 && f->os_amx;
    const int provider = kern_bf16_gemm_ready();
    const int ready = kern_bf16_head_ready();
    char why[256];
    loom_bf16_gemm_describe(why, sizeof why);
    printf("mode %s, AVX512-BF16 %d, AMX-BF16 %d: %s\n", mode, units, amx, why);
    if (!strcmp(mode, "dnnl")) CHECK(!ready, "LOOM_BF16_HEAD=dnnl but loom's kernel is chosen: %s", why);
    else
        CHECK(ready == (units && !amx), "AVX512-BF16 %d, AMX-BF16 %d, but loom's head kernel %s", units, amx,
              ready ? "chosen" : "not chosen");

    /* dlogits (K tokens x V, stride LDA), activations (K x C), wte (V x C) */
    float *dlog = kr_rand_floats((size_t)K * LDA, -1, 1), *x = kr_rand_floats((size_t)K * C, -1, 1);
    float *wte = kr_rand_floats((size_t)V * C, -1, 1), *c0 = kr_rand_floats((size_t)V * C, -1, 1);
    float *dlr = kr_floats((size_t)K * LDA), *xr = kr_floats((size_t)K * C);
    loom_round_bf16(dev, dlr, dlog, (size_t)K * LDA);
    loom_round_bf16(dev, xr, x, (size_t)K * C);
    double *near = ref_tn(dlr, LDA, xr, c0, V, C), *far = ref_tn(dlog, LDA, x, c0, V, C);

    /* through the model's API: dwte += dlogits^T x (the head's backward);
     * the API takes dlogits with stride V: the same values, packed */
    float *dpk = kr_floats((size_t)K * V);
    for (int k = 0; k < K; k++) memcpy(dpk + (size_t)k * V, dlog + (size_t)k * LDA, V * sizeof *dpk);
    float *dwte = kr_copy(c0, (size_t)V * C);
    loom_matmul_nt_bwd(dev, NULL, dwte, dpk, x, wte, K, C, V);
    double e_near = kr_err(dwte, near, (size_t)V * C), e_far = kr_err(dwte, far, (size_t)V * C);
    CHECK(e_near <= KR_FWD_TOL, "head weight gradient: %.3g from the product of the bf16-rounded operands",
          e_near);
    CHECK(e_far >= 1e-4, "head weight gradient: only %.3g from the fp32 product: operands not rounded?",
          e_far);
    printf("head weight gradient through loom_matmul_nt_bwd: %.3g from the rounded product, %.3g from fp32\n",
           e_near, e_far);

    if (!units) {
        printf("no AVX512-BF16 here: loom's kernel cannot run; done\n");
        free(dpk);
        loom_device_free(dev);
        return check_done();
    }
    uint16_t *a16 = to_bf16(dlog, (size_t)K * LDA), *b16 = to_bf16(x, (size_t)K * C);
    float *whole = direct_part(a16, b16, c0, V, C, 1);
    double e = kr_err(whole, near, (size_t)V * C);
    CHECK(e <= KR_FWD_TOL, "kern_bf16_head_dw: %.3g from the product of the bf16-rounded operands", e);

    /* which kernel took the model's product: direct calls on the operands
     * the API call had (stride V) */
    {
        uint16_t *d16 = to_bf16(dpk, (size_t)K * V);
        float *mine = kr_copy(c0, (size_t)V * C), *dn = kr_copy(c0, (size_t)V * C);
        CHECK(kern_bf16_head_dw(dev->ctx, V, C, K, d16, V, b16, C, 1.0f, mine, C),
              "kern_bf16_head_dw ran out of memory");
        if (provider == KERN_BF16_WHOLE) {
            CHECK(kern_dnnl_gemm(1, CblasTrans, CblasNoTrans, V, C, K, 1.0f, d16, V, b16, C, 1.0f, dn, C),
                  "oneDNN refused the head's weight gradient");
            CHECK(!kr_same_bits(mine, dn, (size_t)V * C),
                  "loom's kernel and oneDNN give the same bits here; the "
                  "route is not seen");
            CHECK(kr_same_bits(dwte, ready ? mine : dn, (size_t)V * C),
                  "the model's head weight gradient is not "
                  "%s's bits",
                  ready ? "loom's kernel" : "oneDNN");
            printf("the model's head weight gradient is %s's bits (the two kernels differ)\n",
                   ready ? "loom's kernel" : "oneDNN");
        } else {
            CHECK(!ready || kr_same_bits(dwte, mine, (size_t)V * C),
                  "the model's head weight gradient is not loom's "
                  "kernel's bits");
        }
        free(d16), free(mine), free(dn);
    }

    /* beta 0 over NaN: the old C is not read */
    float *fresh = kr_floats((size_t)V * C);
    kr_fill_nan(fresh, (size_t)V * C);
    CHECK(kern_bf16_head_dw(dev->ctx, V, C, K, a16, LDA, b16, C, 0.0f, fresh, C),
          "kern_bf16_head_dw ran out of memory");
    double *near0 = ref_tn(dlr, LDA, xr, NULL, V, C);
    e = kr_err(fresh, near0, (size_t)V * C);
    CHECK(e <= KR_FWD_TOL, "beta 0 over NaN: %.3g from the rounded product", e);

    /* cuts and threads: the whole product's bits */
    for (int nth = 1; nth <= 2; nth++) {
        float *all = direct_part(a16, b16, c0, V, C, nth);
        float *rows = direct_part(a16, b16, c0, V / 3, C, nth);
        float *cols = direct_part(a16, b16, c0, V, C / 2 + 3, nth);
        CHECK(kr_same_bits(all, whole, (size_t)V * C), "%d thread(s): not the one-thread bits", nth);
        CHECK(kr_same_bits(rows, whole, (size_t)(V / 3) * C),
              "first third of the rows alone, %d thread(s): not "
              "the whole product's bits",
              nth);
        int cols_same = 1;
        for (int i = 0; i < V; i++)
            cols_same &= kr_same_bits(cols + (size_t)i * (C / 2 + 3), whole + (size_t)i * C, C / 2 + 3);
        CHECK(cols_same, "first %d columns alone, %d thread(s): not the whole product's bits", C / 2 + 3,
              nth);
        free(all), free(rows), free(cols);
    }
    printf("V %d (stride %d) x C %d x tokens %d: %.3g from the rounded product; beta 0 over NaN; rows cut, "
           "columns cut, 1 and 2 threads: the same bits\n",
           V, LDA, C, K, e);
    free(a16), free(b16), free(whole), free(fresh), free(near0), free(dpk);
    free(dlog), free(x), free(wte), free(c0), free(dlr), free(xr), free(near), free(far), free(dwte);
    loom_device_free(dev);
    return check_done();
}
