/* cuda_vocab.cu - vocabulary-parallel embedding, positions and softmax
 * cross-entropy on the GPU, with src/kernels/cpu/vocab.c's contract: this
 * rank holds vocabulary rows [v0, v0 + V_l), V_valid of them real; padding
 * never enters a max or a sum. The caller all-reduces between the phases.
 *
 * Gradients into shared rows (two tokens, or two rows at the same position)
 * are summed in increasing row order, the CPU's order: no atomics, so the
 * result is deterministic and the same float additions as the CPU's.
 * Row-wise phases take one block per row.
 */
#include "cuda_internal.cuh"

__global__ static void k_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                                   int C) {
    LC_FOR(e, (size_t)N * C) {
        size_t i = e / (size_t)C, c = e % (size_t)C;
        int r = tok[i] - v0;
        out[e] = r >= 0 && r < V_l ? wte_l[(size_t)r * C + c] : 0.0f;
    }
}

void loom_cuda_embed_fwd(void *ctx, float *out, const int32_t *tok, const float *wte_l, int v0, int V_l,
                         int N, int C) {
    (void)ctx;
    if (N <= 0 || C <= 0) return;
    k_embed_fwd<<<lc_blocks((size_t)N * C), LC_THREADS, 0, lc_stream()>>>(out, tok, wte_l, v0, V_l, N, C);
    lc_launched("embed_fwd");
}

/* One block per row i: if i is the first row holding its token (and the
 * token is local), the block adds every row with that token, in row order,
 * to the token's gradient row - the CPU's order of additions, with the
 * blocks of distinct tokens in parallel. Rows repeating an earlier token
 * return at once. */
__global__ static void k_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l,
                                   int N, int C) {
    __shared__ int seen;
    const int i = blockIdx.x, t = tok[i], r = t - v0;
    if (r < 0 || r >= V_l) return;
    if (threadIdx.x == 0) seen = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < i; j += blockDim.x)
        if (tok[j] == t) seen = 1;
    __syncthreads();
    if (seen) return;
    float *g = dwte_l + (size_t)r * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = g[c];
        for (int j = i; j < N; j++)
            if (tok[j] == t) acc += dout[(size_t)j * C + c];
        g[c] = acc;
    }
}

void loom_cuda_embed_bwd(void *ctx, float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l,
                         int N, int C) {
    (void)ctx;
    if (N <= 0 || C <= 0) return;
    k_embed_bwd<<<N, LC_THREADS, 0, lc_stream()>>>(dwte_l, dout, tok, v0, V_l, N, C);
    lc_launched("embed_bwd");
}

__global__ static void k_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C) {
    LC_FOR(e, (size_t)n * C) {
        size_t i = e / (size_t)C, c = e % (size_t)C;
        out[e] += wpe[(size_t)((row0 + (long)i) % T) * C + c];
    }
}

void loom_cuda_pos_fwd(void *ctx, float *out, const float *wpe, int row0, int n, int T, int C) {
    (void)ctx;
    if (n <= 0 || C <= 0) return;
    k_pos_fwd<<<lc_blocks((size_t)n * C), LC_THREADS, 0, lc_stream()>>>(out, wpe, row0, n, T, C);
    lc_launched("pos_fwd");
}

/* one thread per (position p, column c): rows i with (row0 + i) % T == p, in order */
__global__ static void k_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C) {
    LC_FOR(e, (size_t)T * C) {
        int p = (int)(e / (size_t)C), c = (int)(e % (size_t)C);
        int i = ((p - row0) % T + T) % T;
        float acc = dwpe[e];
        for (; i < n; i += T) acc += dout[(size_t)i * C + c];
        dwpe[e] = acc;
    }
}

void loom_cuda_pos_bwd(void *ctx, float *dwpe, const float *dout, int row0, int n, int T, int C) {
    (void)ctx;
    if (n <= 0 || C <= 0 || T <= 0) return;
    k_pos_bwd<<<lc_blocks((size_t)T * C), LC_THREADS, 0, lc_stream()>>>(dwpe, dout, row0, n, T, C);
    lc_launched("pos_bwd");
}

/* Block-wide reduction (blockDim.x == LC_THREADS), result on every thread:
 * MAX = 1 takes the maximum, else the sum. */
template <int MAX> __device__ static float block_reduce(float x) {
    __shared__ float sh[LC_THREADS / 32];
    x = MAX ? lc_warp_max(x) : lc_warp_sum(x);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = x;
    __syncthreads();
    float r = MAX ? -INFINITY : 0.0f;
    for (int w = 0; w < LC_THREADS / 32; w++) r = MAX ? fmaxf(r, sh[w]) : r + sh[w];
    return r;
}

__global__ static void k_vxent_max(float *rowmax, const float *logits, int V_l, int V_valid) {
    const float *z = logits + (size_t)blockIdx.x * V_l;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V_valid; j += LC_THREADS) m = fmaxf(m, z[j]);
    m = block_reduce<1>(m);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

void loom_cuda_vxent_max(void *ctx, float *rowmax, const float *logits, int N, int V_l, int V_valid) {
    (void)ctx;
    if (N <= 0) return;
    k_vxent_max<<<N, LC_THREADS, 0, lc_stream()>>>(rowmax, logits, V_l, V_valid);
    lc_launched("vxent_max");
}

__global__ static void k_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                                   const int32_t *targets, int v0, int V_l, int V_valid) {
    int i = blockIdx.x;
    float *z = logits + (size_t)i * V_l;
    float gm = gmax[i];
    int t = targets[i] - v0;
    if (threadIdx.x == 0) tgt[i] = targets[i] >= 0 && t >= 0 && t < V_valid ? z[t] - gm : 0.0f;
    __syncthreads(); /* z[t] is read before it is overwritten below */
    float s = 0.0f;
    for (int j = threadIdx.x; j < V_l; j += LC_THREADS) {
        float e = j < V_valid ? expf(z[j] - gm) : 0.0f;
        z[j] = e;
        s += e;
    }
    s = block_reduce<0>(s);
    if (threadIdx.x == 0) rowsum[i] = s;
}

void loom_cuda_vxent_exp(void *ctx, float *logits, float *rowsum, float *tgt, const float *gmax,
                         const int32_t *targets, int v0, int N, int V_l, int V_valid) {
    (void)ctx;
    if (N <= 0) return;
    k_vxent_exp<<<N, LC_THREADS, 0, lc_stream()>>>(logits, rowsum, tgt, gmax, targets, v0, V_l, V_valid);
    lc_launched("vxent_exp");
}

__global__ static void k_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                                      const int32_t *targets, int V_l) {
    int i = blockIdx.x;
    float inv = 1.0f / gsum[i];
    if (threadIdx.x == 0) losses[i] = targets[i] >= 0 ? logf(gsum[i]) - gtgt[i] : 0.0f;
    float *p = probs + (size_t)i * V_l;
    for (int j = threadIdx.x; j < V_l; j += LC_THREADS) p[j] *= inv;
}

void loom_cuda_vxent_finish(void *ctx, float *losses, float *probs, const float *gsum, const float *gtgt,
                            const int32_t *targets, int N, int V_l) {
    (void)ctx;
    if (N <= 0) return;
    k_vxent_finish<<<N, LC_THREADS, 0, lc_stream()>>>(losses, probs, gsum, gtgt, targets, V_l);
    lc_launched("vxent_finish");
}

/* d = p * dloss, minus dloss at the local target; 0 rows for target < 0.
 * dlogits may alias probs: each element is read, then written, by one thread. */
__global__ static void k_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                                   int v0, int V_l) {
    int i = blockIdx.x, t = targets[i] - v0;
    int skip = targets[i] < 0;
    float *d = dlogits + (size_t)i * V_l;
    const float *p = probs + (size_t)i * V_l;
    for (int j = threadIdx.x; j < V_l; j += LC_THREADS) {
        float x = skip ? 0.0f : p[j] * dloss;
        if (!skip && j == t) x -= dloss;
        d[j] = x;
    }
}

void loom_cuda_vxent_bwd(void *ctx, float *dlogits, const float *probs, const int32_t *targets, float dloss,
                         int v0, int N, int V_l) {
    (void)ctx;
    if (N <= 0) return;
    k_vxent_bwd<<<N, LC_THREADS, 0, lc_stream()>>>(dlogits, probs, targets, dloss, v0, V_l);
    lc_launched("vxent_bwd");
}
