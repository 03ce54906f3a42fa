/* test_kernels_dense.c - matmul, tied LM head and residual kernels
 * against plain double references: forward values, backward against central
 * finite differences of L = sum(out * R), accumulation (+=) semantics and
 * NULL gradient outputs. Odd and round sizes.
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

/* ---- matmul (N,C) @ (C,OC) + b ------------------------------------------ */

typedef struct {
    int N, C, OC;
    double *inp, *w, *b; /* (N,C), (C,OC), (OC) */
    const double *r;     /* (N,OC) */
    double *out;         /* (N,OC) */
} mm_ref;

static double mm_objective(void *ctx) {
    mm_ref *m = ctx;
    for (int i = 0; i < m->N; i++)
        for (int o = 0; o < m->OC; o++) {
            double s = m->b ? m->b[o] : 0.0;
            for (int c = 0; c < m->C; c++) s += m->inp[(size_t)i * m->C + c] * m->w[(size_t)c * m->OC + o];
            m->out[(size_t)i * m->OC + o] = s;
        }
    return kr_dot(m->out, m->r, (size_t)m->N * m->OC);
}

/* Backward with only the outputs selected by mask (1 dinp, 2 dw, 4 db) into
 * zeroed buffers; each one present must match its finite differences. */
static void mm_bwd_subset(int mask, const float *dout, const float *inp, const float *w, const double *fd[3],
                          int N, int C, int OC) {
    size_t n[3] = {(size_t)N * C, (size_t)C * OC, (size_t)OC};
    const char *name[3] = {"dinp", "dw", "db"};
    float *g[3];
    for (int k = 0; k < 3; k++) {
        g[k] = (mask >> k) & 1 ? calloc(n[k], sizeof(float)) : NULL;
    }
    loom_matmul_bwd(dev, g[0], g[1], g[2], dout, inp, w, N, C, OC);
    for (int k = 0; k < 3; k++) {
        if (!g[k]) continue;
        double e = kr_err(g[k], fd[k], n[k]);
        CHECK(e <= KR_BWD_TOL, "matmul N=%d C=%d OC=%d mask=%d: %s rel err %.3g", N, C, OC, mask, name[k], e);
        free(g[k]);
    }
}

static void test_matmul(int N, int C, int OC, int with_bias) {
    char what[96];
    snprintf(what, sizeof what, "matmul N=%d C=%d OC=%d bias=%d", N, C, OC, with_bias);
    float *inp = kr_rand_floats((size_t)N * C, -1, 1), *w = kr_rand_floats((size_t)C * OC, -1, 1);
    float *b = with_bias ? kr_rand_floats((size_t)OC, -1, 1) : NULL;
    float *out = kr_floats((size_t)N * OC), *dout = kr_rand_floats((size_t)N * OC, -1, 1);
    kr_fill_nan(out, (size_t)N * OC);
    loom_matmul_fwd(dev, out, inp, w, b, N, C, OC);

    mm_ref ref = {N,
                  C,
                  OC,
                  kr_widen(inp, (size_t)N * C),
                  kr_widen(w, (size_t)C * OC),
                  b ? kr_widen(b, (size_t)OC) : NULL,
                  kr_widen(dout, (size_t)N * OC),
                  kr_doubles((size_t)N * OC)};
    mm_objective(&ref);
    double e = kr_err(out, ref.out, (size_t)N * OC);
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);

    double *fd_inp = kr_doubles((size_t)N * C), *fd_w = kr_doubles((size_t)C * OC);
    double *fd_b = kr_doubles((size_t)OC);
    kr_fd_grad(fd_inp, ref.inp, (size_t)N * C, mm_objective, &ref);
    kr_fd_grad(fd_w, ref.w, (size_t)C * OC, mm_objective, &ref);
    for (int o = 0; o < OC; o++) { /* d/db of sum(out * R) is the column sum of R */
        fd_b[o] = 0;
        for (int i = 0; i < N; i++) fd_b[o] += ref.r[(size_t)i * OC + o];
    }

    kr_acc dinp = kr_acc_new((size_t)N * C), dw = kr_acc_new((size_t)C * OC);
    kr_acc db = kr_acc_new((size_t)OC);
    loom_matmul_bwd(dev, dinp.g, dw.g, db.g, dout, inp, w, N, C, OC);
    kr_acc_snap(&dinp), kr_acc_snap(&dw), kr_acc_snap(&db);
    loom_matmul_bwd(dev, dinp.g, dw.g, db.g, dout, inp, w, N, C, OC);
    kr_acc_check(&dinp, fd_inp, "matmul dinp");
    kr_acc_check(&dw, fd_w, "matmul dw");
    kr_acc_check(&db, fd_b, "matmul db");

    const double *fd[3] = {fd_inp, fd_w, fd_b};
    for (int mask = 1; mask < 7; mask++) mm_bwd_subset(mask, dout, inp, w, fd, N, C, OC);

    kr_acc_free(&dinp), kr_acc_free(&dw), kr_acc_free(&db);
    free(fd_inp), free(fd_w), free(fd_b);
    free(ref.inp), free(ref.w), free(ref.b), free((void *)ref.r), free(ref.out);
    free(inp), free(w), free(b), free(out), free(dout);
}

/* ---- tied LM head (N,C) @ (V,C)^T ---------------------------------------- */

typedef struct {
    int N, C, V;
    double *inp, *wte; /* (N,C), (V,C) */
    const double *r;   /* (N,V) */
    double *out;       /* (N,V) */
} nt_ref;

static double nt_objective(void *ctx) {
    nt_ref *m = ctx;
    for (int i = 0; i < m->N; i++)
        for (int v = 0; v < m->V; v++) {
            double s = 0;
            for (int c = 0; c < m->C; c++) s += m->inp[(size_t)i * m->C + c] * m->wte[(size_t)v * m->C + c];
            m->out[(size_t)i * m->V + v] = s;
        }
    return kr_dot(m->out, m->r, (size_t)m->N * m->V);
}

static void test_matmul_nt(int N, int C, int V) {
    char what[96];
    snprintf(what, sizeof what, "matmul_nt N=%d C=%d V=%d", N, C, V);
    float *inp = kr_rand_floats((size_t)N * C, -1, 1), *wte = kr_rand_floats((size_t)V * C, -1, 1);
    float *out = kr_floats((size_t)N * V), *dout = kr_rand_floats((size_t)N * V, -1, 1);
    kr_fill_nan(out, (size_t)N * V);
    loom_matmul_nt_fwd(dev, out, inp, wte, N, C, V);

    nt_ref ref = {N,
                  C,
                  V,
                  kr_widen(inp, (size_t)N * C),
                  kr_widen(wte, (size_t)V * C),
                  kr_widen(dout, (size_t)N * V),
                  kr_doubles((size_t)N * V)};
    nt_objective(&ref);
    double e = kr_err(out, ref.out, (size_t)N * V);
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);

    double *fd_inp = kr_doubles((size_t)N * C), *fd_wte = kr_doubles((size_t)V * C);
    kr_fd_grad(fd_inp, ref.inp, (size_t)N * C, nt_objective, &ref);
    kr_fd_grad(fd_wte, ref.wte, (size_t)V * C, nt_objective, &ref);

    kr_acc dinp = kr_acc_new((size_t)N * C), dwte = kr_acc_new((size_t)V * C);
    loom_matmul_nt_bwd(dev, dinp.g, dwte.g, dout, inp, wte, N, C, V);
    kr_acc_snap(&dinp), kr_acc_snap(&dwte);
    loom_matmul_nt_bwd(dev, dinp.g, dwte.g, dout, inp, wte, N, C, V);
    kr_acc_check(&dinp, fd_inp, "matmul_nt dinp");
    kr_acc_check(&dwte, fd_wte, "matmul_nt dwte");

    /* each output alone, the other NULL */
    float *g = calloc((size_t)N * C, sizeof *g);
    loom_matmul_nt_bwd(dev, g, NULL, dout, inp, wte, N, C, V);
    e = kr_err(g, fd_inp, (size_t)N * C);
    CHECK(e <= KR_BWD_TOL, "%s: dinp alone rel err %.3g", what, e);
    free(g);
    g = calloc((size_t)V * C, sizeof *g);
    loom_matmul_nt_bwd(dev, NULL, g, dout, inp, wte, N, C, V);
    e = kr_err(g, fd_wte, (size_t)V * C);
    CHECK(e <= KR_BWD_TOL, "%s: dwte alone rel err %.3g", what, e);
    free(g);

    kr_acc_free(&dinp), kr_acc_free(&dwte);
    free(fd_inp), free(fd_wte), free(ref.inp), free(ref.wte), free((void *)ref.r), free(ref.out);
    free(inp), free(wte), free(out), free(dout);
}

/* ---- residual ------------------------------------------------------------ */

static void test_residual(size_t n) {
    float *a = kr_rand_floats(n, -1, 1), *b = kr_rand_floats(n, -1, 1);
    float *out = kr_floats(n), *dout = kr_rand_floats(n, -1, 1);
    double *ref = kr_doubles(n), *fd = kr_widen(dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] + (double)b[i];
    kr_fill_nan(out, n);
    loom_residual_fwd(dev, out, a, b, n);
    double e = kr_err(out, ref, n);
    CHECK(e <= KR_FWD_TOL, "residual n=%zu: forward rel err %.3g", n, e);
    float *alias = kr_copy(a, n); /* out may alias a */
    loom_residual_fwd(dev, alias, alias, b, n);
    CHECK(memcmp(alias, out, n * sizeof *out) == 0, "residual n=%zu: aliased forward differs", n);

    kr_acc da = kr_acc_new(n), db = kr_acc_new(n);
    loom_residual_bwd(dev, da.g, db.g, dout, n);
    kr_acc_snap(&da), kr_acc_snap(&db);
    loom_residual_bwd(dev, da.g, db.g, dout, n);
    kr_acc_check(&da, fd, "residual da"); /* dL/da = R exactly */
    kr_acc_check(&db, fd, "residual db");
    kr_acc_free(&da), kr_acc_free(&db);
    free(a), free(b), free(out), free(dout), free(ref), free(fd), free(alias);
}

int main(void) {
    dev = test_cpu_device(1, 0);
    kr_seed(1);
    test_matmul(7, 12, 20, 1);
    test_matmul(7, 12, 20, 0);
    test_matmul(1, 5, 3, 1);
    test_matmul(16, 32, 64, 1);
    test_matmul_nt(7, 12, 11);
    test_matmul_nt(16, 32, 64);
    test_residual(7);
    test_residual(100003); /* several blocks and a ragged tail */
    loom_device_free(dev);
    return check_done();
}
