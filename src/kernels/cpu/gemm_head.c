/* gemm_head.c - loom's own bf16 kernel for the LM head's weight gradient,
 * dwte (V,C) += dlogits^T x: C (M,N) = A^T B + beta C with A (K,M) and
 * B (K,N) row-major bf16 and C fp32, K the tokens.
 *
 * Why not oneDNN: on a Zen 4 (AVX512-BF16, no AMX) oneDNN 2.6's matmul ran
 * this product, A transposed, at 60-62 % of the bf16 units' rate on one
 * thread (GPT-2 small and 124M shapes), where it ran the head's other two
 * products at 80 %; it was the slowest product of a bf16 step. This kernel
 * runs it 1.19-1.23x faster (docs/performance.md has the table). A
 * transposed operand costs little here, because the kernel wants both
 * operands as bf16 pairs along K - (X[2p][j], X[2p+1][j]), the two inputs
 * of one VDPBF16PS lane - and for A (K,M) and B (K,N) alike that is an
 * interleave of two neighbouring rows, not a transpose. The same kernel was
 * slower than oneDNN on the linear layers' weight gradients (M and N a few
 * hundred) and, written for fp32 FMA, slower than OpenBLAS on the fp32
 * head, so it takes only this product.
 *
 * The method: B is interleaved once into pairs (K/2, N, padded to NR
 * columns). C is cut into tasks of MB rows x NC columns; a task interleaves
 * its MB columns of A into panels of MR rows, KC pairs at a time, and the
 * micro-kernel multiplies one panel by NR columns of B: MR x NR/16 zmm
 * accumulators, each step one broadcast pair of A against NR/16 vectors of
 * B pairs. Each element of C is one running fp32 sum that starts at
 * beta C (0 when beta is 0, C itself when beta is 1) and takes the pairs
 * in order of K; a K block ends by storing the sum into C and the next
 * reloads it, which rounds nothing. So an element's bits depend on its
 * operands and K only: the same whatever the rows or columns around it,
 * the thread count or how the vocabulary is cut over tensor-parallel ranks
 * (kernels_bf16_head checks all three).
 *
 * Chosen (kern_bf16_head_ready) on CPUs with AVX512-BF16 and no AMX-BF16,
 * where oneDNN would multiply with AMX tiles instead, unless
 * LOOM_BF16_HEAD=dnnl. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>

#include "kern_internal.h"
#include "loom/cpu.h"

#define WG_MR 8   /* rows of C per panel: broadcast pairs of A */
#define WG_NR 32  /* columns of C per micro-kernel call: 2 zmm of B pairs */
#define WG_MB 256 /* rows of C per task */
#define WG_NC 256 /* columns of C per task */
#define WG_KC 256 /* pairs of K per block: A's packed block is WG_KC x WG_MB pairs (256 KiB) */

#define WG_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static struct {
    int decided, on;
    char why[96];
} wg;

static void wg_decide(void) {
    wg.decided = 1;
    const loom_cpu_features *f = loom_cpu_features_get();
    const char *mode = getenv("LOOM_BF16_HEAD");
    const int dnnl = mode && !strcmp(mode, "dnnl");
    if (mode && *mode && strcmp(mode, "auto") && !dnnl)
        fprintf(stderr, "loom: warning: LOOM_BF16_HEAD=%s is not auto or dnnl; auto is used\n", mode);
    int units = f->avx512_bf16 && f->os_avx512 && f->avx512bw && f->avx512vl;
    int amx = f->amx_bf16 && f->os_amx;
    wg.on = units && !amx && !dnnl;
    if (wg.on) snprintf(wg.why, sizeof wg.why, "loom's AVX512-BF16 kernel for the LM head's weight gradient");
    else if (dnnl) snprintf(wg.why, sizeof wg.why, "the LM head's weight gradient too (LOOM_BF16_HEAD=dnnl)");
    else wg.why[0] = 0;
}

int kern_bf16_head_ready(void) {
    if (!wg.decided) wg_decide();
    return wg.on;
}

void kern_bf16_head_describe(char *buf, size_t n) {
    if (!wg.decided) wg_decide();
    snprintf(buf, n, "%s", wg.why);
}

/* The first n of 16 lanes (none for n <= 0, all for n >= 16). */
static inline __mmask16 wg_mask(int n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* 16 pairs (X[2p][c], X[2p+1][c]) for c in [c0, c0+16) of X (rows K, ld):
 * columns past ncols and a row past K read as 0. */
WG_TARGET static inline __m512i wg_pairs(const uint16_t *x, int ld, int K, int p, int c0, int ncols) {
    const __mmask16 m = wg_mask(ncols);
    const __m256i r0 = _mm256_maskz_loadu_epi16(m, x + (size_t)(2 * p) * ld + c0);
    const __m256i r1 = 2 * p + 1 < K ? _mm256_maskz_loadu_epi16(m, x + (size_t)(2 * p + 1) * ld + c0)
                                     : _mm256_setzero_si256();
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                         38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return _mm512_permutex2var_epi16(_mm512_castsi256_si512(r0), idx, _mm512_castsi256_si512(r1));
}

/* C rows [0, rows) x columns [0, cols) of one panel (rows <= WG_MR, cols <=
 * WG_NR) += the kc pairs of ap (kc x WG_MR) times bp (kc x WG_NR, ld ldb);
 * first: the sum starts at beta C instead of C. */
WG_TARGET static void wg_micro(const uint32_t *ap, const uint32_t *bp, int ldb, int kc, float *c, int ldc,
                               int rows, int cols, int first, float beta) {
    __m512 acc[WG_MR][WG_NR / 16];
    __mmask16 mk[WG_NR / 16];
    for (int v = 0; v < WG_NR / 16; v++) mk[v] = wg_mask(cols - 16 * v);
    for (int i = 0; i < WG_MR; i++)
        for (int v = 0; v < WG_NR / 16; v++) {
            __m512 c0 = _mm512_setzero_ps();
            if (i < rows && (!first || beta != 0.0f)) {
                c0 = _mm512_maskz_loadu_ps(mk[v], c + (size_t)i * ldc + 16 * v);
                if (first && beta != 1.0f) c0 = _mm512_mul_ps(c0, _mm512_set1_ps(beta));
            }
            acc[i][v] = c0;
        }
    for (int p = 0; p < kc; p++) {
        __m512bh b[WG_NR / 16];
        for (int v = 0; v < WG_NR / 16; v++)
            b[v] = (__m512bh)_mm512_loadu_si512(bp + (size_t)p * ldb + 16 * v);
        for (int i = 0; i < WG_MR; i++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)p * WG_MR + i]);
            for (int v = 0; v < WG_NR / 16; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
        }
    }
    for (int i = 0; i < WG_MR && i < rows; i++)
        for (int v = 0; v < WG_NR / 16; v++)
            if (mk[v]) _mm512_mask_storeu_ps(c + (size_t)i * ldc + 16 * v, mk[v], acc[i][v]);
}

/* The context's scratch (head_b: B's pairs, head_a: each thread's packed
 * block of A) grown to n pairs, 64-byte aligned; contents not kept. */
static uint32_t *wg_grow(kern_buf *b, size_t n) {
    const size_t bytes = n * sizeof(uint32_t);
    if (bytes > b->cap || !b->p) {
        free(b->p);
        b->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        b->cap = b->p ? bytes : 0;
    }
    return b->p;
}

/* One task: C rows [m0, m0+mb) x columns [n0, n0+nc). */
WG_TARGET static void wg_task(const uint16_t *A, int lda, const uint32_t *bp, int ldbp, int K, float beta,
                              float *C, int ldc, int m0, int mb, int n0, int nc, uint32_t *ap) {
    const int K2 = (K + 1) / 2, panels = (mb + WG_MR - 1) / WG_MR;
    for (int k0 = 0; k0 < K2; k0 += WG_KC) {
        const int kc = K2 - k0 < WG_KC ? K2 - k0 : WG_KC;
        /* A's columns [m0, m0+mb) as panels: ap[panel][pair][WG_MR] */
        for (int p = 0; p < kc; p++)
            for (int c = 0; c < mb; c += 16) {
                const __m512i z = wg_pairs(A, lda, K, k0 + p, m0 + c, mb - c);
                uint32_t *dst = ap + ((size_t)(c / WG_MR) * kc + p) * WG_MR;
                _mm256_storeu_si256((__m256i *)dst, _mm512_castsi512_si256(z)); /* two panels of WG_MR */
                _mm256_storeu_si256((__m256i *)(dst + (size_t)kc * WG_MR), _mm512_extracti64x4_epi64(z, 1));
            }
        for (int q = 0; q < panels; q++) {
            const int r0 = q * WG_MR, rows = mb - r0 < WG_MR ? mb - r0 : WG_MR;
            float *crow = C + (size_t)(m0 + r0) * ldc;
            for (int j = 0; j < nc; j += WG_NR) {
                /* the next panel's rows of C under this call's columns, read
                 * when its sums start or resume: fetched a call's share at a
                 * time into L2 (the whole panel at once, into L1, left the
                 * micro-kernel waiting on C: 37.6 against 34.0 ms for the
                 * small config's head on one thread, cold caches) */
                if (q + 1 < panels)
                    for (int i = 0; i < WG_MR && r0 + WG_MR + i < mb; i++)
                        for (int jj = j; jj < j + WG_NR && jj < nc; jj += 16)
                            _mm_prefetch((const char *)(crow + (size_t)(WG_MR + i) * ldc + n0 + jj),
                                         _MM_HINT_T1);
                wg_micro(ap + (size_t)q * kc * WG_MR, bp + (size_t)k0 * ldbp + n0 + j, ldbp, kc,
                         crow + n0 + j, ldc, rows, nc - j < WG_NR ? nc - j : WG_NR, k0 == 0, beta);
            }
        }
    }
}

WG_TARGET static void wg_pack_b(uint32_t *bp, int ldbp, const uint16_t *B, int ldb, int K, int N, int p) {
    for (int c = 0; c < ldbp; c += 16)
        _mm512_storeu_si512(bp + (size_t)p * ldbp + c, wg_pairs(B, ldb, K, p, c, N - c));
}

int kern_bf16_head_dw(loom_cpu_ctx *c, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                      int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 1;
    const int K2 = (K + 1) / 2, ldbp = (N + WG_NR - 1) / WG_NR * WG_NR;
    const int nth = c->threads;
    const int kc = K2 < WG_KC ? K2 : WG_KC;
    uint32_t *bp = wg_grow(&c->head_b, (size_t)(K2 > 0 ? K2 : 1) * ldbp);
    uint32_t *ap = wg_grow(&c->head_a, (size_t)nth * (kc > 0 ? kc : 1) * WG_MB);
    if (!bp || !ap) return 0;
    KERN_PARALLEL_FOR(nth)
    for (int p = 0; p < K2; p++) wg_pack_b(bp, ldbp, B, ldb, K, N, p);
    const int mtasks = (M + WG_MB - 1) / WG_MB, ntasks = (N + WG_NC - 1) / WG_NC;
    KERN_PARALLEL_FOR(nth)
    for (int t = 0; t < mtasks * ntasks; t++) {
        const int m0 = t / ntasks * WG_MB, n0 = t % ntasks * WG_NC;
        wg_task(A, lda, bp, ldbp, K, beta, C, ldc, m0, M - m0 < WG_MB ? M - m0 : WG_MB, n0,
                N - n0 < WG_NC ? N - n0 : WG_NC, ap + (size_t)kern_thread_id() * kc * WG_MB);
    }
    return 1;
}
