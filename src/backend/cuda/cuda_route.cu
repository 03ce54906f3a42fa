/* cuda_route.cu - the routing and row ops of the backend table
 * (include/loom/backend.h): row softmax with logsumexp, top-k gating and its
 * backward (one thread per row: rows are short, n <= LOOM_TOPK_MAX_N), row
 * gathers, scatter-adds in row order (one thread per column, so repeated
 * indices add up in the CPU's order, deterministically), weighted combines
 * and a fill. The same formulas and order of operations as the CPU's
 * (src/kernels/cpu/route_ops.c); the library is built without FMA
 * contraction, so only exp/log (double, CUDA's within 1 ulp) may differ.
 */
#include <stdlib.h>

#include "cuda_internal.cuh"

__global__ static void k_softmax_lse(float *x, float *lse, int N, int n) {
    LC_FOR(i, (size_t)N) {
        float *p = x + i * n;
        float mx = p[0];
        for (int e = 1; e < n; e++) mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int e = 0; e < n; e++) sum += exp((double)p[e] - mx);
        for (int e = 0; e < n; e++) p[e] = (float)(exp((double)p[e] - mx) / sum);
        lse[i] = (float)(mx + log(sum));
    }
}

double loom_cuda_tensor_softmax_lse(void *ctx, float *x, float *lse, int N, int n) {
    (void)ctx;
    if (N <= 0) return 0;
    k_softmax_lse<<<lc_blocks((size_t)N), LC_THREADS, 0, lc_stream()>>>(x, lse, N, n);
    lc_launched("softmax_lse");
    /* the z sum is a host value: lse comes down and is summed in row order */
    float *h = (float *)malloc((size_t)N * sizeof(float));
    if (!h) abort(); /* kernels return void; out of host memory mid-step */
    double zsum = 0;
    if (loom_cuda_memcpy_d2h(h, lse, (size_t)N * sizeof(float)) == LOOM_OK)
        for (int i = 0; i < N; i++) zsum += (double)h[i] * h[i];
    free(h);
    return zsum;
}

__global__ static void k_topk_gate(int32_t *sel, float *gate, const float *p, const float *bias, int N, int n,
                                   int k, int norm) {
    LC_FOR(i, (size_t)N) {
        float score[1024]; /* LOOM_TOPK_MAX_N */
        const float *pi = p + i * n;
        for (int e = 0; e < n; e++) score[e] = pi[e] + bias[e];
        int32_t *s = sel + i * k;
        float *g = gate + i * k, sum = 0;
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

void loom_cuda_tensor_topk_gate(void *ctx, int32_t *sel, float *gate, const float *p, const float *bias,
                                int N, int n, int k, int norm) {
    (void)ctx;
    if (N <= 0) return;
    k_topk_gate<<<lc_blocks((size_t)N), LC_THREADS, 0, lc_stream()>>>(sel, gate, p, bias, N, n, k, norm);
    lc_launched("topk_gate");
}

/* Row i's three steps of the CPU's three passes (each touches row i only). */
__global__ static void k_topk_gate_bwd(float *dx, float *dp, const float *dgate, const int32_t *sel,
                                       const float *gate, const float *p, const float *lse,
                                       const int32_t *add_tab, const int32_t *add_row, float add_scale,
                                       float z_scale, int N, int n, int k, int norm) {
    LC_FOR(i, (size_t)N) {
        const int32_t *s = sel + i * k;
        const float *dg = dgate + i * k, *g = gate + i * k, *pi = p + i * n;
        float *d = dp + i * n;
        for (int e = 0; e < n; e++) d[e] = 0.0f;
        if (norm) {
            float S = 0, wsum = 0;
            for (int j = 0; j < k; j++) {
                S += pi[s[j]];
                wsum += dg[j] * g[j];
            }
            for (int j = 0; j < k; j++) d[s[j]] += (dg[j] - wsum) / S;
        } else {
            for (int j = 0; j < k; j++) d[s[j]] += dg[j];
        }
        const int32_t *t = add_tab + (size_t)add_row[i] * n;
        for (int e = 0; e < n; e++) d[e] += add_scale * (float)t[e];
        float *dl = dx + i * n, dot = 0;
        for (int e = 0; e < n; e++) dot += pi[e] * d[e];
        float zs = z_scale * lse[i] / (float)N;
        for (int e = 0; e < n; e++) dl[e] = pi[e] * (d[e] - dot) + zs * pi[e];
    }
}

void loom_cuda_tensor_topk_gate_bwd(void *ctx, float *dx, float *dp, const float *dgate, const int32_t *sel,
                                    const float *gate, const float *p, const float *lse,
                                    const int32_t *add_tab, const int32_t *add_row, float add_scale,
                                    float z_scale, int N, int n, int k, int norm) {
    (void)ctx;
    if (N <= 0) return;
    k_topk_gate_bwd<<<lc_blocks((size_t)N), LC_THREADS, 0, lc_stream()>>>(
        dx, dp, dgate, sel, gate, p, lse, add_tab, add_row, add_scale, z_scale, N, n, k, norm);
    lc_launched("topk_gate_bwd");
}

__global__ static void k_gather_rows(float *dst, const float *src, const int32_t *idx, int n, int C) {
    LC_FOR(t, (size_t)n * C) {
        size_t r = t / C, q = t % C;
        dst[t] = src[(size_t)idx[r] * C + q];
    }
}

void loom_cuda_tensor_gather_rows(void *ctx, float *dst, const float *src, const int32_t *idx, int n, int C) {
    (void)ctx;
    if (n <= 0 || C <= 0) return;
    k_gather_rows<<<lc_blocks((size_t)n * C), LC_THREADS, 0, lc_stream()>>>(dst, src, idx, n, C);
    lc_launched("gather_rows");
}

__global__ static void k_scatter_add_rows(float *dst, const float *src, const int32_t *idx, int n, int C) {
    LC_FOR(q, (size_t)C) {
        for (int r = 0; r < n; r++) dst[(size_t)idx[r] * C + q] += src[(size_t)r * C + q];
    }
}

void loom_cuda_tensor_scatter_add_rows(void *ctx, float *dst, const float *src, const int32_t *idx, int n,
                                       int C) {
    (void)ctx;
    if (n <= 0 || C <= 0) return;
    k_scatter_add_rows<<<lc_blocks((size_t)C), LC_THREADS, 0, lc_stream()>>>(dst, src, idx, n, C);
    lc_launched("scatter_add_rows");
}

__global__ static void k_combine_rows(float *out, const float *y, const int32_t *row, const float *w, int N,
                                      int k, int C) {
    LC_FOR(t, (size_t)N * C) {
        size_t i = t / C, q = t % C;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[i * k + j];
            if (r < 0) continue;
            acc += w[i * k + j] * y[(size_t)r * C + q];
        }
        out[t] = acc;
    }
}

void loom_cuda_tensor_combine_rows(void *ctx, float *out, const float *y, const int32_t *row, const float *w,
                                   int N, int k, int C) {
    (void)ctx;
    if (N <= 0 || C <= 0) return;
    k_combine_rows<<<lc_blocks((size_t)N * C), LC_THREADS, 0, lc_stream()>>>(out, y, row, w, N, k, C);
    lc_launched("combine_rows");
}

/* One thread per (token, choice): its dot product in column order, as the CPU. */
__global__ static void k_combine_rows_bwd(float *dy, float *dw, const float *dout, const float *y,
                                          const int32_t *row, const float *w, int N, int k, int C) {
    LC_FOR(t, (size_t)N * k) {
        int r = row[t];
        if (r < 0) {
            dw[t] = 0.0f;
            continue;
        }
        const float *d = dout + (t / k) * C, *yr = y + (size_t)r * C;
        float g = w[t], *dyr = dy + (size_t)r * C, dot = 0;
        for (int q = 0; q < C; q++) {
            dyr[q] = g * d[q];
            dot += d[q] * yr[q];
        }
        dw[t] = dot;
    }
}

void loom_cuda_tensor_combine_rows_bwd(void *ctx, float *dy, float *dw, const float *dout, const float *y,
                                       const int32_t *row, const float *w, int N, int k, int C) {
    (void)ctx;
    if (N <= 0 || k <= 0) return;
    k_combine_rows_bwd<<<lc_blocks((size_t)N * k), LC_THREADS, 0, lc_stream()>>>(dy, dw, dout, y, row, w, N,
                                                                                 k, C);
    lc_launched("combine_rows_bwd");
}

__global__ static void k_fill(float *x, size_t n, float v) { LC_FOR(i, n) x[i] = v; }

void loom_cuda_tensor_fill(void *ctx, float *x, size_t n, float v) {
    (void)ctx;
    if (!n) return;
    k_fill<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(x, n, v);
    lc_launched("fill");
}
