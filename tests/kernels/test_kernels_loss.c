/* test_kernels_loss.c - AdamW and the flat-vector helpers against plain
 * double references: AdamW over several steps against the torch formula in
 * double; sumsq, scale and all_finite. (The cross-entropy is tested with the
 * vocabulary-parallel kernels in test_kernels_vocab.c.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kref.h"
#include "loom/kernels.h"

static loom_device *dev; /* the CPU, one thread: every kernel below runs on it */

/* ---- AdamW -------------------------------------------------------------------- */

/* torch.optim.AdamW's single-tensor update in double. */
static void adamw_ref(double *p, const double *g, double *m, double *v, size_t n, double lr, double b1,
                      double b2, double eps, double wd, int t) {
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        p[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
    }
}

static void test_adamw(size_t n, float lr, float b1, float b2, float eps, float wd, int t0, int steps) {
    char what[96];
    snprintf(what, sizeof what, "adamw n=%zu b2=%g wd=%g t0=%d", n, b2, wd, t0);
    float *p = kr_rand_floats(n, -1, 1), *m = kr_rand_floats(n, -0.01, 0.01);
    float *v = kr_rand_floats(n, 0, 1e-4);
    if (t0 == 1) memset(m, 0, n * sizeof *m), memset(v, 0, n * sizeof *v);
    double *pd = kr_widen(p, n), *md = kr_widen(m, n), *vd = kr_widen(v, n);
    double *gd = kr_doubles(n);
    for (int s = 0; s < steps; s++) {
        float *g = kr_rand_floats(n, -1, 1);
        for (size_t i = 0; i < n; i += 7) g[i] = 0.0f; /* eps-dominated entries */
        for (size_t i = 0; i < n; i++) gd[i] = g[i];
        loom_adamw_update(dev, p, g, m, v, n, lr, b1, b2, eps, wd, t0 + s, 1.0f);
        adamw_ref(pd, gd, md, vd, n, lr, b1, b2, eps, wd, t0 + s);
        free(g);
    }
    double ep = kr_err(p, pd, n), em = kr_err(m, md, n), ev = kr_err(v, vd, n);
    CHECK(ep <= KR_FWD_TOL && em <= KR_FWD_TOL && ev <= KR_FWD_TOL, "%s: rel err p %.3g m %.3g v %.3g", what,
          ep, em, ev);
    /* the parameter change itself, not only the parameter, must agree; small
     * parameters, so that rounding p0 + dp to float hides little of dp */
    float *p0 = kr_rand_floats(n, -0.01, 0.01), *g = kr_rand_floats(n, -1, 1);
    float *pc = kr_copy(p0, n);
    double *pcd = kr_widen(p0, n), *dd = kr_doubles(n);
    for (size_t i = 0; i < n; i++) gd[i] = g[i], md[i] = m[i], vd[i] = v[i];
    loom_adamw_update(dev, pc, g, m, v, n, lr, b1, b2, eps, wd, t0 + steps, 1.0f);
    adamw_ref(pcd, gd, md, vd, n, lr, b1, b2, eps, wd, t0 + steps);
    for (size_t i = 0; i < n; i++) {
        pc[i] -= p0[i];
        dd[i] = pcd[i] - (double)p0[i];
    }
    double ed = kr_err(pc, dd, n);
    CHECK(ed <= KR_FWD_TOL, "%s: update rel err %.3g", what, ed);
    free(p), free(m), free(v), free(pd), free(md), free(vd), free(gd);
    free(p0), free(g), free(pc), free(pcd), free(dd);
}

/* ---- sumsq, scale, all_finite ------------------------------------------------ */

static void test_vector_helpers(size_t n) {
    float *x = kr_rand_floats(n, -2, 2);
    double want = 0;
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    double got = loom_sumsq(dev, x, n);
    CHECK(fabs(got - want) <= 1e-10 * want, "sumsq n=%zu: %.17g want %.17g", n, got, want);

    float *y = kr_copy(x, n);
    loom_scale(dev, y, n, 0.3f);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += y[i] != x[i] * 0.3f;
    CHECK(bad == 0, "scale n=%zu: %d entries differ from x * s", n, bad);

    CHECK(loom_all_finite(dev, x, n), "all_finite n=%zu: finite data reported non-finite", n);
    float specials[3] = {INFINITY, -INFINITY, NAN};
    size_t where[3] = {0, n / 2, n - 1};
    for (int s = 0; s < 3; s++)
        for (int w = 0; w < 3; w++) {
            float keep = x[where[w]];
            x[where[w]] = specials[s];
            CHECK(!loom_all_finite(dev, x, n), "all_finite n=%zu: missed %g at %zu", n, specials[s],
                  where[w]);
            x[where[w]] = keep;
        }
    x[0] = 3.4e38f; /* large but finite, and a subnormal */
    x[n - 1] = 1e-45f;
    CHECK(loom_all_finite(dev, x, n), "all_finite n=%zu: FLT_MAX-ish or subnormal flagged", n);
    free(x), free(y);
}

int main(void) {
    dev = test_cpu_device(1, 0);
    kr_seed(4);
    test_adamw(1001, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 5);
    test_adamw(1001, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 5);
    test_adamw(40000, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1000, 3); /* several blocks */
    test_vector_helpers(1);
    test_vector_helpers(1000);
    test_vector_helpers(100003);
    loom_device_free(dev);
    return check_done();
}
