/* cuda_norm.cu - LayerNorm over the last axis, forward and backward, with the
 * formulas of src/kernels/cpu/norm.c: mean, then the biased variance of
 * (x - mean) (two passes), eps 1e-5; backward from the saved mean and rstd.
 * One warp per row for the row-wise work; the weight and bias gradients are
 * column sums over rows, taken deterministically as in cuda_gemm.cu's bias
 * gradient (32 columns per block, 8 row phases added in a fixed order).
 */
#include "cuda_internal.cuh"

#define LN_EPS 1e-5f
#define LN_WARPS 8 /* rows per block */

__global__ static void k_ln_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int N, int C) {
    int row = blockIdx.x * LN_WARPS + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = lc_warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = x[c] - m;
        v += d * d;
    }
    float r = 1.0f / sqrtf(lc_warp_sum(v) / (float)C + LN_EPS);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

void loom_cuda_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C) {
    (void)ctx;
    if (N <= 0) return;
    k_ln_fwd<<<(N + LN_WARPS - 1) / LN_WARPS, dim3(32, LN_WARPS), 0, lc_stream()>>>(out, mean, rstd, inp, w,
                                                                                    b, N, C);
    lc_launched("layernorm_fwd");
}

/* dx (C) += rstd (g - mean(g) - xhat mean(g xhat)), g = dout * w */
__global__ static void k_ln_bwd_dx(float *dinp, const float *dout, const float *inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * LN_WARPS + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = d[c] * w[c];
        sg += g;
        sgx += g * ((x[c] - m) * r);
    }
    float mg = lc_warp_sum(sg) / (float)C, mgx = lc_warp_sum(sgx) / (float)C;
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (x[c] - m) * r;
        dx[c] += r * (d[c] * w[c] - mg - xhat * mgx);
    }
}

/* dw (C) += sum_i dout xhat, db (C) += sum_i dout; either may be NULL */
__global__ static void k_ln_bwd_params(float *dw, float *db, const float *dout, const float *inp,
                                       const float *mean, const float *rstd, int N, int C) {
    __shared__ float pw[8][33], pb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int i = threadIdx.y; i < N; i += 8) {
            float d = dout[(size_t)i * C + c];
            sw += d * ((inp[(size_t)i * C + c] - mean[i]) * rstd[i]);
            sb += d;
        }
    pw[threadIdx.y][threadIdx.x] = sw;
    pb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < 8; y++) tw += pw[y][threadIdx.x], tb += pb[y][threadIdx.x];
        if (dw) dw[c] += tw;
        if (db) db[c] += tb;
    }
}

void loom_cuda_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean, const float *rstd, int N,
                             int C) {
    (void)ctx;
    if (N <= 0 || C <= 0) return;
    if (dinp) {
        k_ln_bwd_dx<<<(N + LN_WARPS - 1) / LN_WARPS, dim3(32, LN_WARPS), 0, lc_stream()>>>(dinp, dout, inp, w,
                                                                                           mean, rstd, N, C);
        if (!lc_launched("layernorm_bwd dinp")) return;
    }
    if (dw || db) {
        k_ln_bwd_params<<<(C + 31) / 32, dim3(32, 8), 0, lc_stream()>>>(dw, db, dout, inp, mean, rstd, N, C);
        lc_launched("layernorm_bwd dw db");
    }
}
