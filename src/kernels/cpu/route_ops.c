/* route_ops.c - the CPU backend's routing and row ops (include/loom/kernel_list.h):
 * row softmax with logsumexp, top-k gating and its backward, gathers,
 * scatter-adds and weighted combines of rows by an index list, a fill.
 *
 * They are the loops the MoE block (src/model/moe.c) and context
 * parallelism (src/parallel/cp.c) ran inline before these entries, kept with
 * the same order of operations so every result is bit for bit what it was.
 * Local to the calling rank; nothing is collective.
 */
#include "kern_internal.h"

double loom_cpu_tensor_softmax_lse(void *ctx, float *x, float *lse, int N, int n) {
    (void)ctx;
    double zsum = 0;
    for (int i = 0; i < N; i++) {
        float *p = x + (size_t)i * n;
        float mx = p[0];
        for (int e = 1; e < n; e++) mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int e = 0; e < n; e++) sum += exp((double)p[e] - mx);
        for (int e = 0; e < n; e++) p[e] = (float)(exp((double)p[e] - mx) / sum);
        lse[i] = (float)(mx + log(sum));
        zsum += (double)lse[i] * lse[i];
    }
    return zsum;
}

void loom_cpu_tensor_topk_gate(void *ctx, int32_t *sel, float *gate, const float *p, const float *bias, int N,
                               int n, int k, int norm) {
    (void)ctx;
    float score[1024]; /* LOOM_TOPK_MAX_N (kernel_types.h) */
    for (int i = 0; i < N; i++) {
        const float *pi = p + (size_t)i * n;
        for (int e = 0; e < n; e++) score[e] = pi[e] + bias[e];
        int32_t *s = sel + (size_t)i * k;
        float *g = gate + (size_t)i * k, sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n; e++) {
                int taken = 0;
                for (int q = 0; q < j; q++) taken |= s[q] == e;
                if (!taken && (best < 0 || score[e] > score[best])) best = e;
            }
            s[j] = best;
            g[j] = pi[best];
            sum += pi[best];
        }
        if (norm)
            for (int j = 0; j < k; j++) g[j] /= sum;
    }
}

void loom_cpu_tensor_topk_gate_bwd(void *ctx, float *dx, float *dp, const float *dgate, const int32_t *sel,
                                   const float *gate, const float *p, const float *lse,
                                   const int32_t *add_tab, const int32_t *add_row, float add_scale,
                                   float z_scale, int N, int n, int k, int norm) {
    (void)ctx;
    memset(dp, 0, (size_t)N * n * sizeof *dp);
    for (int i = 0; i < N; i++) {
        const int32_t *s = sel + (size_t)i * k;
        const float *dg = dgate + (size_t)i * k, *g = gate + (size_t)i * k;
        float *d = dp + (size_t)i * n;
        if (norm) { /* gate_j = p_j / S: dp_m = (dgate_m - sum_j dgate_j gate_j) / S */
            float S = 0, wsum = 0;
            for (int j = 0; j < k; j++) {
                S += p[(size_t)i * n + s[j]];
                wsum += dg[j] * g[j];
            }
            for (int j = 0; j < k; j++) d[s[j]] += (dg[j] - wsum) / S;
        } else {
            for (int j = 0; j < k; j++) d[s[j]] += dg[j];
        }
    }
    for (int i = 0; i < N; i++) {
        const int32_t *t = add_tab + (size_t)add_row[i] * n;
        for (int e = 0; e < n; e++) dp[(size_t)i * n + e] += add_scale * (float)t[e];
    }
    for (int i = 0; i < N; i++) {
        const float *pi = p + (size_t)i * n, *d = dp + (size_t)i * n;
        float *dl = dx + (size_t)i * n, dot = 0;
        for (int e = 0; e < n; e++) dot += pi[e] * d[e];
        float zs = z_scale * lse[i] / (float)N;
        for (int e = 0; e < n; e++) dl[e] = pi[e] * (d[e] - dot) + zs * pi[e];
    }
}

void loom_cpu_tensor_gather_rows(void *ctx, float *dst, const float *src, const int32_t *idx, int n, int C) {
    (void)ctx;
    for (int r = 0; r < n; r++)
        memcpy(dst + (size_t)r * C, src + (size_t)idx[r] * C, (size_t)C * sizeof *dst);
}

void loom_cpu_tensor_scatter_add_rows(void *ctx, float *dst, const float *src, const int32_t *idx, int n,
                                      int C) {
    (void)ctx;
    for (int r = 0; r < n; r++) {
        float *d = dst + (size_t)idx[r] * C;
        const float *s = src + (size_t)r * C;
        for (int q = 0; q < C; q++) d[q] += s[q];
    }
}

void loom_cpu_tensor_combine_rows(void *ctx, float *out, const float *y, const int32_t *row, const float *w,
                                  int N, int k, int C) {
    (void)ctx;
    memset(out, 0, (size_t)N * C * sizeof *out);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)i * k + j];
            if (r < 0) continue;
            float g = w[(size_t)i * k + j], *o = out + (size_t)i * C;
            const float *yr = y + (size_t)r * C;
            for (int q = 0; q < C; q++) o[q] += g * yr[q];
        }
}

void loom_cpu_tensor_combine_rows_bwd(void *ctx, float *dy, float *dw, const float *dout, const float *y,
                                      const int32_t *row, const float *w, int N, int k, int C) {
    (void)ctx;
    memset(dw, 0, (size_t)N * k * sizeof *dw);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)i * k + j];
            if (r < 0) continue;
            const float *d = dout + (size_t)i * C, *yr = y + (size_t)r * C;
            float g = w[(size_t)i * k + j], *dyr = dy + (size_t)r * C, dot = 0;
            for (int q = 0; q < C; q++) {
                dyr[q] = g * d[q];
                dot += d[q] * yr[q];
            }
            dw[(size_t)i * k + j] = dot;
        }
}

void loom_cpu_tensor_fill(void *ctx, float *x, size_t n, float v) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) x[i] = v;
}
