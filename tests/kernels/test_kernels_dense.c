/* test_kernels_dense.c - encoder, matmul, tied LM head and residual kernels
 * against plain double references: forward values, backward against central
 * finite differences of L = sum(out * R), accumulation (+=) semantics and
 * NULL gradient outputs. Odd and round sizes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kref.h"
#include "loom/kernels.h"

/* ---- encoder ----------------------------------------------------------- */

typedef struct {
    int B, T, C;
    const int32_t *inp;   /* (B,T) */
    double *wte, *wpe;    /* (V,C), (T,C) */
    const double *r;      /* (B,T,C) */
    double *out;          /* (B,T,C) */
} enc_ref;

static double enc_objective(void *ctx) {
    enc_ref *e = ctx;
    for (int i = 0; i < e->B * e->T; i++)
        for (int c = 0; c < e->C; c++)
            e->out[(size_t)i * e->C + c] =
                e->wte[(size_t)e->inp[i] * e->C + c] + e->wpe[(size_t)(i % e->T) * e->C + c];
    return kr_dot(e->out, e->r, (size_t)e->B * e->T * e->C);
}

static void test_encoder(int B, int T, int C, int V) {
    char what[96];
    snprintf(what, sizeof what, "encoder B=%d T=%d C=%d V=%d", B, T, C, V);
    size_t N = (size_t)B * T;
    int32_t *inp = malloc(N * sizeof *inp);
    for (size_t i = 0; i < N; i++) inp[i] = kr_randint(V);
    inp[0] = inp[N - 1]; /* a repeated token: its dwte row collects twice */
    float *wte = kr_rand_floats((size_t)V * C, -1, 1), *wpe = kr_rand_floats((size_t)T * C, -1, 1);
    float *out = kr_floats(N * C), *dout = kr_rand_floats(N * C, -1, 1);
    kr_fill_nan(out, N * C);
    loom_encoder_fwd(out, inp, wte, wpe, B, T, C);

    enc_ref ref = {B, T, C, inp, kr_widen(wte, (size_t)V * C), kr_widen(wpe, (size_t)T * C),
                   kr_widen(dout, N * C), kr_doubles(N * C)};
    enc_objective(&ref);
    double e = kr_err(out, ref.out, N * C);
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);

    kr_acc dwte = kr_acc_new((size_t)V * C), dwpe = kr_acc_new((size_t)T * C);
    loom_encoder_bwd(dwte.g, dwpe.g, dout, inp, B, T, C);
    kr_acc_snap(&dwte);
    kr_acc_snap(&dwpe);
    loom_encoder_bwd(dwte.g, dwpe.g, dout, inp, B, T, C);
    double *fd_wte = kr_doubles((size_t)V * C), *fd_wpe = kr_doubles((size_t)T * C);
    kr_fd_grad(fd_wte, ref.wte, (size_t)V * C, enc_objective, &ref);
    kr_fd_grad(fd_wpe, ref.wpe, (size_t)T * C, enc_objective, &ref);
    kr_acc_check(&dwte, fd_wte, "encoder dwte");
    kr_acc_check(&dwpe, fd_wpe, "encoder dwpe");

    kr_acc_free(&dwte);
    kr_acc_free(&dwpe);
    free(fd_wte), free(fd_wpe), free(ref.wte), free(ref.wpe), free((void *)ref.r), free(ref.out);
    free(inp), free(wte), free(wpe), free(out), free(dout);
}

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
            for (int c = 0; c < m->C; c++)
                s += m->inp[(size_t)i * m->C + c] * m->w[(size_t)c * m->OC + o];
            m->out[(size_t)i * m->OC + o] = s;
        }
    return kr_dot(m->out, m->r, (size_t)m->N * m->OC);
}

/* Backward with only the outputs selected by mask (1 dinp, 2 dw, 4 db) into
 * zeroed buffers; each one present must match its finite differences. */
static void mm_bwd_subset(int mask, const float *dout, const float *inp, const float *w,
                          const double *fd[3], int N, int C, int OC) {
    size_t n[3] = {(size_t)N * C, (size_t)C * OC, (size_t)OC};
    const char *name[3] = {"dinp", "dw", "db"};
    float *g[3];
    for (int k = 0; k < 3; k++) {
        g[k] = (mask >> k) & 1 ? calloc(n[k], sizeof(float)) : NULL;
    }
    loom_matmul_bwd(g[0], g[1], g[2], dout, inp, w, N, C, OC);
    for (int k = 0; k < 3; k++) {
        if (!g[k]) continue;
        double e = kr_err(g[k], fd[k], n[k]);
        CHECK(e <= KR_BWD_TOL, "matmul N=%d C=%d OC=%d mask=%d: %s rel err %.3g", N, C, OC, mask,
              name[k], e);
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
    loom_matmul_fwd(out, inp, w, b, N, C, OC);

    mm_ref ref = {N, C, OC, kr_widen(inp, (size_t)N * C), kr_widen(w, (size_t)C * OC),
                  b ? kr_widen(b, (size_t)OC) : NULL, kr_widen(dout, (size_t)N * OC),
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
    loom_matmul_bwd(dinp.g, dw.g, db.g, dout, inp, w, N, C, OC);
    kr_acc_snap(&dinp), kr_acc_snap(&dw), kr_acc_snap(&db);
    loom_matmul_bwd(dinp.g, dw.g, db.g, dout, inp, w, N, C, OC);
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
            for (int c = 0; c < m->C; c++)
                s += m->inp[(size_t)i * m->C + c] * m->wte[(size_t)v * m->C + c];
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
    loom_matmul_nt_fwd(out, inp, wte, N, C, V);

    nt_ref ref = {N, C, V, kr_widen(inp, (size_t)N * C), kr_widen(wte, (size_t)V * C),
                  kr_widen(dout, (size_t)N * V), kr_doubles((size_t)N * V)};
    nt_objective(&ref);
    double e = kr_err(out, ref.out, (size_t)N * V);
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);

    double *fd_inp = kr_doubles((size_t)N * C), *fd_wte = kr_doubles((size_t)V * C);
    kr_fd_grad(fd_inp, ref.inp, (size_t)N * C, nt_objective, &ref);
    kr_fd_grad(fd_wte, ref.wte, (size_t)V * C, nt_objective, &ref);

    kr_acc dinp = kr_acc_new((size_t)N * C), dwte = kr_acc_new((size_t)V * C);
    loom_matmul_nt_bwd(dinp.g, dwte.g, dout, inp, wte, N, C, V);
    kr_acc_snap(&dinp), kr_acc_snap(&dwte);
    loom_matmul_nt_bwd(dinp.g, dwte.g, dout, inp, wte, N, C, V);
    kr_acc_check(&dinp, fd_inp, "matmul_nt dinp");
    kr_acc_check(&dwte, fd_wte, "matmul_nt dwte");

    /* each output alone, the other NULL */
    float *g = calloc((size_t)N * C, sizeof *g);
    loom_matmul_nt_bwd(g, NULL, dout, inp, wte, N, C, V);
    e = kr_err(g, fd_inp, (size_t)N * C);
    CHECK(e <= KR_BWD_TOL, "%s: dinp alone rel err %.3g", what, e);
    free(g);
    g = calloc((size_t)V * C, sizeof *g);
    loom_matmul_nt_bwd(NULL, g, dout, inp, wte, N, C, V);
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
    loom_residual_fwd(out, a, b, n);
    double e = kr_err(out, ref, n);
    CHECK(e <= KR_FWD_TOL, "residual n=%zu: forward rel err %.3g", n, e);
    float *alias = kr_copy(a, n); /* out may alias a */
    loom_residual_fwd(alias, alias, b, n);
    CHECK(memcmp(alias, out, n * sizeof *out) == 0, "residual n=%zu: aliased forward differs", n);

    kr_acc da = kr_acc_new(n), db = kr_acc_new(n);
    loom_residual_bwd(da.g, db.g, dout, n);
    kr_acc_snap(&da), kr_acc_snap(&db);
    loom_residual_bwd(da.g, db.g, dout, n);
    kr_acc_check(&da, fd, "residual da"); /* dL/da = R exactly */
    kr_acc_check(&db, fd, "residual db");
    kr_acc_free(&da), kr_acc_free(&db);
    free(a), free(b), free(out), free(dout), free(ref), free(fd), free(alias);
}

int main(void) {
    loom_kernels_set_threads(1);
    kr_seed(1);
    test_encoder(2, 5, 12, 7);
    test_encoder(4, 16, 64, 32);
    test_matmul(7, 12, 20, 1);
    test_matmul(7, 12, 20, 0);
    test_matmul(1, 5, 3, 1);
    test_matmul(16, 32, 64, 1);
    test_matmul_nt(7, 12, 11);
    test_matmul_nt(16, 32, 64);
    test_residual(7);
    test_residual(100003); /* several blocks and a ragged tail */
    return check_done();
}
