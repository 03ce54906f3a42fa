/* test_bf16_mkl.c - a bf16 GEMM provider (argv[1]: "mkl" for oneMKL's
 * cblas_gemm_bf16bf16f32, "dnnl" for oneDNN's matmul; src/kernels/cpu/
 * gemm_mkl.c and gemm_dnnl.c) computes what --precision bf16 means.
 *
 * LOOM_BF16_GEMM=<provider> forces it, so this runs on any CPU: on one
 * without AVX512-BF16 / AMX-BF16 (the 2-core Zen 3 this was first written
 * on) oneMKL emulates the bf16 products and oneDNN runs its reference matmul,
 * elsewhere both use the bf16 units (oneMKL on Intel only). The matmul kernels in bf16 mode - every operand layout loom uses
 * (NN with a bias, NT, TN, the LM head's NT), on 1 and 2 threads (rows and
 * columns split) - are compared with a double product of the operands
 * rounded to bf16 by loom_round_bf16: within fp32 accumulation error, and
 * clearly away from the product of the unrounded operands (so the operands
 * really went in as bf16). Fails, naming the cause, when libmkl_rt cannot be
 * loaded: scripts/setup.sh installs it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kref.h"
#include "loom/cpu.h"
#include "loom/kernels.h"

/* C (M,N) = op(A) op(B) [+ bias] in double; a: (M,K) or its transpose (K,M). */
static void ref_gemm(double *c, const float *a, int ta, const float *b, int tb, const float *bias, int M,
                     int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = bias ? bias[j] : 0.0;
            for (int k = 0; k < K; k++) {
                double x = ta ? a[(size_t)k * M + i] : a[(size_t)i * K + k];
                double y = tb ? b[(size_t)j * K + k] : b[(size_t)k * N + j];
                s += x * y;
            }
            c[(size_t)i * N + j] = s;
        }
}

static float *rounded(loom_device *dev, const float *x, size_t n) {
    float *r = kr_floats(n);
    loom_round_bf16(dev, r, x, n);
    return r;
}

/* out against the products of the rounded (near) and unrounded (far) operands. */
static void check_pair(const float *out, const double *near, const double *far, size_t n, const char *what,
                       int threads) {
    double e_near = kr_err(out, near, n), e_far = kr_err(out, far, n);
    CHECK(e_near <= 1e-5, "%s, %d thread(s): %.3g from the product of the bf16-rounded operands", what,
          threads, e_near);
    CHECK(e_far >= 1e-4, "%s, %d thread(s): only %.3g from the fp32 product: operands not rounded?", what,
          threads, e_far);
}

/* The products on a bf16 device of `threads` threads. */
static void run(int threads) {
    enum { N = 96, C = 80, OC = 240, V = 500 }; /* rows, in, out, vocab */
    loom_device *dev = test_cpu_device(threads, 1);
    float *x = kr_rand_floats(N * C, -1, 1), *w = kr_rand_floats(C * OC, -1, 1);
    float *bias = kr_rand_floats(OC, -1, 1), *dy = kr_rand_floats(N * OC, -1, 1);
    float *wte = kr_rand_floats((size_t)V * C, -1, 1);
    float *xr = rounded(dev, x, N * C), *wr = rounded(dev, w, C * OC), *dyr = rounded(dev, dy, N * OC);
    float *wter = rounded(dev, wte, (size_t)V * C);
    double *near = kr_doubles((size_t)N * V), *far = kr_doubles((size_t)N * V);

    float *out = kr_floats(N * OC); /* NN + bias */
    loom_matmul_fwd(dev, out, x, w, bias, N, C, OC);
    ref_gemm(near, xr, 0, wr, 0, bias, N, OC, C);
    ref_gemm(far, x, 0, w, 0, bias, N, OC, C);
    check_pair(out, near, far, (size_t)N * OC, "matmul fwd (NN, bias)", threads);

    float *dx = calloc(N * C, sizeof *dx), *dw = calloc(C * OC, sizeof *dw);
    loom_matmul_bwd(dev, dx, dw, NULL, dy, x, w, N, C, OC);
    ref_gemm(near, dyr, 0, wr, 1, NULL, N, C, OC); /* dx = dy w^T */
    ref_gemm(far, dy, 0, w, 1, NULL, N, C, OC);
    check_pair(dx, near, far, (size_t)N * C, "matmul bwd dinp (NT)", threads);
    ref_gemm(near, xr, 1, dyr, 0, NULL, C, OC, N); /* dw = x^T dy */
    ref_gemm(far, x, 1, dy, 0, NULL, C, OC, N);
    check_pair(dw, near, far, (size_t)C * OC, "matmul bwd dw (TN)", threads);

    float *logits = kr_floats((size_t)N * V); /* LM head: x wte^T, N < V: split by columns */
    loom_matmul_nt_fwd(dev, logits, x, wte, N, C, V);
    ref_gemm(near, xr, 0, wter, 1, NULL, N, V, C);
    ref_gemm(far, x, 0, wte, 1, NULL, N, V, C);
    check_pair(logits, near, far, (size_t)N * V, "LM head fwd (NT)", threads);

    { /* a long sum into a small C (the head's input gradient over a long
       * vocabulary): cut along K on 2 threads, each part at its offset of
       * the bf16 copies (gemm.c) */
        enum { VL = 2000 + 53 };
        float *dlong = kr_rand_floats((size_t)N * VL, -1, 1), *wlong = kr_rand_floats((size_t)VL * C, -1, 1);
        float *dlr = rounded(dev, dlong, (size_t)N * VL), *wlr = rounded(dev, wlong, (size_t)VL * C);
        float *dxl = calloc(N * C, sizeof *dxl);
        loom_matmul_nt_bwd(dev, dxl, NULL, dlong, x, wlong, N, C, VL);
        ref_gemm(near, dlr, 0, wlr, 0, NULL, N, C, VL);
        ref_gemm(far, dlong, 0, wlong, 0, NULL, N, C, VL);
        check_pair(dxl, near, far, (size_t)N * C, "long-K head dinp (NN)", threads);
        free(dlong), free(wlong), free(dlr), free(wlr), free(dxl);
    }

    /* kept operands (loom_gemm_keep): the LM head's backward with dlogits
     * and wte converted once gives the same floats as converting at each
     * product; after unkeep, or keeping the same tensor again, a changed
     * tensor is converted afresh */
    float *dl = kr_rand_floats((size_t)N * V, -1, 1);
    float *dx1 = calloc(N * C, sizeof *dx1), *dwte1 = calloc((size_t)V * C, sizeof *dwte1);
    float *dx2 = calloc(N * C, sizeof *dx2), *dwte2 = calloc((size_t)V * C, sizeof *dwte2);
    float *lg2 = kr_floats((size_t)N * V);
    loom_matmul_nt_bwd(dev, dx1, NULL, dl, x, wte, N, C, V);
    loom_matmul_nt_bwd(dev, NULL, dwte1, dl, x, wte, N, C, V);
    loom_gemm_keep(dev, wte, (size_t)V * C);
    loom_gemm_keep(dev, dl, (size_t)N * V);
    loom_gemm_keep(dev, x, (size_t)N * C); /* a third: not kept, still right */
    loom_matmul_nt_fwd(dev, lg2, x, wte, N, C, V);
    loom_matmul_nt_bwd(dev, NULL, dwte2, dl, x, wte, N, C, V);
    loom_matmul_nt_bwd(dev, dx2, NULL, dl, x, wte, N, C, V);
    CHECK(!memcmp(lg2, logits, (size_t)N * V * sizeof *lg2), "kept wte: LM head fwd differs, %d thread(s)",
          threads);
    CHECK(!memcmp(dx1, dx2, (size_t)N * C * sizeof *dx1),
          "kept dlogits, wte: head dinp differs, %d thread(s)", threads);
    CHECK(!memcmp(dwte1, dwte2, (size_t)V * C * sizeof *dwte1),
          "kept dlogits: head dwte differs, %d thread(s)", threads);
    for (size_t i = 0; i < (size_t)N * V; i++) dl[i] = -0.5f * dl[i] + 0.25f; /* changed ... */
    loom_gemm_keep(dev, dl, (size_t)N * V);                                   /* ... and kept again */
    memset(dx1, 0, N * C * sizeof *dx1);
    loom_matmul_nt_bwd(dev, dx1, NULL, dl, x, wte, N, C, V);
    loom_gemm_unkeep(dev, NULL);
    memset(dx2, 0, N * C * sizeof *dx2);
    loom_matmul_nt_bwd(dev, dx2, NULL, dl, x, wte, N, C, V);
    CHECK(!memcmp(dx1, dx2, (size_t)N * C * sizeof *dx1),
          "kept again after a change: the old conversion was used, %d thread(s)", threads);
    loom_gemm_keep(dev, wte, (size_t)V * C);
    loom_matmul_nt_fwd(dev, lg2, x, wte, N, C, V); /* converted and kept */
    loom_gemm_unkeep(dev, wte);
    for (size_t i = 0; i < (size_t)V * C; i++) wte[i] = 0.5f - wte[i]; /* changed after unkeep */
    loom_matmul_nt_fwd(dev, lg2, x, wte, N, C, V);
    loom_gemm_keep(dev, NULL, 0); /* ignored */
    float *wter2 = rounded(dev, wte, (size_t)V * C);
    ref_gemm(near, xr, 0, wter2, 1, NULL, N, V, C);
    CHECK(kr_err(lg2, near, (size_t)N * V) <= 1e-5, "after unkeep: the old wte was used, %d thread(s)",
          threads);
    free(wter2);

    /* the loss's gradient made in the cross-entropy's own pass
     * (loom_vxent_local_grad, straight into the kept bf16 copy with a
     * provider) feeds the head's two backward products the same operand as
     * the cross-entropy, its backward and a kept conversion: the same
     * losses and products, padding columns (garbage) ignored */
    {
        const int Vv = V - 7;
        const float dloss = 1.0f / N;
        int32_t *tg = malloc(N * sizeof *tg);
        for (int i = 0; i < N; i++) tg[i] = (int32_t)((i * 37) % Vv);
        tg[3] = -1; /* ignored */
        float *z1 = kr_rand_floats((size_t)N * V, -4, 4), *z2 = kr_floats((size_t)N * V);
        for (int i = 0; i < N; i++)
            for (int j = Vv; j < V; j++) z1[(size_t)i * V + j] = 50.0f;
        memcpy(z2, z1, (size_t)N * V * sizeof *z1);
        float *ls1 = kr_floats(N), *ls2 = kr_floats(N);
        memset(dx1, 0, N * C * sizeof *dx1), memset(dwte1, 0, (size_t)V * C * sizeof *dwte1);
        memset(dx2, 0, N * C * sizeof *dx2), memset(dwte2, 0, (size_t)V * C * sizeof *dwte2);
        /* first, so the keep buffer it fills still holds another tensor's
         * conversion (dl's, above): a row it failed to write shows */
        CHECK(loom_vxent_local_grad(dev, ls2, z2, tg, N, V, Vv, dloss) == 1, "no vxent_local_grad");
        loom_matmul_nt_bwd(dev, NULL, dwte2, z2, x, wte, N, C, V);
        loom_matmul_nt_bwd(dev, dx2, NULL, z2, x, wte, N, C, V);
        loom_gemm_unkeep(dev, z2);
        CHECK(loom_vxent_local(dev, ls1, z1, tg, N, V, Vv) == 1, "no vxent_local");
        loom_vxent_bwd(dev, z1, z1, tg, dloss, 0, N, V);
        loom_gemm_keep(dev, z1, (size_t)N * V);
        loom_matmul_nt_bwd(dev, NULL, dwte1, z1, x, wte, N, C, V);
        loom_matmul_nt_bwd(dev, dx1, NULL, z1, x, wte, N, C, V);
        loom_gemm_unkeep(dev, z1);
        CHECK(!memcmp(ls1, ls2, N * sizeof *ls1), "vxent_local_grad: losses differ, %d thread(s)", threads);
        CHECK(!memcmp(dx1, dx2, (size_t)N * C * sizeof *dx1),
              "vxent_local_grad: head dinp differs, %d thread(s)", threads);
        CHECK(!memcmp(dwte1, dwte2, (size_t)V * C * sizeof *dwte1),
              "vxent_local_grad: head dwte differs, %d thread(s)", threads);
        free(tg), free(z1), free(z2), free(ls1), free(ls2);
    }

    /* a copy the caller writes (loom_gemm_keep_fill, as the optimizer does
     * for the next step's weights): used without converting only once
     * filled and kept again; a GEMM before that keep, or a fill marked
     * incomplete, converts as usual. The fill here is deliberately wrong
     * (all zero) so that a product shows which copy it read. */
    {
        const size_t nw = (size_t)V * C;
        float *lg_conv = kr_floats((size_t)N * V);
        loom_gemm_unkeep(dev, NULL);
        loom_matmul_nt_fwd(dev, lg_conv, x, wte, N, C, V); /* converted at the use */
        CHECK(loom_gemm_keeps_bf16(dev) == 1, "bf16 precision with a provider: kept copies should be bf16");
        uint16_t *fill = loom_gemm_keep_fill(dev, wte, nw);
        CHECK(fill != NULL, "no buffer for a kept copy the caller writes");
        if (fill) {
            memset(fill, 0, nw * sizeof *fill);
            loom_gemm_keep_filled(dev, wte, 1);
            loom_matmul_nt_fwd(dev, lg2, x, wte, N, C, V); /* filled, not kept yet: converts */
            CHECK(!memcmp(lg2, lg_conv, (size_t)N * V * sizeof *lg2),
                  "a filled copy was used before it was kept, %d thread(s)", threads);
            loom_gemm_unkeep(dev, wte);
            fill = loom_gemm_keep_fill(dev, wte, nw);
            memset(fill, 0, nw * sizeof *fill);
            loom_gemm_keep_filled(dev, wte, 1);
            loom_gemm_keep(dev, wte, nw); /* kept: the filled bits, zeros here */
            loom_matmul_nt_fwd(dev, lg2, x, wte, N, C, V);
            float worst = 0;
            for (size_t i = 0; i < (size_t)N * V; i++) worst = fmaxf(worst, fabsf(lg2[i]));
            CHECK(worst == 0, "a filled and kept copy was converted again (|logit| up to %g), %d thread(s)",
                  worst, threads);
            loom_gemm_unkeep(dev, wte);
            fill = loom_gemm_keep_fill(dev, wte, nw);
            memset(fill, 0, nw * sizeof *fill);
            loom_gemm_keep_filled(dev, wte, 0); /* not all written */
            loom_gemm_keep(dev, wte, nw);
            loom_matmul_nt_fwd(dev, lg2, x, wte, N, C, V);
            CHECK(!memcmp(lg2, lg_conv, (size_t)N * V * sizeof *lg2),
                  "an incomplete fill was used, %d thread(s)", threads);
            loom_gemm_unkeep(dev, wte);
        }
        free(lg_conv);
    }

    free(dl), free(dx1), free(dwte1), free(dx2), free(dwte2), free(lg2);
    free(x), free(w), free(bias), free(dy), free(wte), free(xr), free(wr), free(dyr), free(wter);
    free(near), free(far), free(out), free(dx), free(dw), free(logits);
    loom_device_free(dev);
}

int main(int argc, char **argv) {
    const char *prov = argc > 1 ? argv[1] : "mkl";
    int dnnl = !strcmp(prov, "dnnl");
    setenv("LOOM_BF16_GEMM", prov, 1);
    char why[512];
    loom_bf16_gemm_describe(why, sizeof why);
    printf("bf16 gemm: %s\n", why);
    int have = strstr(why, dnnl ? "oneDNN" : "cblas_gemm_bf16bf16f32") != NULL && strncmp(why, "none", 4);
    const loom_cpu_features *f = loom_cpu_features_get();
    if (dnnl && !(f->avx512f && f->os_avx512)) {
        /* oneDNN 2.6 has no bf16 matmul below AVX-512 (not even a reference
         * one): the provider must say so and the products fall back to
         * bf16-rounded floats on the fp32 kernels, which must still compute
         * the same thing. */
        CHECK(!have && strstr(why, "no bf16 matmul on this CPU") && strstr(why, "fp32 kernels"),
              "without AVX-512 oneDNN should be refused with its reason, got: %s", why);
        have = 1;
    } else {
        CHECK(have, "the bf16 provider %s did not load (%s): scripts/setup.sh installs it", prov, why);
    }
    if (have) {
        kr_seed(17);
        run(1);
        run(2);
    }
    return check_done();
}
