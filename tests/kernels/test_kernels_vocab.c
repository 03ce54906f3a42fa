/* test_kernels_vocab.c - the vocabulary-parallel embedding and softmax
 * cross-entropy against plain double references, for one vocabulary slice
 * (v0 = 0) and for 2 or 3 slices with a padded last one. The test plays the
 * tensor-parallel group itself: it sums the slices' embedding outputs, and
 * takes the MAX of the row maxima and the SUM of [sum-exp | target logit]
 * between the cross-entropy phases, as gpt.c's all-reduces do.
 *
 * Embedding: forward values, loom_pos_fwd on row chunks with row0 != 0 (the
 * sequence-parallel case), backward against central finite differences of
 * L = sum(out * R), accumulation (+=). Cross-entropy: losses and probs,
 * padding columns (huge values there must not change anything), ignored
 * targets, logits of 1e4, aliasing, dlogits against the analytic double
 * gradient and finite differences of dloss * sum(losses).
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

#define MAXS 3 /* most vocabulary slices */

/* Splits V tokens into ns slices of V_l = ceil(V / ns) + pad rows each; the
 * last slices hold the padding. */
typedef struct {
    int ns, V_l, v0[MAXS], V_valid[MAXS];
} vsplit;

static vsplit split_vocab(int V, int ns, int pad) {
    vsplit s = {ns, (V + ns - 1) / ns + pad, {0}, {0}};
    for (int k = 0; k < ns; k++) {
        s.v0[k] = k * s.V_l;
        int left = V - s.v0[k];
        s.V_valid[k] = left < 0 ? 0 : left < s.V_l ? left : s.V_l;
    }
    return s;
}

/* ---- embedding: out = wte[tok] + wpe[row % T] ------------------------------ */

typedef struct {
    int N, T, C;
    const int32_t *tok; /* (N) */
    double *wte, *wpe;  /* (ns*V_l,C) padded, (maxT,C) */
    const double *r;    /* (N,C) */
    double *out;        /* (N,C) */
} emb_ref;

static double emb_objective(void *ctx) {
    emb_ref *e = ctx;
    for (int i = 0; i < e->N; i++)
        for (int c = 0; c < e->C; c++)
            e->out[(size_t)i * e->C + c] =
                e->wte[(size_t)e->tok[i] * e->C + c] + e->wpe[(size_t)(i % e->T) * e->C + c];
    return kr_dot(e->out, e->r, (size_t)e->N * e->C);
}

/* ns vocabulary slices (pad extra rows each), nchunk row chunks for the
 * positions (the sequence-parallel split; chunk k starts at row0 > 0). */
static void test_embed(int B, int T, int C, int V, int ns, int pad, int nchunk) {
    char what[128];
    snprintf(what, sizeof what, "embed B=%d T=%d C=%d V=%d slices=%d pad=%d chunks=%d", B, T, C, V, ns, pad,
             nchunk);
    int N = B * T, maxT = T + 2; /* rows T, T+1 of wpe are never used */
    vsplit s = split_vocab(V, ns, pad);
    size_t Vp = (size_t)ns * s.V_l, nc = (size_t)N * C;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = kr_randint(V);
    tok[0] = tok[N - 1];       /* a repeated token: its row collects twice */
    if (N > 2) tok[1] = V - 1; /* the last real token, in the padded slice */
    float *wte = kr_rand_floats(Vp * C, -1, 1), *wpe = kr_rand_floats((size_t)maxT * C, -1, 1);
    float *out = kr_floats(nc), *part = kr_floats(nc), *dout = kr_rand_floats(nc, -1, 1);

    /* forward: each slice writes its rows (0 for the others), summed here */
    memset(out, 0, nc * sizeof *out);
    for (int k = 0; k < ns; k++) {
        kr_fill_nan(part, nc); /* writes, never reads */
        loom_embed_fwd(dev, part, tok, wte + (size_t)s.v0[k] * C, s.v0[k], s.V_l, N, C);
        for (size_t i = 0; i < nc; i++) out[i] += part[i];
    }
    int done = 0;
    for (int k = 0; k < nchunk; k++) {
        int row0 = done, n = k == nchunk - 1 ? N - done : N / nchunk;
        loom_pos_fwd(dev, out + (size_t)row0 * C, wpe, row0, n, T, C);
        done += n;
    }
    emb_ref ref = {N,
                   T,
                   C,
                   tok,
                   kr_widen(wte, Vp * C),
                   kr_widen(wpe, (size_t)maxT * C),
                   kr_widen(dout, nc),
                   kr_doubles(nc)};
    emb_objective(&ref);
    double e = kr_err(out, ref.out, nc);
    CHECK(e <= KR_FWD_TOL, "%s: forward rel err %.3g", what, e);

    /* backward twice: the gradients accumulate */
    kr_acc dwte = kr_acc_new(Vp * C), dwpe = kr_acc_new((size_t)maxT * C);
    for (int rep = 0; rep < 2; rep++) {
        for (int k = 0; k < ns; k++)
            loom_embed_bwd(dev, dwte.g + (size_t)s.v0[k] * C, dout, tok, s.v0[k], s.V_l, N, C);
        done = 0;
        for (int k = 0; k < nchunk; k++) {
            int row0 = done, n = k == nchunk - 1 ? N - done : N / nchunk;
            loom_pos_bwd(dev, dwpe.g, dout + (size_t)row0 * C, row0, n, T, C);
            done += n;
        }
        if (rep == 0) kr_acc_snap(&dwte), kr_acc_snap(&dwpe);
    }
    double *fd_wte = kr_doubles(Vp * C), *fd_wpe = kr_doubles((size_t)maxT * C);
    kr_fd_grad(fd_wte, ref.wte, Vp * C, emb_objective, &ref);
    kr_fd_grad(fd_wpe, ref.wpe, (size_t)maxT * C, emb_objective, &ref);
    char gwhat[160];
    snprintf(gwhat, sizeof gwhat, "%s dwte", what);
    kr_acc_check(&dwte, fd_wte, gwhat);
    snprintf(gwhat, sizeof gwhat, "%s dwpe", what);
    kr_acc_check(&dwpe, fd_wpe, gwhat);
    /* padding rows and unused positions are untouched */
    int touched = 0;
    for (int k = 0; k < ns; k++)
        for (size_t i = (size_t)(s.v0[k] + s.V_valid[k]) * C; i < (size_t)(s.v0[k] + s.V_l) * C; i++)
            touched += dwte.g[i] != dwte.g0[i];
    for (size_t i = (size_t)T * C; i < (size_t)maxT * C; i++) touched += dwpe.g[i] != dwpe.g0[i];
    CHECK(touched == 0, "%s: %d padding / unused gradient entries changed", what, touched);

    kr_acc_free(&dwte);
    kr_acc_free(&dwpe);
    free(fd_wte), free(fd_wpe), free(ref.wte), free(ref.wpe), free((void *)ref.r), free(ref.out);
    free(tok), free(wte), free(wpe), free(out), free(part), free(dout);
}

/* ---- softmax cross-entropy ------------------------------------------------ */

typedef struct {
    int N, V;
    double *logits;         /* (N,V), no padding */
    const int32_t *targets; /* (N) */
    double dloss;
    double *probs, *losses; /* (N,V), (N) */
} xent_ref;

/* L = dloss * sum of the losses of the rows that count. */
static double xent_objective(void *ctx) {
    xent_ref *x = ctx;
    double L = 0;
    for (int i = 0; i < x->N; i++) {
        const double *z = x->logits + (size_t)i * x->V;
        double *p = x->probs + (size_t)i * x->V;
        double mx = z[0], sum = 0;
        for (int j = 1; j < x->V; j++) mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < x->V; j++) sum += exp(z[j] - mx);
        for (int j = 0; j < x->V; j++) p[j] = exp(z[j] - mx) / sum;
        int t = x->targets[i];
        x->losses[i] = t < 0 ? 0.0 : log(sum) - (z[t] - mx);
        L += x->dloss * x->losses[i];
    }
    return L;
}

/* The three phases over ns slices, combined as the all-reduces would. sl[k]
 * (N,V_l) holds slice k's logits and ends as its probs; losses[k] (N) per
 * slice (every rank computes all of them). */
static void vxent_fwd(float **sl, float **losses, const int32_t *targets, const vsplit *s, int N) {
    float *mx = kr_floats((size_t)N), *gmax = kr_floats((size_t)N);
    float *sum = kr_floats((size_t)2 * N), *gsum = kr_floats((size_t)2 * N);
    for (int i = 0; i < N; i++) gmax[i] = -INFINITY;
    for (int k = 0; k < s->ns; k++) {
        kr_fill_nan(mx, (size_t)N);
        loom_vxent_max(dev, mx, sl[k], N, s->V_l, s->V_valid[k]);
        for (int i = 0; i < N; i++) gmax[i] = mx[i] > gmax[i] ? mx[i] : gmax[i]; /* MAX */
    }
    memset(gsum, 0, (size_t)2 * N * sizeof *gsum);
    for (int k = 0; k < s->ns; k++) {
        kr_fill_nan(sum, (size_t)2 * N);
        loom_vxent_exp(dev, sl[k], sum, sum + N, gmax, targets, s->v0[k], N, s->V_l, s->V_valid[k]);
        for (int i = 0; i < 2 * N; i++) gsum[i] += sum[i]; /* SUM of [sum-exp | target] */
    }
    for (int k = 0; k < s->ns; k++) {
        kr_fill_nan(losses[k], (size_t)N);
        loom_vxent_finish(dev, losses[k], sl[k], gsum, gsum + N, targets, N, s->V_l);
    }
    free(mx), free(gmax), free(sum), free(gsum);
}

/* Gathers the valid columns of the slices into full (N,V); counts nonzero
 * padding entries. */
static int gather(float *full, float *const *sl, const vsplit *s, int N, int V) {
    int bad = 0;
    for (int k = 0; k < s->ns; k++)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < s->V_l; j++) {
                float v = sl[k][(size_t)i * s->V_l + j];
                if (j < s->V_valid[k]) full[(size_t)i * V + s->v0[k] + j] = v;
                else bad += v != 0.0f;
            }
    return bad;
}

/* N rows, V tokens over ns slices with pad extra columns each (filled with
 * padval: never part of a max or a sum); logits in [-range, range]. */
static void test_vxent(int N, int V, int ns, int pad, double range, float padval, int alias, int fd_check) {
    char what[128];
    snprintf(what, sizeof what, "vxent N=%d V=%d slices=%d pad=%d range=%g alias=%d", N, V, ns, pad, range,
             alias);
    vsplit s = split_vocab(V, ns, pad);
    size_t nv = (size_t)N * V, nl = (size_t)N * s.V_l;
    float *logits = kr_rand_floats(nv, -range, range);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    for (int i = 0; i < N; i++) targets[i] = kr_randint(V);
    targets[0] = V - 1;           /* the last real token: in the padded slice */
    if (N > 2) targets[2] = -1;   /* ignored */
    if (N > 3) targets[3] = -100; /* ignored, torch's ignore_index */
    if (N > 4) {                  /* a row whose target is its max */
        logits[(size_t)4 * V + targets[4]] = (float)range;
    }
    float dloss = 1.0f / (float)N;
    xent_ref ref = {N, V, kr_widen(logits, nv), targets, dloss, kr_doubles(nv), kr_doubles((size_t)N)};
    xent_objective(&ref);

    float *sl[MAXS], *losses[MAXS];
    for (int k = 0; k < ns; k++) {
        sl[k] = kr_floats(nl), losses[k] = kr_floats((size_t)N);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < s.V_l; j++)
                sl[k][(size_t)i * s.V_l + j] =
                    j < s.V_valid[k] ? logits[(size_t)i * V + s.v0[k] + j] : padval;
    }
    float *loc = NULL, *loc_losses = NULL;   /* one slice: the fused kernel on a copy */
    float *gloc = NULL, *gloc_losses = NULL; /* ... and the one with the gradient */
    if (ns == 1) {
        loc = kr_floats(nl), loc_losses = kr_floats((size_t)N);
        memcpy(loc, sl[0], nl * sizeof *loc);
        kr_fill_nan(loc_losses, (size_t)N);
        gloc = kr_floats(nl), gloc_losses = kr_floats((size_t)N);
        memcpy(gloc, sl[0], nl * sizeof *gloc);
        kr_fill_nan(gloc_losses, (size_t)N);
        CHECK(loom_vxent_local_grad(dev, gloc_losses, gloc, targets, N, s.V_l, s.V_valid[0], dloss) == 1,
              "%s: the CPU backend has no vxent_local_grad", what);
        loom_gemm_unkeep(dev, gloc);
    }
    vxent_fwd(sl, losses, targets, &s, N);
    if (ns == 1) {
        CHECK(loom_vxent_local(dev, loc_losses, loc, targets, N, s.V_l, s.V_valid[0]) == 1,
              "%s: the CPU backend has no vxent_local", what);
        CHECK(memcmp(loc, sl[0], nl * sizeof *loc) == 0,
              "%s: vxent_local's probs differ from the three phases'", what);
        CHECK(memcmp(loc_losses, losses[0], (size_t)N * sizeof *loc_losses) == 0,
              "%s: vxent_local's losses differ from the three phases'", what);
        free(loc), free(loc_losses);
    }

    double e = kr_err(losses[0], ref.losses, (size_t)N);
    CHECK(e <= KR_FWD_TOL, "%s: losses rel err %.3g", what, e);
    CHECK(loom_all_finite(dev, losses[0], (size_t)N), "%s: losses not finite", what);
    for (int k = 1; k < ns; k++)
        CHECK(memcmp(losses[k], losses[0], (size_t)N * sizeof(float)) == 0,
              "%s: slice %d's losses differ from slice 0's", what, k);
    for (int i = 0; i < N; i++)
        if (targets[i] < 0)
            CHECK(losses[0][i] == 0.0f, "%s: ignored row %d has loss %g", what, i, losses[0][i]);
    float *full = kr_floats(nv);
    kr_fill_nan(full, nv);
    int bad = gather(full, sl, &s, N, V);
    CHECK(bad == 0, "%s: %d padding probs nonzero", what, bad);
    e = kr_err(full, ref.probs, nv);
    CHECK(e <= KR_FWD_TOL, "%s: probs rel err %.3g", what, e);
    CHECK(loom_all_finite(dev, full, nv), "%s: probs not finite", what);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double sum = 0;
        for (int j = 0; j < V; j++) sum += full[(size_t)i * V + j];
        worst = fabs(sum - 1) > worst ? fabs(sum - 1) : worst;
    }
    CHECK(worst <= 1e-6, "%s: a row of probs sums to 1 %+.3g", what, worst);

    /* backward per slice: writes (NaN-filled first), may alias probs */
    float *dl[MAXS];
    for (int k = 0; k < ns; k++) {
        dl[k] = alias ? sl[k] : kr_floats(nl);
        if (!alias) kr_fill_nan(dl[k], nl);
        loom_vxent_bwd(dev, dl[k], sl[k], targets, dloss, s.v0[k], N, s.V_l);
    }
    if (ns == 1) { /* fp32: the gradient in place, the same floats */
        CHECK(memcmp(gloc, dl[0], nl * sizeof *gloc) == 0,
              "%s: vxent_local_grad's dlogits differ from vxent_local + vxent_bwd's", what);
        CHECK(memcmp(gloc_losses, losses[0], (size_t)N * sizeof *gloc_losses) == 0,
              "%s: vxent_local_grad's losses differ from the three phases'", what);
        free(gloc), free(gloc_losses);
    }
    kr_fill_nan(full, nv);
    bad = gather(full, dl, &s, N, V);
    CHECK(bad == 0, "%s: %d padding dlogits nonzero", what, bad);
    CHECK(loom_all_finite(dev, full, nv), "%s: dlogits not finite", what);
    double *an = kr_doubles(nv); /* dloss * (p - onehot) in double */
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++) {
            size_t q = (size_t)i * V + j;
            an[q] = targets[i] < 0 ? 0.0 : dloss * (ref.probs[q] - (j == targets[i]));
        }
    e = kr_err(full, an, nv);
    CHECK(e <= KR_BWD_TOL, "%s: dlogits vs analytic rel err %.3g", what, e);
    if (fd_check) {
        double *fd = kr_doubles(nv);
        kr_fd_grad(fd, ref.logits, nv, xent_objective, &ref);
        e = kr_err(full, fd, nv);
        CHECK(e <= KR_BWD_TOL, "%s: dlogits vs finite differences rel err %.3g", what, e);
        free(fd);
    }
    for (int i = 2; i < N && i < 4; i++) {
        int nonzero = 0;
        for (int k = 0; k < ns; k++)
            for (int j = 0; j < s.V_l; j++) nonzero += dl[k][(size_t)i * s.V_l + j] != 0.0f;
        CHECK(nonzero == 0, "%s: ignored row %d has %d nonzero gradients", what, i, nonzero);
    }

    for (int k = 0; k < ns; k++) {
        if (!alias) free(dl[k]);
        free(sl[k]), free(losses[k]);
    }
    free(an), free(full), free(ref.logits), free(ref.probs), free(ref.losses);
    free(logits), free(targets);
}

int main(void) {
    dev = test_cpu_device(1, 0);
    kr_seed(6);
    /* embedding: one slice (v0 = 0, V_l = V), then 2 and 3 with a padded last */
    /* row chunks that do not start at a multiple of T (row0 % T != 0) */
    test_embed(2, 5, 12, 7, 1, 0, 1);
    test_embed(3, 5, 12, 7, 1, 0, 2); /* row0 7 */
    test_embed(2, 5, 12, 7, 2, 0, 5); /* V_l 4: last slice 3 valid of 4; row0 2, 4, ... */
    test_embed(2, 6, 10, 8, 3, 1, 3); /* V_l 4: last slice 0 valid; row0 4, 8 */
    test_embed(4, 16, 64, 32, 3, 2, 2);
    test_embed(4, 16, 64, 32, 1, 0, 3); /* row0 21, 42 */
    /* cross-entropy: one slice, one padded slice, 2 and 3 slices */
    test_vxent(7, 11, 1, 0, 3.0, 0.0f, 0, 1);
    test_vxent(7, 11, 1, 0, 3.0, 0.0f, 1, 1);
    test_vxent(7, 11, 1, 5, 3.0, 50.0f, 0, 1);
    test_vxent(7, 11, 2, 1, 3.0, 50.0f, 0, 1); /* V_l 7: 7 + 4 valid */
    test_vxent(7, 11, 3, 0, 3.0, 50.0f, 1, 1); /* V_l 4: 4 + 4 + 3 valid */
    test_vxent(1, 2, 2, 0, 1.0, 50.0f, 0, 1);  /* one column each */
    test_vxent(16, 64, 3, 2, 5.0, -50.0f, 0, 1);
    test_vxent(9, 301, 1, 3, 8.0, 50.0f, 0, 0); /* one padded slice, whole vectors: vxent_local */
    test_vxent(5, 300, 2, 3, 8.0, 1e30f, 1, 1);
    test_vxent(5, 300, 1, 0, 8.0, 0.0f, 0, 1);
    /* logits of size 1e4 (padding larger still): finite, the double
     * log-sum-exp; the analytic gradient only (h would be 0.1 there) */
    test_vxent(6, 9, 1, 0, 1e4, 0.0f, 1, 0);
    test_vxent(6, 9, 3, 2, 1e4, 3e4f, 0, 0);
    test_vxent(6, 9, 2, 1, 1e4, 3e4f, 1, 0);
    loom_device_free(dev);
    return check_done();
}
