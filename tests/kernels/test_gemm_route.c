/* test_gemm_route.c - which kernel computes each fp32 product (gemm.c).
 *
 * argv[1] "auto": the default choice. On a CPU with AVX-512 and oneDNN
 * (libdnnl.so.2) installed, oneDNN's fp32 matmul must be chosen, and the
 * forward and input-gradient products (op(A) not transposed, K <= 4096) must
 * be oneDNN's bits, and so must the LM head's input gradient (K = the
 * vocabulary, over 4096) of a model at most 512 wide, while the weight
 * gradients (A transposed) and the head's input gradient of a wider model
 * (here 640) must be OpenBLAS's.
 * Elsewhere every product must be OpenBLAS's. argv[1] "openblas" runs with
 * LOOM_FP32_GEMM=openblas (set by ctest): every product OpenBLAS's.
 *
 * "Must be X's bits" is checked against a direct call of each kernel on the
 * same operands (one thread), and the two kernels are first shown to give
 * different bits on each shape, so the check can fail. Every product is
 * also within fp32 accumulation error of a double reference. Then, for the
 * products oneDNN takes, the properties loom's layouts lean on: the first
 * half of the rows computed alone (a batch cut over data-parallel ranks) and
 * the first half of the columns computed alone (a weight cut over tensor-
 * parallel ranks) are the same bits as in the whole product, on one thread
 * and on two. Last, 100 products of as many different row counts (a
 * Mixture-of-Experts layer's expert products: a new M nearly every step),
 * more than oneDNN's primitive cache holds, each within fp32 error of the
 * whole product's rows - the first ones again after they were evicted.
 */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kernels/cpu/kern_internal.h"
#include "kref.h"
#include "loom/cpu.h"
#include "loom/kernels.h"

enum { NT = 400, CI = 448, OC = 640, VL = 4096 + 300 }; /* tokens, in, out, a vocabulary over 4096 */

/* C (M,N) = op(A) op(B) + C0 in double (row-major; A (M,K) or (K,M) when ta). */
static double *ref_prod(const float *a, int ta, const float *b, int tb, const float *c0, int M, int N,
                        int K) {
    double *c = kr_doubles((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = c0 ? c0[(size_t)i * N + j] : 0.0;
            for (int k = 0; k < K; k++) {
                double x = ta ? a[(size_t)k * M + i] : a[(size_t)i * K + k];
                double y = tb ? b[(size_t)j * K + k] : b[(size_t)k * N + j];
                s += x * y;
            }
            c[(size_t)i * N + j] = s;
        }
    return c;
}

typedef struct {
    const char *name;
    int ta, tb, M, N, K;
    const float *a, *b; /* op(A), op(B) storage as loom passes them */
    int lda, ldb;
    float *loom; /* loom's result (C starts as c0) */
    const float *c0;
    int head_dx; /* the LM head's input gradient (gemm.c's head_dx) */
} product;

/* The product by one kernel directly, on one thread: dnnl 1 = oneDNN's fp32 matmul. */
static float *direct(const product *p, int dnnl) {
    float *c = kr_floats((size_t)p->M * p->N);
    memcpy(c, p->c0, (size_t)p->M * p->N * sizeof *c);
    if (dnnl)
        CHECK(kern_dnnl_sgemm(1, p->ta, p->tb, p->M, p->N, p->K, 1.0f, p->a, p->lda, p->b, p->ldb, 1.0f, c,
                              p->N),
              "%s: oneDNN refused the product", p->name);
    else
        cblas_sgemm(CblasRowMajor, p->ta, p->tb, p->M, p->N, p->K, 1.0f, p->a, p->lda, p->b, p->ldb, 1.0f, c,
                    p->N);
    return c;
}

static int dlopen_libdnnl(void) {
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    return h != NULL; /* kept open: loom holds it too */
}

static void check_product(const product *p, int dnnl_ready) {
    const size_t n = (size_t)p->M * p->N;
    double *ref = ref_prod(p->a, p->ta != CblasNoTrans, p->b, p->tb != CblasNoTrans, p->c0, p->M, p->N, p->K);
    double e = kr_err(p->loom, ref, n);
    CHECK(e <= KR_FWD_TOL, "%s: rel err %.3g against the double product", p->name, e);
    int to_dnnl = dnnl_ready && p->ta == CblasNoTrans && (p->K <= 4096 || (p->head_dx && p->N <= 512));
    float *blas = direct(p, 0);
    if (dnnl_ready) {
        float *dn = direct(p, 1);
        CHECK(!kr_same_bits(blas, dn, n),
              "%s: OpenBLAS and oneDNN give the same bits here; the route is not seen", p->name);
        CHECK(kr_same_bits(p->loom, to_dnnl ? dn : blas, n), "%s (%c%c, K %d): not %s's bits", p->name,
              p->ta == CblasNoTrans ? 'N' : 'T', p->tb == CblasNoTrans ? 'N' : 'T', p->K,
              to_dnnl ? "oneDNN" : "OpenBLAS");
        free(dn);
    } else {
        CHECK(kr_same_bits(p->loom, blas, n), "%s: not OpenBLAS's bits (oneDNN is not chosen)", p->name);
    }
    printf("%-34s %c%c M %4d N %4d K %4d -> %s\n", p->name, p->ta == CblasNoTrans ? 'N' : 'T',
           p->tb == CblasNoTrans ? 'N' : 'T', p->M, p->N, p->K, to_dnnl ? "oneDNN" : "OpenBLAS");
    free(blas), free(ref);
}

/* The forward product of rows [0, m) and columns [0, oc) of w (C, OC), on
 * nth threads, into a fresh buffer (m x oc). */
static float *fwd_part(const float *x, const float *w, const float *bias, int m, int oc, int nth) {
    float *wpart = kr_floats((size_t)CI * oc), *out = kr_floats((size_t)m * oc);
    for (int i = 0; i < CI; i++) memcpy(wpart + (size_t)i * oc, w + (size_t)i * OC, (size_t)oc * sizeof *w);
    loom_device *dev = test_cpu_device(nth, 0);
    loom_matmul_fwd(dev, out, x, wpart, bias, m, CI, oc);
    loom_device_free(dev);
    free(wpart);
    return out;
}

/* Rows and columns cut, one and two threads: the same bits as the whole. */
static void check_cuts(const float *x, const float *w, const float *bias) {
    float *whole = fwd_part(x, w, bias, NT, OC, 1);
    for (int nth = 1; nth <= 2; nth++) {
        float *all = fwd_part(x, w, bias, NT, OC, nth);
        float *rows = fwd_part(x, w, bias, NT / 2, OC, nth);
        float *cols = fwd_part(x, w, bias, NT, OC / 2, nth);
        CHECK(kr_same_bits(all, whole, (size_t)NT * OC), "forward on %d thread(s): not the one-thread bits",
              nth);
        CHECK(kr_same_bits(rows, whole, (size_t)NT / 2 * OC),
              "forward, first half of the rows alone, %d thread(s): "
              "not the whole product's bits",
              nth);
        int cols_same = 1;
        for (int i = 0; i < NT; i++)
            cols_same &= kr_same_bits(cols + (size_t)i * (OC / 2), whole + (size_t)i * OC, OC / 2);
        CHECK(cols_same,
              "forward, first half of the columns alone, %d thread(s): not the whole product's bits", nth);
        free(all), free(rows), free(cols);
    }
    printf("forward: rows cut, columns cut, 1 and 2 threads: the same bits\n");
    free(whole);
}

/* Forward products of 1, 2, ..., 100 rows, then 1..10 again. */
static void check_many_shapes(loom_device *dev, const float *x, const float *w, const float *bias,
                              const float *whole) {
    float *out = kr_floats((size_t)NT * OC);
    double *ref = kr_widen(whole, (size_t)NT * OC);
    double worst = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int m = 1; m <= (pass ? 10 : 100); m++) {
            loom_matmul_fwd(dev, out, x, w, bias, m, CI, OC);
            double e = kr_err(out, ref, (size_t)m * OC);
            worst = e > worst ? e : worst;
            CHECK(e <= KR_FWD_TOL, "forward of %d rows (pass %d): rel err %.3g against the whole product", m,
                  pass + 1, e);
        }
    printf("forward of 1..100 rows, then 1..10 again: worst rel err %.3g\n", worst);
    free(out), free(ref);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "auto";
    kr_seed(11);
    const loom_cpu_features *f = loom_cpu_features_get();
    int avx512 = f->avx512f && f->os_avx512;
    int ready = kern_dnnl_f32_ready();
    char why[256];
    kern_dnnl_f32_describe(why, sizeof why);
    printf("mode %s, AVX-512 %d: %s\n", mode, avx512, why);
    if (!strcmp(mode, "openblas")) {
        CHECK(!ready, "LOOM_FP32_GEMM=openblas but oneDNN takes fp32 products: %s", why);
    } else {
        /* with AVX-512, oneDNN must be taken wherever it is installed (it is
         * on every machine scripts/setup.sh prepared: python3-torch needs it) */
        int installed = dlopen_libdnnl();
        CHECK(ready == (avx512 && installed), "AVX-512 %d, libdnnl.so.2 %s, but oneDNN %s: %s", avx512,
              installed ? "present" : "absent", ready ? "chosen" : "not chosen", why);
    }

    float *x = kr_rand_floats((size_t)NT * CI, -1, 1), *w = kr_rand_floats((size_t)CI * OC, -1, 1);
    float *bias = kr_rand_floats(OC, -1, 1), *dy = kr_rand_floats((size_t)NT * OC, -1, 1);
    float *wte = kr_rand_floats((size_t)VL * CI, -1, 1), *dlog = kr_rand_floats((size_t)NT * VL, -1, 1);
    float *zero = calloc((size_t)VL * OC, sizeof(float));
    float *c0x = kr_rand_floats((size_t)NT * CI, -1, 1), *c0w = kr_rand_floats((size_t)CI * OC, -1, 1);
    float *c0e = kr_rand_floats((size_t)VL * CI, -1, 1);
    float *bias_rows = kr_floats((size_t)NT * OC);
    for (int i = 0; i < NT; i++) memcpy(bias_rows + (size_t)i * OC, bias, OC * sizeof *bias);

    loom_device *dev = test_cpu_device(1, 0);
    float *fwd = kr_floats((size_t)NT * OC), *logits = kr_floats((size_t)NT * VL);
    loom_matmul_fwd(dev, fwd, x, w, bias, NT, CI, OC);
    loom_matmul_nt_fwd(dev, logits, x, wte, NT, CI, VL);
    float *dx = kr_copy(c0x, (size_t)NT * CI), *dw = kr_copy(c0w, (size_t)CI * OC);
    loom_matmul_bwd(dev, dx, dw, NULL, dy, x, w, NT, CI, OC);
    float *dxh = kr_copy(c0x, (size_t)NT * CI), *dwte = kr_copy(c0e, (size_t)VL * CI);
    loom_matmul_nt_bwd(dev, dxh, dwte, dlog, x, wte, NT, CI, VL);
    float *wte2 = kr_rand_floats((size_t)VL * OC, -1, 1), *c0x2 = kr_rand_floats((size_t)NT * OC, -1, 1);
    float *dxh2 = kr_copy(c0x2, (size_t)NT * OC); /* a model OC = 640 wide */
    loom_matmul_nt_bwd(dev, dxh2, NULL, dlog, NULL, wte2, NT, OC, VL);

    const product ps[] = {
        {"linear forward (with bias)", CblasNoTrans, CblasNoTrans, NT, OC, CI, x, w, CI, OC, fwd, bias_rows,
         0},
        {"linear input gradient", CblasNoTrans, CblasTrans, NT, CI, OC, dy, w, OC, OC, dx, c0x, 0},
        {"linear weight gradient", CblasTrans, CblasNoTrans, CI, OC, NT, x, dy, CI, OC, dw, c0w, 0},
        {"head forward", CblasNoTrans, CblasTrans, NT, VL, CI, x, wte, CI, CI, logits, zero, 0},
        {"head input gradient (long K)", CblasNoTrans, CblasNoTrans, NT, CI, VL, dlog, wte, VL, CI, dxh, c0x,
         1},
        {"head input gradient (long K, wide)", CblasNoTrans, CblasNoTrans, NT, OC, VL, dlog, wte2, VL, OC,
         dxh2, c0x2, 1},
        {"head weight gradient", CblasTrans, CblasNoTrans, VL, CI, NT, dlog, x, VL, CI, dwte, c0e, 0},
    };
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) check_product(&ps[i], ready);
    if (ready) check_cuts(x, w, bias);
    check_many_shapes(dev, x, w, bias, fwd);

    free(x), free(w), free(bias), free(dy), free(wte), free(dlog), free(zero), free(c0x), free(c0w),
        free(c0e);
    free(bias_rows), free(fwd), free(logits), free(dx), free(dw), free(dxh), free(dwte), free(wte2),
        free(c0x2);
    free(dxh2);
    loom_device_free(dev);
    return check_done();
}
