/* sha256.c - SHA-256 from FIPS 180-4 section 6.2: 64 rounds per 64-byte
 * block over eight 32-bit words, the message padded with 0x80, zeros and
 * its bit length (big-endian). Local compute and file reads only.
 *
 * Two block functions give the same digests: the portable one below, and on
 * x86 CPUs with the SHA extensions (CPUID leaf 7 EBX bit 29: Intel since Ice
 * Lake / Goldmont, AMD since Zen) one that runs two rounds per
 * sha256rnds2 and the message schedule with sha256msg1/msg2, about 5x the
 * portable speed. Chosen once, by the CPU's flags. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "loom/sha256.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOOM_SHA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

#ifdef LOOM_SHA_X86
/* n blocks with the SHA extensions. The state lives in two registers as the
 * instructions want it: ABEF (dwords 3..0 = A, B, E, F) and CDGH. */
__attribute__((target("sha,sse4.1"))) static void blocks_shani(uint32_t h[8], const unsigned char *p,
                                                               size_t n) {
    /* byte order of each 32-bit word: the message is big-endian */
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i badc = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);
    __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B);
    __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);
    __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);
    for (; n > 0; n--, p += 64) {
        const __m128i abef0 = abef, cdgh0 = cdgh;
        __m128i m[4]; /* W[4g .. 4g+3] of the last four groups, m[g % 4] */
        for (int g = 0; g < 16; g++) {
            __m128i *w = &m[g & 3];
            if (g < 4) {
                *w = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
            } else {
                /* W[i] = s1(W[i-2]) + W[i-7] + s0(W[i-15]) + W[i-16], four at a time */
                const __m128i w1 = m[(g + 1) & 3], w2 = m[(g + 2) & 3], w3 = m[(g + 3) & 3];
                __m128i t = _mm_add_epi32(_mm_sha256msg1_epu32(*w, w1), _mm_alignr_epi8(w3, w2, 4));
                *w = _mm_sha256msg2_epu32(t, w3);
            }
            __m128i wk = _mm_add_epi32(*w, _mm_loadu_si128((const __m128i *)&K[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk); /* two rounds: the new ABEF */
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B), dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static int cpu_has_sha(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 29) & 1;
}
#endif

static int g_impl = -1; /* -1 not chosen yet, 0 portable, 1 SHA extensions */

static void blocks(uint32_t h[8], const unsigned char *p, size_t n) {
#ifdef LOOM_SHA_X86
    int impl = __atomic_load_n(&g_impl, __ATOMIC_RELAXED);
    if (impl < 0) __atomic_store_n(&g_impl, impl = cpu_has_sha(), __ATOMIC_RELAXED);
    if (impl == 1) {
        blocks_shani(h, p, n);
        return;
    }
#endif
    for (; n > 0; n--, p += 64) block(h, p);
}

int loom_sha256_use_extensions(int on) {
#ifdef LOOM_SHA_X86
    int impl = on ? cpu_has_sha() : 0;
    __atomic_store_n(&g_impl, impl, __ATOMIC_RELAXED);
    return impl;
#else
    (void)on;
    g_impl = 0;
    return 0;
#endif
}

void loom_sha256_init(loom_sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->bytes = 0;
    s->used = 0;
}

void loom_sha256_update(loom_sha256 *s, const void *data, size_t n) {
    const unsigned char *p = data;
    s->bytes += n;
    if (s->used) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->buf + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used < 64) return;
        blocks(s->h, s->buf, 1);
        s->used = 0;
    }
    blocks(s->h, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    memcpy(s->buf, p, n);
    s->used = n;
}

void loom_sha256_final(loom_sha256 *s, unsigned char out[32]) {
    uint64_t bits = s->bytes * 8;
    unsigned char pad[72] = {0x80};
    size_t npad = (s->used < 56 ? 56 : 120) - s->used;
    for (int i = 0; i < 8; i++) pad[npad + i] = (unsigned char)(bits >> (56 - 8 * i));
    loom_sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (unsigned char)(s->h[i] >> (24 - 8 * j));
}

static void to_hex(const unsigned char d[32], char out[65]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[64] = '\0';
}

void loom_sha256_hex(const void *data, size_t n, char out[65]) {
    loom_sha256 s;
    unsigned char d[32];
    loom_sha256_init(&s);
    loom_sha256_update(&s, data, n);
    loom_sha256_final(&s, d);
    to_hex(d, out);
}

loom_status loom_sha256_file(const char *path, char out[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
    loom_sha256 s;
    loom_sha256_init(&s);
    static _Thread_local unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) loom_sha256_update(&s, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) return loom_fail(LOOM_EIO, "%s: read failed", path);
    unsigned char d[32];
    loom_sha256_final(&s, d);
    to_hex(d, out);
    return LOOM_OK;
}
