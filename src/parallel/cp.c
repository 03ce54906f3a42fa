/* cp.c - context parallelism: the causal load-balanced split, ring attention
 * and Ulysses attention (include/loom/cp.h, docs/context-parallel.md).
 *
 * Heads: a qkv row is [q (Cq = NH*HS) | k (Ckv = NKV*HS) | v (Ckv)]; with
 * grouped-query attention Ckv < Cq and the ring's blocks shrink with it.
 *
 * Ring, on rank r of cp with local rows = chunks (r, 2cp-1-r) of Tc rows:
 * K and V are packed into one (B, T_l, 2Ckv) block. At step s = 0..cp-1 the
 * block held is rank (r - s)'s; the rank starts sending it to r+1 and
 * receiving the next one from r-1 (except at the last step), computes the
 * four (query chunk, key chunk) partial attentions with accumulation into
 * (out, lse), then waits. The backward does the same walk with the final
 * (out, lse); each step's dK/dV go into a fresh block, the accumulator
 * received from r-1 (that block's dK/dV summed by the ranks it visited
 * before) is added after the compute and sent on to r+1; after cp steps
 * every accumulator has reached its owner.
 */
#include "loom/cp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h" /* loom_attention_tiles */
#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/log.h"

enum { TAG_KV = 0x4c00, TAG_DKV = 0x4c01 };

struct loom_cp_buffers {
    float *kv[2];     /* ring: K/V blocks (B, T_l, 2Ckv), the one held and the one arriving */
    float *dacc[2];   /* ring: this step's dK/dV, the previous step's (still being sent) */
    float *din;       /* ring: the dK/dV accumulator arriving */
    float *a, *b, *c; /* Ulysses: send, receive, head-sharded full sequence (B*T_l*W each, W = Cq+2Ckv) */
    float *o;         /* Ulysses: head-sharded out, dout, dq|dk|dv (B*T_l*(2Cq + W)) */
    /* Ulysses, device index lists of B*T rows: the received row of each
     * position (to_heads) and the position of each row to send (to_seq) */
    int32_t *to_heads, *to_seq;
    size_t kv_n, big_n, o_n, rows; /* floats per ring block, per Ulysses buffer, in o; B*T */
};

/* Widths of a qkv row's parts. */
static int width_q(const loom_att_heads *h) { return h->NH * h->HS; }
static int width_kv(const loom_att_heads *h) { return h->NKV * h->HS; }
static int width_qkv(const loom_att_heads *h) { return width_q(h) + 2 * width_kv(h); }

/* The global chunk index of local chunk lc (0 or 1) of cp rank r. */
static int chunk_of(int size, int r, int lc) { return lc == 0 ? r : 2 * size - 1 - r; }

static int position_on(int size, int r, int t, int T_l) {
    int Tc = T_l / 2;
    return chunk_of(size, r, t / Tc) * Tc + t % Tc;
}

loom_status loom_cp_alloc(loom_cp *cp, int B, int T_l, const loom_att_heads *h) {
    cp->buf = NULL;
    if (cp->size <= 1) return LOOM_OK;
    loom_cp_buffers *w = calloc(1, sizeof *w);
    if (!w) return loom_fail(LOOM_EOS, "out of memory for context-parallel buffers");
    cp->buf = w;
    const size_t rows_l = (size_t)B * T_l;
    const size_t kv = rows_l * 2 * width_kv(h), big = rows_l * width_qkv(h);
    loom_device *dev = cp->dev; /* device memory, zeroed */
    int ok = 1;
    w->kv_n = kv;
    w->big_n = big;
    w->o_n = rows_l * (2 * width_q(h) + width_qkv(h));
    if (cp->impl == LOOM_CP_RING) {
        for (int i = 0; i < 2; i++) {
            ok &= (w->kv[i] = loom_device_alloc(dev, kv * sizeof(float))) != NULL;
            ok &= (w->dacc[i] = loom_device_alloc(dev, kv * sizeof(float))) != NULL;
        }
        ok &= (w->din = loom_device_alloc(dev, kv * sizeof(float))) != NULL;
    } else {
        const int P = cp->size, T = T_l * P;
        w->rows = (size_t)B * T;
        ok &= (w->a = loom_device_alloc(dev, big * sizeof(float))) != NULL;
        ok &= (w->b = loom_device_alloc(dev, big * sizeof(float))) != NULL;
        ok &= (w->c = loom_device_alloc(dev, big * sizeof(float))) != NULL;
        ok &= (w->o = loom_device_alloc(dev, w->o_n * sizeof(float))) != NULL;
        ok &= (w->to_heads = loom_device_alloc(dev, w->rows * sizeof(int32_t))) != NULL;
        ok &= (w->to_seq = loom_device_alloc(dev, w->rows * sizeof(int32_t))) != NULL;
        /* the permutations are host bookkeeping, built here and uploaded once */
        int32_t *h = ok ? malloc(2 * w->rows * sizeof *h) : NULL;
        ok &= h != NULL;
        for (int i = 0; h && i < P; i++) /* row r of rank i's block <-> its position */
            for (int b = 0; b < B; b++)
                for (int t = 0; t < T_l; t++) {
                    const int32_t r = (int32_t)(((size_t)i * B + b) * T_l + t),
                                  pos = (int32_t)b * T + position_on(P, i, t, T_l);
                    h[pos] = r;
                    h[w->rows + (size_t)r] = pos;
                }
        if (h) {
            loom_tensor_upload_i32(cp->dev, w->to_heads, h, w->rows);
            loom_tensor_upload_i32(cp->dev, w->to_seq, h + w->rows, w->rows);
        }
        free(h);
    }
    if (!ok) return loom_fail(LOOM_EOS, "out of memory for context-parallel buffers");
    return LOOM_OK;
}

void loom_cp_release(loom_cp *cp) {
    loom_cp_buffers *w = cp->buf;
    if (!w) return;
    const size_t kv = w->kv_n * sizeof(float), big = w->big_n * sizeof(float),
                 idx = w->rows * sizeof(int32_t);
    const struct {
        void *p;
        size_t bytes;
    } mem[] = {{w->kv[0], kv},     {w->kv[1], kv},  {w->dacc[0], kv},
               {w->dacc[1], kv},   {w->din, kv},    {w->a, big},
               {w->b, big},        {w->c, big},     {w->o, w->o_n * sizeof(float)},
               {w->to_heads, idx}, {w->to_seq, idx}};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        loom_device_release(cp->dev, mem[i].p, mem[i].bytes);
    free(w);
    cp->buf = NULL;
}

int loom_cp_position(const loom_cp *cp, int t, int T_l) {
    return cp->size <= 1 ? t : position_on(cp->size, cp->rank, t, T_l);
}

void loom_cp_split_tokens(const loom_cp *cp, int32_t *x, int B, int T) {
    if (cp->size <= 1) return;
    const int T_l = T / cp->size;
    /* the source index is never below the destination: safe in place, in order */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T_l; t++)
            x[(size_t)b * T_l + t] = x[(size_t)b * T + loom_cp_position(cp, t, T_l)];
}

void loom_cp_pos_fwd(const loom_cp *cp, float *out, const float *wpe, int row0, int n, int T_l, int C) {
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * C;
        loom_residual_fwd(cp->dev, o, o, wpe + (size_t)loom_cp_position(cp, (row0 + i) % T_l, T_l) * C,
                          (size_t)C);
    }
}

void loom_cp_pos_bwd(const loom_cp *cp, float *dwpe, const float *dout, int row0, int n, int T_l, int C) {
    for (int i = 0; i < n; i++) {
        float *g = dwpe + (size_t)loom_cp_position(cp, (row0 + i) % T_l, T_l) * C;
        loom_residual_fwd(cp->dev, g, g, dout + (size_t)i * C, (size_t)C);
    }
}

/* ---- ring ------------------------------------------------------------------ */

/* rows (B,T_l) of width w at column col of src (row stride ls) -> dst
 * (row stride ld) at column dcol; add: += instead of =. */
static void copy_cols(loom_device *dev, float *dst, int ld, int dcol, const float *src, int ls, int col,
                      size_t rows, int w, int add) {
    for (size_t i = 0; i < rows; i++) {
        float *d = dst + i * ld + dcol;
        const float *s = src + i * ls + col;
        if (add) loom_residual_fwd(dev, d, d, s, (size_t)w);
        else loom_tensor_copy(dev, d, s, (size_t)w);
    }
}

/* Queries of local chunk qc against key chunk kc of the block of rank src. */
static loom_att_view ring_view(const loom_cp *cp, const float *qkv, const float *kv, int qc, int kc, int src,
                               int B, int T_l, const loom_att_heads *h) {
    const int Tc = T_l / 2, W = width_qkv(h), Ckv = width_kv(h);
    return (loom_att_view){.q = qkv + (size_t)qc * Tc * W,
                           .k = kv + (size_t)kc * Tc * 2 * Ckv,
                           .v = kv + (size_t)kc * Tc * 2 * Ckv + Ckv,
                           .q_bs = (size_t)T_l * W,
                           .kv_bs = (size_t)T_l * 2 * Ckv,
                           .q_ld = W,
                           .kv_ld = 2 * Ckv,
                           .B = B,
                           .Tq = Tc,
                           .Tk = Tc,
                           .NH = h->NH,
                           .HS = h->HS,
                           .q_pos0 = (long)chunk_of(cp->size, cp->rank, qc) * Tc,
                           .k_pos0 = (long)chunk_of(cp->size, src, kc) * Tc,
                           .NKV = h->NKV,
                           .window = h->window};
}

/* Step s of the ring: unless it is the last, send the K/V block held
 * (kv[cur]) to rank + 1 and receive the next into kv[cur ^ 1] from rank - 1. */
static loom_status ring_pass(loom_cp *cp, int s, int cur, size_t bytes, loom_req **rs, loom_req **rr) {
    const int P = cp->size;
    if (s == P - 1) return LOOM_OK;
    loom_cp_buffers *w = cp->buf;
    LOOM_TRY(loom_comm_isend(cp->comm, w->kv[cur], bytes, (cp->rank + 1) % P, TAG_KV, rs));
    return loom_comm_irecv(cp->comm, w->kv[cur ^ 1], bytes, (cp->rank + P - 1) % P, TAG_KV, rr);
}

static loom_status ring_fwd(loom_cp *cp, float *out, float *lse, const float *qkv, int B, int T_l,
                            const loom_att_heads *h) {
    loom_cp_buffers *w = cp->buf;
    const int P = cp->size, Tc = T_l / 2, C = width_q(h), Ckv = width_kv(h), NH = h->NH;
    const size_t rows = (size_t)B * T_l, bytes = rows * 2 * Ckv * sizeof(float);
    copy_cols(cp->dev, w->kv[0], 2 * Ckv, 0, qkv, width_qkv(h), C, rows, 2 * Ckv, 0);
    loom_tensor_zero(cp->dev, out, rows * C);
    loom_tensor_fill(cp->dev, lse, rows * NH, -INFINITY);
    int cur = 0;
    for (int s = 0; s < P; s++) {
        loom_req *rs = NULL, *rr = NULL;
        LOOM_TRY(ring_pass(cp, s, cur, bytes, &rs, &rr));
        const int src = (cp->rank - s + P) % P;
        for (int qc = 0; qc < 2; qc++)
            for (int kc = 0; kc < 2; kc++) {
                loom_att_view v = ring_view(cp, qkv, w->kv[cur], qc, kc, src, B, T_l, h);
                if (!loom_attention_tiles(&v)) continue;
                cp->tiles += loom_attention_part_fwd(cp->dev, &v, out + (size_t)qc * Tc * C, (size_t)T_l * C,
                                                     C, lse + (size_t)qc * B * NH * Tc, 1);
            }
        LOOM_TRY(loom_comm_wait(rs));
        LOOM_TRY(loom_comm_wait(rr));
        cur ^= 1;
    }
    return LOOM_OK;
}

static loom_status ring_bwd(loom_cp *cp, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T_l, const loom_att_heads *h) {
    loom_cp_buffers *w = cp->buf;
    const int P = cp->size, Tc = T_l / 2, next = (cp->rank + 1) % P, prev = (cp->rank + P - 1) % P;
    const int C = width_q(h), Ckv = width_kv(h), W = width_qkv(h), NH = h->NH;
    const size_t rows = (size_t)B * T_l, n = rows * 2 * Ckv, bytes = n * sizeof(float);
    copy_cols(cp->dev, w->kv[0], 2 * Ckv, 0, qkv, W, C, rows, 2 * Ckv, 0);
    int cur = 0;
    loom_req *ds = NULL, *dr = NULL; /* the accumulator leaving, and arriving */
    for (int s = 0; s < P; s++) {
        loom_req *rs = NULL, *rr = NULL;
        LOOM_TRY(ring_pass(cp, s, cur, bytes, &rs, &rr));
        const int src = (cp->rank - s + P) % P;
        float *dl = w->dacc[s & 1];
        loom_tensor_zero(cp->dev, dl, n);
        for (int qc = 0; qc < 2; qc++)
            for (int kc = 0; kc < 2; kc++) {
                loom_att_view v = ring_view(cp, qkv, w->kv[cur], qc, kc, src, B, T_l, h);
                if (!loom_attention_tiles(&v)) continue;
                float *dk = dl + (size_t)kc * Tc * 2 * Ckv;
                cp->tiles += loom_attention_part_bwd(cp->dev, &v, dqkv + (size_t)qc * Tc * W, dk, dk + Ckv,
                                                     dout + (size_t)qc * Tc * C, out + (size_t)qc * Tc * C,
                                                     (size_t)T_l * C, C, lse + (size_t)qc * B * NH * Tc);
            }
        if (s > 0) { /* what the ranks before added to this block */
            LOOM_TRY(loom_comm_wait(dr));
            loom_residual_fwd(cp->dev, dl, dl, w->din, n);
        }
        LOOM_TRY(loom_comm_wait(ds)); /* the previous step's accumulator has left */
        LOOM_TRY(loom_comm_isend(cp->comm, dl, bytes, next, TAG_DKV, &ds));
        LOOM_TRY(loom_comm_irecv(cp->comm, w->din, bytes, prev, TAG_DKV, &dr));
        LOOM_TRY(loom_comm_wait(rs));
        LOOM_TRY(loom_comm_wait(rr));
        cur ^= 1;
    }
    LOOM_TRY(loom_comm_wait(dr)); /* this rank's own K/V gradient, home */
    LOOM_TRY(loom_comm_wait(ds));
    copy_cols(cp->dev, dqkv, W, C, w->din, 2 * Ckv, 0, rows, 2 * Ckv, 1);
    return LOOM_OK;
}

/* ---- Ulysses ------------------------------------------------------------- */

/* x (B,T_l,W) sequence-sharded, W the sum of np part widths wd[k] -> y
 * (B,T,W/cp) head-sharded (each part's j-th slice of wd[k]/cp columns to cp
 * rank j), rows in position order. Collective. */
static loom_status seq_to_heads(loom_cp *cp, float *y, const float *x, int B, int T_l, const int *wd,
                                int np) {
    loom_cp_buffers *w = cp->buf;
    const int P = cp->size, T = T_l * P;
    int W = 0;
    for (int k = 0; k < np; k++) W += wd[k];
    const size_t blk = (size_t)B * T_l * (W / P); /* floats per peer */
    for (int j = 0; j < P; j++)                   /* to rank j: its heads of every local row */
        for (int k = 0, in = 0, outc = 0; k < np; in += wd[k], outc += wd[k] / P, k++)
            copy_cols(cp->dev, w->a + j * blk, W / P, outc, x, W, in + j * (wd[k] / P), (size_t)B * T_l,
                      wd[k] / P, 0);
    LOOM_TRY(loom_comm_alltoall(cp->comm, w->a, w->b, blk * sizeof(float)));
    /* from rank i: its rows, at their positions */
    loom_tensor_gather_rows(cp->dev, y, w->b, w->to_heads, B * T, W / P);
    return LOOM_OK;
}

/* The inverse: y (B,T,W/cp) head-sharded -> x (B,T_l,W); add: +=. */
static loom_status heads_to_seq(loom_cp *cp, float *x, const float *y, int B, int T_l, const int *wd, int np,
                                int add) {
    loom_cp_buffers *w = cp->buf;
    const int P = cp->size, T = T_l * P;
    int W = 0;
    for (int k = 0; k < np; k++) W += wd[k];
    const size_t blk = (size_t)B * T_l * (W / P);
    /* to rank i: the rows it holds */
    loom_tensor_gather_rows(cp->dev, w->a, y, w->to_seq, B * T, W / P);
    LOOM_TRY(loom_comm_alltoall(cp->comm, w->a, w->b, blk * sizeof(float)));
    for (int j = 0; j < P; j++) /* from rank j: its heads */
        for (int k = 0, in = 0, outc = 0; k < np; in += wd[k], outc += wd[k] / P, k++)
            copy_cols(cp->dev, x, W, in + j * (wd[k] / P), w->b + j * blk, W / P, outc, (size_t)B * T_l,
                      wd[k] / P, add);
    return LOOM_OK;
}

/* The whole sequence's causal attention on this rank's heads of c (B,T,W/cp). */
static loom_att_view ulysses_view(const loom_cp *cp, const float *c, int B, int T, const loom_att_heads *h) {
    const loom_att_heads mine = {h->NH / cp->size, h->NKV / cp->size, h->HS, h->window};
    return loom_att_packed(c, B, T, &mine);
}

static loom_status ulysses_fwd(loom_cp *cp, float *out, float *lse, const float *qkv, int B, int T_l,
                               const loom_att_heads *h) {
    loom_cp_buffers *w = cp->buf;
    const int P = cp->size, T = T_l * P, C = width_q(h);
    const int parts[3] = {C, width_kv(h), width_kv(h)};
    LOOM_TRY(seq_to_heads(cp, w->c, qkv, B, T_l, parts, 3));
    loom_att_view v = ulysses_view(cp, w->c, B, T, h);
    cp->tiles += loom_attention_part_fwd(cp->dev, &v, w->o, (size_t)T * C / P, C / P, lse, 0);
    return heads_to_seq(cp, out, w->o, B, T_l, parts, 1, 0);
}

/* The head-sharded q, k, v and out are not kept between forward and
 * backward (they would be a second copy of every layer's qkv): the backward
 * exchanges them again. */
static loom_status ulysses_bwd(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T_l, const loom_att_heads *h) {
    loom_cp_buffers *w = cp->buf;
    const int P = cp->size, T = T_l * P, Cp = width_q(h) / P, Kp = width_kv(h) / P;
    const int parts[3] = {width_q(h), width_kv(h), width_kv(h)};
    const size_t n = (size_t)B * T * Cp;
    float *o = w->o, *g = w->o + n, *d = w->o + 2 * n; /* out, dout, dqkv head-sharded */
    LOOM_TRY(seq_to_heads(cp, w->c, qkv, B, T_l, parts, 3));
    LOOM_TRY(seq_to_heads(cp, o, out, B, T_l, parts, 1));
    LOOM_TRY(seq_to_heads(cp, g, dout, B, T_l, parts, 1));
    loom_tensor_zero(cp->dev, d, (size_t)B * T * (Cp + 2 * Kp));
    loom_att_view v = ulysses_view(cp, w->c, B, T, h);
    cp->tiles += loom_attention_part_bwd(cp->dev, &v, d, d + Cp, d + Cp + Kp, g, o, (size_t)T * Cp, Cp, lse);
    return heads_to_seq(cp, dqkv, d, B, T_l, parts, 3, 1);
}

loom_status loom_cp_attention_fwd(loom_cp *cp, float *out, float *lse, const float *qkv, int B, int T_l,
                                  const loom_att_heads *h) {
    if (cp->impl == LOOM_CP_ULYSSES) return ulysses_fwd(cp, out, lse, qkv, B, T_l, h);
    return ring_fwd(cp, out, lse, qkv, B, T_l, h);
}

loom_status loom_cp_attention_bwd(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T_l,
                                  const loom_att_heads *h) {
    if (cp->impl == LOOM_CP_ULYSSES) return ulysses_bwd(cp, dqkv, dout, qkv, out, lse, B, T_l, h);
    return ring_bwd(cp, dqkv, dout, qkv, out, lse, B, T_l, h);
}
