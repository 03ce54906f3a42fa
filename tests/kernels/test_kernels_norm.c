/* test_kernels_norm.c - LayerNorm and GELU against plain double references
 * (forward, saved statistics, backward against central finite differences,
 * accumulation), and the kernels' inline expf and sqrtf against libm.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kernels/cpu/kern_internal.h"
#include "kref.h"
#include "loom/kernels.h"

static loom_device *dev; /* the CPU, one thread: every kernel below runs on it */

/* ---- layernorm ------------------------------------------------------------ */

typedef struct {
    int N, C;
    double *inp, *w, *b; /* (N,C), (C), (C) */
    const double *r;     /* (N,C) */
    double *out;         /* (N,C) */
    double *mean, *rstd; /* (N), (N) */
} ln_ref;

static double ln_objective(void *ctx) {
    ln_ref *l = ctx;
    int C = l->C;
    for (int i = 0; i < l->N; i++) {
        const double *x = l->inp + (size_t)i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        double s = 1.0 / sqrt(v / C + 1e-5);
        for (int c = 0; c < C; c++) l->out[(size_t)i * C + c] = (x[c] - m) * s * l->w[c] + l->b[c];
        l->mean[i] = m;
        l->rstd[i] = s;
    }
    return kr_dot(l->out, l->r, (size_t)l->N * C);
}

static void test_layernorm(int N, int C, double offset) {
    char what[96];
    snprintf(what, sizeof what, "layernorm N=%d C=%d offset=%g", N, C, offset);
    size_t nc = (size_t)N * C;
    float *inp = kr_rand_floats(nc, offset - 1, offset + 1);
    float *w = kr_rand_floats((size_t)C, 0.5, 1.5), *b = kr_rand_floats((size_t)C, -1, 1);
    float *out = kr_floats(nc), *mean = kr_floats((size_t)N), *rstd = kr_floats((size_t)N);
    float *dout = kr_rand_floats(nc, -1, 1);
    kr_fill_nan(out, nc);
    loom_layernorm_fwd(dev, out, mean, rstd, inp, w, b, N, C);

    ln_ref ref = {N,
                  C,
                  kr_widen(inp, nc),
                  kr_widen(w, (size_t)C),
                  kr_widen(b, (size_t)C),
                  kr_widen(dout, nc),
                  kr_doubles(nc),
                  kr_doubles((size_t)N),
                  kr_doubles((size_t)N)};
    ln_objective(&ref);
    double e = kr_err(out, ref.out, nc);
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);
    e = kr_err(mean, ref.mean, (size_t)N);
    CHECK(e <= KR_FWD_TOL, "%s: mean rel err %.3g", what, e);
    e = kr_err(rstd, ref.rstd, (size_t)N);
    CHECK(e <= KR_FWD_TOL, "%s: rstd rel err %.3g", what, e);

    double *fd_inp = kr_doubles(nc), *fd_w = kr_doubles((size_t)C), *fd_b = kr_doubles((size_t)C);
    kr_fd_grad(fd_inp, ref.inp, nc, ln_objective, &ref);
    kr_fd_grad(fd_w, ref.w, (size_t)C, ln_objective, &ref);
    kr_fd_grad(fd_b, ref.b, (size_t)C, ln_objective, &ref);

    kr_acc dinp = kr_acc_new(nc), dw = kr_acc_new((size_t)C), db = kr_acc_new((size_t)C);
    loom_layernorm_bwd(dev, dinp.g, dw.g, db.g, dout, inp, w, mean, rstd, N, C);
    kr_acc_snap(&dinp), kr_acc_snap(&dw), kr_acc_snap(&db);
    loom_layernorm_bwd(dev, dinp.g, dw.g, db.g, dout, inp, w, mean, rstd, N, C);
    kr_acc_check(&dinp, fd_inp, "layernorm dinp");
    kr_acc_check(&dw, fd_w, "layernorm dw");
    kr_acc_check(&db, fd_b, "layernorm db");

    /* NULL outputs take the other (two-loop) path */
    float *g = calloc(nc, sizeof *g), *gw = calloc((size_t)C, sizeof *gw);
    loom_layernorm_bwd(dev, g, NULL, NULL, dout, inp, w, mean, rstd, N, C);
    loom_layernorm_bwd(dev, NULL, gw, NULL, dout, inp, w, mean, rstd, N, C);
    e = kr_err(g, fd_inp, nc);
    CHECK(e <= KR_BWD_TOL, "%s: dinp alone rel err %.3g", what, e);
    e = kr_err(gw, fd_w, (size_t)C);
    CHECK(e <= KR_BWD_TOL, "%s: dw alone rel err %.3g", what, e);
    free(g), free(gw);

    kr_acc_free(&dinp), kr_acc_free(&dw), kr_acc_free(&db);
    free(fd_inp), free(fd_w), free(fd_b);
    free(ref.inp), free(ref.w), free(ref.b), free((void *)ref.r), free(ref.out);
    free(ref.mean), free(ref.rstd);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout);
}

/* ---- gelu ------------------------------------------------------------------ */

typedef struct {
    size_t n;
    double *inp;     /* (n) */
    const double *r; /* (n) */
    double *out;     /* (n) */
} gelu_ref;

static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_objective(void *ctx) {
    gelu_ref *g = ctx;
    for (size_t i = 0; i < g->n; i++) g->out[i] = gelu_d(g->inp[i]);
    return kr_dot(g->out, g->r, g->n);
}

static void test_gelu(size_t n, double lo, double hi) {
    char what[96];
    snprintf(what, sizeof what, "gelu n=%zu in [%g, %g]", n, lo, hi);
    float *inp = kr_rand_floats(n, lo, hi), *out = kr_floats(n), *dout = kr_rand_floats(n, -1, 1);
    inp[0] = 0.0f;
    kr_fill_nan(out, n);
    loom_gelu_fwd(dev, out, inp, n);
    gelu_ref ref = {n, kr_widen(inp, n), kr_widen(dout, n), kr_doubles(n)};
    gelu_objective(&ref);
    double e = kr_err(out, ref.out, n), worst = 0;
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);
    /* Pointwise too: float rounding of z = 2u costs about |z| ulps of
     * exp(-z), so allow (4 + |z|) ulps; a tanhf-based gelu fails this on the
     * negative tail, where it cancels in 1 + tanh(u). */
    for (size_t i = 0; i < n; i++) {
        double x = inp[i], z = 2 * sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        double d = fabs(out[i] - ref.out[i]), s = fabs(ref.out[i]);
        double ratio = s > 0 ? d / s / ((4 + fabs(z)) * 0x1p-23) : 0;
        worst = ratio > worst ? ratio : worst;
    }
    CHECK(worst <= 1.0, "%s: pointwise forward error %.3g of the bound", what, worst);

    double *fd = kr_doubles(n);
    kr_fd_grad(fd, ref.inp, n, gelu_objective, &ref);
    kr_acc dinp = kr_acc_new(n);
    loom_gelu_bwd(dev, dinp.g, inp, dout, n);
    kr_acc_snap(&dinp);
    loom_gelu_bwd(dev, dinp.g, inp, dout, n);
    kr_acc_check(&dinp, fd, "gelu dinp");

    kr_acc_free(&dinp);
    free(fd), free(ref.inp), free((void *)ref.r), free(ref.out);
    free(inp), free(out), free(dout);
}

/* Extreme inputs: finite outputs and gradients with the right limits. */
static void test_gelu_extremes(void) {
    float x[6] = {-1e4f, -60.0f, -12.0f, 12.0f, 60.0f, 1e4f};
    float y[6], dx[6] = {0}, one[6] = {1, 1, 1, 1, 1, 1};
    loom_gelu_fwd(dev, y, x, 6);
    loom_gelu_bwd(dev, dx, x, one, 6);
    for (int i = 0; i < 6; i++) {
        double want = x[i] > 0 ? x[i] : 0.0, dwant = x[i] > 0 ? 1.0 : 0.0;
        CHECK(isfinite(y[i]) && fabs(y[i] - want) <= 1e-6 * fabs(x[i]), "gelu(%g) = %g, want %g", x[i], y[i],
              want);
        CHECK(isfinite(dx[i]) && fabs(dx[i] - dwant) <= 1e-6, "gelu'(%g) = %g, want %g", x[i], dx[i], dwant);
    }
}

/* ---- the kernels' expf ----------------------------------------------------- */

static void test_expf(void) {
    double worst = 0, at = 0;
    for (double a = -87.3; a <= 88.0; a += 0.00123) {
        float af = (float)a;
        double want = exp((double)af), got = kern_expf(af);
        double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel, at = af;
    }
    CHECK(worst <= 3e-7, "kern_expf: worst rel err %.3g at %.6g", worst, at);
    CHECK(kern_expf(0.0f) == 1.0f, "kern_expf(0) = %.9g", kern_expf(0.0f));
    CHECK(kern_expf(-88.0f) == 0.0f && kern_expf(-1e30f) == 0.0f && kern_expf(-INFINITY) == 0.0f,
          "kern_expf underflow is not 0");
    CHECK(isinf(kern_expf(89.0f)) && isinf(kern_expf(INFINITY)), "kern_expf overflow is not inf");
    CHECK(isnan(kern_expf(NAN)), "kern_expf(NaN) is not NaN");
}

/* ---- the kernels' sqrtf ---------------------------------------------------- */

/* Equal to libm's correctly rounded sqrtf: on every float in [1, 4) (all
 * mantissas, both exponent parities; the method is scale-invariant by 4) and
 * every subnormal, plus the special values. */
static void test_sqrtf(void) {
    long bad = 0;
    float first = 0;
    for (float x = 1.0f; x < 4.0f; x = nextafterf(x, 8.0f))
        if (kern_sqrtf(x) != sqrtf(x) && bad++ == 0) first = x;
    for (float x = 0x1p-149f; x < 0x1p-126f; x = nextafterf(x, 1.0f))
        if (kern_sqrtf(x) != sqrtf(x) && bad++ == 0) first = x;
    CHECK(bad == 0, "kern_sqrtf differs from sqrtf on %ld inputs, first %a", bad, first);
    float big = 3.4e38f;
    CHECK(kern_sqrtf(big) == sqrtf(big), "kern_sqrtf(%g)", big);
    CHECK(kern_sqrtf(0.0f) == 0.0f && kern_sqrtf(INFINITY) == INFINITY, "kern_sqrtf(0 or inf)");
    CHECK(isnan(kern_sqrtf(NAN)) && isnan(kern_sqrtf(-1.0f)), "kern_sqrtf(NaN or -1)");
}

int main(void) {
    dev = test_cpu_device(1, 0);
    kr_seed(2);
    test_layernorm(7, 12, 0.0);
    test_layernorm(5, 1, 0.0); /* C = 1: output is the bias */
    test_layernorm(16, 64, 0.0);
    test_layernorm(6, 37, 10.0); /* large mean, small spread */
    test_gelu(1001, -6, 6);
    test_gelu(256, -0.5, 0.5);
    test_gelu_extremes();
    test_expf();
    test_sqrtf();
    loom_device_free(dev);
    return check_done();
}
