/* test_kernels_attention.c - causal multi-head attention (online softmax)
 * against a plain double reference: output and per-row log-sum-exp, backward
 * against central finite differences of L = sum(out * R) with respect to
 * qkv, and accumulation into dqkv. Sizes include odd ones and T beyond the
 * kernel's 64-row tiles. The partial (context-parallel) path is checked the
 * same way: a query slice at a position offset attends to two key/value
 * slices, one of them in a separate (B,Tk,2C) buffer as a ring would pass it,
 * the two partial (out, lse) are merged (by loom_attention_merge and by
 * accumulation), and the per-part backwards must add up to the gradient.
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

static loom_device *dev; /* the CPU, one thread: every kernel below runs on it */

typedef struct {
    int B, T, C, NH;
    double *qkv;     /* (B,T,3C) */
    const double *r; /* (B,T,C) */
    double *out;     /* (B,T,C) */
    double *lse;     /* (B,NH,T) */
} att_ref;

/* One (b, h): probabilities into its (T,T) block of att, output columns
 * h*HS.. of out. */
static void att_ref_head(att_ref *A, int b, int h) {
    int T = A->T, C = A->C, HS = C / A->NH;
    double scale = 1.0 / sqrt((double)HS);
    const double *q = A->qkv + (size_t)b * T * 3 * C + (size_t)h * HS; /* (T,HS) ld 3C */
    const double *k = q + C, *v = q + 2 * C;
    for (int i = 0; i < T; i++) {
        double a[T];
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
        A->lse[((size_t)b * A->NH + h) * T + i] = mx + log(sum);
        for (int j = 0; j <= i; j++) a[j] /= sum;
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

static void test_attention(int B, int T, int C, int NH, double qk_range) {
    char what[96];
    snprintf(what, sizeof what, "attention B=%d T=%d C=%d NH=%d", B, T, C, NH);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = kr_rand_floats(nqkv, -qk_range, qk_range);
    float *out = kr_floats(nout), *lse = kr_floats(nlse), *dout = kr_rand_floats(nout, -1, 1);
    kr_fill_nan(out, nout);
    kr_fill_nan(lse, nlse);
    loom_attention_fwd(dev, out, lse, qkv, B, T, C, NH);

    att_ref ref = {
        B, T, C, NH, kr_widen(qkv, nqkv), kr_widen(dout, nout), kr_doubles(nout), kr_doubles(nlse)};
    att_objective(&ref);
    double e = kr_err(out, ref.out, nout);
    CHECK(e <= KR_FWD_TOL, "%s: forward out rel err %.3g", what, e);
    e = kr_err(lse, ref.lse, nlse);
    CHECK(e <= KR_FWD_TOL, "%s: forward lse rel err %.3g", what, e);

    double *fd = kr_doubles(nqkv);
    kr_fd_grad(fd, ref.qkv, nqkv, att_objective, &ref);
    kr_acc dqkv = kr_acc_new(nqkv);
    loom_attention_bwd(dev, dqkv.g, dout, qkv, out, lse, B, T, C, NH);
    kr_acc_snap(&dqkv);
    loom_attention_bwd(dev, dqkv.g, dout, qkv, out, lse, B, T, C, NH);
    kr_acc_check(&dqkv, fd, what);

    kr_acc_free(&dqkv);
    free(fd), free(ref.qkv), free((void *)ref.r), free(ref.out), free(ref.lse);
    free(qkv), free(out), free(lse), free(dout);
}

/* Scores of 1e4: softmax must stay finite and exact (one-hot rows). */
static void test_attention_large_scores(void) {
    int B = 1, T = 9, C = 8, NH = 2;
    size_t nqkv = (size_t)B * T * 3 * C;
    float *qkv = kr_rand_floats(nqkv, -100, 100);
    float out[9 * 8], lse[1 * 2 * 9];
    loom_attention_fwd(dev, out, lse, qkv, B, T, C, NH);
    CHECK(loom_all_finite(dev, out, sizeof out / sizeof *out), "large scores: out not finite");
    CHECK(loom_all_finite(dev, lse, sizeof lse / sizeof *lse), "large scores: lse not finite");
    free(qkv);
}

/* Queries [qa, qa+mq) of a (B,T) sequence attend to keys [0, ks) (a view
 * into qkv) and keys [ks, T) (copied into a separate (B,T-ks,2C) buffer).
 * Forward: both merges equal the reference rows. Backward: the two parts'
 * gradients, given the merged (out, lse), add up to the finite differences of
 * L = sum over the slice of out * R. */
static void test_partial(int B, int T, int C, int NH, int qa, int mq, int ks) {
    char what[128];
    snprintf(what, sizeof what, "partial B=%d T=%d C=%d NH=%d q[%d,%d) keys [0,%d)+[%d,%d)", B, T, C, NH, qa,
             qa + mq, ks, ks, T);
    const int HS = C / NH, T2 = T - ks;
    size_t nqkv = (size_t)B * T * 3 * C, nfull = (size_t)B * T * C;
    size_t nout = (size_t)B * mq * C, nlse = (size_t)B * NH * mq, nkv2 = (size_t)B * T2 * 2 * C;
    float *qkv = kr_rand_floats(nqkv, -1, 1);
    float *kv2 = kr_floats(nkv2); /* keys/values [ks, T) as a ring block */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T2; t++)
            memcpy(kv2 + ((size_t)b * T2 + t) * 2 * C, qkv + ((size_t)b * T + ks + t) * 3 * C + C,
                   2 * (size_t)C * sizeof(float));
    loom_att_view p1 = {qkv + (size_t)qa * 3 * C,
                        qkv + C,
                        qkv + 2 * C,
                        (size_t)T * 3 * C,
                        (size_t)T * 3 * C,
                        3 * C,
                        3 * C,
                        B,
                        mq,
                        ks,
                        NH,
                        HS,
                        qa,
                        0,
                        0,
                        0};
    loom_att_view p2 = p1;
    p2.k = kv2, p2.v = kv2 + C, p2.kv_bs = (size_t)T2 * 2 * C, p2.kv_ld = 2 * C;
    p2.Tk = T2, p2.k_pos0 = ks;

    float *out = kr_floats(nout), *lse = kr_floats(nlse), *out2 = kr_floats(nout);
    float *lse2 = kr_floats(nlse), *acc = kr_floats(nout), *acclse = kr_floats(nlse);
    size_t o_bs = (size_t)mq * C;
    long tiles = loom_attention_part_fwd(dev, &p1, out, o_bs, C, lse, 0);
    tiles += loom_attention_part_fwd(dev, &p2, out2, o_bs, C, lse2, 0);
    CHECK(tiles == loom_attention_tiles(&p1) + loom_attention_tiles(&p2) && tiles > 0, "%s: tiles %ld", what,
          tiles);
    loom_attention_merge(dev, out, lse, out2, lse2, o_bs, C, B, mq, NH, HS);
    loom_attention_part_fwd(dev, &p2, acc, o_bs, C, acclse, 0);
    loom_attention_part_fwd(dev, &p1, acc, o_bs, C, acclse, 1); /* the other order */

    float *r = kr_rand_floats(nout, -1, 1); /* dout of the slice */
    double *rfull = kr_doubles(nfull);
    memset(rfull, 0, nfull * sizeof *rfull);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < mq; i++)
            for (int c = 0; c < C; c++)
                rfull[((size_t)b * T + qa + i) * C + c] = r[((size_t)b * mq + i) * C + c];
    att_ref ref = {
        B, T, C, NH, kr_widen(qkv, nqkv), rfull, kr_doubles(nfull), kr_doubles((size_t)B * NH * T)};
    att_objective(&ref);
    double *oref = kr_doubles(nout), *lref = kr_doubles(nlse);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < mq; i++)
            for (int c = 0; c < C; c++)
                oref[((size_t)b * mq + i) * C + c] = ref.out[((size_t)b * T + qa + i) * C + c];
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < mq; i++)
                lref[((size_t)b * NH + h) * mq + i] = ref.lse[((size_t)b * NH + h) * T + qa + i];
    }
    double e = kr_err(out, oref, nout);
    CHECK(e <= KR_FWD_TOL, "%s: merged out rel err %.3g", what, e);
    e = kr_err(lse, lref, nlse);
    CHECK(e <= KR_FWD_TOL, "%s: merged lse rel err %.3g", what, e);
    e = kr_err(acc, oref, nout);
    CHECK(e <= KR_FWD_TOL, "%s: accumulated out rel err %.3g", what, e);
    e = kr_err(acclse, lref, nlse);
    CHECK(e <= KR_FWD_TOL, "%s: accumulated lse rel err %.3g", what, e);

    double *fd = kr_doubles(nqkv);
    kr_fd_grad(fd, ref.qkv, nqkv, att_objective, &ref);
    kr_acc dqkv = kr_acc_new(nqkv);
    float *dkv2 = kr_floats(nkv2);
    for (int pass = 0; pass < 2; pass++) {
        memset(dkv2, 0, nkv2 * sizeof *dkv2);
        loom_attention_part_bwd(dev, &p1, dqkv.g + (size_t)qa * 3 * C, dqkv.g + C, dqkv.g + 2 * C, r, out,
                                o_bs, C, lse);
        loom_attention_part_bwd(dev, &p2, dqkv.g + (size_t)qa * 3 * C, dkv2, dkv2 + C, r, out, o_bs, C, lse);
        for (int b = 0; b < B; b++) /* the ring's dK/dV come home */
            for (int t = 0; t < T2; t++)
                for (int c = 0; c < 2 * C; c++)
                    dqkv.g[((size_t)b * T + ks + t) * 3 * C + C + c] +=
                        dkv2[((size_t)b * T2 + t) * 2 * C + c];
        if (pass == 0) kr_acc_snap(&dqkv);
    }
    kr_acc_check(&dqkv, fd, what);

    kr_acc_free(&dqkv);
    free(fd), free(ref.qkv), free(rfull), free(ref.out), free(ref.lse), free(oref), free(lref);
    free(qkv), free(kv2), free(dkv2), free(out), free(lse), free(out2), free(lse2), free(acc);
    free(acclse), free(r);
}

/* Tile counts: a causal T=130 sequence on 64-tiles computes 1+2+3 tiles of
 * the 3x3 grid per head; keys wholly after the queries compute none. */
static void test_tiles(void) {
    float x = 0;
    loom_att_view v = {&x, &x, &x, 0, 0, 0, 0, 2, 130, 130, 3, 4, 0, 0, 0, 0};
    CHECK(loom_attention_tiles(&v) == 2 * 3 * 6, "causal tiles %ld", loom_attention_tiles(&v));
    v.k_pos0 = 130;
    CHECK(loom_attention_tiles(&v) == 0, "future keys: tiles %ld", loom_attention_tiles(&v));
    v.k_pos0 = 0, v.q_pos0 = 130;
    CHECK(loom_attention_tiles(&v) == 2 * 3 * 9, "past keys: tiles %ld", loom_attention_tiles(&v));
}

int main(void) {
    dev = test_cpu_device(1, 0);
    kr_seed(3);
    test_attention(2, 5, 12, 3, 1.0);  /* HS = 4 */
    test_attention(1, 1, 6, 2, 1.0);   /* a single position */
    test_attention(2, 16, 32, 4, 1.0); /* HS = 8 */
    test_attention(1, 70, 12, 3, 1.0); /* crosses the 64-row block */
    test_attention(1, 128, 8, 2, 1.0); /* two full blocks */
    test_attention(1, 7, 16, 1, 3.0);  /* one head, peaked softmax */
    test_attention_large_scores();
    test_partial(1, 40, 8, 2, 9, 20, 17);    /* diagonal inside both parts */
    test_partial(1, 150, 4, 2, 40, 75, 90);  /* multi-tile; rows that see none of part 2 */
    test_partial(1, 160, 4, 1, 100, 60, 64); /* queries wholly after part 1 */
    test_tiles();
    loom_device_free(dev);
    return check_done();
}
