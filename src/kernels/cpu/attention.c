/* attention.c - causal multi-head attention with online softmax (blocked,
 * flash-attention style), forward and backward, in O(T) memory.
 *
 * The forward walks query tiles of ATT_BQ rows; for each it visits the key
 * tiles of ATT_BK keys the causal mask lets it see, keeping per row a running
 * maximum m and a running sum l of exp(score - m) and rescaling the output
 * accumulated so far whenever m grows. Only the normalised output and the
 * per-row log-sum-exp lse = m + log(l) are kept. The backward recomputes
 * each tile's probabilities exp(score - lse) from q, k and lse, so the
 * T x T matrix never exists; its only per-row input besides lse is
 * D_i = sum_d dout[i,d] out[i,d].
 *
 * The tile routines work on views with arbitrary strides and global
 * positions (loom_att_view), so a query slice can attend to a key/value slice
 * held elsewhere (ring context parallelism); two such partial results merge
 * exactly through their log-sum-exps. Products are cblas_sgemm calls on
 * strided views; independent (batch, head, query tile) work is shared out
 * over OpenMP threads, each calling the one-thread OpenBLAS. The per-tile
 * buffers live on the stack, so no kernel here takes scratch memory.
 */
#include <cblas.h>

#include "kern_vec.h"
#include "loom/cpu.h"

#define ATT_BQ 64 /* query rows per tile */
#define ATT_BK 64 /* keys per tile */

/* Keys of tile [j0, j0+n) visible to some query of tile [i0, i0+m)? (The
 * causal right edge; tiles left of the window are skipped by tile_start.) */
static int tile_visible(const loom_att_view *v, int i0, int m, int j0) {
    return v->k_pos0 + j0 <= v->q_pos0 + i0 + m - 1;
}

/* The first key tile a query tile starting at i0 may see: 0, or with a
 * window the tile holding its first query's first visible key. */
static int tile_start(const loom_att_view *v, int i0) {
    if (v->window <= 0) return 0;
    long lo = v->q_pos0 + i0 - v->window - v->k_pos0;
    return lo <= 0 ? 0 : lo >= v->Tk ? v->Tk : (int)(lo / ATT_BK * ATT_BK);
}

/* Every key of tile [j0, j0+n) visible to every query of [i0, i0+m)? */
static int tile_full(const loom_att_view *v, int i0, int m, int j0, int n) {
    if (v->window > 0 && v->q_pos0 + i0 + m - 1 - (v->k_pos0 + j0) > v->window) return 0;
    return v->k_pos0 + j0 + n - 1 <= v->q_pos0 + i0;
}

static int imin(int a, int b) { return a < b ? a : b; }

long loom_attention_tiles(const loom_att_view *v) {
    long tiles = 0;
    for (int i0 = 0; i0 < v->Tq; i0 += ATT_BQ) {
        int m = imin(ATT_BQ, v->Tq - i0);
        for (int j0 = tile_start(v, i0); j0 < v->Tk && tile_visible(v, i0, m, j0); j0 += ATT_BK) tiles++;
    }
    return tiles * v->B * v->NH;
}

/* s (m,n) = scale * q_tile k_tile^T, with -inf where the key is masked. */
static void tile_scores(float *s, const loom_att_view *v, const float *q, const float *k, int i0, int m,
                        int j0, int n, float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, v->HS, scale, q + (size_t)i0 * v->q_ld,
                v->q_ld, k + (size_t)j0 * v->kv_ld, v->kv_ld, 0.0f, s, ATT_BK);
    if (tile_full(v, i0, m, j0, n)) return;
    for (int i = 0; i < m; i++) {
        long last = v->q_pos0 + i0 + i - v->k_pos0 - j0; /* last visible column */
        for (int j = (int)(last + 1 < 0 ? 0 : last + 1); j < n; j++) s[(size_t)i * ATT_BK + j] = -INFINITY;
        long first = v->window > 0 ? last - v->window : 0; /* first visible column */
        for (int j = 0; j < n && j < first; j++) s[(size_t)i * ATT_BK + j] = -INFINITY;
    }
}

/* Forward of one (b, h) and query tile [i0, i0+m). q, k, v, o point at
 * head h of batch b; lse at (b, h, 0). */
static void tile_fwd(const loom_att_view *v, const float *q, const float *k, const float *vv, float *o,
                     int o_ld, float *lse, int i0, int m, int accumulate, float scale) {
    float s[ATT_BQ * ATT_BK], mrow[ATT_BQ], lrow[ATT_BQ];
    const int HS = v->HS;
    for (int i = 0; i < m; i++) {
        float *orow = o + (size_t)(i0 + i) * o_ld;
        float l0 = accumulate ? lse[i0 + i] : -INFINITY;
        if (l0 == -INFINITY) {
            memset(orow, 0, (size_t)HS * sizeof *orow);
            mrow[i] = -INFINITY, lrow[i] = 0.0f;
        } else {
            mrow[i] = l0, lrow[i] = 1.0f; /* out is already normalised */
        }
    }
    for (int j0 = tile_start(v, i0); j0 < v->Tk && tile_visible(v, i0, m, j0); j0 += ATT_BK) {
        int n = imin(ATT_BK, v->Tk - j0);
        tile_scores(s, v, q, k, i0, m, j0, n, scale);
        for (int i = 0; i < m; i++) {
            float *row = s + (size_t)i * ATT_BK;
            float mx = kern_max(row, n);
            if (mx == -INFINITY) { /* no visible key in this tile */
                memset(row, 0, (size_t)n * sizeof *row);
                continue;
            }
            float mnew = mx > mrow[i] ? mx : mrow[i];
            float alpha = mrow[i] == -INFINITY ? 0.0f : kern_expf(mrow[i] - mnew);
            kv_exp_shift(row, n, mnew);
            lrow[i] = lrow[i] * alpha + kern_sum(row, n);
            if (alpha != 1.0f) kern_scale_row(o + (size_t)(i0 + i) * o_ld, HS, alpha);
            mrow[i] = mnew;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, n, 1.0f, s, ATT_BK,
                    vv + (size_t)j0 * v->kv_ld, v->kv_ld, 1.0f, o + (size_t)i0 * o_ld, o_ld);
    }
    for (int i = 0; i < m; i++) {
        if (lrow[i] > 0.0f) {
            kern_scale_row(o + (size_t)(i0 + i) * o_ld, HS, 1.0f / lrow[i]);
            lse[i0 + i] = mrow[i] + logf(lrow[i]);
        } else {
            lse[i0 + i] = -INFINITY;
        }
    }
}

long loom_cpu_attention_part_fwd(void *ctx, const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                                 float *lse, int accumulate) {
    const int nqt = (v->Tq + ATT_BQ - 1) / ATT_BQ;
    const int work = v->B * v->NH * nqt;
    const float scale = 1.0f / sqrtf((float)v->HS);
    int nth = kern_threads(ctx);
    KERN_PARALLEL_FOR(nth)
    for (int w = 0; w < work; w++) {
        int bh = w / nqt, i0 = (w % nqt) * ATT_BQ;
        int b = bh / v->NH, h = bh % v->NH;
        size_t hc = (size_t)h * v->HS, kc = (size_t)loom_att_kv_head(v, h) * v->HS;
        tile_fwd(v, v->q + b * v->q_bs + hc, v->k + b * v->kv_bs + kc, v->v + b * v->kv_bs + kc,
                 out + b * o_bs + hc, o_ld, lse + (size_t)bh * v->Tq, i0, imin(ATT_BQ, v->Tq - i0),
                 accumulate, scale);
    }
    return loom_attention_tiles(v);
}

/* Backward of one (b, h): every query tile against its visible key tiles. */
static void head_bwd(const loom_att_view *v, const float *q, const float *k, const float *vv, float *dq,
                     float *dk, float *dv, const float *dout, const float *o, int o_ld, const float *lse,
                     float scale) {
    float p[ATT_BQ * ATT_BK], dp[ATT_BQ * ATT_BK], D[ATT_BQ];
    const int HS = v->HS, ql = v->q_ld, kl = v->kv_ld;
    for (int i0 = 0; i0 < v->Tq; i0 += ATT_BQ) {
        int m = imin(ATT_BQ, v->Tq - i0);
        for (int i = 0; i < m; i++)
            D[i] = kern_dot(dout + (size_t)(i0 + i) * o_ld, o + (size_t)(i0 + i) * o_ld, HS);
        for (int j0 = tile_start(v, i0); j0 < v->Tk && tile_visible(v, i0, m, j0); j0 += ATT_BK) {
            int n = imin(ATT_BK, v->Tk - j0);
            tile_scores(p, v, q, k, i0, m, j0, n, scale);
            for (int i = 0; i < m; i++) {
                float *row = p + (size_t)i * ATT_BK;
                if (lse[i0 + i] == -INFINITY) memset(row, 0, (size_t)n * sizeof *row);
                else kv_exp_shift(row, n, lse[i0 + i]); /* masked: exp(-inf) = 0 */
            }
            /* dv (n,HS) += p^T dout;  dp (m,n) = dout v^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, m, 1.0f, p, ATT_BK,
                        dout + (size_t)i0 * o_ld, o_ld, 1.0f, dv + (size_t)j0 * kl, kl);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, HS, 1.0f, dout + (size_t)i0 * o_ld,
                        o_ld, vv + (size_t)j0 * kl, kl, 0.0f, dp, ATT_BK);
            /* dscore * scale = scale * p (dp - D) */
            for (int i = 0; i < m; i++) {
                float *dr = dp + (size_t)i * ATT_BK;
                const float *pr = p + (size_t)i * ATT_BK;
                for (int j = 0; j < n; j++) dr[j] = scale * pr[j] * (dr[j] - D[i]);
            }
            /* dq (m,HS) += ds k;  dk (n,HS) += ds^T q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, n, 1.0f, dp, ATT_BK,
                        k + (size_t)j0 * kl, kl, 1.0f, dq + (size_t)i0 * ql, ql);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, m, 1.0f, dp, ATT_BK,
                        q + (size_t)i0 * ql, ql, 1.0f, dk + (size_t)j0 * kl, kl);
        }
    }
}

long loom_cpu_attention_part_bwd(void *ctx, const loom_att_view *v, float *dq, float *dk, float *dv,
                                 const float *dout, const float *out, size_t o_bs, int o_ld,
                                 const float *lse) {
    const float scale = 1.0f / sqrtf((float)v->HS);
    const int nkv = loom_att_nkv(v), rep = v->NH / nkv;
    int nth = kern_threads(ctx);
    /* a task per (batch, key/value head): the query heads sharing that head
     * add into its dk, dv one after another */
    KERN_PARALLEL_FOR(nth)
    for (int bg = 0; bg < v->B * nkv; bg++) {
        int b = bg / nkv, g = bg % nkv;
        size_t ko = b * v->kv_bs + (size_t)g * v->HS;
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            size_t hc = (size_t)h * v->HS, qo = b * v->q_bs + hc;
            head_bwd(v, v->q + qo, v->k + ko, v->v + ko, dq + qo, dk + ko, dv + ko, dout + b * o_bs + hc,
                     out + b * o_bs + hc, o_ld, lse + ((size_t)b * v->NH + h) * v->Tq, scale);
        }
    }
    return loom_attention_tiles(v);
}

void loom_cpu_attention_merge(void *ctx, float *out, float *lse, const float *out2, const float *lse2,
                              size_t o_bs, int o_ld, int B, int Tq, int NH, int HS) {
    (void)ctx;
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        for (int i = 0; i < Tq; i++) {
            size_t r = (size_t)bh * Tq + i, oo = b * o_bs + (size_t)i * o_ld + (size_t)h * HS;
            float a = lse[r], c = lse2[r];
            if (c == -INFINITY) continue;
            if (a == -INFINITY) {
                memcpy(out + oo, out2 + oo, (size_t)HS * sizeof *out);
                lse[r] = c;
                continue;
            }
            float mx = a > c ? a : c;
            float wa = kern_expf(a - mx), wc = kern_expf(c - mx), l = wa + wc;
            wa /= l, wc /= l;
            for (int d = 0; d < HS; d++) out[oo + d] = wa * out[oo + d] + wc * out2[oo + d];
            lse[r] = mx + logf(l);
        }
    }
}

/* The whole causal sequence of a packed qkv (B,T,3C). */
static loom_att_view qkv_view(const float *qkv, int B, int T, int C, int NH) {
    const loom_att_heads h = {NH, NH, C / NH, 0};
    return loom_att_packed(qkv, B, T, &h);
}

void loom_cpu_attention_fwd(void *ctx, float *out, float *lse, const float *qkv, int B, int T, int C,
                            int NH) {
    loom_att_view v = qkv_view(qkv, B, T, C, NH);
    loom_cpu_attention_part_fwd(ctx, &v, out, (size_t)T * C, C, lse, 0);
}

void loom_cpu_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH) {
    loom_att_view v = qkv_view(qkv, B, T, C, NH);
    loom_cpu_attention_part_bwd(ctx, &v, dqkv, dqkv + C, dqkv + 2 * C, dout, out, (size_t)T * C, C, lse);
}
