/* bench_cuda_kernels.c - time every CUDA kernel at one model's shapes.
 *
 *   build/tests/gpu/bench_cuda_kernels [B T C NH V]   (default 4 1024 768 12 50304:
 *                                                      GPT-2 124M at llm.c's B, T)
 *
 * Prints, per kernel, the median of 20 runs (CUDA events, after a warm-up)
 * and the rate it reaches - GFLOP/s for GEMMs and attention, GB/s of the
 * bytes the kernel must read and write for the rest - plus the measured
 * GEMM peak (loom_cuda_calibrate_gemm) at fp32, TF32 and bf16. Exits 77
 * without a GPU. Inputs are random; nothing is checked here
 * (tests/gpu/test_cuda_kernels.c checks the numbers).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_backend.h"

#define REPS 20

static loom_cuda_event g_e0, g_e1;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of REPS runs of `run` after one warm-up. */
#define TIME(ms_out, call)                                                                                   \
    do {                                                                                                     \
        float t_[REPS];                                                                                      \
        call;                                                                                                \
        for (int r_ = 0; r_ < REPS; r_++) {                                                                  \
            loom_cuda_event_record(g_e0, loom_cuda_stream_get());                                            \
            call;                                                                                            \
            loom_cuda_event_record(g_e1, loom_cuda_stream_get());                                            \
            loom_cuda_event_sync(g_e1);                                                                      \
            loom_cuda_event_elapsed(&t_[r_], g_e0, g_e1);                                                    \
        }                                                                                                    \
        qsort(t_, REPS, sizeof t_[0], cmp_float);                                                            \
        ms_out = t_[REPS / 2];                                                                               \
    } while (0)

static void row(const char *name, float ms, double amount, const char *unit) {
    printf("%-28s %9.3f ms %10.1f %s\n", name, ms, amount / (1e-3 * ms) / 1e9, unit);
}

static float *dev_rand(size_t n, float scale) {
    float *h = malloc(n * sizeof *h), *d = loom_cuda_alloc(n * sizeof *d);
    uint64_t s = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = ((float)(s >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
    if (d) loom_cuda_memcpy_h2d(d, h, n * sizeof *h);
    free(h);
    return d;
}

int main(int argc, char **argv) {
    int B = argc > 5 ? atoi(argv[1]) : 4, T = argc > 5 ? atoi(argv[2]) : 1024;
    int C = argc > 5 ? atoi(argv[3]) : 768, NH = argc > 5 ? atoi(argv[4]) : 12;
    int V = argc > 5 ? atoi(argv[5]) : 50304;
    if (loom_cuda_device_count() == 0) {
        printf("no CUDA device: nothing to time (exit 77)\n");
        return 77;
    }
    loom_cuda_ctx *ctx = NULL;
    if (loom_cuda_init(0) != LOOM_OK || loom_cuda_ctx_create(LOOM_CUDA_FP32, &ctx) != LOOM_OK ||
        loom_cuda_event_create(&g_e0) != LOOM_OK || loom_cuda_event_create(&g_e1) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_errmsg());
        return 1;
    }
    int N = B * T;
    size_t nc = (size_t)N * C;
    printf("B=%d T=%d C=%d NH=%d V=%d (N=%d)\n", B, T, C, NH, V, N);
    const char *prec_name[3] = {"fp32", "bf16", "tf32"};
    for (int p = 0; p < 3; p++) {
        loom_cuda_set_precision(ctx, p);
        printf("%-28s %9s    %10.1f TFLOP/s\n", "gemm peak 4096^3", prec_name[p],
               loom_cuda_calibrate_gemm(ctx, 4096, 5) / 1e12);
    }
    loom_cuda_set_precision(ctx, LOOM_CUDA_FP32);
    float *x = dev_rand(nc, 1.0f), *y = dev_rand(nc, 1.0f), *out = dev_rand(4 * nc, 1.0f),
          *h4 = dev_rand(4 * nc, 1.0f);
    float *w = dev_rand((size_t)C * 4 * C, 0.02f), *b = dev_rand(4 * (size_t)C, 0.02f),
          *dw = dev_rand((size_t)C * 4 * C, 0.0f);
    float *mean = dev_rand(N, 0.0f), *rstd = dev_rand(N, 0.0f), *qkv = dev_rand(3 * nc, 1.0f),
          *lse = dev_rand((size_t)B * NH * T, 0.0f);
    float *wte = dev_rand((size_t)V * C, 0.02f), *logits = dev_rand((size_t)N * V, 1.0f),
          *dqkv = dev_rand(3 * nc, 0.0f);
    float ms;
    double fl_mm = 2.0 * N * C * 4.0 * C, fl_att = 4.0 * B * NH * (double)T * T / 2 * (C / NH);
    TIME(ms, loom_cuda_matmul_fwd(ctx, out, x, w, b, N, C, 4 * C));
    row("matmul_fwd C->4C", ms, fl_mm, "GFLOP/s");
    TIME(ms, loom_cuda_matmul_bwd(ctx, x, dw, b, out, y, w, N, C, 4 * C));
    row("matmul_bwd C->4C", ms, 2 * fl_mm, "GFLOP/s");
    TIME(ms, loom_cuda_matmul_nt_fwd(ctx, logits, x, wte, N, C, V));
    row("matmul_nt_fwd (head)", ms, 2.0 * N * C * V, "GFLOP/s");
    TIME(ms, loom_cuda_matmul_nt_bwd(ctx, x, wte, logits, y, wte, N, C, V));
    row("matmul_nt_bwd (head)", ms, 4.0 * N * C * V, "GFLOP/s");
    TIME(ms, loom_cuda_attention_fwd(ctx, out, lse, qkv, B, T, C, NH));
    row("attention_fwd", ms, fl_att, "GFLOP/s");
    TIME(ms, loom_cuda_attention_bwd(ctx, dqkv, out, qkv, out, lse, B, T, C, NH));
    row("attention_bwd", ms, 2.5 * fl_att, "GFLOP/s");
    TIME(ms, loom_cuda_layernorm_fwd(ctx, out, mean, rstd, x, w, b, N, C));
    row("layernorm_fwd", ms, 8.0 * nc, "GB/s");
    TIME(ms, loom_cuda_layernorm_bwd(ctx, y, dw, dw + C, out, x, w, mean, rstd, N, C));
    row("layernorm_bwd", ms, 16.0 * nc, "GB/s");
    TIME(ms, loom_cuda_gelu_fwd(ctx, out, h4, 4 * nc));
    row("gelu_fwd", ms, 32.0 * nc, "GB/s");
    TIME(ms, loom_cuda_gelu_bwd(ctx, out, x, y, nc));
    row("gelu_bwd (N*C)", ms, 16.0 * nc, "GB/s");
    TIME(ms, loom_cuda_residual_fwd(ctx, out, x, y, nc));
    row("residual_fwd", ms, 12.0 * nc, "GB/s");
    TIME(ms, loom_cuda_adamw_update(ctx, w, dw, x, y, (size_t)C * 4 * C, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3,
                                    1.0f));
    row("adamw (C*4C)", ms, 28.0 * C * 4 * C, "GB/s");
    printf("status: %s\n", loom_cuda_sync() == LOOM_OK ? "ok" : loom_errmsg());
    loom_cuda_ctx_free(ctx);
    return 0;
}
