/* bf16.c - mixed precision for the model's GEMMs (a device made with bf16).
 *
 * In bf16 mode every operand of kern_sgemm (activations, weights, output
 * gradients) is rounded to bfloat16 (round to nearest, ties to even - what
 * PyTorch's .to(torch.bfloat16) and the AVX512-BF16 VCVTNEPS2BF16
 * instruction do; loom/bf16.h, the rounding the bf16 gradient reductions
 * use too) before the product, and the product accumulates in fp32.
 * Master weights, optimizer state, norms, softmax, the loss and every
 * reduction stay fp32. Here the rounded operands are kept as floats (a bf16
 * value is a float with its low 16 bits zero) and the product runs on the
 * fp32 sgemm kernels: the numerics of a bf16 x bf16 -> fp32 GEMM on any CPU,
 * without its speed. Debian's OpenBLAS 0.3.21 exports no sbgemm, so a fast
 * path needs oneDNN or kernels of loom's own (docs/performance.md).
 *
 * With the bf16 GEMM provider (gemm_mkl.c: oneMKL on CPUs with AVX512-BF16
 * or AMX-BF16) the operands are stored as 16-bit bf16 instead - the same
 * rounding - and the provider multiplies them on the bf16 units.
 *
 * The rounded copies live in two buffers of the context that grow to the
 * largest operand seen (the first step allocates them; later steps reuse
 * them).
 *
 * Kept operands (loom_cpu_gemm_keep): a caller that knows a tensor will not
 * change across several GEMMs - the tied embedding wte from the LM head's
 * forward to its backward, the logits' gradient between the head's two
 * backward products - names it, and the first GEMM that reads any part of
 * it converts the whole of it into a buffer of its own, which the later
 * ones read at the same offsets. The same rounding of the same floats, so
 * the same products; for GPT-2's head it saves two of the four conversions
 * of a (tokens or vocabulary) x 50257 tensor per step. Forgetting it
 * (loom_cpu_gemm_unkeep) keeps the buffer for the next step.
 */
#include <cblas.h>
#include <stdlib.h>

#include "kern_internal.h"
#include "kern_vec.h"
#include "loom/bf16.h"
#include "loom/cpu.h"

/* One vector of KV elements from i: rounded floats, bf16 bits, or back. */
static inline void round_lanes(float *dst, const float *src, size_t i) {
    kvu u;
    memcpy(&u, src + i, sizeof u);
    u = bf16_round_bits(u);
    memcpy(dst + i, &u, sizeof u);
}
static inline void pack_lanes(uint16_t *dst, const float *src, size_t i) {
    kv_store_bf16(dst + i, kv_load(src + i));
}
static inline void unpack_lanes(float *dst, const uint16_t *src, size_t i) {
    kvh h;
    memcpy(&h, src + i, sizeof h);
    kvu u = __builtin_convertvector(h, kvu) << 16;
    memcpy(dst + i, &u, sizeof u);
}

/* dst[i] = CONVERT(src[i]) for i < n, in blocks over ctx's threads:
 * LANES(dst, src, i) for whole vectors, CONVERT for a block's tail. */
#define BF16_MAP(ctx, dst, src, n, CONVERT, LANES)                                                           \
    do {                                                                                                     \
        size_t nblk_ = ((n) + KERN_BLOCK - 1) / KERN_BLOCK;                                                  \
        int nth_ = kern_threads(ctx);                                                                        \
        KERN_PARALLEL_FOR(nth_)                                                                              \
        for (size_t k_ = 0; k_ < nblk_; k_++) {                                                              \
            size_t lo_ = k_ * KERN_BLOCK, hi_ = lo_ + KERN_BLOCK < (n) ? lo_ + KERN_BLOCK : (n);             \
            size_t i_ = lo_;                                                                                 \
            for (; i_ + KV <= hi_; i_ += KV) LANES((dst), (src), i_);                                        \
            for (; i_ < hi_; i_++) (dst)[i_] = CONVERT((src)[i_]);                                           \
        }                                                                                                    \
    } while (0)

void loom_cpu_round_bf16(void *ctx, float *dst, const float *src, size_t n) {
    BF16_MAP(ctx, dst, src, n, loom_bf16_round, round_lanes);
}
void loom_cpu_bf16_pack(void *ctx, uint16_t *dst, const float *src, size_t n) {
    BF16_MAP(ctx, dst, src, n, loom_bf16_from_f32, pack_lanes);
}
void loom_cpu_bf16_unpack(void *ctx, float *dst, const uint16_t *src, size_t n) {
    BF16_MAP(ctx, dst, src, n, loom_bf16_to_f32, unpack_lanes);
}

/* A rounded copy of n floats in buffer `which`, or NULL without memory. */
static const float *bf16_copy(loom_cpu_ctx *c, int which, const float *src, size_t n) {
    float *dst = kern_buf_grow(&c->round[which], n * sizeof(float));
    if (dst) loom_cpu_round_bf16(c, dst, src, n);
    return dst;
}

/* The bf16 bits (as uint16) of n floats in buffer `which`, or NULL. */
static const uint16_t *bf16_copy16(loom_cpu_ctx *c, int which, const float *src, size_t n) {
    uint16_t *dst = kern_buf_grow(&c->bits[which], n * sizeof(uint16_t));
    if (dst) loom_cpu_bf16_pack(c, dst, src, n);
    return dst;
}

/* The slot keeping [src, src + n), else a free one; NULL when all are taken. */
static kern_kept *keep_slot(loom_cpu_ctx *c, const float *src, size_t n) {
    kern_kept *free_slot = NULL;
    for (int i = 0; i < KERN_KEEP; i++) {
        if (c->keep[i].src == src && c->keep[i].n == n) return &c->keep[i];
        if (!c->keep[i].src && !free_slot) free_slot = &c->keep[i];
    }
    return free_slot;
}

void loom_cpu_gemm_keep(void *ctx, const float *src, size_t n) {
    if (!src || !n) return;
    kern_kept *k = keep_slot(ctx, src, n);
    if (!k) return;                               /* full: that tensor is converted at every use, as before */
    if (k->src == src && k->n == n && k->fresh) { /* filled from the floats now at src */
        k->ready = 1, k->fresh = 0;
        return;
    }
    k->src = src, k->n = n, k->ready = 0, k->fresh = 0; /* new, or kept again: maybe changed since */
}

int loom_cpu_gemm_keeps_bf16(void *ctx) { return ((loom_cpu_ctx *)ctx)->bf16 && kern_bf16_gemm_ready(); }

/* A slot for [src, src + n) with room for its bf16 bits, which the caller
 * writes (ready: at once, else at loom_cpu_gemm_keep_filled); NULL without
 * 16-bit kept copies, a free slot or memory. */
static uint16_t *keep_claim16(loom_cpu_ctx *c, const float *src, size_t n, int ready) {
    if (!loom_cpu_gemm_keeps_bf16(c) || !src || !n) return NULL;
    kern_kept *k = keep_slot(c, src, n);
    if (!k) return NULL;
    if (!kern_buf_grow(&k->buf, n * sizeof(uint16_t))) {
        k->src = NULL, k->ready = k->fresh = 0;
        return NULL;
    }
    k->src = src, k->n = n, k->ready = ready, k->fresh = 0, k->is16 = 1;
    return k->buf.p;
}

uint16_t *loom_cpu_gemm_keep_fill(void *ctx, const float *src, size_t n) {
    return keep_claim16(ctx, src, n, 0);
}

void loom_cpu_gemm_keep_filled(void *ctx, const float *src, int ok) {
    loom_cpu_ctx *c = ctx;
    for (int i = 0; i < KERN_KEEP; i++) {
        kern_kept *k = &c->keep[i];
        if (k->src != src || k->ready || k->fresh) continue;
        if (ok) k->fresh = 1;
        else k->src = NULL;
    }
}

uint16_t *kern_bf16_keep_filled(loom_cpu_ctx *c, const float *src, size_t n) {
    return keep_claim16(c, src, n, 1);
}

void loom_cpu_gemm_unkeep(void *ctx, const float *src) {
    loom_cpu_ctx *c = ctx;
    for (int i = 0; i < KERN_KEEP; i++)
        if (c->keep[i].src && (!src || c->keep[i].src == src)) {
            c->keep[i].src = NULL;
            c->keep[i].ready = c->keep[i].fresh = 0;
        }
}

/* The kept copy of [p, p + n) (bf16 bits if is16, else rounded floats),
 * converting its tensor at the first use; NULL if p is not inside a kept
 * tensor, 0 in *oom without memory. */
static const void *bf16_kept(loom_cpu_ctx *c, const float *p, size_t n, int is16, int *oom) {
    for (int i = 0; i < KERN_KEEP; i++) {
        kern_kept *k = &c->keep[i];
        if (!k->src || p < k->src || n > k->n || (size_t)(p - k->src) > k->n - n) continue;
        size_t esz = is16 ? sizeof(uint16_t) : sizeof(float);
        if (!k->ready || k->is16 != is16) {
            if (!kern_buf_grow(&k->buf, k->n * esz)) {
                *oom = 1;
                return NULL;
            }
            if (is16) loom_cpu_bf16_pack(c, k->buf.p, k->src, k->n);
            else loom_cpu_round_bf16(c, k->buf.p, k->src, k->n);
            k->ready = 1;
            k->is16 = is16;
        }
        return (const char *)k->buf.p + (size_t)(p - k->src) * esz;
    }
    return NULL;
}

int kern_gemm_bf16_operands(loom_cpu_ctx *c, kern_gemm *g) {
    if (!c->bf16) return 1;
    /* the storage each operand spans: rows of its stored layout x ld */
    size_t a_rows = (size_t)(g->ta == CblasNoTrans ? g->M : g->K);
    size_t b_rows = (size_t)(g->tb == CblasNoTrans ? g->K : g->N);
    size_t na = a_rows ? (a_rows - 1) * (size_t)g->lda + (size_t)(g->ta == CblasNoTrans ? g->K : g->M) : 0;
    size_t nb = b_rows ? (b_rows - 1) * (size_t)g->ldb + (size_t)(g->tb == CblasNoTrans ? g->N : g->K) : 0;
    int is16 = kern_bf16_gemm_ready() != 0, oom = 0;
    const void *ka = bf16_kept(c, g->A, na, is16, &oom), *kb = bf16_kept(c, g->B, nb, is16, &oom);
    if (oom) return 0;
    if (is16) {
        const uint16_t *a16 = ka ? ka : bf16_copy16(c, 0, g->A, na),
                       *b16 = kb ? kb : bf16_copy16(c, 1, g->B, nb);
        if (!a16 || !b16) return 0;
        g->A16 = a16;
        g->B16 = b16;
        return 1;
    }
    const float *a = ka ? ka : bf16_copy(c, 0, g->A, na), *b = kb ? kb : bf16_copy(c, 1, g->B, nb);
    if (!a || !b) return 0;
    g->A = a;
    g->B = b;
    return 1;
}

/* Times the bf16 GEMM provider on products of bf16 operands converted once
 * beforehand (the provider's rate, as the sgemm calibration is the fp32
 * kernel's), threaded as the model's matmuls are: the best rate over
 * kern_cal_shapes, best of `trials` each, a shape tried only while the
 * previous one took under 0.1 s (as loom_kernels_calibrate_sgemm). 0 without
 * a provider or memory. */
double loom_kernels_calibrate_bf16(int threads, int trials) {
    if (!kern_bf16_gemm_ready()) return 0.0;
    const size_t big = kern_cal_elems();
    float *a = malloc(big * sizeof *a), *b = malloc(big * sizeof *b), *c = malloc(big * sizeof *c);
    uint16_t *a16 = malloc(big * sizeof *a16), *b16 = malloc(big * sizeof *b16);
    /* precision fp32: kern_sgemm takes the bf16 operands as they are */
    loom_cpu_ctx *ctx = loom_cpu_ctx_create(threads, 0);
    double best = 0.0;
    for (int i = 0; i < KERN_CAL_SHAPES && a && b && c && a16 && b16 && ctx; i++) {
        int m = kern_cal_shapes[i][0], n = kern_cal_shapes[i][1], k = kern_cal_shapes[i][2];
        size_t na = (size_t)m * k, nb = (size_t)k * n;
        kern_cal_fill(a, b, na, nb);
        loom_cpu_bf16_pack(ctx, a16, a, na);
        loom_cpu_bf16_pack(ctx, b16, b, nb);
        kern_gemm g = kern_cal_gemm(m, n, k, a, b, c);
        g.A16 = a16;
        g.B16 = b16;
        kern_time_gemm(ctx, &g, 1); /* warm-up: oneDNN's primitive for this shape, pages */
        const double tbest = kern_time_gemm(ctx, &g, trials);
        double rate = 2.0 * (double)m * n * k / tbest;
        if (rate > best) best = rate;
        if (tbest > 0.1) break;
    }
    free(a), free(b), free(c), free(a16), free(b16);
    loom_cpu_ctx_free(ctx);
    return best;
}
