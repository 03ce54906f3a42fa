/* cuda_llama.cu - the Llama family's block parts on the GPU, with the
 * formulas of src/kernels/cpu/llama_ops.c: RMSNorm (one warp per row;
 * the weight gradient a deterministic column sum as cuda_norm.cu's),
 * SwiGLU (elementwise) and rotary positions (a thread per rotated pair,
 * cosf / sinf of the float angle, as the CPU computes them).
 */
#include "cuda_internal.cuh"

#define RMS_WARPS 8 /* rows per block */

__global__ static void k_rms_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                                 float eps) {
    int row = blockIdx.x * RMS_WARPS + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c] * x[c];
    float r = 1.0f / sqrtf(lc_warp_sum(s) / (float)C + eps);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = x[c] * r * w[c];
    if (lane == 0) rstd[row] = r;
}

void loom_cuda_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                           float eps) {
    (void)ctx;
    if (N <= 0) return;
    k_rms_fwd<<<(N + RMS_WARPS - 1) / RMS_WARPS, dim3(32, RMS_WARPS), 0, lc_stream()>>>(out, rstd, inp, w, N,
                                                                                        C, eps);
    lc_launched("rmsnorm_fwd");
}

/* dx (C) += r (g - x r^2 mean(g x)), g = dout * w */
__global__ static void k_rms_bwd_dx(float *dinp, const float *dout, const float *inp, const float *w,
                                    const float *rstd, int N, int C) {
    int row = blockIdx.x * RMS_WARPS + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float r = rstd[row], s = 0.0f;
    for (int c = lane; c < C; c += 32) s += d[c] * w[c] * x[c];
    float k = r * r * (lc_warp_sum(s) / (float)C);
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) dx[c] += r * (d[c] * w[c] - x[c] * k);
}

/* dw (C) += sum_i dout x rstd */
__global__ static void k_rms_bwd_dw(float *dw, const float *dout, const float *inp, const float *rstd, int N,
                                    int C) {
    __shared__ float pw[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sw = 0.0f;
    if (c < C)
        for (int i = threadIdx.y; i < N; i += 8)
            sw += dout[(size_t)i * C + c] * (inp[(size_t)i * C + c] * rstd[i]);
    pw[threadIdx.y][threadIdx.x] = sw;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += pw[y][threadIdx.x];
        dw[c] += t;
    }
}

void loom_cuda_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                           const float *w, const float *rstd, int N, int C) {
    (void)ctx;
    if (N <= 0 || C <= 0) return;
    if (dinp) {
        k_rms_bwd_dx<<<(N + RMS_WARPS - 1) / RMS_WARPS, dim3(32, RMS_WARPS), 0, lc_stream()>>>(
            dinp, dout, inp, w, rstd, N, C);
        if (!lc_launched("rmsnorm_bwd dinp")) return;
    }
    if (dw) {
        k_rms_bwd_dw<<<(C + 31) / 32, dim3(32, 8), 0, lc_stream()>>>(dw, dout, inp, rstd, N, C);
        lc_launched("rmsnorm_bwd dw");
    }
}

/* exp(-g) with its argument capped at 80, as the CPU's */
__device__ static inline float silu_exp_neg(float g) { return expf(fminf(-g, 80.0f)); }

__global__ static void k_swiglu_fwd(float *out, const float *gu, int N, int H) {
    size_t n = (size_t)N * H;
    LC_FOR(i, n) {
        size_t r = i / H, c = i % H;
        float g = gu[r * 2 * H + c], u = gu[r * 2 * H + H + c];
        out[i] = g / (1.0f + silu_exp_neg(g)) * u;
    }
}

__global__ static void k_swiglu_bwd(float *dgu, const float *gu, const float *dout, int N, int H) {
    size_t n = (size_t)N * H;
    LC_FOR(i, n) {
        size_t r = i / H, c = i % H;
        float g = gu[r * 2 * H + c], u = gu[r * 2 * H + H + c], d = dout[i];
        float s = 1.0f / (1.0f + silu_exp_neg(g));
        dgu[r * 2 * H + c] = d * u * (s * (1.0f + g * (1.0f - s)));
        dgu[r * 2 * H + H + c] = d * (g * s);
    }
}

void loom_cuda_swiglu_fwd(void *ctx, float *out, const float *gu, int N, int H) {
    (void)ctx;
    size_t n = (size_t)N * H;
    if (!n) return;
    k_swiglu_fwd<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(out, gu, N, H);
    lc_launched("swiglu_fwd");
}

void loom_cuda_swiglu_bwd(void *ctx, float *dgu, const float *gu, const float *dout, int N, int H) {
    (void)ctx;
    size_t n = (size_t)N * H;
    if (!n) return;
    k_swiglu_bwd<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(dgu, gu, dout, N, H);
    lc_launched("swiglu_bwd");
}

/* one thread per (row, head, pair) */
__global__ static void k_rope(float *x, int ld, const int32_t *pos, const float *inv_freq, int N, int nh,
                              int HS, int inverse) {
    const int half = HS / 2;
    size_t n = (size_t)N * nh * half;
    LC_FOR(e, n) {
        size_t r = e / ((size_t)nh * half);
        int rest = (int)(e % ((size_t)nh * half)), h = rest / half, i = rest % half;
        float f = (float)pos[r] * inv_freq[i];
        float cs = cosf(f), sn = inverse ? -sinf(f) : sinf(f);
        float *a = x + r * ld + (size_t)h * HS;
        float xa = a[i], xb = a[i + half];
        a[i] = xa * cs - xb * sn;
        a[i + half] = xb * cs + xa * sn;
    }
}

void loom_cuda_rope(void *ctx, float *x, int ld, const int32_t *pos, const float *inv_freq, int N, int nh,
                    int HS, int inverse) {
    (void)ctx;
    size_t n = (size_t)N * nh * (HS / 2);
    if (!n) return;
    k_rope<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(x, ld, pos, inv_freq, N, nh, HS, inverse);
    lc_launched("rope");
}
