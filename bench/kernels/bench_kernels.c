/* bench_kernels.c - per-kernel timings for one GPT-2 block shape.
 *
 * usage: bench_kernels [B T C NH V [threads [layers]]]
 *        (default 8 256 256 4 256, 1 thread, 4 layers)
 *
 * Times every forward and backward kernel a transformer block calls, at the
 * shapes the model uses (qkv C->3C, attention projection C->C, MLP C->4C->C,
 * tied LM head, loss, AdamW over the parameters of `layers` blocks), and
 * prints the best (minimum) time over repetitions in milliseconds - on a
 * shared machine the minimum is the time undisturbed by other jobs -, with GFLOP/s for the
 * sgemm-bound kernels. The last lines estimate one training step from these
 * parts. Compare with bench_kernels_torch.py, which times the same ops in
 * PyTorch on the same thread count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/device.h"
#include "loom/kernels.h"

#define REPS 15

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *buf(size_t n) {
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What to time: a closure over the shapes and buffers. */
typedef struct bench bench;
typedef void (*bench_fn)(bench *);

struct bench {
    loom_device *dev; /* the CPU, the asked threads */
    int B, T, C, NH, V, N;
    int32_t *tok, *tgt;
    float *wte, *wpe, *x, *dx, *x2, *mean, *rstd, *lnw, *lnb, *dlnw, *dlnb;
    float *qkv, *dqkv, *wqkv, *dwqkv, *bqkv, *dbqkv, *att, *y, *dy;
    float *wproj, *dwproj, *h, *dh, *hg, *wfc, *dwfc, *wfc2, *dwfc2, *b4, *db4;
    float *logits, *losses, *dwte, *dwpe, *xstat; /* xstat (3N): row max, sums, targets */
    float *p, *g, *m, *v;
    size_t nparams;
    double total_ms;
};

static double time_it(bench *b, bench_fn fn) {
    double t[REPS];
    fn(b); /* warm-up */
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        fn(b);
        t[r] = now_s() - t0;
    }
    qsort(t, REPS, sizeof *t, cmp_double);
    return t[0] * 1e3; /* best of REPS */
}

/* Prints one row; flops = 0 for elementwise kernels. count: calls per step. */
static void report(bench *b, const char *name, bench_fn fn, double flops, int count) {
    double ms = time_it(b, fn);
    b->total_ms += ms * count;
    if (flops > 0) printf("  %-26s %9.3f ms  %7.1f GFLOP/s  x%d\n", name, ms, flops / ms * 1e-6, count);
    else printf("  %-26s %9.3f ms                   x%d\n", name, ms, count);
}

#define MM_FLOPS(n, k, m) (2.0 * (double)(n) * (double)(k) * (double)(m))

/* embedding as one rank holding the whole vocabulary (v0 = 0) */
static void f_enc(bench *b) {
    loom_embed_fwd(b->dev, b->x, b->tok, b->wte, 0, b->V, b->N, b->C);
    loom_pos_fwd(b->dev, b->x, b->wpe, 0, b->N, b->T, b->C);
}
static void f_enc_b(bench *b) {
    loom_embed_bwd(b->dev, b->dwte, b->dx, b->tok, 0, b->V, b->N, b->C);
    loom_pos_bwd(b->dev, b->dwpe, b->dx, 0, b->N, b->T, b->C);
}
static void f_ln(bench *b) {
    loom_layernorm_fwd(b->dev, b->x2, b->mean, b->rstd, b->x, b->lnw, b->lnb, b->N, b->C);
}
static void f_ln_b(bench *b) {
    loom_layernorm_bwd(b->dev, b->dx, b->dlnw, b->dlnb, b->dy, b->x, b->lnw, b->mean, b->rstd, b->N, b->C);
}
static void f_qkv(bench *b) {
    loom_matmul_fwd(b->dev, b->qkv, b->x2, b->wqkv, b->bqkv, b->N, b->C, 3 * b->C);
}
static void f_qkv_b(bench *b) {
    loom_matmul_bwd(b->dev, b->dx, b->dwqkv, b->dbqkv, b->dqkv, b->x2, b->wqkv, b->N, b->C, 3 * b->C);
}
static void f_att(bench *b) { loom_attention_fwd(b->dev, b->y, b->att, b->qkv, b->B, b->T, b->C, b->NH); }
static void f_att_b(bench *b) {
    loom_attention_bwd(b->dev, b->dqkv, b->dy, b->qkv, b->y, b->att, b->B, b->T, b->C, b->NH);
}
static void f_proj(bench *b) { loom_matmul_fwd(b->dev, b->x2, b->y, b->wproj, b->lnb, b->N, b->C, b->C); }
static void f_proj_b(bench *b) {
    loom_matmul_bwd(b->dev, b->dy, b->dwproj, b->dlnb, b->dx, b->y, b->wproj, b->N, b->C, b->C);
}
static void f_res(bench *b) { loom_residual_fwd(b->dev, b->x2, b->x, b->x2, (size_t)b->N * b->C); }
static void f_res_b(bench *b) { loom_residual_bwd(b->dev, b->dx, b->dy, b->x2, (size_t)b->N * b->C); }
static void f_fc(bench *b) { loom_matmul_fwd(b->dev, b->h, b->x2, b->wfc, b->b4, b->N, b->C, 4 * b->C); }
static void f_fc_b(bench *b) {
    loom_matmul_bwd(b->dev, b->dx, b->dwfc, b->db4, b->dh, b->x2, b->wfc, b->N, b->C, 4 * b->C);
}
static void f_gelu(bench *b) { loom_gelu_fwd(b->dev, b->hg, b->h, (size_t)b->N * 4 * b->C); }
static void f_gelu_b(bench *b) { loom_gelu_bwd(b->dev, b->dh, b->h, b->dqkv, (size_t)b->N * 4 * b->C); }
static void f_fc2(bench *b) { loom_matmul_fwd(b->dev, b->x2, b->hg, b->wfc2, b->lnb, b->N, 4 * b->C, b->C); }
static void f_fc2_b(bench *b) {
    loom_matmul_bwd(b->dev, b->dh, b->dwfc2, b->dlnb, b->dy, b->hg, b->wfc2, b->N, 4 * b->C, b->C);
}
static void f_head(bench *b) { loom_matmul_nt_fwd(b->dev, b->logits, b->x2, b->wte, b->N, b->C, b->V); }
static void f_head_b(bench *b) {
    loom_matmul_nt_bwd(b->dev, b->dx, b->dwte, b->logits, b->x2, b->wte, b->N, b->C, b->V);
}
/* the cross-entropy as one rank runs it: the fused kernel where the backend
 * has one, else the vocab-parallel phases on one slice (no all-reduces) */
static void f_xent(bench *b) {
    if (loom_vxent_local(b->dev, b->losses, b->logits, b->tgt, b->N, b->V, b->V)) return;
    float *rowmax = b->xstat, *sum = b->xstat + b->N;
    loom_vxent_max(b->dev, rowmax, b->logits, b->N, b->V, b->V);
    loom_vxent_exp(b->dev, b->logits, sum, sum + b->N, rowmax, b->tgt, 0, b->N, b->V, b->V);
    loom_vxent_finish(b->dev, b->losses, b->logits, sum, sum + b->N, b->tgt, b->N, b->V);
}
static void f_xent_b(bench *b) {
    loom_vxent_bwd(b->dev, b->logits, b->logits, b->tgt, 1.0f / (float)b->N, 0, b->N, b->V);
}
static void f_adamw(bench *b) {
    loom_adamw_update(b->dev, b->p, b->g, b->m, b->v, b->nparams, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f);
}

static void bench_alloc(bench *b, int layers) {
    size_t N = (size_t)b->N, C = (size_t)b->C, T = (size_t)b->T;
    b->tok = malloc(N * sizeof *b->tok), b->tgt = malloc(N * sizeof *b->tgt);
    for (size_t i = 0; i < N; i++) b->tok[i] = (int32_t)(i * 7 % (size_t)b->V), b->tgt[i] = b->tok[i];
    b->wte = buf((size_t)b->V * C), b->wpe = buf(T * C), b->dwte = buf((size_t)b->V * C);
    b->dwpe = buf(T * C), b->x = buf(N * C), b->dx = buf(N * C), b->x2 = buf(N * C);
    b->mean = buf(N), b->rstd = buf(N), b->lnw = buf(C), b->lnb = buf(C), b->dlnw = buf(C);
    b->dlnb = buf(C), b->qkv = buf(N * 3 * C), b->dqkv = buf(N * 4 * C), b->wqkv = buf(C * 3 * C);
    b->dwqkv = buf(C * 3 * C), b->bqkv = buf(3 * C), b->dbqkv = buf(3 * C);
    b->att = buf((size_t)b->B * b->NH * T); /* the log-sum-exp rows */
    b->y = buf(N * C), b->dy = buf(N * C), b->wproj = buf(C * C), b->dwproj = buf(C * C);
    b->h = buf(N * 4 * C), b->dh = buf(N * 4 * C), b->hg = buf(N * 4 * C), b->wfc = buf(C * 4 * C);
    b->dwfc = buf(C * 4 * C), b->wfc2 = buf(4 * C * C), b->dwfc2 = buf(4 * C * C);
    b->b4 = buf(4 * C), b->db4 = buf(4 * C), b->logits = buf(N * (size_t)b->V), b->losses = buf(N);
    b->xstat = buf(3 * (size_t)N);
    b->nparams = (size_t)b->V * C + T * C + (size_t)layers * (12 * C * C + 13 * C) + 2 * C;
    b->p = buf(b->nparams), b->g = buf(b->nparams), b->m = buf(b->nparams);
    b->v = buf(b->nparams);
    for (size_t i = 0; i < b->nparams; i++) b->v[i] = b->v[i] * b->v[i];
}

int main(int argc, char **argv) {
    bench b = {.B = 8, .T = 256, .C = 256, .NH = 4, .V = 256};
    int threads = 1, layers = 4;
    if (argc >= 6) {
        b.B = atoi(argv[1]), b.T = atoi(argv[2]), b.C = atoi(argv[3]), b.NH = atoi(argv[4]);
        b.V = atoi(argv[5]);
    }
    if (argc >= 7) threads = atoi(argv[6]);
    if (argc >= 8) layers = atoi(argv[7]);
    b.N = b.B * b.T;
    const loom_device_opts dopts = {.name = "cpu", .threads = threads};
    if (loom_device_create(&dopts, &b.dev) != LOOM_OK) return 1;
    bench_alloc(&b, layers);
    double N = b.N, C = b.C, T = b.T;
    printf("loom kernels: B=%d T=%d C=%d NH=%d V=%d, %d thread(s), best of %d\n", b.B, b.T, b.C, b.NH, b.V,
           threads, REPS);
    printf("block (per layer, x%d):\n", layers);
    b.total_ms = 0;
    report(&b, "layernorm fwd", f_ln, 0, 2);
    report(&b, "layernorm bwd", f_ln_b, 0, 2);
    report(&b, "matmul qkv fwd", f_qkv, MM_FLOPS(N, C, 3 * C), 1);
    report(&b, "matmul qkv bwd", f_qkv_b, 2 * MM_FLOPS(N, C, 3 * C), 1);
    report(&b, "attention fwd", f_att, 2 * MM_FLOPS(b.B * T, T, C) / 2, 1);
    report(&b, "attention bwd", f_att_b, 4 * MM_FLOPS(b.B * T, T, C) / 2, 1);
    report(&b, "matmul proj fwd", f_proj, MM_FLOPS(N, C, C), 1);
    report(&b, "matmul proj bwd", f_proj_b, 2 * MM_FLOPS(N, C, C), 1);
    report(&b, "residual fwd", f_res, 0, 2);
    report(&b, "residual bwd", f_res_b, 0, 2);
    report(&b, "matmul fc fwd", f_fc, MM_FLOPS(N, C, 4 * C), 1);
    report(&b, "matmul fc bwd", f_fc_b, 2 * MM_FLOPS(N, C, 4 * C), 1);
    report(&b, "gelu fwd", f_gelu, 0, 1);
    report(&b, "gelu bwd", f_gelu_b, 0, 1);
    report(&b, "matmul fcproj fwd", f_fc2, MM_FLOPS(N, 4 * C, C), 1);
    report(&b, "matmul fcproj bwd", f_fc2_b, 2 * MM_FLOPS(N, 4 * C, C), 1);
    double block_ms = b.total_ms;
    printf("  %-26s %9.3f ms\n", "block total", block_ms);
    printf("once per step:\n");
    b.total_ms = 0;
    report(&b, "encoder fwd", f_enc, 0, 1);
    report(&b, "encoder bwd", f_enc_b, 0, 1);
    report(&b, "layernorm final fwd+bwd", f_ln, 0, 1);
    b.total_ms += time_it(&b, f_ln_b);
    report(&b, "lm head fwd", f_head, MM_FLOPS(N, C, b.V), 1);
    report(&b, "lm head bwd", f_head_b, 2 * MM_FLOPS(N, C, b.V), 1);
    report(&b, "softmax_xent fwd", f_xent, 0, 1);
    report(&b, "softmax_xent bwd", f_xent_b, 0, 1);
    report(&b, "adamw (all params)", f_adamw, 0, 1);
    double step_ms = block_ms * layers + b.total_ms;
    printf("params %zu; estimated step %.2f ms = %.0f tokens/s (kernels only)\n", b.nparams, step_ms,
           N / step_ms * 1e3);
    loom_device_free(b.dev);
    return 0;
}
