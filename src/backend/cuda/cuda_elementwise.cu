/* cuda_elementwise.cu - GELU (tanh), residual, AdamW, scale, bf16 rounding
 * and packing:
 * flat grid-stride loops, the same formulas as the CPU kernels
 * (src/kernels/cpu/activations.c, util.c, optim.c, bf16.c) in the same
 * order of operations. The library is built without FMA contraction, so an
 * expression rounds as the CPU's does; GELU's exp is CUDA's expf (within
 * 2 ulp) where the CPU uses its own kern_expf, the only source of difference.
 */
#include "cuda_internal.cuh"

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* exp(-2u) of gelu(x) = x / (1 + exp(-2u)), argument capped at 80 as on the CPU */
__device__ static inline float gelu_exp_m2u(float x) {
    float z = -2.0f * GELU_K0 * (x + GELU_K1 * x * x * x);
    z = z > 80.0f ? 80.0f : z;
    return expf(z);
}

__global__ static void k_gelu_fwd(float *out, const float *inp, size_t n) {
    LC_FOR(i, n) {
        float x = inp[i];
        out[i] = x / (1.0f + gelu_exp_m2u(x));
    }
}

__global__ static void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    LC_FOR(i, n) {
        float x = inp[i];
        float e = gelu_exp_m2u(x);
        float s = 1.0f / (1.0f + e);
        float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
        float grad = s + 2.0f * x * s * (du * (e * s));
        dinp[i] += grad * dout[i];
    }
}

void loom_cuda_gelu_fwd(void *ctx, float *out, const float *inp, size_t n) {
    (void)ctx;
    if (!n) return;
    k_gelu_fwd<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(out, inp, n);
    lc_launched("gelu_fwd");
}

void loom_cuda_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n) {
    (void)ctx;
    if (!n) return;
    k_gelu_bwd<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(dinp, inp, dout, n);
    lc_launched("gelu_bwd");
}

__global__ static void k_residual_fwd(float *out, const float *a, const float *b, size_t n) {
    LC_FOR(i, n) out[i] = a[i] + b[i];
}

__global__ static void k_residual_bwd(float *da, float *db, const float *dout, size_t n) {
    LC_FOR(i, n) {
        float d = dout[i];
        da[i] += d;
        db[i] += d;
    }
}

void loom_cuda_residual_fwd(void *ctx, float *out, const float *a, const float *b, size_t n) {
    (void)ctx;
    if (!n) return;
    k_residual_fwd<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(out, a, b, n);
    lc_launched("residual_fwd");
}

void loom_cuda_residual_bwd(void *ctx, float *da, float *db, const float *dout, size_t n) {
    (void)ctx;
    if (!n) return;
    k_residual_bwd<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(da, db, dout, n);
    lc_launched("residual_bwd");
}

/* ---- AdamW: torch.optim.AdamW's single-tensor update, per-step scalars in
 * double on the host and rounded once, as optim.c does ---------------------- */

typedef struct {
    float decay, b1, c1, b2, c2, bc2_sqrt, neg_step, eps, gscale;
} adamw_k;

__global__ static void k_adamw(float *p, const float *g, float *m, float *v, size_t n, adamw_k k) {
    LC_FOR(i, n) {
        float gi = g[i] * k.gscale;
        float mi = m[i] * k.b1 + k.c1 * gi;
        float vi = v[i] * k.b2 + k.c2 * gi * gi;
        float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
        p[i] = p[i] * k.decay + k.neg_step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void loom_cuda_adamw_update(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                            float beta1, float beta2, float eps, float wd, int t, float gscale) {
    (void)ctx;
    if (!n) return;
    adamw_k k;
    k.decay = (float)(1.0 - (double)lr * (double)wd);
    k.b1 = beta1;
    k.c1 = (float)(1.0 - (double)beta1);
    k.b2 = beta2;
    k.c2 = (float)(1.0 - (double)beta2);
    k.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
    k.neg_step = -(float)((double)lr / (1.0 - pow((double)beta1, (double)t)));
    k.eps = eps;
    k.gscale = gscale;
    k_adamw<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(p, g, m, v, n, k);
    lc_launched("adamw_update");
}

/* ---- whole-buffer helpers ---------------------------------------------------- */

__global__ static void k_scale(float *x, size_t n, float s) { LC_FOR(i, n) x[i] *= s; }

void loom_cuda_scale(void *ctx, float *x, size_t n, float s) {
    (void)ctx;
    if (!n) return;
    k_scale<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(x, n, s);
    lc_launched("scale");
}

/* round to nearest bf16, ties to even; inf stays, NaN stays a quiet NaN (bf16.c) */
__device__ static inline float bf16_round(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        if (u & 0x007fffffu) u = (u & 0xffff0000u) | 0x00400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
    }
    return __uint_as_float(u);
}

__global__ static void k_round_bf16(float *dst, const float *src, size_t n) {
    LC_FOR(i, n) dst[i] = bf16_round(src[i]);
}

void loom_cuda_round_bf16(void *ctx, float *dst, const float *src, size_t n) {
    (void)ctx;
    if (!n) return;
    k_round_bf16<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(dst, src, n);
    lc_launched("round_bf16");
}

/* bf16 bits and back (loom/bf16.h: loom_bf16_from_f32, loom_bf16_to_f32) */
__global__ static void k_bf16_pack(uint16_t *dst, const float *src, size_t n) {
    LC_FOR(i, n) dst[i] = (uint16_t)(__float_as_uint(bf16_round(src[i])) >> 16);
}
__global__ static void k_bf16_unpack(float *dst, const uint16_t *src, size_t n) {
    LC_FOR(i, n) dst[i] = __uint_as_float((unsigned)src[i] << 16);
}

void loom_cuda_bf16_pack(void *ctx, uint16_t *dst, const float *src, size_t n) {
    (void)ctx;
    if (!n) return;
    k_bf16_pack<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(dst, src, n);
    lc_launched("bf16_pack");
}

void loom_cuda_bf16_unpack(void *ctx, float *dst, const uint16_t *src, size_t n) {
    (void)ctx;
    if (!n) return;
    k_bf16_unpack<<<lc_blocks(n), LC_THREADS, 0, lc_stream()>>>(dst, src, n);
    lc_launched("bf16_unpack");
}

/* Sum of squares in double: each block writes one partial, the host adds
 * the partials (at most lc_blocks(n) of them) in order. */
__global__ static void k_sumsq(double *part, const float *x, size_t n) {
    __shared__ double sh[LC_THREADS];
    double s = 0.0;
    LC_FOR(i, n) s += (double)x[i] * (double)x[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = LC_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

/* Reductions to a host value use up to this many blocks. */
#define LC_RED_BLOCKS 1024

double loom_cuda_sumsq(void *ctx, const float *x, size_t n) {
    if (!n) return 0.0;
    unsigned nb = lc_blocks(n) < LC_RED_BLOCKS ? lc_blocks(n) : LC_RED_BLOCKS;
    double *part = (double *)lc_scratch(lc_ctx(ctx), LC_SCRATCH_RED, nb * sizeof(double));
    if (!part) return NAN;
    k_sumsq<<<nb, LC_THREADS, 0, lc_stream()>>>(part, x, n);
    if (!lc_launched("sumsq")) return NAN;
    double host[LC_RED_BLOCKS];
    if (!lc_cuda(cudaMemcpyAsync(host, part, nb * sizeof(double), cudaMemcpyDeviceToHost, lc_stream()),
                 "sumsq copy") ||
        !lc_cuda(cudaStreamSynchronize(lc_stream()), "sumsq synchronize"))
        return NAN;
    double s = 0.0;
    for (unsigned i = 0; i < nb; i++) s += host[i];
    return s;
}

/* 1 in *bad when some element's exponent bits are all ones (inf or NaN) */
__global__ static void k_nonfinite(unsigned *bad, const float *x, size_t n) {
    unsigned b = 0;
    LC_FOR(i, n) b |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
    if (__syncthreads_or(b) && threadIdx.x == 0) *bad = 1u;
}

int loom_cuda_all_finite(void *ctx, const float *x, size_t n) {
    if (!n) return 1;
    unsigned *bad = (unsigned *)lc_scratch(lc_ctx(ctx), LC_SCRATCH_RED, LC_RED_BLOCKS * sizeof(double));
    if (!bad) return 0;
    unsigned host = 1;
    if (!lc_cuda(cudaMemsetAsync(bad, 0, sizeof *bad, lc_stream()), "all_finite memset")) return 0;
    unsigned nb = lc_blocks(n) < LC_RED_BLOCKS ? lc_blocks(n) : LC_RED_BLOCKS;
    k_nonfinite<<<nb, LC_THREADS, 0, lc_stream()>>>(bad, x, n);
    if (!lc_launched("all_finite")) return 0;
    if (!lc_cuda(cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, lc_stream()),
                 "all_finite copy") ||
        !lc_cuda(cudaStreamSynchronize(lc_stream()), "all_finite synchronize"))
        return 0;
    return host == 0;
}
