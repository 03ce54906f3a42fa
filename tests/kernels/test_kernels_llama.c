/* test_kernels_llama.c - the Llama family's kernels against plain double
 * references: RMSNorm, SwiGLU, rotary positions, nn.Linear layers and
 * grouped-query attention with a sliding window (forward; backward against
 * central finite differences of L = sum(out * R); accumulation where the
 * kernel accumulates). A test per kernel, in kref.h's pattern.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kref.h"
#include "loom/kernels.h"

static loom_device *dev; /* the CPU, two threads: the kernels' parallel loops run */

/* ---- rmsnorm ---------------------------------------------------------------- */

typedef struct {
    int N, C;
    double *x, *w, *out;
    const double *r;
} rms_ref;

static double rms_objective(void *ctx) {
    rms_ref *q = ctx;
    for (int i = 0; i < q->N; i++) {
        const double *x = q->x + (size_t)i * q->C;
        double ss = 0;
        for (int c = 0; c < q->C; c++) ss += x[c] * x[c];
        double r = 1.0 / sqrt(ss / q->C + 1e-6);
        for (int c = 0; c < q->C; c++) q->out[(size_t)i * q->C + c] = x[c] * r * q->w[c];
    }
    return kr_dot(q->out, q->r, (size_t)q->N * q->C);
}

static void test_rmsnorm(int N, int C) {
    const size_t nc = (size_t)N * C;
    float *x = kr_rand_floats(nc, -2, 2), *w = kr_rand_floats((size_t)C, 0.5, 1.5),
          *dout = kr_rand_floats(nc, -1, 1);
    float *out = kr_floats(nc), *rstd = kr_floats((size_t)N);
    loom_rmsnorm_fwd(dev, out, rstd, x, w, N, C, 1e-6f);
    rms_ref ref = {N, C, kr_widen(x, nc), kr_widen(w, (size_t)C), kr_doubles(nc), kr_widen(dout, nc)};
    rms_objective(&ref);
    double e = kr_err(out, ref.out, nc);
    CHECK(e <= KR_FWD_TOL, "rmsnorm N=%d C=%d: forward rel err %.3g", N, C, e);
    double *fx = kr_doubles(nc), *fw = kr_doubles((size_t)C);
    kr_fd_grad(fx, ref.x, nc, rms_objective, &ref);
    kr_fd_grad(fw, ref.w, (size_t)C, rms_objective, &ref);
    kr_acc dx = kr_acc_new(nc), dw = kr_acc_new((size_t)C);
    loom_rmsnorm_bwd(dev, dx.g, dw.g, dout, x, w, rstd, N, C);
    kr_acc_snap(&dx), kr_acc_snap(&dw);
    loom_rmsnorm_bwd(dev, dx.g, dw.g, dout, x, w, rstd, N, C);
    kr_acc_check(&dx, fx, "rmsnorm dinp");
    kr_acc_check(&dw, fw, "rmsnorm dw");
    kr_acc_free(&dx), kr_acc_free(&dw);
    free(fx), free(fw), free(ref.x), free(ref.w), free(ref.out), free((void *)ref.r);
    free(x), free(w), free(dout), free(out), free(rstd);
}

/* ---- swiglu ------------------------------------------------------------------ */

typedef struct {
    int N, H;
    double *gu, *out;
    const double *r;
} swiglu_ref;

static double swiglu_objective(void *ctx) {
    swiglu_ref *q = ctx;
    for (int i = 0; i < q->N; i++)
        for (int c = 0; c < q->H; c++) {
            double g = q->gu[(size_t)i * 2 * q->H + c], u = q->gu[(size_t)i * 2 * q->H + q->H + c];
            q->out[(size_t)i * q->H + c] = g / (1.0 + exp(-g)) * u;
        }
    return kr_dot(q->out, q->r, (size_t)q->N * q->H);
}

static void test_swiglu(int N, int H, double range) {
    const size_t ngu = (size_t)N * 2 * H, nh = (size_t)N * H;
    float *gu = kr_rand_floats(ngu, -range, range), *dout = kr_rand_floats(nh, -1, 1);
    float *out = kr_floats(nh), *dgu = kr_floats(ngu);
    gu[0] = -200.0f; /* silu's far negative tail: 0, not NaN */
    loom_swiglu_fwd(dev, out, gu, N, H);
    swiglu_ref ref = {N, H, kr_widen(gu, ngu), kr_doubles(nh), kr_widen(dout, nh)};
    swiglu_objective(&ref);
    double e = kr_err(out, ref.out, nh);
    CHECK(e <= KR_FWD_TOL, "swiglu N=%d H=%d: forward rel err %.3g", N, H, e);
    double *fd = kr_doubles(ngu);
    kr_fd_grad(fd, ref.gu, ngu, swiglu_objective, &ref);
    kr_fill_nan(dgu, ngu); /* writes, does not accumulate */
    loom_swiglu_bwd(dev, dgu, gu, dout, N, H);
    e = kr_err(dgu, fd, ngu);
    CHECK(e <= KR_BWD_TOL, "swiglu N=%d H=%d: backward rel err %.3g", N, H, e);
    free(fd), free(ref.gu), free(ref.out), free((void *)ref.r), free(gu), free(dout), free(out), free(dgu);
}

/* ---- rope ------------------------------------------------------------------------ */

/* Rotation by angles pos * inv_freq (in double) of heads h < nh of rows of ld. */
static void rope_ref(double *y, const float *x, const int32_t *pos, const float *f, int N, int ld, int nh,
                     int HS) {
    for (size_t i = 0; i < (size_t)N * ld; i++) y[i] = x[i];
    for (int r = 0; r < N; r++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < HS / 2; i++) {
                double a = x[(size_t)r * ld + h * HS + i], b = x[(size_t)r * ld + h * HS + HS / 2 + i];
                double ang = (double)(float)((float)pos[r] * f[i]);
                y[(size_t)r * ld + h * HS + i] = a * cos(ang) - b * sin(ang);
                y[(size_t)r * ld + h * HS + HS / 2 + i] = b * cos(ang) + a * sin(ang);
            }
}

static void test_rope(int N, int nh, int HS) {
    const int ld = (nh + 1) * HS; /* one head more in each row, left alone */
    const size_t n = (size_t)N * ld;
    float *x = kr_rand_floats(n, -1, 1), *y = kr_copy(x, n), *f = kr_floats((size_t)HS / 2);
    int32_t *pos = malloc((size_t)N * sizeof *pos);
    for (int r = 0; r < N; r++) pos[r] = (r * 131) % 4096;
    for (int i = 0; i < HS / 2; i++) f[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)HS);
    double *ref = kr_doubles(n);
    rope_ref(ref, x, pos, f, N, ld, nh, HS);
    loom_rope(dev, y, ld, pos, f, N, nh, HS, 0);
    double e = kr_err(y, ref, n);
    CHECK(e <= KR_FWD_TOL, "rope N=%d nh=%d HS=%d: forward rel err %.3g", N, nh, HS, e);
    /* the backward of a rotation is the inverse rotation: back to x */
    loom_rope(dev, y, ld, pos, f, N, nh, HS, 1);
    double *xd = kr_widen(x, n);
    e = kr_err(y, xd, n);
    CHECK(e <= KR_FWD_TOL, "rope N=%d nh=%d HS=%d: inverse rel err %.3g", N, nh, HS, e);
    free(x), free(y), free(f), free(pos), free(ref), free(xd);
}

/* ---- linear ----------------------------------------------------------------------- */

typedef struct {
    int N, C, OC;
    double *x, *w, *b, *out;
    const double *r;
} lin_ref;

static double lin_objective(void *ctx) {
    lin_ref *q = ctx;
    for (int i = 0; i < q->N; i++)
        for (int o = 0; o < q->OC; o++) {
            double s = q->b[o];
            for (int c = 0; c < q->C; c++) s += q->x[(size_t)i * q->C + c] * q->w[(size_t)o * q->C + c];
            q->out[(size_t)i * q->OC + o] = s;
        }
    return kr_dot(q->out, q->r, (size_t)q->N * q->OC);
}

static void test_linear(int N, int C, int OC) {
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *x = kr_rand_floats(nx, -1, 1), *w = kr_rand_floats(nw, -1, 1),
          *b = kr_rand_floats((size_t)OC, -1, 1);
    float *dout = kr_rand_floats(no, -1, 1), *out = kr_floats(no);
    loom_linear_fwd(dev, out, x, w, b, N, C, OC);
    lin_ref ref = {N,
                   C,
                   OC,
                   kr_widen(x, nx),
                   kr_widen(w, nw),
                   kr_widen(b, (size_t)OC),
                   kr_doubles(no),
                   kr_widen(dout, no)};
    lin_objective(&ref);
    double e = kr_err(out, ref.out, no);
    CHECK(e <= KR_FWD_TOL, "linear N=%d C=%d OC=%d: forward rel err %.3g", N, C, OC, e);
    double *fx = kr_doubles(nx), *fw = kr_doubles(nw), *fb = kr_doubles((size_t)OC);
    kr_fd_grad(fx, ref.x, nx, lin_objective, &ref);
    kr_fd_grad(fw, ref.w, nw, lin_objective, &ref);
    kr_fd_grad(fb, ref.b, (size_t)OC, lin_objective, &ref);
    kr_acc dx = kr_acc_new(nx), dw = kr_acc_new(nw), db = kr_acc_new((size_t)OC);
    loom_linear_bwd(dev, dx.g, dw.g, db.g, dout, x, w, N, C, OC);
    kr_acc_snap(&dx), kr_acc_snap(&dw), kr_acc_snap(&db);
    loom_linear_bwd(dev, dx.g, dw.g, db.g, dout, x, w, N, C, OC);
    kr_acc_check(&dx, fx, "linear dinp");
    kr_acc_check(&dw, fw, "linear dw");
    kr_acc_check(&db, fb, "linear db");
    kr_acc_free(&dx), kr_acc_free(&dw), kr_acc_free(&db);
    free(fx), free(fw), free(fb), free(ref.x), free(ref.w), free(ref.b), free(ref.out), free((void *)ref.r);
    free(x), free(w), free(b), free(dout), free(out);
}

/* ---- grouped-query attention with a window ---------------------------------------- */

typedef struct {
    int B, T, NH, NKV, HS, window;
    double *qkv, *out;
    const double *r;
} att_ref;

static double att_objective(void *ctx) {
    att_ref *a = ctx;
    const int C = a->NH * a->HS, K = a->NKV * a->HS, W = C + 2 * K, rep = a->NH / a->NKV;
    double *p = malloc((size_t)a->T * sizeof *p);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->NH; h++)
            for (int i = 0; i < a->T; i++) {
                const double *q = a->qkv + ((size_t)b * a->T + i) * W + h * a->HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    p[j] = -INFINITY;
                    if (a->window > 0 && i - j > a->window) continue;
                    const double *k = a->qkv + ((size_t)b * a->T + j) * W + C + (h / rep) * a->HS;
                    double s = 0;
                    for (int d = 0; d < a->HS; d++) s += q[d] * k[d];
                    p[j] = s / sqrt((double)a->HS);
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
                double *o = a->out + ((size_t)b * a->T + i) * C + h * a->HS;
                for (int d = 0; d < a->HS; d++) {
                    double s = 0;
                    for (int j = 0; j <= i; j++)
                        s += p[j] * a->qkv[((size_t)b * a->T + j) * W + C + K + (h / rep) * a->HS + d];
                    o[d] = s / sum;
                }
            }
    free(p);
    return kr_dot(a->out, a->r, (size_t)a->B * a->T * C);
}

static void test_attention_gqa(int B, int T, int NH, int NKV, int HS, int window) {
    const int C = NH * HS, K = NKV * HS, W = C + 2 * K;
    const size_t nq = (size_t)B * T * W, no = (size_t)B * T * C;
    float *qkv = kr_rand_floats(nq, -1, 1), *dout = kr_rand_floats(no, -1, 1), *out = kr_floats(no);
    float *lse = kr_floats((size_t)B * NH * T);
    loom_att_view v = {qkv, qkv + C, qkv + C + K, (size_t)T * W, (size_t)T * W, W, W, B, T, T, NH,
                       HS,  0,       0,           NKV,           window};
    loom_attention_part_fwd(dev, &v, out, (size_t)T * C, C, lse, 0);
    att_ref ref = {B, T, NH, NKV, HS, window, kr_widen(qkv, nq), kr_doubles(no), kr_widen(dout, no)};
    att_objective(&ref);
    double e = kr_err(out, ref.out, no);
    CHECK(e <= KR_FWD_TOL, "attention NH=%d NKV=%d window=%d: forward rel err %.3g", NH, NKV, window, e);
    double *fd = kr_doubles(nq);
    kr_fd_grad(fd, ref.qkv, nq, att_objective, &ref);
    kr_acc g = kr_acc_new(nq);
    loom_attention_part_bwd(dev, &v, g.g, g.g + C, g.g + C + K, dout, out, (size_t)T * C, C, lse);
    kr_acc_snap(&g);
    loom_attention_part_bwd(dev, &v, g.g, g.g + C, g.g + C + K, dout, out, (size_t)T * C, C, lse);
    kr_acc_check(&g, fd, "attention gqa dqkv");
    kr_acc_free(&g);
    free(fd), free(ref.qkv), free(ref.out), free((void *)ref.r), free(qkv), free(dout), free(out), free(lse);
}

int main(void) {
    dev = test_cpu_device(2, 0);
    kr_seed(30);
    test_rmsnorm(7, 12);
    test_rmsnorm(5, 67);
    test_swiglu(6, 21, 4.0);
    test_swiglu(3, 5, 30.0);
    test_rope(9, 3, 16);
    test_rope(4, 2, 128);
    test_linear(5, 7, 11);
    test_linear(17, 24, 3);
    test_attention_gqa(2, 9, 4, 2, 4, 0);  /* grouped-query */
    test_attention_gqa(1, 11, 4, 1, 4, 3); /* one key/value head, window 3 */
    test_attention_gqa(1, 70, 2, 2, 4, 5); /* past one key tile: whole tiles skipped left of the window */
    loom_device_free(dev);
    return check_done();
}
