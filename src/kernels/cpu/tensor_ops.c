/* tensor_ops.c - the CPU backend's small tensor ops (include/loom/kernel_list.h):
 * add, the bias + residual add of a block, column sums, a loss sum.
 *
 * They are the loops model, parallel and pipeline code ran inline before the
 * backend table, kept with the same order of additions so every result is
 * bit for bit what it was. Local to the calling rank; nothing is collective.
 */
#include "kern_internal.h"

void loom_cpu_tensor_add(void *ctx, float *y, const float *x, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void loom_cpu_tensor_add2(void *ctx, float *a, float *b, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) a[i] = b[i] = a[i] + b[i];
}

void loom_cpu_tensor_add_bias_residual(void *ctx, float *out, const float *res, const float *bias, int n,
                                       int C) {
    (void)ctx;
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * C;
        const float *r = res + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] += r[c] + bias[c];
    }
}

void loom_cpu_tensor_colsum_acc(void *ctx, float *y, const float *x, int N, int ld, int ncols) {
    (void)ctx;
    for (int i = 0; i < N; i++) {
        const float *row = x + (size_t)i * ld;
        for (int j = 0; j < ncols; j++) y[j] += row[j];
    }
}

void loom_cpu_tensor_sum_acc(void *ctx, double *host_acc, const float *x, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) *host_acc += x[i];
}
