/* test_kernels_threads.c - the multi-threaded paths agree with one thread.
 *
 * Runs each kernel at sizes that give several OpenMP blocks, column slices
 * and (b, h) pairs, first on one thread and then on two, and compares every
 * output (the one-thread paths are checked against double references in the
 * other kernel tests): each count is a device of its own, both alive at
 * once. Also checks the device's thread setting and the sgemm calibration.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cpu_device.h"
#include "kref.h"
#include "loom/cpu.h"
#include "loom/kernels.h"

#define B 3
#define T 80
#define C 96
#define NH 4
#define V 50
#define V0 10 /* the embedding slice [V0, V0 + VS) of the vocabulary */
#define VS 30
#define VL (V + 6) /* cross-entropy: one slice with 6 padding columns */
#define N (B * T)

/* All the inputs, and one buffer per output, of every kernel. */
typedef struct {
    int32_t tok[N], tgt[N];
    float *wte, *wpe, *x, *w, *bias, *qkv, *dy, *dqkv_in;
    /* outputs */
    float *enc, *dwte, *dwpe, *dlogits, *ln, *mean, *rstd, *dln, *dlnw, *dlnb, *mm, *dmmx, *dmmw, *dmmb;
    float *att_out, *att, *dqkv, *gelu, *dgelu, *probs, *losses, *p, *m, *v;
    double sumsq;
} run_t;

static void run_alloc(run_t *r) {
    r->enc = kr_floats(N * C), r->dwte = calloc(VS * C, sizeof(float)),
    r->dwpe = calloc(T * C, sizeof(float));
    r->ln = kr_floats(N * C), r->mean = kr_floats(N), r->rstd = kr_floats(N);
    r->dln = calloc(N * C, sizeof(float)), r->dlnw = calloc(C, sizeof(float)),
    r->dlnb = calloc(C, sizeof(float));
    r->mm = kr_floats(N * 3 * C), r->dmmx = calloc(N * C, sizeof(float)),
    r->dmmw = calloc(C * 3 * C, sizeof(float));
    r->dmmb = calloc(3 * C, sizeof(float)), r->att_out = kr_floats(N * C), r->att = kr_floats(B * NH * T);
    r->dqkv = calloc(N * 3 * C, sizeof(float)), r->gelu = kr_floats(N * 3 * C),
    r->dgelu = calloc(N * 3 * C, sizeof(float));
    r->probs = kr_copy(r->qkv, N * VL), r->losses = kr_floats(N); /* rows of qkv as logits */
    r->dlogits = kr_floats(N * VL);
    r->p = kr_copy(r->x, N * C), r->m = calloc(N * C, sizeof(float)), r->v = calloc(N * C, sizeof(float));
}

static void run_kernels(loom_device *dev, run_t *r) {
    float *xbuf = kr_floats(3 * N);
    loom_embed_fwd(dev, r->enc, r->tok, r->wte + V0 * C, V0, VS, N, C);
    loom_pos_fwd(dev, r->enc, r->wpe, 0, N / 2, T, C);
    loom_pos_fwd(dev, r->enc + (N / 2) * C, r->wpe, N / 2, N - N / 2, T, C); /* row0 != 0 */
    loom_embed_bwd(dev, r->dwte, r->dy, r->tok, V0, VS, N, C);
    loom_pos_bwd(dev, r->dwpe, r->dy, 0, N / 2, T, C);
    loom_pos_bwd(dev, r->dwpe, r->dy + (N / 2) * C, N / 2, N - N / 2, T, C);
    loom_layernorm_fwd(dev, r->ln, r->mean, r->rstd, r->x, r->w, r->bias, N, C);
    loom_layernorm_bwd(dev, r->dln, r->dlnw, r->dlnb, r->dy, r->x, r->w, r->mean, r->rstd, N, C);
    loom_matmul_fwd(dev, r->mm, r->x, r->wte, r->bias, N, C, 3 * C); /* wte as a (C,3C) weight */
    loom_matmul_bwd(dev, r->dmmx, r->dmmw, r->dmmb, r->dqkv_in, r->x, r->wte, N, C, 3 * C);
    loom_attention_fwd(dev, r->att_out, r->att, r->qkv, B, T, C, NH);
    loom_attention_bwd(dev, r->dqkv, r->dy, r->qkv, r->att_out, r->att, B, T, C, NH);
    loom_gelu_fwd(dev, r->gelu, r->qkv, N * 3 * C);
    loom_gelu_bwd(dev, r->dgelu, r->qkv, r->dqkv_in, N * 3 * C);
    loom_vxent_max(dev, xbuf, r->probs, N, VL, V);
    loom_vxent_exp(dev, r->probs, xbuf + N, xbuf + 2 * N, xbuf, r->tgt, 0, N, VL, V);
    loom_vxent_finish(dev, r->losses, r->probs, xbuf + N, xbuf + 2 * N, r->tgt, N, VL);
    loom_vxent_bwd(dev, r->dlogits, r->probs, r->tgt, 1.0f / N, 0, N, VL);
    free(xbuf);
    loom_adamw_update(dev, r->p, r->dy, r->m, r->v, N * C, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.625f);
    r->sumsq = loom_sumsq(dev, r->qkv, N * 3 * C);
}

static void compare(const float *a, const float *b, size_t n, const char *what) {
    double *bd = kr_widen(b, n);
    double e = kr_err(a, bd, n);
    CHECK(e <= KR_FWD_TOL, "2 threads vs 1: %s rel err %.3g", what, e);
    free(bd);
}

static void test_two_threads(void) {
    run_t one, two;
    kr_seed(5);
    for (int i = 0; i < N; i++) one.tok[i] = kr_randint(V), one.tgt[i] = kr_randint(V);
    one.tgt[1] = -1; /* ignored */
    one.wte = kr_rand_floats(V * C > C * 3 * C ? V * C : C * 3 * C, -1, 1);
    one.wpe = kr_rand_floats(T * C, -1, 1), one.x = kr_rand_floats(N * C, -1, 1);
    one.w = kr_rand_floats(C, 0.5, 1.5), one.bias = kr_rand_floats(3 * C, -1, 1);
    one.qkv = kr_rand_floats(N * 3 * C, -2, 2), one.dy = kr_rand_floats(N * C, -1, 1);
    one.dqkv_in = kr_rand_floats(N * 3 * C, -1, 1);
    two = one;
    run_alloc(&one);
    run_alloc(&two);
    loom_device *d1 = test_cpu_device(1, 0), *d2 = test_cpu_device(2, 0);
    CHECK(d2->threads == 2, "a device made for 2 threads has %d", d2->threads);
    run_kernels(d1, &one);
    run_kernels(d2, &two);
    loom_device_free(d1);
    loom_device_free(d2);

    compare(two.enc, one.enc, N * C, "embed+pos out");
    compare(two.dwte, one.dwte, VS * C, "embed dwte");
    compare(two.dwpe, one.dwpe, T * C, "pos dwpe");
    compare(two.ln, one.ln, N * C, "layernorm out");
    compare(two.dln, one.dln, N * C, "layernorm dinp");
    compare(two.dlnw, one.dlnw, C, "layernorm dw");
    compare(two.dlnb, one.dlnb, C, "layernorm db");
    compare(two.mm, one.mm, N * 3 * C, "matmul out");
    compare(two.dmmx, one.dmmx, N * C, "matmul dinp");
    compare(two.dmmw, one.dmmw, C * 3 * C, "matmul dw");
    compare(two.dmmb, one.dmmb, 3 * C, "matmul db");
    compare(two.att_out, one.att_out, N * C, "attention out");
    compare(two.att, one.att, B * NH * T, "attention lse");
    compare(two.dqkv, one.dqkv, N * 3 * C, "attention dqkv");
    compare(two.gelu, one.gelu, N * 3 * C, "gelu out");
    compare(two.dgelu, one.dgelu, N * 3 * C, "gelu dinp");
    compare(two.probs, one.probs, N * VL, "vxent probs");
    compare(two.losses, one.losses, N, "vxent losses");
    compare(two.dlogits, one.dlogits, N * VL, "vxent dlogits");
    compare(two.p, one.p, N * C, "adamw p");
    /* the blocks' partials are added in block order whatever the threads: the same double */
    CHECK(two.sumsq == one.sumsq, "sumsq %.17g (2 threads) vs %.17g (1)", two.sumsq, one.sumsq);

    run_t *runs[2] = {&one, &two};
    for (int k = 0; k < 2; k++) {
        run_t *r = runs[k];
        float *bufs[] = {r->enc,  r->dwte,  r->dwpe,  r->ln,     r->mean,    r->rstd,    r->dln, r->dlnw,
                         r->dlnb, r->mm,    r->dmmx,  r->dmmw,   r->dmmb,    r->att_out, r->att, r->dqkv,
                         r->gelu, r->dgelu, r->probs, r->losses, r->dlogits, r->p,       r->m,   r->v};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    }
    free(one.wte), free(one.wpe), free(one.x), free(one.w), free(one.bias), free(one.qkv);
    free(one.dy), free(one.dqkv_in);
}

/* sumsq over several windows of blocks at 1, 2 and 3 threads against a
 * double sum in block order; all_finite and zero on the threaded paths. */
static void test_flat_helpers(void) {
    const size_t n = 600 * 16384 + 123; /* > one 512-block window of loom_sumsq */
    float *x = kr_rand_floats(n, -1, 1);
    double ref = 0.0;
    for (size_t lo = 0; lo < n; lo += 16384) {
        double blk = 0.0;
        for (size_t i = lo; i < n && i < lo + 16384; i++) blk += (double)x[i] * x[i];
        ref += blk;
    }
    double s[3];
    loom_device *devs[3];
    for (int t = 1; t <= 3; t++) {
        loom_device *dev = devs[t - 1] = test_cpu_device(t, 0);
        s[t - 1] = loom_sumsq(dev, x, n);
        CHECK(loom_all_finite(dev, x, n), "all_finite on finite data, %d threads", t);
        float keep = x[n - 7];
        x[n - 7] = NAN;
        CHECK(!loom_all_finite(dev, x, n), "all_finite misses a NaN near the end, %d threads", t);
        x[n - 7] = keep;
    }
    CHECK(fabs(s[0] - ref) <= 1e-12 * ref, "sumsq %.17g vs double %.17g", s[0], ref);
    CHECK(s[1] == s[0] && s[2] == s[0], "sumsq differs across threads: %.17g %.17g %.17g", s[0], s[1], s[2]);
    loom_tensor_zero(devs[1], x + 1, n - 2); /* 2 threads, the CPU backend: loom_cpu_zero */
    size_t nz = 0;
    for (size_t i = 1; i < n - 1; i++) nz += x[i] != 0.0f;
    CHECK(nz == 0 && x[0] != 0.0f && x[n - 1] != 0.0f, "zero: %zu nonzero inside, ends %g %g", nz, x[0],
          x[n - 1]);
    for (int t = 0; t < 3; t++) loom_device_free(devs[t]);
    free(x);
}

/* A long sum into a small C - the LM head's input gradient - is cut along K
 * on several threads (gemm.c): added onto what C held (beta 1), every part
 * counted once, at 1, 2 and 3 threads (3 parts, the last one shorter),
 * against a double reference. */
static void test_long_k(void) {
    enum { M = 24, KC = 20, KV = 2000 + 77 }; /* rows, columns of C, the long vocabulary */
    float *dl = kr_rand_floats((size_t)M * KV, -1, 1), *w = kr_rand_floats((size_t)KV * KC, -1, 1);
    float *x = kr_rand_floats(M * KC, -1, 1), *c0 = kr_rand_floats(M * KC, -1, 1);
    double *ref = kr_doubles(M * KC);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < KC; j++) {
            double s = c0[i * KC + j];
            for (int k = 0; k < KV; k++) s += (double)dl[(size_t)i * KV + k] * w[(size_t)k * KC + j];
            ref[i * KC + j] = s;
        }
    float *c = kr_floats(M * KC);
    for (int t = 1; t <= 3; t++) {
        loom_device *dev = test_cpu_device(t, 0);
        memcpy(c, c0, M * KC * sizeof *c);
        loom_matmul_nt_bwd(dev, c, NULL, dl, x, w, M, KC, KV); /* dinp += dlogits wte */
        double e = kr_err(c, ref, M * KC);
        CHECK(e <= KR_FWD_TOL, "long-K input gradient on %d thread(s): rel err %.3g", t, e);
        loom_device_free(dev);
    }
    free(dl), free(w), free(x), free(c0), free(ref), free(c);
}

static void test_settings(void) {
    loom_device *d3 = test_cpu_device(3, 0), *d0 = test_cpu_device(0, 0);
    CHECK(d3->threads == 3, "a device for 3 threads has %d", d3->threads);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(d0->threads == (cpus > 0 ? cpus : 1), "a device for 0 threads has %d, %ld CPUs are online",
          d0->threads, cpus);
    loom_device_free(d3);
    loom_device_free(d0);
    double flops = loom_kernels_calibrate_sgemm(1, 3);
    printf("sgemm on 1 thread: %.1f GFLOP/s\n", flops * 1e-9);
    CHECK(flops > 1e9 && flops < 1e14, "calibrate_sgemm: %.3g FLOP/s", flops);
}

int main(void) {
    test_two_threads();
    test_flat_helpers();
    test_long_k();
    test_settings();
    return check_done();
}
