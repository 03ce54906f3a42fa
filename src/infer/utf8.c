/* utf8.c - bytes to valid UTF-8 the way Hugging Face decodes tokens: every
 * well-formed sequence (Unicode's table 3-7) is copied, every maximal
 * subpart of an ill-formed one becomes one U+FFFD (Rust's
 * String::from_utf8_lossy, which `tokenizers` uses, and Python's
 * bytes.decode("utf-8", "replace") both do exactly this). The decoder is
 * incremental: a sequence still incomplete at the end of the input is held
 * until the next bytes complete it or prove it ill-formed, so the
 * concatenation of every piece it returns equals the lossy decoding of all
 * the bytes at once. See include/loom/tokenizer.h. */
#include <string.h>

#include "loom/tokenizer.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Bytes a sequence led by c has (0: c cannot lead one), and the range its
 * second byte must be in (the later ones are always 80..BF). */
static int seq_len(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Does byte c continue the held sequence d->held[0..d->n)? */
static int continues(const loom_utf8_dec *d, unsigned char c) {
    unsigned char lo, hi;
    seq_len((unsigned char)d->held[0], &lo, &hi);
    if (d->n > 1) lo = 0x80, hi = 0xBF;
    return c >= lo && c <= hi;
}

size_t loom_utf8_feed(loom_utf8_dec *d, const char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)in[i];
        if (d->n > 0) {
            if (!continues(d, c)) { /* the held bytes are a maximal subpart; c starts afresh */
                memcpy(out + o, REPLACEMENT, 3);
                o += 3;
                d->n = 0;
                continue;
            }
            d->held[d->n++] = (char)c;
            i++;
            unsigned char lo, hi;
            if (d->n == seq_len((unsigned char)d->held[0], &lo, &hi)) {
                memcpy(out + o, d->held, (size_t)d->n);
                o += (size_t)d->n;
                d->n = 0;
            }
            continue;
        }
        unsigned char lo, hi;
        const int len = seq_len(c, &lo, &hi);
        if (len == 1) {
            out[o++] = (char)c;
        } else if (len == 0) {
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
        } else {
            d->held[0] = (char)c;
            d->n = 1;
        }
        i++;
    }
    return o;
}

size_t loom_utf8_flush(loom_utf8_dec *d, char *out) {
    if (d->n == 0) return 0;
    d->n = 0;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}

size_t loom_utf8_valid_len(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char lo, hi;
        const int len = seq_len((unsigned char)s[i], &lo, &hi);
        if (len == 0 || i + (size_t)len > n) return i;
        for (int k = 1; k < len; k++) {
            const unsigned char c = (unsigned char)s[i + (size_t)k];
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return i;
        }
        i += (size_t)len;
    }
    return n;
}
