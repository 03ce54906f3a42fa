/* test_kernels_attention.c - causal multi-head attention against a plain
 * double reference: output and probabilities (rows sum to 1, exact zeros
 * above the diagonal), backward against central finite differences of
 * L = sum(out * R) with respect to qkv, and accumulation into dqkv. Sizes
 * include odd ones and T beyond the kernel's 64-row block.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kref.h"
#include "loom/kernels.h"

typedef struct {
    int B, T, C, NH;
    double *qkv;      /* (B,T,3C) */
    const double *r;  /* (B,T,C) */
    double *out;      /* (B,T,C) */
    double *att;      /* (B,NH,T,T) */
} att_ref;

/* One (b, h): probabilities into its (T,T) block of att, output columns
 * h*HS.. of out. */
static void att_ref_head(att_ref *A, int b, int h) {
    int T = A->T, C = A->C, HS = C / A->NH;
    double scale = 1.0 / sqrt((double)HS);
    const double *q = A->qkv + (size_t)b * T * 3 * C + (size_t)h * HS; /* (T,HS) ld 3C */
    const double *k = q + C, *v = q + 2 * C;
    for (int i = 0; i < T; i++) {
        double *a = A->att + (((size_t)b * A->NH + h) * T + i) * T; /* (T) */
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int d = 0; d < HS; d++) s += q[(size_t)i * 3 * C + d] * k[(size_t)j * 3 * C + d];
            a[j] = s * scale;
            if (a[j] > mx) mx = a[j];
        }
        for (int j = 0; j <= i; j++) {
            a[j] = exp(a[j] - mx);
            sum += a[j];
        }
        for (int j = 0; j < T; j++) a[j] = j <= i ? a[j] / sum : 0.0;
        for (int d = 0; d < HS; d++) {
            double o = 0;
            for (int j = 0; j <= i; j++) o += a[j] * v[(size_t)j * 3 * C + d];
            A->out[((size_t)b * T + i) * C + (size_t)h * HS + d] = o;
        }
    }
}

static double att_objective(void *ctx) {
    att_ref *A = ctx;
    for (int b = 0; b < A->B; b++)
        for (int h = 0; h < A->NH; h++) att_ref_head(A, b, h);
    return kr_dot(A->out, A->r, (size_t)A->B * A->T * A->C);
}

/* Probabilities: rows sum to 1, exact zeros above the diagonal. */
static void check_att_rows(const float *att, int B, int NH, int T, const char *what) {
    double worst = 0;
    int nonzero = 0;
    for (size_t row = 0; row < (size_t)B * NH * T; row++) {
        int i = (int)(row % (size_t)T);
        const float *a = att + row * T;
        double s = 0;
        for (int j = 0; j < T; j++) {
            s += a[j];
            if (j > i && a[j] != 0.0f) nonzero++;
        }
        if (fabs(s - 1) > worst) worst = fabs(s - 1);
    }
    CHECK(worst <= 1e-6, "%s: a row of att sums to 1 %+.3g", what, worst);
    CHECK(nonzero == 0, "%s: %d entries above the diagonal are not 0", what, nonzero);
}

static void test_attention(int B, int T, int C, int NH, double qk_range) {
    char what[96];
    snprintf(what, sizeof what, "attention B=%d T=%d C=%d NH=%d", B, T, C, NH);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *qkv = kr_rand_floats(nqkv, -qk_range, qk_range);
    float *out = kr_floats(nout), *att = kr_floats(natt), *dout = kr_rand_floats(nout, -1, 1);
    size_t nscratch = loom_attention_scratch_floats(T);
    float *scratch = kr_floats(nscratch);
    kr_fill_nan(out, nout);
    kr_fill_nan(att, natt);
    loom_attention_fwd(out, att, qkv, B, T, C, NH);

    att_ref ref = {B, T, C, NH, kr_widen(qkv, nqkv), kr_widen(dout, nout), kr_doubles(nout),
                   kr_doubles(natt)};
    att_objective(&ref);
    double e = kr_err(out, ref.out, nout);
    CHECK(e <= KR_FWD_TOL, "%s: forward out rel err %.3g", what, e);
    e = kr_err(att, ref.att, natt);
    CHECK(e <= KR_FWD_TOL, "%s: forward att rel err %.3g", what, e);
    check_att_rows(att, B, NH, T, what);

    double *fd = kr_doubles(nqkv);
    kr_fd_grad(fd, ref.qkv, nqkv, att_objective, &ref);
    kr_acc dqkv = kr_acc_new(nqkv);
    kr_fill_nan(scratch, nscratch); /* scratch holds nothing on entry */
    loom_attention_bwd(dqkv.g, scratch, dout, qkv, att, B, T, C, NH);
    kr_acc_snap(&dqkv);
    kr_fill_nan(scratch, nscratch);
    loom_attention_bwd(dqkv.g, scratch, dout, qkv, att, B, T, C, NH);
    kr_acc_check(&dqkv, fd, what);

    kr_acc_free(&dqkv);
    free(fd), free(ref.qkv), free((void *)ref.r), free(ref.out), free(ref.att);
    free(qkv), free(out), free(att), free(dout), free(scratch);
}

/* Scores of 1e4: softmax must stay finite and exact (one-hot rows). */
static void test_attention_large_scores(void) {
    int B = 1, T = 9, C = 8, NH = 2;
    size_t nqkv = (size_t)B * T * 3 * C;
    float *qkv = kr_rand_floats(nqkv, -100, 100);
    float out[9 * 8], att[1 * 2 * 9 * 9];
    loom_attention_fwd(out, att, qkv, B, T, C, NH);
    CHECK(loom_all_finite(out, sizeof out / sizeof *out), "large scores: out not finite");
    CHECK(loom_all_finite(att, sizeof att / sizeof *att), "large scores: att not finite");
    check_att_rows(att, B, NH, T, "attention large scores");
    free(qkv);
}

int main(void) {
    loom_kernels_set_threads(1);
    kr_seed(3);
    test_attention(2, 5, 12, 3, 1.0);  /* HS = 4 */
    test_attention(1, 1, 6, 2, 1.0);   /* a single position */
    test_attention(2, 16, 32, 4, 1.0); /* HS = 8 */
    test_attention(1, 70, 12, 3, 1.0); /* crosses the 64-row block */
    test_attention(1, 128, 8, 2, 1.0); /* two full blocks */
    test_attention(1, 7, 16, 1, 3.0);  /* one head, peaked softmax */
    test_attention_large_scores();
    return check_done();
}
