/* nfc.c - Normalization Form C (see nfc.h). The check walks the text once
 * and is what almost every input meets; only text it flags is normalized:
 * decoded to code points, each replaced by its full canonical decomposition
 * (Hangul syllables algorithmically), each run of combining marks put in
 * canonical order (a stable sort by combining class), then every mark or
 * jamo that is not blocked from the last starter and forms a primary
 * composite with it is composed into it. */
#include "nfc.h"

#include <stdint.h>
#include <stdlib.h>

#include "nfc_table.h"

/* Hangul syllables: S = SBASE + (L * VCOUNT + V) * TCOUNT + T */
enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28
};
enum { SCOUNT = LCOUNT * VCOUNT * TCOUNT };

/* A byte that is not part of well-formed UTF-8, kept as itself. */
#define RAW_BYTE 0x80000000u

size_t loom_utf8_next(const unsigned char *s, size_t n, long *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || c >= 0xF8 || len > n) goto bad;
    long v = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3F);
    }
    /* overlong, surrogate, beyond U+10FFFF */
    static const long min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_of[len] || (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) goto bad;
    *cp = v;
    return len;
bad:
    *cp = -1;
    return 1;
}

/* One UTF-8 sequence at s[0..n): its length; *cp = RAW_BYTE | s[0] for an
 * ill-formed one (length 1). */
static size_t next_cp(const unsigned char *s, size_t n, uint32_t *cp) {
    long v;
    size_t len = loom_utf8_next(s, n, &v);
    *cp = v < 0 ? RAW_BYTE | s[0] : (uint32_t)v;
    return len;
}

static size_t put_cp(unsigned char *o, uint32_t c) {
    if (c & RAW_BYTE) {
        o[0] = (unsigned char)(c & 0xFF);
        return 1;
    }
    if (c < 0x80) {
        o[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (unsigned char)(0xC0 | (c >> 6)), o[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (c >> 12)), o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (c >> 18)), o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F)), o[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

/* ---- table look-ups ------------------------------------------------------ */

static int in_nfc_no(uint32_t cp) {
    size_t lo = 0, hi = sizeof loom_nfc_no / sizeof loom_nfc_no[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < loom_nfc_no[mid].first) hi = mid;
        else if (cp > loom_nfc_no[mid].last) lo = mid + 1;
        else return 1;
    }
    return 0;
}

typedef struct ccc_range {
    unsigned first, last;
    unsigned char ccc;
} ccc_range;

static int ccc_in(const void *table, size_t n, uint32_t cp) {
    const ccc_range *r = table;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].first) hi = mid;
        else if (cp > r[mid].last) lo = mid + 1;
        else return r[mid].ccc;
    }
    return 0;
}

/* canonical combining class (0 for a raw byte); of a starter, its decomposition's last one */
static int ccc_of(uint32_t cp) {
    return cp & RAW_BYTE ? 0 : ccc_in(loom_ccc, sizeof loom_ccc / sizeof loom_ccc[0], cp);
}
static int trailing_ccc(uint32_t cp) {
    return ccc_in(loom_nfc_trail, sizeof loom_nfc_trail / sizeof loom_nfc_trail[0], cp);
}

/* The primary composite of a and b, or 0 when they do not compose. */
static uint32_t composite(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT; /* L + V */
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE); /* LV + T */
    if ((a | b) & RAW_BYTE) return 0;
    unsigned long long key = ((unsigned long long)a << 21) | (unsigned long long)b;
    size_t lo = 0, hi = sizeof loom_nfc_pairs / sizeof loom_nfc_pairs[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (key < loom_nfc_pairs[mid].key) hi = mid;
        else if (key > loom_nfc_pairs[mid].key) lo = mid + 1;
        else return loom_nfc_pairs[mid].composite;
    }
    return 0;
}

/* cp's full canonical decomposition into d (at most 4): its length. */
static int decompose(uint32_t cp, uint32_t d[4]) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE, t = s % TCOUNT;
        d[0] = LBASE + s / (VCOUNT * TCOUNT);
        d[1] = VBASE + (s % (VCOUNT * TCOUNT)) / TCOUNT;
        if (!t) return 2;
        d[2] = TBASE + t;
        return 3;
    }
    size_t lo = 0, hi = (cp & RAW_BYTE) ? 0 : sizeof loom_nfd / sizeof loom_nfd[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < loom_nfd[mid].cp) hi = mid;
        else if (cp > loom_nfd[mid].cp) lo = mid + 1;
        else {
            for (int i = 0; i < loom_nfd[mid].n; i++) d[i] = loom_nfd[mid].d[i];
            return loom_nfd[mid].n;
        }
    }
    d[0] = cp;
    return 1;
}

/* ---- the check ------------------------------------------------------------ */

/* No code point NFC replaces, combining marks in canonical order (a
 * precomposed letter counting as its decomposition's last mark), no
 * unblocked mark or jamo that composes with its starter. Conservative: a
 * mark after a precomposed letter whose own last mark sorts after it is
 * flagged even where NFC recomposes the same text. */
size_t loom_nfc_quick_check(const unsigned char *s, size_t n) {
    uint32_t starter = RAW_BYTE;
    int prev_ccc = 0, between_max = 0, between = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = next_cp(s + i, n - i, &cp);
        if (cp < 0x300 || (cp & RAW_BYTE)) { /* nothing below U+0300 composes, reorders or changes */
            starter = cp;
            prev_ccc = cp >= 0xC0 && !(cp & RAW_BYTE) ? trailing_ccc(cp) : 0;
            between_max = between = 0;
            i += l;
            continue;
        }
        int c = ccc_of(cp);
        if (in_nfc_no(cp) || (c && prev_ccc > c)) return i;
        if (!(starter & RAW_BYTE) && (!between || (c && between_max < c)) && composite(starter, cp)) return i;
        if (c == 0) {
            starter = cp;
            between_max = between = 0;
            prev_ccc = trailing_ccc(cp); /* a mark after U+00E9 sorts against its U+0301 */
        } else {
            between = 1;
            between_max = c > between_max ? c : between_max;
            prev_ccc = c;
        }
        i += l;
    }
    return n;
}

/* ---- the normalization -------------------------------------------------- */

/* Canonical ordering: each run of non-starters sorted by class, stably
 * (insertion sort: runs are short). */
static void canonical_order(uint32_t *cp, size_t n) {
    for (size_t i = 1; i < n; i++) {
        int c = ccc_of(cp[i]);
        if (!c) continue;
        uint32_t x = cp[i];
        size_t j = i;
        while (j > 0) {
            int p = ccc_of(cp[j - 1]);
            if (!p || p <= c) break;
            cp[j] = cp[j - 1];
            j--;
        }
        cp[j] = x;
    }
}

/* Canonical composition in place; returns the new length. */
static size_t compose(uint32_t *cp, size_t n) {
    size_t out = 0, starter = (size_t)-1;
    int last = 0; /* class of the last code point kept after the starter (0: none since it) */
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[i];
        int cc = ccc_of(c);
        if (starter != (size_t)-1) {
            int adjacent = starter + 1 == out;
            uint32_t k = (adjacent || (last && last < cc)) ? composite(cp[starter], c) : 0;
            if (k) {
                cp[starter] = k;
                continue;
            }
        }
        if (cc == 0) {
            starter = out;
            last = 0;
        } else {
            last = cc;
        }
        cp[out++] = c;
    }
    return out;
}

loom_status loom_nfc_normalize(const unsigned char *s, size_t n, unsigned char **out, size_t *out_n) {
    *out = NULL;
    *out_n = 0;
    size_t cap = 4 * n + 1, m = 0; /* a code point decomposes into at most 4 */
    uint32_t *cp = malloc(cap * sizeof *cp);
    if (!cp) return loom_fail(LOOM_EOS, "NFC: cannot allocate %zu code points", cap);
    for (size_t i = 0; i < n;) {
        uint32_t c, d[4];
        i += next_cp(s + i, n - i, &c);
        int k = decompose(c, d);
        for (int j = 0; j < k; j++) cp[m++] = d[j];
    }
    canonical_order(cp, m);
    m = compose(cp, m);
    unsigned char *o = malloc(4 * m + 1);
    if (!o) {
        free(cp);
        return loom_fail(LOOM_EOS, "NFC: cannot allocate %zu bytes", 4 * m + 1);
    }
    size_t len = 0;
    for (size_t i = 0; i < m; i++) len += put_cp(o + len, cp[i]);
    free(cp);
    *out = o;
    *out_n = len;
    return LOOM_OK;
}
