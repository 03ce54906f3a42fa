/* test_cuda_kernels.c - every CUDA kernel against the CPU kernel it mirrors.
 *
 * For each kernel of include/loom/kernel_list.h (against the CPU device's):
 * random inputs (odd sizes, so no tile or
 * warp divides them), the CPU kernel on host buffers, loom_cuda_X on device
 * copies of the same buffers, and a comparison of every output - including
 * outputs that accumulate (+=), which start from the same non-zero values on
 * both sides. Errors are max|gpu - cpu| / max|cpu| over a tensor
 * (check_max_rel_err). Bounds:
 *   fp32 (TF32 off)        1e-5
 *   bf16 GEMM operands     1e-4 against the CPU's bf16 mode (the same
 *                          rounding of the operands; only the order of the
 *                          fp32 sums differs)
 *   TF32 GEMM              5e-3 against fp32 (operands keep 10 mantissa bits)
 * Exit 77 (ctest's skip code) only when cudaGetDeviceCount sees no device.
 * Built at all, this binary is also the check that loom_cuda links. The same
 * source also runs, without a GPU, against the kernels built for a CPU
 * emulation of CUDA (tests/gpu/emu/run_emu.sh, ctest cuda_kernels_emu).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_backend.h"
#include "loom/device.h"
#include "loom/cpu.h"
#include "loom/kernels.h"

#define TOL 1e-5
#define TOL_BF16 1e-4
#define TOL_TF32 5e-3

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* The CPU kernels as the reference, in fp32 and in bf16 (one thread each),
 * and the CUDA kernels' context. */
static loom_device *cpu, *cpu_bf16;
static loom_cuda_ctx *gpu;

static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *host_rand(size_t n, float scale) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = frand() * scale;
    return h;
}

static float *host_copy(const float *src, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    memcpy(h, src, n * sizeof *h);
    return h;
}

static void *dev_from(const void *h, size_t bytes) {
    void *d = loom_cuda_alloc(bytes);
    CHECK(d != NULL, "device alloc of %zu bytes: %s", bytes, loom_errmsg());
    if (d) CHECK(loom_cuda_memcpy_h2d(d, h, bytes) == LOOM_OK, "h2d: %s", loom_errmsg());
    return d;
}

/* The device buffer's contents compared with the CPU's result; frees d. */
static void expect_close(const char *what, float *d, const float *cpu, size_t n, double tol) {
    float *g = malloc((n ? n : 1) * sizeof *g);
    CHECK(loom_cuda_sync() == LOOM_OK, "%s: %s", what, loom_errmsg());
    CHECK(loom_cuda_memcpy_d2h(g, d, n * sizeof *g) == LOOM_OK, "%s d2h: %s", what, loom_errmsg());
    double e = check_max_rel_err(g, cpu, n);
    CHECK(e <= tol, "%s: max rel err %.3g > %.1g", what, e, tol);
    free(g);
    loom_cuda_free(d);
}

/* ---- dense ------------------------------------------------------------------ */

static void test_layernorm(int N, int C) {
    float *inp = host_rand((size_t)N * C, 2.0f), *w = host_rand(C, 1.0f), *b = host_rand(C, 1.0f);
    float *out = malloc((size_t)N * C * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    float *d_inp = dev_from(inp, (size_t)N * C * 4), *d_w = dev_from(w, C * 4), *d_b = dev_from(b, C * 4);
    float *d_out = loom_cuda_alloc((size_t)N * C * 4), *d_mean = loom_cuda_alloc(N * 4),
          *d_rstd = loom_cuda_alloc(N * 4);
    loom_layernorm_fwd(cpu, out, mean, rstd, inp, w, b, N, C);
    loom_cuda_layernorm_fwd(gpu, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    expect_close("layernorm_fwd out", d_out, out, (size_t)N * C, TOL);
    float *dout = host_rand((size_t)N * C, 1.0f), *dinp = host_rand((size_t)N * C, 0.5f);
    float *dw = host_rand(C, 0.5f), *db = host_rand(C, 0.5f);
    float *d_dout = dev_from(dout, (size_t)N * C * 4), *d_dinp = dev_from(dinp, (size_t)N * C * 4);
    float *d_dw = dev_from(dw, C * 4), *d_db = dev_from(db, C * 4);
    float *d_db2 = dev_from(db, C * 4), *db2 = host_copy(db, C);
    loom_layernorm_bwd(cpu, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    loom_cuda_layernorm_bwd(gpu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    loom_layernorm_bwd(cpu, NULL, NULL, db2, dout, inp, w, mean, rstd, N, C); /* only db */
    loom_cuda_layernorm_bwd(gpu, NULL, NULL, d_db2, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    expect_close("layernorm_bwd dinp", d_dinp, dinp, (size_t)N * C, TOL);
    expect_close("layernorm_bwd dw", d_dw, dw, C, TOL);
    expect_close("layernorm_bwd db", d_db, db, C, TOL);
    expect_close("layernorm_bwd db alone", d_db2, db2, C, TOL);
    expect_close("layernorm_fwd mean", d_mean, mean, N, TOL);
    expect_close("layernorm_fwd rstd", d_rstd, rstd, N, TOL);
    loom_cuda_free(d_inp), loom_cuda_free(d_w), loom_cuda_free(d_b), loom_cuda_free(d_dout);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp), free(dw),
        free(db), free(db2);
}

/* matmul fwd/bwd and the tied head, at the given GPU precision and bound
 * (CPU precision: bf16 mode when gpu_mode is BF16, else fp32). */
static void test_matmul(int N, int C, int OC, int gpu_mode, double tol) {
    const char *tag = gpu_mode == LOOM_CUDA_BF16 ? "bf16" : gpu_mode == LOOM_CUDA_TF32 ? "tf32" : "fp32";
    char what[96];
    loom_device *mm = gpu_mode == LOOM_CUDA_BF16 ? cpu_bf16 : cpu; /* the CPU's precision */
    loom_cuda_set_precision(gpu, gpu_mode);
    size_t nin = (size_t)N * C, nout = (size_t)N * OC, nw = (size_t)C * OC;
    float *inp = host_rand(nin, 1.0f), *w = host_rand(nw, 0.5f), *b = host_rand(OC, 0.5f);
    float *out = malloc(nout * 4), *out_nb = malloc(nout * 4);
    float *d_inp = dev_from(inp, nin * 4), *d_w = dev_from(w, nw * 4), *d_b = dev_from(b, OC * 4);
    float *d_out = loom_cuda_alloc(nout * 4), *d_out_nb = loom_cuda_alloc(nout * 4);
    loom_matmul_fwd(mm, out, inp, w, b, N, C, OC);
    loom_matmul_fwd(mm, out_nb, inp, w, NULL, N, C, OC);
    loom_cuda_matmul_fwd(gpu, d_out, d_inp, d_w, d_b, N, C, OC);
    loom_cuda_matmul_fwd(gpu, d_out_nb, d_inp, d_w, NULL, N, C, OC);
    snprintf(what, sizeof what, "matmul_fwd %s", tag), expect_close(what, d_out, out, nout, tol);
    snprintf(what, sizeof what, "matmul_fwd no bias %s", tag),
        expect_close(what, d_out_nb, out_nb, nout, tol);
    /* operands 4 bytes past an aligned address: cuBLASLt told the real alignment
     * (inp), and the fallback without cuBLASLt (bias, which must be 16-byte aligned) */
    float *d_inp1 = loom_cuda_alloc((nin + 1) * 4), *d_b1 = loom_cuda_alloc((OC + 1) * 4);
    loom_cuda_memcpy_h2d(d_inp1 + 1, inp, nin * 4);
    loom_cuda_memcpy_h2d(d_b1 + 1, b, OC * 4);
    float *d_o1 = loom_cuda_alloc(nout * 4), *d_o2 = loom_cuda_alloc(nout * 4);
    loom_cuda_matmul_fwd(gpu, d_o1, d_inp1 + 1, d_w, d_b, N, C, OC);
    loom_cuda_matmul_fwd(gpu, d_o2, d_inp, d_w, d_b1 + 1, N, C, OC);
    snprintf(what, sizeof what, "matmul_fwd inp +4 bytes %s", tag), expect_close(what, d_o1, out, nout, tol);
    snprintf(what, sizeof what, "matmul_fwd bias +4 bytes %s", tag), expect_close(what, d_o2, out, nout, tol);
    loom_cuda_free(d_inp1), loom_cuda_free(d_b1);
    float *dout = host_rand(nout, 1.0f), *dinp = host_rand(nin, 1.0f), *dw = host_rand(nw, 1.0f),
          *db = host_rand(OC, 1.0f);
    float *d_dout = dev_from(dout, nout * 4), *d_dinp = dev_from(dinp, nin * 4), *d_dw = dev_from(dw, nw * 4),
          *d_db = dev_from(db, OC * 4);
    loom_matmul_bwd(mm, dinp, dw, db, dout, inp, w, N, C, OC);
    loom_cuda_matmul_bwd(gpu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    snprintf(what, sizeof what, "matmul_bwd dinp %s", tag), expect_close(what, d_dinp, dinp, nin, tol);
    snprintf(what, sizeof what, "matmul_bwd dw %s", tag), expect_close(what, d_dw, dw, nw, tol);
    snprintf(what, sizeof what, "matmul_bwd db %s", tag), expect_close(what, d_db, db, OC, TOL);
    /* tied head: V = OC rows of wte (V, C) */
    int V = OC;
    float *wte = host_rand((size_t)V * C, 0.5f), *logits = malloc(nout * 4);
    float *d_wte = dev_from(wte, (size_t)V * C * 4), *d_logits = loom_cuda_alloc(nout * 4);
    loom_matmul_nt_fwd(mm, logits, inp, wte, N, C, V);
    loom_cuda_matmul_nt_fwd(gpu, d_logits, d_inp, d_wte, N, C, V);
    snprintf(what, sizeof what, "matmul_nt_fwd %s", tag), expect_close(what, d_logits, logits, nout, tol);
    float *dinp2 = host_rand(nin, 1.0f), *dwte = host_rand((size_t)V * C, 1.0f);
    float *d_dinp2 = dev_from(dinp2, nin * 4), *d_dwte = dev_from(dwte, (size_t)V * C * 4);
    loom_matmul_nt_bwd(mm, dinp2, dwte, dout, inp, wte, N, C, V);
    loom_cuda_matmul_nt_bwd(gpu, d_dinp2, d_dwte, d_dout, d_inp, d_wte, N, C, V);
    snprintf(what, sizeof what, "matmul_nt_bwd dinp %s", tag), expect_close(what, d_dinp2, dinp2, nin, tol);
    snprintf(what, sizeof what, "matmul_nt_bwd dwte %s", tag),
        expect_close(what, d_dwte, dwte, (size_t)V * C, tol);
    loom_cuda_free(d_inp), loom_cuda_free(d_w), loom_cuda_free(d_b), loom_cuda_free(d_dout),
        loom_cuda_free(d_wte);
    free(inp), free(w), free(b), free(out), free(out_nb), free(dout), free(dinp), free(dw), free(db),
        free(wte), free(logits), free(dinp2), free(dwte);
    loom_cuda_set_precision(gpu, LOOM_CUDA_FP32);
}

static void test_elementwise(size_t n) {
    float *x = host_rand(n, 6.0f), *y = host_rand(n, 1.0f), *out = malloc(n * 4);
    x[0] = 40.0f, x[1] = -40.0f, x[2] = 0.0f; /* saturated tails */
    float *d_x = dev_from(x, n * 4), *d_y = dev_from(y, n * 4), *d_out = loom_cuda_alloc(n * 4);
    loom_gelu_fwd(cpu, out, x, n);
    loom_cuda_gelu_fwd(gpu, d_out, d_x, n);
    expect_close("gelu_fwd", d_out, out, n, TOL);
    float *dinp = host_rand(n, 1.0f), *d_dinp = dev_from(dinp, n * 4);
    loom_gelu_bwd(cpu, dinp, x, y, n);
    loom_cuda_gelu_bwd(gpu, d_dinp, d_x, d_y, n);
    expect_close("gelu_bwd", d_dinp, dinp, n, TOL);
    float *res = malloc(n * 4), *d_res = loom_cuda_alloc(n * 4);
    loom_residual_fwd(cpu, res, x, y, n);
    loom_cuda_residual_fwd(gpu, d_res, d_x, d_y, n);
    expect_close("residual_fwd", d_res, res, n, TOL);
    float *da = host_rand(n, 1.0f), *db = host_rand(n, 1.0f);
    float *d_da = dev_from(da, n * 4), *d_db = dev_from(db, n * 4);
    loom_residual_bwd(cpu, da, db, y, n);
    loom_cuda_residual_bwd(gpu, d_da, d_db, d_y, n);
    expect_close("residual_bwd da", d_da, da, n, TOL);
    expect_close("residual_bwd db", d_db, db, n, TOL);
    /* AdamW, step 3 (bias corrections != 1), weight decay on */
    float *p = host_rand(n, 1.0f), *m = host_rand(n, 0.1f), *v = host_rand(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *d_p = dev_from(p, n * 4), *d_m = dev_from(m, n * 4), *d_v = dev_from(v, n * 4);
    loom_adamw_update(cpu, p, y, m, v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.75f);
    loom_cuda_adamw_update(gpu, d_p, d_y, d_m, d_v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.75f);
    expect_close("adamw p", d_p, p, n, TOL);
    expect_close("adamw m", d_m, m, n, TOL);
    expect_close("adamw v", d_v, v, n, TOL);
    /* whole-buffer helpers */
    double s_cpu = loom_sumsq(cpu, x, n), s_gpu = loom_cuda_sumsq(gpu, d_x, n);
    CHECK(fabs(s_gpu - s_cpu) <= 1e-9 * s_cpu, "sumsq %.17g vs cpu %.17g", s_gpu, s_cpu);
    CHECK(loom_cuda_all_finite(gpu, d_x, n) == 1, "all_finite on finite data");
    float bad = NAN;
    loom_cuda_memcpy_h2d(d_x + n / 2, &bad, sizeof bad);
    CHECK(loom_cuda_all_finite(gpu, d_x, n) == 0, "all_finite misses a NaN");
    float *sc = host_copy(y, n), *r = malloc(n * 4), *d_r = loom_cuda_alloc(n * 4);
    loom_scale(cpu, sc, n, 0.37f);
    loom_cuda_scale(gpu, d_y, n, 0.37f);
    loom_round_bf16(cpu, r, sc, n);
    loom_cuda_round_bf16(gpu, d_r, d_y, n);
    expect_close("scale", d_y, sc, n, 0.0);
    expect_close("round_bf16", d_r, r, n, 0.0);
    loom_cuda_free(d_x);
    free(x), free(y), free(out), free(dinp), free(res), free(da), free(db), free(p), free(m), free(v),
        free(sc), free(r);
}

/* ---- routing and row ops (backend.h; CPU: loom_backend_cpu) ------------------- */

static int32_t *dev_i32(const int32_t *h, size_t n) { return dev_from(h, (n ? n : 1) * 4); }

static void test_routing(int N, int n, int k, int C) {
    const size_t Nn = (size_t)N * n, Nk = (size_t)N * k;
    /* softmax with lse and the z sum */
    float *x = host_rand(Nn, 4.0f), *lse = malloc(N * 4), *d_x = dev_from(x, Nn * 4),
          *d_lse = loom_cuda_alloc(N * 4);
    double z_cpu = loom_tensor_softmax_lse(cpu, x, lse, N, n);
    double z_gpu = loom_cuda_tensor_softmax_lse(gpu, d_x, d_lse, N, n);
    CHECK(fabs(z_gpu - z_cpu) <= 1e-9 * z_cpu, "softmax_lse z %.17g vs cpu %.17g", z_gpu, z_cpu);
    expect_close("softmax_lse p", d_x, x, Nn, TOL);
    expect_close("softmax_lse lse", d_lse, lse, N, TOL);
    /* top-k on the CPU's probabilities (so the choices must agree exactly) */
    float *bias = host_rand(n, 0.02f), *gate = malloc(Nk * 4), *d_p = dev_from(x, Nn * 4),
          *d_bias = dev_from(bias, n * 4), *d_gate = loom_cuda_alloc(Nk * 4);
    int32_t *sel = malloc(Nk * 4), *gsel = malloc(Nk * 4), *d_sel = loom_cuda_alloc(Nk * 4);
    for (int norm = 0; norm < 2; norm++) {
        loom_tensor_topk_gate(cpu, sel, gate, x, bias, N, n, k, norm);
        loom_cuda_tensor_topk_gate(gpu, d_sel, d_gate, d_p, d_bias, N, n, k, norm);
        CHECK(loom_cuda_memcpy_d2h(gsel, d_sel, Nk * 4) == LOOM_OK, "sel d2h");
        CHECK(memcmp(gsel, sel, Nk * 4) == 0, "topk_gate norm %d: choices differ", norm);
        float *g = malloc(Nk * 4);
        CHECK(loom_cuda_memcpy_d2h(g, d_gate, Nk * 4) == LOOM_OK, "gate d2h");
        CHECK(check_max_rel_err(g, gate, Nk) <= TOL, "topk_gate norm %d: gates", norm);
        free(g);
    }
    /* backward: 3 groups of counts, rows assigned at random; dp starts dirty */
    float *dgate = host_rand(Nk, 1.0f), *dx = host_rand(Nn, 1.0f), *dp = host_rand(Nn, 1.0f);
    int32_t tab[3 * 64], *grp = malloc(N * 4);
    for (int i = 0; i < 3 * n; i++) tab[i] = (int32_t)((frand() + 1.0f) * 20.0f);
    for (int i = 0; i < N; i++) grp[i] = (int32_t)((frand() + 1.0f) * 1.5f) % 3;
    float *d_dgate = dev_from(dgate, Nk * 4), *d_dx = dev_from(dx, Nn * 4), *d_dp = dev_from(dp, Nn * 4),
          *d_lse2 = dev_from(lse, N * 4), *d_gate2 = dev_from(gate, Nk * 4);
    int32_t *d_tab = dev_i32(tab, 3 * (size_t)n), *d_grp = dev_i32(grp, N), *d_sel2 = dev_i32(sel, Nk);
    loom_tensor_topk_gate_bwd(cpu, dx, dp, dgate, sel, gate, x, lse, tab, grp, 3e-3f, 0.7f, N, n, k, 1);
    loom_cuda_tensor_topk_gate_bwd(gpu, d_dx, d_dp, d_dgate, d_sel2, d_gate2, d_p, d_lse2, d_tab, d_grp,
                                   3e-3f, 0.7f, N, n, k, 1);
    expect_close("topk_gate_bwd dx", d_dx, dx, Nn, TOL);
    /* gather and scatter-add by an index list with repeats (M source rows) */
    const int M = N + 5, A = (int)Nk;
    float *src = host_rand((size_t)M * C, 1.0f), *dst = host_rand((size_t)A * C, 1.0f);
    int32_t *idx = malloc(A * 4);
    for (int r = 0; r < A; r++) idx[r] = (int32_t)((frand() + 1.0f) * 0.5f * M) % M;
    float *d_src = dev_from(src, (size_t)M * C * 4), *d_dst = dev_from(dst, (size_t)A * C * 4);
    int32_t *d_idx = dev_i32(idx, A);
    loom_tensor_gather_rows(cpu, dst, src, idx, A, C);
    loom_cuda_tensor_gather_rows(gpu, d_dst, d_src, d_idx, A, C);
    expect_close("gather_rows", d_dst, dst, (size_t)A * C, 0.0);
    float *acc = host_rand((size_t)M * C, 1.0f), *d_acc = dev_from(acc, (size_t)M * C * 4);
    float *rows = host_rand((size_t)A * C, 1.0f), *d_rows = dev_from(rows, (size_t)A * C * 4);
    loom_tensor_scatter_add_rows(cpu, acc, rows, idx, A, C);
    loom_cuda_tensor_scatter_add_rows(gpu, d_acc, d_rows, d_idx, A, C);
    expect_close("scatter_add_rows", d_acc, acc, (size_t)M * C, 0.0);
    /* combine: each choice its own row (a permutation), every fourth dropped */
    int32_t *row = malloc(Nk * 4);
    for (int t = 0; t < A; t++) row[t] = t % 4 == 3 ? -1 : (int32_t)((size_t)t * 7 % (size_t)A);
    float *y = host_rand((size_t)A * C, 1.0f), *out = host_rand((size_t)N * C, 1.0f),
          *dout = host_rand((size_t)N * C, 1.0f), *dy = host_rand((size_t)A * C, 1.0f),
          *dw = host_rand(Nk, 1.0f);
    float *d_y = dev_from(y, (size_t)A * C * 4), *d_out = dev_from(out, (size_t)N * C * 4),
          *d_dout = dev_from(dout, (size_t)N * C * 4), *d_dy = dev_from(dy, (size_t)A * C * 4),
          *d_dw = dev_from(dw, Nk * 4);
    int32_t *d_row = dev_i32(row, Nk);
    loom_tensor_combine_rows(cpu, out, y, row, gate, N, k, C);
    loom_cuda_tensor_combine_rows(gpu, d_out, d_y, d_row, d_gate2, N, k, C);
    expect_close("combine_rows", d_out, out, (size_t)N * C, TOL);
    loom_tensor_combine_rows_bwd(cpu, dy, dw, dout, y, row, gate, N, k, C);
    loom_cuda_tensor_combine_rows_bwd(gpu, d_dy, d_dw, d_dout, d_y, d_row, d_gate2, N, k, C);
    expect_close("combine_rows_bwd dy", d_dy, dy, (size_t)A * C, TOL);
    expect_close("combine_rows_bwd dw", d_dw, dw, Nk, TOL);
    /* fill with -inf */
    float *f = malloc((size_t)A * C * 4), *d_f = loom_cuda_alloc((size_t)A * C * 4);
    loom_cuda_tensor_fill(gpu, d_f, (size_t)A * C, -INFINITY);
    CHECK(loom_cuda_memcpy_d2h(f, d_f, (size_t)A * C * 4) == LOOM_OK, "fill d2h");
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)A * C; i++) bad += !(isinf(f[i]) && f[i] < 0);
    CHECK(bad == 0, "fill: %zu of %zu not -inf", bad, (size_t)A * C);
    loom_cuda_free(d_f), loom_cuda_free(d_p), loom_cuda_free(d_bias), loom_cuda_free(d_gate);
    loom_cuda_free(d_sel), loom_cuda_free(d_dgate), loom_cuda_free(d_dp), loom_cuda_free(d_lse2);
    loom_cuda_free(d_gate2), loom_cuda_free(d_tab), loom_cuda_free(d_grp), loom_cuda_free(d_sel2);
    loom_cuda_free(d_src), loom_cuda_free(d_idx), loom_cuda_free(d_rows), loom_cuda_free(d_y);
    loom_cuda_free(d_dout), loom_cuda_free(d_row);
    free(x), free(lse), free(bias), free(gate), free(sel), free(gsel), free(dgate), free(dx), free(dp);
    free(grp), free(src), free(dst), free(idx), free(acc), free(rows), free(row), free(y), free(out);
    free(dout), free(dy), free(dw), free(f);
}

/* ---- attention ---------------------------------------------------------------- */

static void test_attention(int B, int T, int C, int NH) {
    char what[96];
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = host_rand(nqkv, 1.5f), *out = malloc(nout * 4), *lse = malloc(nl * 4);
    float *d_qkv = dev_from(qkv, nqkv * 4), *d_out = loom_cuda_alloc(nout * 4),
          *d_lse = loom_cuda_alloc(nl * 4);
    loom_attention_fwd(cpu, out, lse, qkv, B, T, C, NH);
    loom_cuda_attention_fwd(gpu, d_out, d_lse, d_qkv, B, T, C, NH);
    float *dout = host_rand(nout, 1.0f), *dqkv = host_rand(nqkv, 0.5f);
    float *d_dout = dev_from(dout, nout * 4), *d_dqkv = dev_from(dqkv, nqkv * 4);
    loom_attention_bwd(cpu, dqkv, dout, qkv, out, lse, B, T, C, NH);
    loom_cuda_attention_bwd(gpu, d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C,
                            NH); /* from the GPU's own fwd */
    snprintf(what, sizeof what, "attention_fwd out B%d T%d C%d NH%d", B, T, C, NH);
    expect_close(what, d_out, out, nout, TOL);
    snprintf(what, sizeof what, "attention_fwd lse B%d T%d C%d NH%d", B, T, C, NH);
    expect_close(what, d_lse, lse, nl, TOL);
    snprintf(what, sizeof what, "attention_bwd dqkv B%d T%d C%d NH%d", B, T, C, NH);
    expect_close(what, d_dqkv, dqkv, nqkv, TOL);
    loom_cuda_free(d_qkv), loom_cuda_free(d_dout);
    free(qkv), free(out), free(lse), free(dout), free(dqkv);
}

/* Context parallelism's pieces: the second half of a sequence's queries
 * against the first half's keys, then (accumulate) against its own; a merge
 * of two partial results; the part backward; and the KV-cache decode. */
static void test_attention_parts(int B, int T, int C, int NH) {
    int HS = C / NH, Th = T / 2, Tq = T - Th;
    size_t nqkv = (size_t)B * T * 3 * C, bs = (size_t)T * 3 * C;
    float *qkv = host_rand(nqkv, 1.5f);
    float *d_qkv = dev_from(qkv, nqkv * 4);
    size_t o_bs = (size_t)Tq * C, nout = (size_t)B * o_bs, nl = (size_t)B * NH * Tq;
    /* host and device views: queries Th..T-1, keys 0..Th-1 then Th..T-1 */
    loom_att_view h1 = {
        qkv + (size_t)Th * 3 * C, qkv + C, qkv + 2 * C, bs, bs, 3 * C, 3 * C, B, Tq, Th, NH, HS, Th, 0, 0, 0};
    loom_att_view h2 = h1;
    h2.k = qkv + (size_t)Th * 3 * C + C, h2.v = qkv + (size_t)Th * 3 * C + 2 * C, h2.Tk = Tq, h2.k_pos0 = Th;
    loom_att_view g1 = h1, g2 = h2;
    g1.q = d_qkv + (h1.q - qkv), g1.k = d_qkv + (h1.k - qkv), g1.v = d_qkv + (h1.v - qkv);
    g2.q = d_qkv + (h2.q - qkv), g2.k = d_qkv + (h2.k - qkv), g2.v = d_qkv + (h2.v - qkv);
    float *out = malloc(nout * 4), *lse = malloc(nl * 4);
    float *d_out = loom_cuda_alloc(nout * 4), *d_lse = loom_cuda_alloc(nl * 4);
    loom_attention_part_fwd(cpu, &h1, out, o_bs, C, lse, 0);
    loom_cuda_attention_part_fwd(gpu, &g1, d_out, o_bs, C, d_lse, 0);
    /* merge: a second part computed separately, merged into copies */
    float *out2 = malloc(nout * 4), *lse2 = malloc(nl * 4);
    float *d_out2 = loom_cuda_alloc(nout * 4), *d_lse2 = loom_cuda_alloc(nl * 4);
    loom_attention_part_fwd(cpu, &h2, out2, o_bs, C, lse2, 0);
    loom_cuda_attention_part_fwd(gpu, &g2, d_out2, o_bs, C, d_lse2, 0);
    float *mo = host_copy(out, nout), *ml = host_copy(lse, nl);
    float *d_mo = dev_from(mo, nout * 4), *d_ml = dev_from(ml, nl * 4);
    loom_attention_merge(cpu, mo, ml, out2, lse2, o_bs, C, B, Tq, NH, HS);
    loom_cuda_attention_merge(gpu, d_mo, d_ml, d_out2, d_lse2, o_bs, C, B, Tq, NH, HS);
    expect_close("attention_merge out", d_mo, mo, nout, TOL);
    expect_close("attention_merge lse", d_ml, ml, nl, TOL);
    /* accumulate: continue the first part with the second */
    loom_attention_part_fwd(cpu, &h2, out, o_bs, C, lse, 1);
    loom_cuda_attention_part_fwd(gpu, &g2, d_out, o_bs, C, d_lse, 1);
    float *dout = host_rand(nout, 1.0f), *d_dout = dev_from(dout, nout * 4);
    float *dqkv = host_rand(nqkv, 0.5f), *d_dqkv = dev_from(dqkv, nqkv * 4);
    float *dq = dqkv + (size_t)Th * 3 * C, *dk = dqkv + C, *dv = dqkv + 2 * C;
    loom_attention_part_bwd(cpu, &h1, dq, dk, dv, dout, out, o_bs, C, lse);
    loom_cuda_attention_part_bwd(gpu, &g1, d_dqkv + (dq - dqkv), d_dqkv + (dk - dqkv), d_dqkv + (dv - dqkv),
                                 d_dout, d_out, o_bs, C, d_lse);
    expect_close("attention_part_fwd accumulate out", d_out, out, nout, TOL);
    expect_close("attention_part_fwd accumulate lse", d_lse, lse, nl, TOL);
    expect_close("attention_part_bwd dqkv", d_dqkv, dqkv, nqkv, TOL);
    loom_cuda_free(d_out2), loom_cuda_free(d_lse2), loom_cuda_free(d_dout);
    /* decode: n = 3 new rows at p0 = T - 3 of batch 0; q rows of qkv, cache = k, v rows */
    int n = 3, p0 = T - 3;
    float *kc = malloc((size_t)T * C * 4), *vc = malloc((size_t)T * C * 4),
          *kv_out = malloc((size_t)n * C * 4);
    for (int t = 0; t < T; t++) {
        memcpy(kc + (size_t)t * C, qkv + (size_t)t * 3 * C + C, (size_t)C * 4);
        memcpy(vc + (size_t)t * C, qkv + (size_t)t * 3 * C + 2 * C, (size_t)C * 4);
    }
    float *scratch = malloc(loom_attention_kv_scratch_floats(cpu->threads, n, T) * 4);
    loom_attention_kv_fwd(cpu, kv_out, qkv + (size_t)p0 * 3 * C, 3 * C, kc, vc, p0, n, C, NH, NH, 0, scratch);
    float *d_kc = dev_from(kc, (size_t)T * C * 4), *d_vc = dev_from(vc, (size_t)T * C * 4);
    float *d_kv_out = loom_cuda_alloc((size_t)n * C * 4);
    loom_cuda_attention_kv_fwd(gpu, d_kv_out, d_qkv + (size_t)p0 * 3 * C, 3 * C, d_kc, d_vc, p0, n, C, NH, NH,
                               0, NULL);
    expect_close("attention_kv_fwd", d_kv_out, kv_out, (size_t)n * C, TOL);
    loom_cuda_free(d_kc), loom_cuda_free(d_vc), loom_cuda_free(d_qkv);
    free(qkv), free(out), free(lse), free(out2), free(lse2), free(mo), free(ml), free(dout), free(dqkv),
        free(kc), free(vc), free(kv_out), free(scratch);
}

/* ---- the Llama family's parts -------------------------------------------------- */

static void test_llama_parts(int N, int C, int H, int HS) {
    const size_t nx = (size_t)N * C, ngu = (size_t)N * 2 * H, nh = (size_t)N * H;
    float *x = host_rand(nx, 1.5f), *w = host_rand(C, 1.0f), *out = malloc(nx * 4), *rstd = malloc(N * 4);
    float *d_x = dev_from(x, nx * 4), *d_w = dev_from(w, C * 4), *d_out = loom_cuda_alloc(nx * 4),
          *d_rstd = loom_cuda_alloc(N * 4);
    loom_rmsnorm_fwd(cpu, out, rstd, x, w, N, C, 1e-6f);
    loom_cuda_rmsnorm_fwd(gpu, d_out, d_rstd, d_x, d_w, N, C, 1e-6f);
    float *dout = host_rand(nx, 1.0f), *dx = host_rand(nx, 0.5f), *dw = host_rand(C, 0.5f);
    float *d_dout = dev_from(dout, nx * 4), *d_dx = dev_from(dx, nx * 4), *d_dw = dev_from(dw, C * 4);
    loom_rmsnorm_bwd(cpu, dx, dw, dout, x, w, rstd, N, C);
    loom_cuda_rmsnorm_bwd(gpu, d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, C); /* from the GPU's own rstd */
    expect_close("rmsnorm_fwd out", d_out, out, nx, TOL);
    expect_close("rmsnorm_fwd rstd", d_rstd, rstd, N, TOL);
    expect_close("rmsnorm_bwd dinp", d_dx, dx, nx, TOL);
    d_dx = dev_from(dx, nx * 4);
    expect_close("rmsnorm_bwd dw", d_dw, dw, C, TOL);
    float *gu = host_rand(ngu, 6.0f), *h = malloc(nh * 4), *dh = host_rand(nh, 1.0f), *dgu = malloc(ngu * 4);
    float *d_gu = dev_from(gu, ngu * 4), *d_h = loom_cuda_alloc(nh * 4), *d_dh = dev_from(dh, nh * 4),
          *d_dgu = loom_cuda_alloc(ngu * 4);
    loom_swiglu_fwd(cpu, h, gu, N, H);
    loom_cuda_swiglu_fwd(gpu, d_h, d_gu, N, H);
    loom_swiglu_bwd(cpu, dgu, gu, dh, N, H);
    loom_cuda_swiglu_bwd(gpu, d_dgu, d_gu, d_dh, N, H);
    expect_close("swiglu_fwd", d_h, h, nh, TOL);
    expect_close("swiglu_bwd", d_dgu, dgu, ngu, TOL);
    /* rope on the first 3 heads of rows of 4 heads, positions up to 5000 */
    const int ld = 4 * HS;
    int32_t *pos = malloc(N * sizeof *pos);
    float *f = malloc((size_t)HS / 2 * 4);
    for (int i = 0; i < N; i++) pos[i] = (i * 977) % 5000;
    for (int i = 0; i < HS / 2; i++) f[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)HS);
    float *r = host_rand((size_t)N * ld, 1.0f);
    float *d_r = dev_from(r, (size_t)N * ld * 4), *d_f = dev_from(f, (size_t)HS / 2 * 4);
    int32_t *d_pos = dev_from(pos, N * sizeof *pos);
    loom_rope(cpu, r, ld, pos, f, N, 3, HS, 0);
    loom_cuda_rope(gpu, d_r, ld, d_pos, d_f, N, 3, HS, 0);
    expect_close("rope", d_r, r, (size_t)N * ld, TOL);
    d_r = dev_from(r, (size_t)N * ld * 4);
    loom_rope(cpu, r, ld, pos, f, N, 3, HS, 1);
    loom_cuda_rope(gpu, d_r, ld, d_pos, d_f, N, 3, HS, 1);
    expect_close("rope inverse", d_r, r, (size_t)N * ld, TOL);
    /* nn.Linear [out, in]: out (N,H) = x (N,C) w (H,C)^T + b */
    float *lw = host_rand((size_t)H * C, 0.3f), *lb = host_rand(H, 1.0f), *lo = malloc(nh * 4);
    float *d_lw = dev_from(lw, (size_t)H * C * 4), *d_lb = dev_from(lb, H * 4),
          *d_lo = loom_cuda_alloc(nh * 4);
    loom_linear_fwd(cpu, lo, x, lw, lb, N, C, H);
    loom_cuda_linear_fwd(gpu, d_lo, d_x, d_lw, d_lb, N, C, H);
    expect_close("linear_fwd", d_lo, lo, nh, TOL);
    float *ldw = host_rand((size_t)H * C, 0.5f), *ldb = host_rand(H, 0.5f);
    float *d_ldw = dev_from(ldw, (size_t)H * C * 4), *d_ldb = dev_from(ldb, H * 4);
    loom_linear_bwd(cpu, dx, ldw, ldb, dh, x, lw, N, C, H);
    loom_cuda_linear_bwd(gpu, d_dx, d_ldw, d_ldb, d_dh, d_x, d_lw, N, C, H);
    expect_close("linear_bwd dinp", d_dx, dx, nx, TOL);
    expect_close("linear_bwd dw", d_ldw, ldw, (size_t)H * C, TOL);
    expect_close("linear_bwd db", d_ldb, ldb, H, TOL);
    loom_cuda_free(d_x), loom_cuda_free(d_w), loom_cuda_free(d_dout), loom_cuda_free(d_gu),
        loom_cuda_free(d_dh);
    loom_cuda_free(d_f), loom_cuda_free(d_pos), loom_cuda_free(d_lw), loom_cuda_free(d_lb);
    free(x), free(w), free(out), free(rstd), free(dout), free(dx), free(dw), free(gu), free(h), free(dh),
        free(dgu);
    free(pos), free(f), free(r), free(lw), free(lb), free(lo), free(ldw), free(ldb);
}

/* Grouped-query attention with a sliding window: NH query heads on NKV
 * key/value heads, packed rows [q | k | v], forward and backward, and the
 * KV-cache decode of the last rows against the narrower cache. */
static void test_attention_gqa(int B, int T, int NH, int NKV, int HS, int window) {
    const int C = NH * HS, K = NKV * HS, W = C + 2 * K;
    const size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = host_rand(nqkv, 1.5f), *out = malloc(nout * 4), *lse = malloc(nl * 4);
    float *d_qkv = dev_from(qkv, nqkv * 4), *d_out = loom_cuda_alloc(nout * 4),
          *d_lse = loom_cuda_alloc(nl * 4);
    loom_att_view v = {qkv, qkv + C, qkv + C + K, (size_t)T * W, (size_t)T * W, W, W, B, T, T, NH,
                       HS,  0,       0,           NKV,           window};
    loom_att_view g = v;
    g.q = d_qkv, g.k = d_qkv + C, g.v = d_qkv + C + K;
    loom_attention_part_fwd(cpu, &v, out, (size_t)T * C, C, lse, 0);
    loom_cuda_attention_part_fwd(gpu, &g, d_out, (size_t)T * C, C, d_lse, 0);
    char what[96];
    float *dout = host_rand(nout, 1.0f), *dqkv = host_rand(nqkv, 0.5f);
    float *d_dout = dev_from(dout, nout * 4), *d_dqkv = dev_from(dqkv, nqkv * 4);
    loom_attention_part_bwd(cpu, &v, dqkv, dqkv + C, dqkv + C + K, dout, out, (size_t)T * C, C, lse);
    loom_cuda_attention_part_bwd(gpu, &g, d_dqkv, d_dqkv + C, d_dqkv + C + K, d_dout, d_out, (size_t)T * C, C,
                                 d_lse); /* from the GPU's own forward */
    snprintf(what, sizeof what, "attention gqa NH%d NKV%d W%d out", NH, NKV, window);
    expect_close(what, d_out, out, nout, TOL);
    snprintf(what, sizeof what, "attention gqa NH%d NKV%d W%d lse", NH, NKV, window);
    expect_close(what, d_lse, lse, nl, TOL);
    snprintf(what, sizeof what, "attention gqa NH%d NKV%d W%d dqkv", NH, NKV, window);
    expect_close(what, d_dqkv, dqkv, nqkv, TOL);
    /* decode: rows p0.. of sequence 0 against a (T, K) cache */
    const int p0 = T - 3, n = 3;
    float *kc = malloc((size_t)T * K * 4), *vc = malloc((size_t)T * K * 4),
          *kv_out = malloc((size_t)n * C * 4);
    for (int t = 0; t < T; t++) {
        memcpy(kc + (size_t)t * K, qkv + (size_t)t * W + C, (size_t)K * 4);
        memcpy(vc + (size_t)t * K, qkv + (size_t)t * W + C + K, (size_t)K * 4);
    }
    float *scratch = malloc(loom_attention_kv_scratch_floats(cpu->threads, n, T) * 4);
    loom_attention_kv_fwd(cpu, kv_out, qkv + (size_t)p0 * W, W, kc, vc, p0, n, C, NH, NKV, window, scratch);
    float *d_kc = dev_from(kc, (size_t)T * K * 4), *d_vc = dev_from(vc, (size_t)T * K * 4);
    float *d_kv_out = loom_cuda_alloc((size_t)n * C * 4);
    loom_cuda_attention_kv_fwd(gpu, d_kv_out, d_qkv + (size_t)p0 * W, W, d_kc, d_vc, p0, n, C, NH, NKV,
                               window, NULL);
    snprintf(what, sizeof what, "attention_kv_fwd gqa NH%d NKV%d W%d", NH, NKV, window);
    expect_close(what, d_kv_out, kv_out, (size_t)n * C, TOL);
    /* the cache decode agrees with the training forward's rows */
    int same = 1;
    for (int i = 0; i < n * C; i++) same &= fabsf(kv_out[i] - out[(size_t)p0 * C + i]) <= 1e-5f;
    CHECK(same, "attention_kv_fwd gqa NH%d NKV%d W%d differs from the forward's rows", NH, NKV, window);
    loom_cuda_free(d_qkv), loom_cuda_free(d_dout), loom_cuda_free(d_kc), loom_cuda_free(d_vc);
    free(qkv), free(out), free(lse), free(dout), free(dqkv), free(kc), free(vc), free(kv_out), free(scratch);
}

/* ---- vocabulary-parallel embedding and cross-entropy ----------------------------- */

static void test_vocab(void) {
    const int N = 29, C = 40, T = 8, v0 = 10, V_l = 41, V_valid = 35, row0 = 5;
    int32_t tok[29], tgt[29];
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(i * 7 % 60); /* some below v0, some above the slice */
        tgt[i] = i % 9 == 4 ? -1 : (int32_t)(i * 5 % 55);
    }
    tok[3] = tok[4] = tok[20] = 12; /* three rows of one token, not all adjacent */
    int32_t *d_tok = dev_from(tok, sizeof tok), *d_tgt = dev_from(tgt, sizeof tgt);
    size_t nx = (size_t)N * C;
    float *wte = host_rand((size_t)V_l * C, 1.0f), *wpe = host_rand((size_t)T * C, 1.0f);
    float *d_wte = dev_from(wte, (size_t)V_l * C * 4), *d_wpe = dev_from(wpe, (size_t)T * C * 4);
    float *x = malloc(nx * 4), *d_x = loom_cuda_alloc(nx * 4);
    loom_embed_fwd(cpu, x, tok, wte, v0, V_l, N, C);
    loom_pos_fwd(cpu, x, wpe, row0, N, T, C);
    loom_cuda_embed_fwd(gpu, d_x, d_tok, d_wte, v0, V_l, N, C);
    loom_cuda_pos_fwd(gpu, d_x, d_wpe, row0, N, T, C);
    expect_close("embed_fwd + pos_fwd", d_x, x, nx, TOL);
    float *dout = host_rand(nx, 1.0f), *d_dout = dev_from(dout, nx * 4);
    float *dwte = host_rand((size_t)V_l * C, 1.0f), *dwpe = host_rand((size_t)T * C, 1.0f);
    float *d_dwte = dev_from(dwte, (size_t)V_l * C * 4), *d_dwpe = dev_from(dwpe, (size_t)T * C * 4);
    loom_embed_bwd(cpu, dwte, dout, tok, v0, V_l, N, C);
    loom_pos_bwd(cpu, dwpe, dout, row0, N, T, C);
    loom_cuda_embed_bwd(gpu, d_dwte, d_dout, d_tok, v0, V_l, N, C);
    loom_cuda_pos_bwd(gpu, d_dwpe, d_dout, row0, N, T, C);
    expect_close("embed_bwd", d_dwte, dwte, (size_t)V_l * C, TOL);
    expect_close("pos_bwd", d_dwpe, dwpe, (size_t)T * C, TOL);
    /* cross-entropy on one rank's slice: the "all-reduced" values are this rank's own */
    size_t nl = (size_t)N * V_l;
    float *logits = host_rand(nl, 4.0f), *d_logits = dev_from(logits, nl * 4);
    float mx[29], sum[29], tg[29], loss[29];
    float *d_mx = loom_cuda_alloc(sizeof mx), *d_sum = loom_cuda_alloc(sizeof sum),
          *d_tg = loom_cuda_alloc(sizeof tg), *d_loss = loom_cuda_alloc(sizeof loss);
    loom_vxent_max(cpu, mx, logits, N, V_l, V_valid);
    loom_cuda_vxent_max(gpu, d_mx, d_logits, N, V_l, V_valid);
    loom_vxent_exp(cpu, logits, sum, tg, mx, tgt, v0, N, V_l, V_valid);
    loom_cuda_vxent_exp(gpu, d_logits, d_sum, d_tg, d_mx, d_tgt, v0, N, V_l, V_valid);
    loom_vxent_finish(cpu, loss, logits, sum, tg, tgt, N, V_l);
    loom_cuda_vxent_finish(gpu, d_loss, d_logits, d_sum, d_tg, d_tgt, N, V_l);
    float *dl = malloc(nl * 4), *d_dl = loom_cuda_alloc(nl * 4);
    loom_vxent_bwd(cpu, dl, logits, tgt, 1.0f / N, v0, N, V_l);
    loom_cuda_vxent_bwd(gpu, d_dl, d_logits, d_tgt, 1.0f / N, v0, N, V_l);
    expect_close("vxent_max", d_mx, mx, N, TOL);
    expect_close("vxent_exp rowsum", d_sum, sum, N, TOL);
    expect_close("vxent_exp tgt", d_tg, tg, N, TOL);
    expect_close("vxent_finish losses", d_loss, loss, N, TOL);
    expect_close("vxent_finish probs", d_logits, logits, nl, TOL);
    expect_close("vxent_bwd", d_dl, dl, nl, TOL);
    loom_cuda_free(d_tok), loom_cuda_free(d_tgt), loom_cuda_free(d_wte), loom_cuda_free(d_wpe),
        loom_cuda_free(d_dout);
    free(wte), free(wpe), free(x), free(dout), free(dwte), free(dwpe), free(logits), free(dl);
}

/* ---- memory, streams, events, errors ------------------------------------------- */

static void test_memory_streams(void) {
    enum { n = 1000 };
    float h[n], back[n];
    for (int i = 0; i < n; i++) h[i] = (float)i * 0.5f;
    loom_cuda_stream s = NULL;
    loom_cuda_event e0 = NULL, e1 = NULL;
    CHECK(loom_cuda_stream_create(&s) == LOOM_OK && s, "stream create: %s", loom_errmsg());
    CHECK(loom_cuda_event_create(&e0) == LOOM_OK && loom_cuda_event_create(&e1) == LOOM_OK, "event create");
    loom_cuda_stream_set(s);
    CHECK(loom_cuda_stream_get() == s, "current stream not kept");
    float *a = dev_from(h, sizeof h), *b = loom_cuda_alloc(sizeof h);
    CHECK(loom_cuda_event_record(e0, s) == LOOM_OK, "event record");
    CHECK(loom_cuda_memcpy_d2d(b, a, sizeof h) == LOOM_OK, "d2d");
    CHECK(loom_cuda_memset(a, 0, sizeof h / 2) == LOOM_OK, "memset");
    CHECK(loom_cuda_event_record(e1, s) == LOOM_OK, "event record");
    CHECK(loom_cuda_event_sync(e1) == LOOM_OK, "event sync");
    float ms = -1.0f;
    CHECK(loom_cuda_event_elapsed(&ms, e0, e1) == LOOM_OK && ms >= 0.0f, "elapsed %g ms", ms);
    CHECK(loom_cuda_memcpy_d2h(back, b, sizeof h) == LOOM_OK && !memcmp(back, h, sizeof h),
          "d2d copy differs");
    CHECK(loom_cuda_memcpy_d2h(back, a, sizeof h) == LOOM_OK, "d2h");
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= i < n / 2 ? back[i] == 0.0f : back[i] == h[i];
    CHECK(ok, "memset did not clear exactly the first half");
    loom_cuda_stream_set(NULL);
    CHECK(loom_cuda_stream_sync(s) == LOOM_OK, "stream sync");
    loom_cuda_free(a), loom_cuda_free(b);
    loom_cuda_event_destroy(e0), loom_cuda_event_destroy(e1), loom_cuda_stream_destroy(s);
    void *huge = loom_cuda_alloc((size_t)1 << 50);
    CHECK(huge == NULL && strstr(loom_errmsg(), "cannot allocate"), "1 PiB alloc: %p '%s'", huge,
          loom_errmsg());
}

/* Last: a head size the kernels refuse leaves a remembered failure. */
static void test_error_sticky(void) {
    CHECK(loom_cuda_status() == LOOM_OK, "an earlier kernel failed: %s", loom_errmsg());
    int B = 1, T = 4, C = 512, NH = 1; /* HS 512 > 256 */
    float *d_qkv = loom_cuda_alloc((size_t)B * T * 3 * C * 4),
          *d_out = loom_cuda_alloc((size_t)B * T * C * 4), *d_lse = loom_cuda_alloc((size_t)B * NH * T * 4);
    loom_cuda_attention_fwd(gpu, d_out, d_lse, d_qkv, B, T, C, NH);
    loom_status st = loom_cuda_status();
    CHECK(st == LOOM_EUNAVAIL && strstr(loom_errmsg(), "head size"), "HS 512: status %d '%s'", (int)st,
          loom_errmsg());
    loom_cuda_free(d_qkv), loom_cuda_free(d_out), loom_cuda_free(d_lse);
}

int main(void) {
    int ndev = loom_cuda_device_count();
    if (ndev == 0) {
        printf("no CUDA device: skipped (exit 77)\n");
        return 77;
    }
    if (loom_cuda_init(0) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_errmsg());
        return 1;
    }
    const loom_device_opts f32 = {.name = "cpu", .threads = 1},
                           b16 = {.name = "cpu", .threads = 1, .bf16 = 1};
    if (loom_device_create(&f32, &cpu) != LOOM_OK || loom_device_create(&b16, &cpu_bf16) != LOOM_OK ||
        loom_cuda_ctx_create(LOOM_CUDA_FP32, &gpu) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_errmsg());
        return 1;
    }
    test_memory_streams();
    test_layernorm(37, 100);
    test_layernorm(5, 768);
    test_layernorm(3, 7); /* C below a warp: idle lanes */
    test_matmul(33, 48, 80, LOOM_CUDA_FP32, TOL);
    test_matmul(70, 96, 130, LOOM_CUDA_FP32, TOL);
    test_matmul(33, 48, 80, LOOM_CUDA_BF16, TOL_BF16);
    test_matmul(33, 48, 80, LOOM_CUDA_TF32, TOL_TF32);
    test_elementwise(100003);
    test_attention(2, 70, 64, 4);   /* HS 16 */
    test_attention(1, 130, 128, 2); /* HS 64, T past two 64-tiles */
    test_attention(2, 33, 96, 2);   /* HS 48: lanes with one and two dims */
    test_attention(1, 40, 256, 1);  /* HS 256, the largest: over 48 KB of shared memory */
    test_attention(3, 1, 32, 2);    /* T 1: each row sees only itself */
    test_attention_parts(2, 70, 64, 4);
    test_attention_gqa(2, 70, 4, 2, 16, 0);   /* grouped-query, causal */
    test_attention_gqa(2, 130, 4, 1, 32, 37); /* one key/value head, a window across tiles */
    test_attention_gqa(1, 40, 2, 2, 64, 5);   /* plain heads, a short window */
    test_llama_parts(37, 100, 72, 16);
    test_llama_parts(5, 64, 33, 128);
    test_vocab();
    test_routing(37, 11, 3, 45);
    test_routing(5, 64, 8, 7); /* 64 experts, top 8 */
    test_error_sticky();
    loom_cuda_ctx_free(gpu);
    loom_device_free(cpu);
    loom_device_free(cpu_bf16);
    return check_done();
}
