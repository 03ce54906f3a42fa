/* cuda_attention.cu - causal attention with online softmax on the GPU,
 * forward and backward, on the strided views of loom_att_view (so whole
 * sequences, context-parallel parts and the KV-cache decode share one
 * kernel), with the contract of src/kernels/cpu/attention.c: scores scaled
 * by 1/sqrt(HS), a key visible when its global position <= the query's,
 * output plus per-row log-sum-exp, rows that see no key give out 0 and
 * lse -inf, `accumulate` continues from an (out, lse) already there.
 *
 * Work split (fp32 on CUDA cores, no tensor cores): blocks of ATT_WARPS
 * warps, one row each; the rows of a block share tiles of 32 keys/values
 * (or queries/dout) that the block loads into shared memory once.
 * - forward: one warp per query row; per tile, lane j scores key j, the warp
 *   keeps the running max m and sum l, rescales its output (lane owns dims
 *   lane, lane+32, ...) when m grows, then adds p_j v_j.
 * - backward, pass 1: one warp per query row: D = dout . out, then
 *   dq += sum_j ds_j k_j with p_j = exp(s_j - lse), ds_j = scale p_j (dout.v_j - D).
 * - backward, pass 2: one warp per key row: dk += sum_i ds_i q_i,
 *   dv += sum_i p_i dout_i over the queries that see it (D from pass 1).
 * Each output row is written by one warp, so no atomics; the T x T matrix
 * never exists (memory O(T): D is B*NH*Tq floats of scratch).
 * Grouped-query attention: query head h reads key/value head h / rep; pass 2
 * runs per key/value head and adds the rep query heads that share it in
 * order. A sliding window narrows each row's keys to [lo, nk) and each key's
 * queries to [first, last].
 */
#include "cuda_internal.cuh"

#define ATT_WARPS 8 /* rows per block: warps sharing each key (or query) tile */
#define ATT_MAXD 8  /* dims per lane: HS <= 256 */

typedef struct {
    const float *q, *k, *v;
    size_t q_bs, kv_bs, o_bs;
    int q_ld, kv_ld, o_ld;
    int B, Tq, Tk, NH, HS;
    long q_pos0, k_pos0;
    int rep, window; /* query heads per key/value head; the view's window */
    float scale;
} att_args;

static att_args att_make(const loom_att_view *v, size_t o_bs, int o_ld) {
    att_args a;
    a.q = v->q, a.k = v->k, a.v = v->v;
    a.q_bs = v->q_bs, a.kv_bs = v->kv_bs, a.o_bs = o_bs;
    a.q_ld = v->q_ld, a.kv_ld = v->kv_ld, a.o_ld = o_ld;
    a.B = v->B, a.Tq = v->Tq, a.Tk = v->Tk, a.NH = v->NH, a.HS = v->HS;
    a.q_pos0 = v->q_pos0, a.k_pos0 = v->k_pos0;
    a.rep = v->NH / loom_att_nkv(v), a.window = v->window;
    a.scale = 1.0f / sqrtf((float)v->HS);
    return a;
}

__device__ static inline float att_dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* acc (the lane's dims lane, lane+32, ...) += s * row */
__device__ static inline void att_axpy(float *acc, float s, const float *row, int lane, int HS) {
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) {
        int d = lane + 32 * r;
        if (d < HS) acc[r] += s * row[d];
    }
}

/* Keys of the view visible to query row t: [0, nk). */
__device__ static inline int att_nk(const att_args &a, int t) {
    long last = a.q_pos0 + t - a.k_pos0; /* last visible key index */
    return last < 0 ? 0 : (last + 1 < a.Tk ? (int)(last + 1) : a.Tk);
}

/* The first key of the view visible to query row t (the window's left edge; 0 without one). */
__device__ static inline int att_lo(const att_args &a, int t) {
    if (a.window <= 0) return 0;
    long lo = a.q_pos0 + t - a.window - a.k_pos0;
    return lo < 0 ? 0 : (lo < a.Tk ? (int)lo : a.Tk);
}

/* First query row that sees key j (Tq when none does). */
__device__ static inline int att_first_q(const att_args &a, int j) {
    long first = a.k_pos0 + j - a.q_pos0;
    return first < 0 ? 0 : (first < a.Tq ? (int)first : a.Tq);
}

/* One past the last query row that sees key j (the window's; Tq without one). */
__device__ static inline int att_end_q(const att_args &a, int j) {
    if (a.window <= 0) return a.Tq;
    long end = a.k_pos0 + j + a.window + 1 - a.q_pos0;
    return end < 0 ? 0 : (end < a.Tq ? (int)end : a.Tq);
}

/* Rows [r0, r0+n) of a strided head slice (row stride ld) into shared
 * memory with row stride sld, by every thread of the block. */
__device__ static inline void att_load_tile(float *dst, int sld, const float *src, size_t ld, int n, int HS) {
    const int tid = threadIdx.y * 32 + threadIdx.x, nthr = 32 * ATT_WARPS;
    for (int e = tid; e < n * HS; e += nthr) {
        int r = e / HS, d = e % HS;
        dst[r * sld + d] = src[(size_t)r * ld + d];
    }
}

/* Forward: grid (ceil(Tq / ATT_WARPS), B*NH), block (32, ATT_WARPS): warp w
 * takes query row blockIdx.x * ATT_WARPS + w. The block loads each tile of
 * 32 keys (and values) into shared memory once for all its warps. Shared:
 * ATT_WARPS query rows, the key tile (rows padded to HS+1 floats: lane j
 * reads row j, no bank conflicts) and the value tile. */
__global__ static void k_att_fwd(att_args a, float *out, float *lse, int accumulate) {
    extern __shared__ float sh[];
    const int lane = threadIdx.x, w = threadIdx.y, t0 = blockIdx.x * ATT_WARPS, t = t0 + w, bh = blockIdx.y;
    const int b = bh / a.NH, h = bh % a.NH, HS = a.HS, KP = HS + 1;
    const bool active = t < a.Tq;
    float *qs = sh + w * HS, *ks = sh + ATT_WARPS * HS, *vs = ks + 32 * KP;
    const size_t kh = (size_t)(h / a.rep) * HS; /* its key/value head */
    const float *k = a.k + b * a.kv_bs + kh, *v = a.v + b * a.kv_bs + kh;
    float *o = out + b * a.o_bs + (size_t)(active ? t : 0) * a.o_ld + (size_t)h * HS;
    const int nk = active ? att_nk(a, t) : 0, lo = active ? att_lo(a, t) : 0;
    const int nk_blk =
        att_nk(a, (t0 + ATT_WARPS < a.Tq ? t0 + ATT_WARPS : a.Tq) - 1); /* the block's last row sees most */
    const int lo_blk = att_lo(a, t0) / 32 * 32;                         /* its first row the earliest */
    float acc[ATT_MAXD], m = -INFINITY, l = 0.0f;
    float l0 = active && accumulate && lse ? lse[(size_t)bh * a.Tq + t] : -INFINITY;
    if (active) {
        const float *q = a.q + b * a.q_bs + (size_t)t * a.q_ld + (size_t)h * HS;
        for (int d = lane; d < HS; d += 32) qs[d] = q[d];
    }
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) {
        int d = lane + 32 * r;
        acc[r] = l0 != -INFINITY && d < HS ? o[d] : 0.0f;
    }
    if (l0 != -INFINITY) m = l0, l = 1.0f; /* out is already normalised */
    for (int j0 = lo_blk; j0 < nk_blk; j0 += 32) {
        int nt = nk_blk - j0 < 32 ? nk_blk - j0 : 32;
        __syncthreads(); /* the previous tile is consumed */
        att_load_tile(ks, KP, k + (size_t)j0 * a.kv_ld, a.kv_ld, nt, HS);
        att_load_tile(vs, HS, v + (size_t)j0 * a.kv_ld, a.kv_ld, nt, HS);
        __syncthreads();
        if (j0 >= nk || j0 + 32 <= lo) continue; /* this warp's row sees none of the tile (warp-uniform) */
        int j = j0 + lane;
        float s = j < nk && j >= lo ? a.scale * att_dot(qs, ks + lane * KP, HS) : -INFINITY;
        float mx = lc_warp_max(s);
        if (mx == -INFINITY) continue; /* every score -inf (inf inputs): nothing to add */
        float mnew = fmaxf(mx, m);
        float alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
        float p = j < nk && j >= lo ? expf(s - mnew) : 0.0f;
        l = l * alpha + lc_warp_sum(p);
#pragma unroll
        for (int r = 0; r < ATT_MAXD; r++) acc[r] *= alpha;
        int n = nk - j0 < 32 ? nk - j0 : 32;
        for (int jj = 0; jj < n; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            att_axpy(acc, pj, vs + jj * HS, lane, HS);
        }
        m = mnew;
    }
    if (!active) return;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) {
        int d = lane + 32 * r;
        if (d < HS) o[d] = l > 0.0f ? acc[r] * inv : 0.0f;
    }
    if (lse && lane == 0) lse[(size_t)bh * a.Tq + t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* Backward pass 1: per query row, D (scratch) and dq +=. Shared: the warps'
 * q and dout rows, then tiles of 32 keys and values (padded rows). */
__global__ static void k_att_bwd_q(att_args a, float *dq, float *D, const float *dout, const float *out,
                                   const float *lse) {
    extern __shared__ float sh[];
    const int lane = threadIdx.x, w = threadIdx.y, t0 = blockIdx.x * ATT_WARPS, t = t0 + w, bh = blockIdx.y;
    const int b = bh / a.NH, h = bh % a.NH, HS = a.HS, KP = HS + 1;
    const bool active = t < a.Tq;
    float *qs = sh + w * 2 * HS, *gs = qs + HS, *ks = sh + 2 * ATT_WARPS * HS, *vs = ks + 32 * KP;
    const size_t kh = (size_t)(h / a.rep) * HS;
    const float *k = a.k + b * a.kv_bs + kh, *v = a.v + b * a.kv_bs + kh;
    size_t qo = b * a.q_bs + (size_t)(active ? t : 0) * a.q_ld + (size_t)h * HS;
    size_t oo = b * a.o_bs + (size_t)(active ? t : 0) * a.o_ld + (size_t)h * HS;
    float dpart = 0.0f;
    if (active)
        for (int d = lane; d < HS; d += 32) {
            qs[d] = a.q[qo + d];
            gs[d] = dout[oo + d];
            dpart += dout[oo + d] * out[oo + d];
        }
    float Di = lc_warp_sum(dpart), L = active ? lse[(size_t)bh * a.Tq + t] : -INFINITY;
    if (active && lane == 0) D[(size_t)bh * a.Tq + t] = Di;
    const int nk = active && L != -INFINITY ? att_nk(a, t) : 0; /* lse -inf: p = 0 everywhere */
    const int lo = active ? att_lo(a, t) : 0;
    const int nk_blk = att_nk(a, (t0 + ATT_WARPS < a.Tq ? t0 + ATT_WARPS : a.Tq) - 1);
    const int lo_blk = att_lo(a, t0) / 32 * 32;
    float acc[ATT_MAXD];
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) acc[r] = 0.0f;
    for (int j0 = lo_blk; j0 < nk_blk; j0 += 32) {
        int nt = nk_blk - j0 < 32 ? nk_blk - j0 : 32;
        __syncthreads();
        att_load_tile(ks, KP, k + (size_t)j0 * a.kv_ld, a.kv_ld, nt, HS);
        att_load_tile(vs, KP, v + (size_t)j0 * a.kv_ld, a.kv_ld, nt, HS);
        __syncthreads();
        if (j0 >= nk || j0 + 32 <= lo) continue;
        int j = j0 + lane;
        float ds = 0.0f;
        if (j < nk && j >= lo) {
            float p = expf(a.scale * att_dot(qs, ks + lane * KP, HS) - L);
            float dp = att_dot(gs, vs + lane * KP, HS);
            ds = a.scale * p * (dp - Di);
        }
        int n = nk - j0 < 32 ? nk - j0 : 32;
        for (int jj = lo > j0 ? lo - j0 : 0; jj < n; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            att_axpy(acc, dsj, ks + jj * KP, lane, HS);
        }
    }
    if (!active || L == -INFINITY) return;
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) {
        int d = lane + 32 * r;
        if (d < HS) dq[qo + d] += acc[r];
    }
}

/* Backward pass 2: per key row of key/value head g (grid y: b * NKV + g),
 * dk += and dv += over the rep query heads sharing it, in order. Shared:
 * the warps' k and v rows, then tiles of 32 query rows and their dout rows
 * (padded), lse and D. */
__global__ static void k_att_bwd_kv(att_args a, float *dk, float *dv, const float *D, const float *dout,
                                    const float *lse) {
    extern __shared__ float sh[];
    const int lane = threadIdx.x, w = threadIdx.y, j0k = blockIdx.x * ATT_WARPS, j = j0k + w;
    const int NKV = a.NH / a.rep, b = blockIdx.y / NKV, kvh = blockIdx.y % NKV, HS = a.HS, KP = HS + 1;
    const bool active = j < a.Tk;
    float *ks = sh + w * 2 * HS, *vs = ks + HS, *qt = sh + 2 * ATT_WARPS * HS, *gt = qt + 32 * KP;
    float *Lt = gt + 32 * KP, *Dt = Lt + 32;
    size_t ko = b * a.kv_bs + (size_t)(active ? j : 0) * a.kv_ld + (size_t)kvh * HS;
    if (active)
        for (int d = lane; d < HS; d += 32) {
            ks[d] = a.k[ko + d];
            vs[d] = a.v[ko + d];
        }
    const int jl = (j0k + ATT_WARPS < a.Tk ? j0k + ATT_WARPS : a.Tk) - 1; /* the block's last key */
    const int i_lo = active ? att_first_q(a, j) : a.Tq, i_end = active ? att_end_q(a, j) : 0,
              i_blk = att_first_q(a, j0k), /* the block's first key is seen first */
        i_blk_end = att_end_q(a, jl);      /* its last key the longest */
    float ak[ATT_MAXD], av[ATT_MAXD];
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) ak[r] = av[r] = 0.0f;
    for (int h = kvh * a.rep; h < (kvh + 1) * a.rep; h++) {
        const size_t bh = (size_t)b * a.NH + h;
        const float *q = a.q + b * a.q_bs + (size_t)h * HS, *g = dout + b * a.o_bs + (size_t)h * HS;
        const float *Lr = lse + bh * a.Tq, *Dr = D + bh * a.Tq;
        for (int i0 = i_blk; i0 < i_blk_end; i0 += 32) {
            int nt = i_blk_end - i0 < 32 ? i_blk_end - i0 : 32;
            __syncthreads();
            att_load_tile(qt, KP, q + (size_t)i0 * a.q_ld, a.q_ld, nt, HS);
            att_load_tile(gt, KP, g + (size_t)i0 * a.o_ld, a.o_ld, nt, HS);
            if (w == 0 && lane < nt) Lt[lane] = Lr[i0 + lane], Dt[lane] = Dr[i0 + lane];
            __syncthreads();
            if (i0 + nt <= i_lo || i0 >= i_end)
                continue; /* no query of the tile sees this key (warp-uniform) */
            int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (lane < nt && i >= i_lo && i < i_end && Lt[lane] != -INFINITY) {
                p = expf(a.scale * att_dot(qt + lane * KP, ks, HS) - Lt[lane]);
                float dp = att_dot(gt + lane * KP, vs, HS);
                ds = a.scale * p * (dp - Dt[lane]);
            }
            int ii_end = i_end - i0 < nt ? i_end - i0 : nt;
            for (int ii = i_lo > i0 ? i_lo - i0 : 0; ii < ii_end; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
                att_axpy(ak, dsi, qt + ii * KP, lane, HS);
                att_axpy(av, pi, gt + ii * KP, lane, HS);
            }
        }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < ATT_MAXD; r++) {
        int d = lane + 32 * r;
        if (d < HS) {
            dk[ko + d] += ak[r];
            dv[ko + d] += av[r];
        }
    }
}

/* 1 when there is work the kernels can do; a head size above 256 is
 * remembered as a failure (the per-lane accumulators hold 8 dims). */
static int att_check(const loom_att_view *v) {
    if (v->HS > 32 * ATT_MAXD) {
        lc_cuda(cudaErrorInvalidValue, "attention: head size above 256 is not supported");
        return 0;
    }
    return v->B > 0 && v->NH > 0 && v->Tq > 0 && v->HS > 0;
}

/* Dynamic shared memory of each kernel (floats), and the opt-in above the
 * default 48 KB (head sizes above 128). */
static size_t att_shm_fwd(int HS) {
    return ((size_t)ATT_WARPS * HS + 32 * (size_t)(HS + 1) + 32 * (size_t)HS) * sizeof(float);
}
static size_t att_shm_bwd(int HS) {
    return (2 * (size_t)ATT_WARPS * HS + 2 * 32 * (size_t)(HS + 1) + 64) * sizeof(float);
}

template <class K> static int att_shm_ok(K kernel, size_t bytes, const char *what) {
    if (bytes <= 48 * 1024) return 1;
    return lc_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                   what);
}

long loom_cuda_attention_part_fwd(void *ctx, const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                                  float *lse, int accumulate) {
    (void)ctx;
    if (att_check(v)) {
        att_args a = att_make(v, o_bs, o_ld);
        dim3 grid((v->Tq + ATT_WARPS - 1) / ATT_WARPS, v->B * v->NH);
        size_t shm = att_shm_fwd(v->HS);
        if (att_shm_ok(k_att_fwd, shm, "attention_fwd shared memory")) {
            k_att_fwd<<<grid, dim3(32, ATT_WARPS), shm, lc_stream()>>>(a, out, lse, accumulate);
            lc_launched("attention_fwd");
        }
    }
    return loom_attention_tiles(v);
}

long loom_cuda_attention_part_bwd(void *ctx, const loom_att_view *v, float *dq, float *dk, float *dv,
                                  const float *dout, const float *out, size_t o_bs, int o_ld,
                                  const float *lse) {
    if (att_check(v)) {
        att_args a = att_make(v, o_bs, o_ld);
        float *D =
            (float *)lc_scratch(lc_ctx(ctx), LC_SCRATCH_ROWS, (size_t)v->B * v->NH * v->Tq * sizeof(float));
        size_t shm = att_shm_bwd(v->HS);
        if (D && att_shm_ok(k_att_bwd_q, shm, "attention_bwd shared memory") &&
            att_shm_ok(k_att_bwd_kv, shm, "attention_bwd shared memory")) {
            dim3 gq((v->Tq + ATT_WARPS - 1) / ATT_WARPS, v->B * v->NH);
            k_att_bwd_q<<<gq, dim3(32, ATT_WARPS), shm, lc_stream()>>>(a, dq, D, dout, out, lse);
            if (lc_launched("attention_bwd dq") && v->Tk > 0) {
                dim3 gk((v->Tk + ATT_WARPS - 1) / ATT_WARPS, v->B * loom_att_nkv(v));
                k_att_bwd_kv<<<gk, dim3(32, ATT_WARPS), shm, lc_stream()>>>(a, dk, dv, D, dout, lse);
                lc_launched("attention_bwd dk dv");
            }
        }
    }
    return loom_attention_tiles(v);
}

/* The whole causal sequence of a packed qkv (B,T,3C). */
static loom_att_view qkv_view(const float *qkv, int B, int T, int C, int NH) {
    const loom_att_heads h = {NH, NH, C / NH, 0};
    return loom_att_packed(qkv, B, T, &h);
}

void loom_cuda_attention_fwd(void *ctx, float *out, float *lse, const float *qkv, int B, int T, int C,
                             int NH) {
    loom_att_view v = qkv_view(qkv, B, T, C, NH);
    loom_cuda_attention_part_fwd(ctx, &v, out, (size_t)T * C, C, lse, 0);
}

void loom_cuda_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int C, int NH) {
    loom_att_view v = qkv_view(qkv, B, T, C, NH);
    loom_cuda_attention_part_bwd(ctx, &v, dqkv, dqkv + C, dqkv + 2 * C, dout, out, (size_t)T * C, C, lse);
}

/* Merge of two partial results: one warp per (b, h, row). */
__global__ static void k_att_merge(float *out, float *lse, const float *out2, const float *lse2, size_t o_bs,
                                   int o_ld, int B, int Tq, int NH, int HS) {
    size_t row = (size_t)blockIdx.x * ATT_WARPS + threadIdx.y;
    if (row >= (size_t)B * NH * Tq) return;
    int bh = (int)(row / Tq), i = (int)(row % Tq), b = bh / NH, h = bh % NH;
    size_t oo = b * o_bs + (size_t)i * o_ld + (size_t)h * HS;
    float a = lse[row], c = lse2[row];
    if (c == -INFINITY) return;
    if (a == -INFINITY) {
        for (int d = threadIdx.x; d < HS; d += 32) out[oo + d] = out2[oo + d];
        __syncwarp();
        if (threadIdx.x == 0) lse[row] = c;
        return;
    }
    float mx = fmaxf(a, c);
    float wa = expf(a - mx), wc = expf(c - mx), l = wa + wc;
    wa /= l, wc /= l;
    for (int d = threadIdx.x; d < HS; d += 32) out[oo + d] = wa * out[oo + d] + wc * out2[oo + d];
    __syncwarp();
    if (threadIdx.x == 0) lse[row] = mx + logf(l);
}

void loom_cuda_attention_merge(void *ctx, float *out, float *lse, const float *out2, const float *lse2,
                               size_t o_bs, int o_ld, int B, int Tq, int NH, int HS) {
    (void)ctx;
    size_t rows = (size_t)B * NH * Tq;
    if (!rows) return;
    k_att_merge<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), dim3(32, ATT_WARPS), 0, lc_stream()>>>(
        out, lse, out2, lse2, o_bs, o_ld, B, Tq, NH, HS);
    lc_launched("attention_merge");
}

/* Decode against a KV cache: the view of n query rows at positions p0.. of
 * one sequence over cache rows 0 .. p0+n-1; no lse needed. */
void loom_cuda_attention_kv_fwd(void *ctx, float *out, const float *q, int ldq, const float *kc,
                                const float *vc, int p0, int n, int C, int NH, int NKV, int window,
                                float *scratch) {
    (void)scratch;
    loom_att_view v = {q, kc, vc, 0, 0, ldq, NKV * (C / NH), 1, n, p0 + n, NH, C / NH, p0, 0, NKV, window};
    loom_cuda_attention_part_fwd(ctx, &v, out, 0, C, NULL, 0);
}
