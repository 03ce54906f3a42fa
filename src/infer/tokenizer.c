/* tokenizer.c - GPT-2 byte-level BPE: file loading, pre-tokenization, merges,
 * decode. See include/loom/tokenizer.h for the semantics. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/tokenizer.h"
#include "unicode_table.h"

/* ---- small open-addressing hash maps ---------------------------------- */

/* (left id, right id) -> (rank, merged id). */
typedef struct merge_slot {
    uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
    uint32_t rank, id;
} merge_slot;

/* encoded pre-token cache: key bytes and ids live in pools. */
typedef struct cache_slot {
    uint64_t hash; /* 0 = empty */
    uint32_t key_off, key_len, ids_off, ids_len;
} cache_slot;

#define CACHE_SLOTS (1u << 16)

enum { PRE_GPT2 = 0, PRE_LLAMA3, PRE_QWEN2 };
/* SentencePiece-style: spaces become U+2581 and one U+2581 is put in front of
 * every segment (Prepend normalizer), of every one (Metaspace always) or of
 * the text's first (Metaspace first). */
enum { SP_PREPEND = 1, SP_ALWAYS, SP_FIRST };

struct loom_tokenizer {
    int n_vocab;
    uint32_t *tok_off; /* (n_vocab + 1) offsets into tok_pool */
    char *tok_pool;
    uint32_t byte_tok[256];
    merge_slot *merges;
    size_t merge_mask;
    int eot, bos;
    int pretok;        /* PRE_GPT2, PRE_LLAMA3 or PRE_QWEN2 */
    int ignore_merges; /* a pre-token in the vocabulary is that token */
    int nfc;           /* the file's normalizer is NFC: text must already be NFC */
    int sp;            /* SentencePiece-style BPE (SP_*), or 0 */
    uint32_t *dec_off; /* sp: token bytes for decoding ("\xe2\x96\x81" -> ' ', <0xXX> -> the byte) */
    char *dec_pool;
    char *norm; /* sp: the normalized segment */
    size_t norm_cap;
    /* model.vocab bytes -> id (merges while loading, ignore_merges) */
    uint64_t *vhash;
    uint32_t *vid;
    size_t vmask;
    /* added tokens (special or not), matched in the text before anything else */
    uint32_t *added;
    int n_added;
    unsigned char added_first[256];
    /* cache */
    cache_slot *cache;
    size_t cache_used;
    char *ckeys;
    size_t ckeys_n, ckeys_cap;
    loom_ids cids;
    loom_ids sym; /* scratch for one pre-token */
    /* long pre-tokens: linked symbols and a heap of candidate merges */
    uint32_t *nxt, *prv;
    struct heap_item *heap;
    size_t long_cap;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h | 1; /* never 0 */
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const merge_slot *merge_find(const loom_tokenizer *t, uint32_t a, uint32_t b) {
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (size_t i = mix64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        if (t->merges[i].key == key) return &t->merges[i];
        if (t->merges[i].key == 0) return NULL;
    }
}

/* The model.vocab id of the token whose bytes are s[0..n), or -1. */
static long vocab_find(const loom_tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    for (size_t i = h & t->vmask; t->vhash[i]; i = (i + 1) & t->vmask) {
        uint32_t id = t->vid[i];
        size_t len = t->tok_off[id + 1] - t->tok_off[id];
        if (t->vhash[i] == h && len == n && memcmp(t->tok_pool + t->tok_off[id], s, n) == 0) return id;
    }
    return -1;
}

/* ---- GPT-2's byte <-> printable code point mapping --------------------- */

/* Bytes that are printable Latin-1 stand for themselves; the other 68 map, in
 * byte order, to U+0100 onwards. */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static void byte_to_cp_table(unsigned cp_of[256]) {
    unsigned next = 256;
    for (int b = 0; b < 256; b++) cp_of[b] = byte_is_printable(b) ? (unsigned)b : next++;
}

/* Decode one UTF-8 sequence at s[0..n). Returns its length; *cp = -1 for an
 * invalid sequence (length 1). */
static size_t utf8_next(const unsigned char *s, size_t n, long *cp) {
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

/* Vocabulary strings are in the mapped alphabet: turn one into raw bytes.
 * Returns the byte count, or -1 if a code point is not in the alphabet. */
static long mapped_to_bytes(const char *s, size_t n, const int byte_of_cp[324], char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        long cp;
        i += utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (cp < 0 || cp >= 324 || byte_of_cp[cp] < 0) return -1;
        out[o++] = (char)byte_of_cp[cp];
    }
    return (long)o;
}

/* ---- character classes ------------------------------------------------- */

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };

static int is_white_space(long cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int char_class(long cp) {
    if (cp < 0) return C_OTHER;
    if (cp < 128) {
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return C_SPACE;
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return C_LETTER;
        if (cp >= '0' && cp <= '9') return C_NUMBER;
        return C_OTHER;
    }
    if (is_white_space(cp)) return C_SPACE;
    size_t lo = 0, hi = sizeof loom_uni_ranges / sizeof loom_uni_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((unsigned long)cp < loom_uni_ranges[mid].first) hi = mid;
        else if ((unsigned long)cp > loom_uni_ranges[mid].last) lo = mid + 1;
        else return loom_uni_ranges[mid].cls;
    }
    return C_OTHER;
}

/* Class of the code point at s[i] (C_OTHER past the end: callers check),
 * its byte length through *len. */
static int class_at(const unsigned char *s, size_t n, size_t i, size_t *len) {
    long cp;
    *len = utf8_next(s + i, n - i, &cp);
    return char_class(cp);
}

/* Length in bytes of the pre-token that starts at s[i] (i < n), following
 * the alternatives of GPT-2's pattern in order. */
static size_t pretoken_len(const unsigned char *s, size_t n, size_t i) {
    /* 's 't 're 've 'm 'll 'd */
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    size_t len, j = i;
    int c = class_at(s, n, i, &len);
    /* ` ?X+` for X = letter, number, other: an optional ASCII space first */
    if (s[i] == ' ' && i + 1 < n) {
        size_t l2;
        int c2 = class_at(s, n, i + 1, &l2);
        if (c2 != C_SPACE) {
            c = c2;
            len = 1 + l2;
        }
    }
    if (c != C_SPACE) {
        j = i + len;
        while (j < n) {
            size_t l;
            if (class_at(s, n, j, &l) != c) break;
            j += l;
        }
        return j - i;
    }
    /* \s+(?!\S) then \s+: the whole run if it ends the text, else the run
     * less its last character, unless that leaves nothing. */
    size_t last = i;
    j = i;
    while (j < n) {
        size_t l;
        if (class_at(s, n, j, &l) != C_SPACE) break;
        last = j;
        j += l;
    }
    if (j == n || last == i) return j - i;
    return last - i;
}

/* End of the run of class c that starts at s[j]. */
static size_t run_end(const unsigned char *s, size_t n, size_t j, int c) {
    while (j < n) {
        size_t l;
        if (class_at(s, n, j, &l) != c) break;
        j += l;
    }
    return j;
}

/* Length of a contraction of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i], or 0.
 * Case folding is Unicode's: U+017F (long s) matches s, as in Oniguruma. */
static size_t contraction_len(const unsigned char *s, size_t n, size_t i) {
    if (s[i] != '\'' || i + 1 >= n) return 0;
    unsigned a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
    if (a == 0xC5 && b == 0xBF) return 3; /* 'ſ */
    if (a < 128) a |= 0x20;
    if (b < 128) b |= 0x20;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Length in bytes of the pre-token at s[i] (i < n) under the pattern of
 * Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * the alternatives tried in order, as the regex does. */
static size_t pretoken_len_l3(const unsigned char *s, size_t n, size_t i, int max_digits) {
    size_t len, l2, j = contraction_len(s, n, i);
    if (j) return j;
    long cp;
    len = utf8_next(s + i, n - i, &cp);
    int c = char_class(cp);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c == C_LETTER) return run_end(s, n, i + len, C_LETTER) - i;
    if (c != C_NUMBER && cp != '\r' && cp != '\n' && i + len < n && class_at(s, n, i + len, &l2) == C_LETTER)
        return run_end(s, n, i + len + l2, C_LETTER) - i;
    /* \p{N}{1,max_digits} */
    if (c == C_NUMBER) {
        j = i + len;
        for (int k = 1; k < max_digits && j < n && class_at(s, n, j, &l2) == C_NUMBER; k++) j += l2;
        return j - i;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t k = i;
    if (s[i] == ' ' && i + 1 < n && class_at(s, n, i + 1, &l2) == C_OTHER) k = i + 1;
    if (class_at(s, n, k, &l2) == C_OTHER) {
        j = run_end(s, n, k, C_OTHER);
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j - i;
    }
    /* a whitespace run: \s*[\r\n]+ ends after its last CR or LF; else
     * \s+(?!\S) then \s+ as in GPT-2's pattern */
    size_t last = i, crlf_end = 0;
    for (j = i; j < n;) {
        size_t l;
        if (class_at(s, n, j, &l) != C_SPACE) break;
        if (s[j] == '\r' || s[j] == '\n') crlf_end = j + 1;
        last = j;
        j += l;
    }
    if (crlf_end) return crlf_end - i;
    if (j == n || last == i) return j - i;
    return last - i;
}

/* ---- the NFC normalizer, as a check ------------------------------------ */

static int in_ranges_nfc_no(long cp) {
    size_t lo = 0, hi = sizeof loom_nfc_no / sizeof loom_nfc_no[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((unsigned long)cp < loom_nfc_no[mid].first) hi = mid;
        else if ((unsigned long)cp > loom_nfc_no[mid].last) lo = mid + 1;
        else return 1;
    }
    return 0;
}

typedef struct ccc_range {
    unsigned first, last;
    unsigned char ccc;
} ccc_range;

static int ccc_in(const void *table, size_t n, long cp) {
    const ccc_range *r = table;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((unsigned long)cp < r[mid].first) hi = mid;
        else if ((unsigned long)cp > r[mid].last) lo = mid + 1;
        else return r[mid].ccc;
    }
    return 0;
}

/* canonical combining class; of a starter, its decomposition's last one */
static int ccc_of(long cp) { return ccc_in(loom_ccc, sizeof loom_ccc / sizeof loom_ccc[0], cp); }
static int trailing_ccc(long cp) {
    return ccc_in(loom_nfc_trail, sizeof loom_nfc_trail / sizeof loom_nfc_trail[0], cp);
}

/* Whether canonical composition joins starter a and b. */
static int composes(long a, long b) {
    if (a >= 0x1100 && a <= 0x1112 && b >= 0x1161 && b <= 0x1175) return 1; /* Hangul L + V */
    if (a >= 0xAC00 && a <= 0xD7A3 && (a - 0xAC00) % 28 == 0 && b >= 0x11A8 && b <= 0x11C2)
        return 1; /* LV + T */
    unsigned long long key = ((unsigned long long)a << 21) | (unsigned long long)b;
    size_t lo = 0, hi = sizeof loom_nfc_pairs / sizeof loom_nfc_pairs[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (key < loom_nfc_pairs[mid].key) hi = mid;
        else if (key > loom_nfc_pairs[mid].key) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* loom does not rewrite text to NFC: it checks that s[0..n) is already in
 * NFC (no code point NFC replaces, combining marks in canonical order - a
 * precomposed letter counting as its decomposition's last mark - no
 * unblocked mark or jamo that composes with its starter), where normalizing
 * would change nothing. Conservative: a mark after a precomposed letter whose
 * own last mark sorts after it is refused even where NFC recomposes the
 * same text. Returns the offset of the first offending code point, or n. */
static size_t nfc_violation(const unsigned char *s, size_t n) {
    long starter = -1;
    int prev_ccc = 0, between_max = 0, between = 0;
    for (size_t i = 0; i < n;) {
        long cp;
        size_t l = utf8_next(s + i, n - i, &cp);
        if (cp < 0x300) { /* nothing below U+0300 composes, reorders or changes */
            starter = cp;
            prev_ccc = cp >= 0xC0 ? trailing_ccc(cp) : 0;
            between_max = between = 0;
            i += l;
            continue;
        }
        int c = ccc_of(cp);
        if (in_ranges_nfc_no(cp) || (c && prev_ccc > c)) return i;
        if (starter >= 0 && (!between || (c && between_max < c)) && composes(starter, cp)) return i;
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

/* ---- BPE on one pre-token ------------------------------------------------ */

/* A candidate merge of the symbols at slots pos and nxt[pos]. */
typedef struct heap_item {
    uint32_t rank, pos, left, right;
} heap_item;

static int heap_less(const heap_item *a, const heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(&x, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = x;
    return top;
}

#define NONE UINT32_MAX
#define LONG_WORD 64

static void push_pair(loom_tokenizer *t, size_t *hn, uint32_t pos) {
    if (pos == NONE || t->nxt[pos] == NONE) return;
    uint32_t q = t->nxt[pos];
    const merge_slot *ms = merge_find(t, t->sym.v[pos], t->sym.v[q]);
    if (ms) heap_push(t->heap, hn, (heap_item){ms->rank, pos, t->sym.v[pos], t->sym.v[q]});
}

/* The same merges in O(n log n) for long pre-tokens: the lowest rank first,
 * the leftmost first among equal ranks - which is GPT-2's "merge every
 * occurrence of the best pair, left to right" (a merge never creates the
 * pair it merges). Symbols stay in their slots, linked by nxt / prv; stale
 * heap entries are skipped when popped. Returns the symbol count, compacted
 * into t->sym. */
static size_t bpe_word_long(loom_tokenizer *t, size_t n) {
    uint32_t *sym = t->sym.v, *nxt = t->nxt, *prv = t->prv;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (uint32_t)(i + 1) : NONE;
        prv[i] = i > 0 ? (uint32_t)(i - 1) : NONE;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, &hn, (uint32_t)i);
    while (hn > 0) {
        heap_item it = heap_pop(t->heap, &hn);
        uint32_t q = nxt[it.pos];
        if (sym[it.pos] == NONE || q == NONE || sym[it.pos] != it.left || sym[q] != it.right) continue;
        sym[it.pos] = merge_find(t, it.left, it.right)->id;
        sym[q] = NONE;
        nxt[it.pos] = nxt[q];
        if (nxt[q] != NONE) prv[nxt[q]] = it.pos;
        if (prv[it.pos] != NONE) push_pair(t, &hn, prv[it.pos]);
        push_pair(t, &hn, it.pos);
    }
    size_t m = 0;
    for (uint32_t i = 0; i != NONE; i = nxt[i]) sym[m++] = sym[i];
    return m;
}

/* Merge the n symbols in t->sym; returns the symbol count. */
static size_t bpe_syms(loom_tokenizer *t, size_t n) {
    uint32_t *sym = t->sym.v;
    if (n > LONG_WORD) return bpe_word_long(t, n);
    size_t m = n;
    while (m > 1) {
        uint32_t best = UINT32_MAX, a = 0, b = 0, to = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            const merge_slot *ms = merge_find(t, sym[i], sym[i + 1]);
            if (ms && ms->rank < best) {
                best = ms->rank;
                a = sym[i];
                b = sym[i + 1];
                to = ms->id;
            }
        }
        if (best == UINT32_MAX) break;
        size_t o = 0;
        for (size_t i = 0; i < m;) {
            if (i + 1 < m && sym[i] == a && sym[i + 1] == b) {
                sym[o++] = to;
                i += 2;
            } else {
                sym[o++] = sym[i++];
            }
        }
        m = o;
    }
    return m;
}

static void cache_clear(loom_tokenizer *t) {
    memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
    t->cache_used = t->ckeys_n = 0;
    t->cids.n = 0;
}

/* Room for n symbols in t->sym (and the long-word scratch). */
static loom_status reserve_syms(loom_tokenizer *t, size_t n) {
    LOOM_TRY(loom_ids_reserve(&t->sym, n));
    if (n > LONG_WORD && n > t->long_cap) { /* a merge adds at most 2 heap entries: 3n in all */
        uint32_t *a = realloc(t->nxt, n * sizeof *a), *b = a ? realloc(t->prv, n * sizeof *b) : NULL;
        if (a) t->nxt = a;
        if (b) t->prv = b;
        heap_item *h = b ? realloc(t->heap, 3 * n * sizeof *h) : NULL;
        if (!h) return loom_fail(LOOM_EOS, "tokenizer: out of memory for a %zu-symbol word", n);
        t->heap = h;
        t->long_cap = n;
    }
    return LOOM_OK;
}

static loom_status encode_pretoken(loom_tokenizer *t, const unsigned char *s, size_t n, loom_ids *ids) {
    if (t->ignore_merges) {
        long id = vocab_find(t, (const char *)s, n);
        if (id >= 0) return loom_ids_push(ids, (uint32_t)id);
    }
    uint64_t h = hash_bytes((const char *)s, n);
    size_t i = h & (CACHE_SLOTS - 1);
    for (; t->cache[i].hash; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *c = &t->cache[i];
        if (c->hash == h && c->key_len == n && memcmp(t->ckeys + c->key_off, s, n) == 0) {
            LOOM_TRY(loom_ids_reserve(ids, ids->n + c->ids_len));
            memcpy(ids->v + ids->n, t->cids.v + c->ids_off, c->ids_len * sizeof(uint32_t));
            ids->n += c->ids_len;
            return LOOM_OK;
        }
    }
    LOOM_TRY(reserve_syms(t, n));
    for (size_t k = 0; k < n; k++) t->sym.v[k] = t->byte_tok[s[k]];
    size_t m = bpe_syms(t, n);
    LOOM_TRY(loom_ids_reserve(ids, ids->n + m));
    memcpy(ids->v + ids->n, t->sym.v, m * sizeof(uint32_t));
    ids->n += m;
    /* remember short pre-tokens; start over when the table is half full or
     * the pools would pass 64 MiB */
    if (n > 256) return LOOM_OK;
    if (t->cache_used >= CACHE_SLOTS / 2 || t->ckeys_n + n > (64u << 20) || t->cids.n + m > (16u << 20)) {
        cache_clear(t);
        i = h & (CACHE_SLOTS - 1);
    }
    if (t->ckeys_n + n > t->ckeys_cap) {
        size_t nc = t->ckeys_cap ? t->ckeys_cap * 2 : (1u << 16);
        while (nc < t->ckeys_n + n) nc *= 2;
        char *p = realloc(t->ckeys, nc);
        if (!p) return LOOM_OK; /* the cache is an optimisation */
        t->ckeys = p;
        t->ckeys_cap = nc;
    }
    if (loom_ids_reserve(&t->cids, t->cids.n + m) != LOOM_OK) return LOOM_OK;
    memcpy(t->ckeys + t->ckeys_n, s, n);
    memcpy(t->cids.v + t->cids.n, t->sym.v, m * sizeof(uint32_t));
    t->cache[i] = (cache_slot){h, (uint32_t)t->ckeys_n, (uint32_t)n, (uint32_t)t->cids.n, (uint32_t)m};
    t->ckeys_n += n;
    t->cids.n += m;
    t->cache_used++;
    return LOOM_OK;
}

/* SentencePiece-style: the whole segment is one word of characters, each
 * its vocabulary token or else its bytes' <0xXX> tokens, merged as above. */
static loom_status encode_sp(loom_tokenizer *t, const unsigned char *s, size_t n, int at_start,
                             loom_ids *ids) {
    if (n == 0) return LOOM_OK;
    size_t cap = 3 * n + 3;
    if (cap > t->norm_cap) {
        char *p = realloc(t->norm, cap);
        if (!p) return loom_fail(LOOM_EOS, "tokenizer: out of memory for a %zu-byte text", n);
        t->norm = p;
        t->norm_cap = cap;
    }
    static const char meta[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 */
    size_t m = 0;
    /* Metaspace does not add one where the text already starts with a space */
    int spaced = s[0] == ' ' || (n >= 3 && memcmp(s, meta, 3) == 0);
    if (t->sp == SP_PREPEND || (!spaced && (t->sp == SP_ALWAYS || at_start))) {
        memcpy(t->norm, meta, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(t->norm + m, meta, 3);
            m += 3;
        } else {
            t->norm[m++] = (char)s[i];
        }
    }
    LOOM_TRY(reserve_syms(t, m));
    size_t k = 0;
    for (size_t i = 0; i < m;) {
        long cp;
        size_t l = utf8_next((const unsigned char *)t->norm + i, m - i, &cp);
        long id = vocab_find(t, t->norm + i, l);
        if (id >= 0) t->sym.v[k++] = (uint32_t)id;
        else
            for (size_t b = 0; b < l; b++) t->sym.v[k++] = t->byte_tok[(unsigned char)t->norm[i + b]];
        i += l;
    }
    k = bpe_syms(t, k);
    LOOM_TRY(loom_ids_reserve(ids, ids->n + k));
    memcpy(ids->v + ids->n, t->sym.v, k * sizeof(uint32_t));
    ids->n += k;
    return LOOM_OK;
}

static loom_status encode_plain(loom_tokenizer *t, const unsigned char *s, size_t n, int at_start,
                                loom_ids *ids) {
    if (t->sp) return encode_sp(t, s, n, at_start, ids);
    if (t->nfc) {
        size_t at = nfc_violation(s, n);
        if (at < n) {
            long cp;
            utf8_next(s + at, n - at, &cp);
            return loom_fail(
                LOOM_EDATA,
                "tokenizer: the text is not in NFC at U+%04lX (its normalizer is NFC, which loom "
                "checks but does not apply: normalize the text to NFC first)",
                cp);
        }
    }
    for (size_t i = 0; i < n;) {
        size_t len = t->pretok == PRE_GPT2 ? pretoken_len(s, n, i)
                                           : pretoken_len_l3(s, n, i, t->pretok == PRE_LLAMA3 ? 3 : 1);
        LOOM_TRY(encode_pretoken(t, s + i, len, ids));
        i += len;
    }
    return LOOM_OK;
}

/* The longest added token whose text starts at s[i], or -1. */
static long added_at(const loom_tokenizer *t, const unsigned char *s, size_t n, size_t i) {
    if (!t->added_first[s[i]]) return -1;
    long best = -1;
    size_t best_len = 0;
    for (int k = 0; k < t->n_added; k++) {
        size_t l;
        const char *b = loom_tokenizer_token_bytes(t, t->added[k], &l);
        if (l > best_len && l <= n - i && memcmp(b, s + i, l) == 0) {
            best = t->added[k];
            best_len = l;
        }
    }
    return best;
}

loom_status loom_tokenizer_encode(loom_tokenizer *t, const char *text, size_t len, int allow_special,
                                  loom_ids *ids) {
    const unsigned char *s = (const unsigned char *)text;
    size_t start = 0;
    /* added tokens, leftmost first and the longest among those starting at
     * one place, as Hugging Face's added vocabulary matches them */
    for (size_t i = 0; allow_special && i < len;) {
        long id = added_at(t, s, len, i);
        if (id < 0) {
            i++;
            continue;
        }
        size_t l;
        loom_tokenizer_token_bytes(t, (uint32_t)id, &l);
        LOOM_TRY(encode_plain(t, s + start, i - start, start == 0, ids));
        LOOM_TRY(loom_ids_push(ids, (uint32_t)id));
        start = i = i + l;
    }
    return encode_plain(t, s + start, len - start, start == 0, ids);
}

/* ---- ids and decode ------------------------------------------------------ */

int loom_tokenizer_vocab_size(const loom_tokenizer *t) { return t->n_vocab; }
int loom_tokenizer_eot(const loom_tokenizer *t) { return t->eot; }
int loom_tokenizer_bos(const loom_tokenizer *t) { return t->bos; }

const char *loom_tokenizer_token_bytes(const loom_tokenizer *t, uint32_t id, size_t *len) {
    if (id >= (uint32_t)t->n_vocab) {
        *len = 0;
        return NULL;
    }
    const uint32_t *off = t->dec_off ? t->dec_off : t->tok_off;
    *len = off[id + 1] - off[id];
    return (t->dec_off ? t->dec_pool : t->tok_pool) + off[id];
}

loom_status loom_tokenizer_decode(const loom_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                                  size_t *out_len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= (uint32_t)t->n_vocab)
            return loom_fail(LOOM_EDATA, "decode: token %u at position %zu is outside the vocabulary (%d)",
                             ids[i], i, t->n_vocab);
        total += t->tok_off[ids[i] + 1] - t->tok_off[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) return loom_fail(LOOM_EOS, "decode: out of memory (%zu bytes)", total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *b = loom_tokenizer_token_bytes(t, ids[i], &l);
        memcpy(buf + o, b, l);
        o += l;
    }
    if (t->sp && o > 0 && buf[0] == ' ') memmove(buf, buf + 1, --o); /* the decoder strips the one it added */
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return LOOM_OK;
}

/* ---- loading ------------------------------------------------------------- */

static loom_status read_file(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "tokenizer file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return loom_fail(LOOM_ENOINPUT, "tokenizer file %s: not a regular file", path);
    }
    char *b = malloc((size_t)sb.st_size + 1);
    if (!b) {
        fclose(f);
        return loom_fail(LOOM_EOS, "tokenizer file %s: out of memory", path);
    }
    size_t got = fread(b, 1, (size_t)sb.st_size, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)sb.st_size) {
        free(b);
        return loom_fail(LOOM_EIO, "tokenizer file %s: read failed", path);
    }
    b[got] = '\0';
    *buf = b;
    *len = got;
    return LOOM_OK;
}

typedef struct loader {
    loom_tokenizer *t;
    int byte_of_cp[324];
    char scratch[1024];
    const char *file;
} loader;

static long bm_find(const loader *L, const char *s, size_t n) { return vocab_find(L->t, s, n); }

/* vocab: a JSON object {token string: id}. Fills tok_off/tok_pool and the
 * bytes map. */
static loom_status load_vocab(loader *L, const cJSON *vocab) {
    loom_tokenizer *t = L->t;
    if (!cJSON_IsObject(vocab))
        return loom_fail(LOOM_EDATA, "%s: the vocabulary is not a JSON object", L->file);
    int max_id = -1, count = 0;
    size_t pool = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216 ||
            e->valuedouble != (int)e->valuedouble)
            return loom_fail(LOOM_EDATA, "%s: vocabulary entry \"%s\" has no valid id", L->file, e->string);
        if (e->valueint > max_id) max_id = e->valueint;
        pool += strlen(e->string);
        count++;
    }
    if (count == 0) return loom_fail(LOOM_EDATA, "%s: the vocabulary is empty", L->file);
    t->n_vocab = max_id + 1;
    int *len_of = calloc((size_t)t->n_vocab, sizeof *len_of);
    char *tmp = malloc(pool + 1);
    t->tok_off = calloc((size_t)t->n_vocab + 1, sizeof *t->tok_off);
    t->tok_pool = malloc(pool + 1);
    size_t slots = 1;
    while (slots < (size_t)count * 2) slots *= 2;
    t->vhash = calloc(slots, sizeof *t->vhash);
    t->vid = calloc(slots, sizeof *t->vid);
    t->vmask = slots - 1;
    loom_status st = LOOM_OK;
    if (!len_of || !tmp || !t->tok_off || !t->tok_pool || !t->vhash || !t->vid) {
        st = loom_fail(LOOM_EOS, "%s: out of memory loading the vocabulary", L->file);
        goto done;
    }
    for (int i = 0; i < t->n_vocab; i++) len_of[i] = -1;
    /* pass 1: byte lengths of each id, to lay out the pool in id order */
    size_t o = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        long nb = L->t->sp ? -1 : mapped_to_bytes(e->string, strlen(e->string), L->byte_of_cp, tmp + o);
        if (nb < 0) {
            /* not in the byte alphabet (an added token such as
             * "<|endoftext|>" in some files): keep its UTF-8 text */
            nb = (long)strlen(e->string);
            memcpy(tmp + o, e->string, (size_t)nb);
        }
        if (len_of[e->valueint] >= 0) {
            st = loom_fail(LOOM_EDATA, "%s: id %d appears twice in the vocabulary", L->file, e->valueint);
            goto done;
        }
        len_of[e->valueint] = (int)nb;
        o += (size_t)nb;
    }
    uint32_t off = 0;
    for (int i = 0; i < t->n_vocab; i++) {
        t->tok_off[i] = off;
        off += len_of[i] > 0 ? (uint32_t)len_of[i] : 0;
    }
    t->tok_off[t->n_vocab] = off;
    o = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        memcpy(t->tok_pool + t->tok_off[e->valueint], tmp + o, (size_t)len_of[e->valueint]);
        o += (size_t)len_of[e->valueint];
    }
    for (const cJSON *e = vocab->child; e; e = e->next) {
        size_t n;
        const char *b = loom_tokenizer_token_bytes(t, (uint32_t)e->valueint, &n);
        if (bm_find(L, b, n) >= 0) continue; /* a duplicate string: the first id wins */
        uint64_t h = hash_bytes(b, n);
        size_t i = h & t->vmask;
        while (t->vhash[i]) i = (i + 1) & t->vmask;
        t->vhash[i] = h;
        t->vid[i] = (uint32_t)e->valueint;
        if (strcmp(e->string, "<|endoftext|>") == 0) t->eot = e->valueint;
    }
    for (int b = 0; b < 256; b++) {
        char c[8];
        size_t cl = t->sp ? (size_t)snprintf(c, sizeof c, "<0x%02X>", b) : 1;
        c[0] = t->sp ? c[0] : (char)b;
        long id = bm_find(L, c, cl);
        if (id < 0) {
            st = loom_fail(LOOM_EDATA, "%s: the vocabulary has no token for byte 0x%02x", L->file, b);
            goto done;
        }
        t->byte_tok[b] = (uint32_t)id;
    }
done:
    free(len_of);
    free(tmp);
    return st;
}

static loom_status merges_alloc(loader *L, size_t n) {
    size_t slots = 1;
    while (slots < n * 2 + 2) slots *= 2;
    L->t->merges = calloc(slots, sizeof *L->t->merges);
    if (!L->t->merges) return loom_fail(LOOM_EOS, "%s: out of memory for %zu merges", L->file, n);
    L->t->merge_mask = slots - 1;
    return LOOM_OK;
}

/* Merge number `rank`: the tokens whose mapped strings are a and b. */
static loom_status add_merge(loader *L, const char *a, size_t na, const char *b, size_t nb, uint32_t rank,
                             long line) {
    char *buf = L->scratch;
    if (na + nb > sizeof L->scratch) return loom_fail(LOOM_EDATA, "%s: merge %ld is too long", L->file, line);
    long la = (long)na, lb = (long)nb;
    if (L->t->sp) { /* the vocabulary's own strings */
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
    } else {
        la = mapped_to_bytes(a, na, L->byte_of_cp, buf);
        lb = la < 0 ? -1 : mapped_to_bytes(b, nb, L->byte_of_cp, buf + la);
    }
    if (la < 0 || lb < 0)
        return loom_fail(LOOM_EDATA,
                         "%s: merge %ld (\"%.*s %.*s\") has a character outside GPT-2's byte alphabet",
                         L->file, line, (int)na, a, (int)nb, b);
    long ia = bm_find(L, buf, (size_t)la), ib = bm_find(L, buf + la, (size_t)lb),
         ic = bm_find(L, buf, (size_t)(la + lb));
    if (ia < 0 || ib < 0 || ic < 0)
        return loom_fail(LOOM_EDATA, "%s: merge %ld (\"%.*s %.*s\") names a token the vocabulary lacks",
                         L->file, line, (int)na, a, (int)nb, b);
    uint64_t key = (((uint64_t)ia << 32) | (uint64_t)ib) + 1;
    size_t i = mix64(key) & L->t->merge_mask;
    for (; L->t->merges[i].key; i = (i + 1) & L->t->merge_mask)
        if (L->t->merges[i].key == key) return LOOM_OK; /* repeated: the first rank wins */
    L->t->merges[i] = (merge_slot){key, rank, (uint32_t)ic};
    return LOOM_OK;
}

/* merges.txt / vocab.bpe: an optional "#version" line, then "a b" per line. */
static loom_status load_merges_text(loader *L, char *text, size_t len) {
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    LOOM_TRY(merges_alloc(L, lines));
    uint32_t rank = 0;
    long lineno = 0;
    for (char *p = text, *end = text + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        lineno++;
        size_t n = (size_t)(le - p);
        if (n && p[n - 1] == '\r') n--;
        if (n > 0 && !(lineno == 1 && p[0] == '#')) {
            char *sp = memchr(p, ' ', n);
            if (!sp || sp == p || sp == p + n - 1)
                return loom_fail(LOOM_EDATA, "%s: line %ld is not \"a b\"", L->file, lineno);
            LOOM_TRY(add_merge(L, p, (size_t)(sp - p), sp + 1, (size_t)(p + n - sp - 1), rank++, lineno));
        }
        p = le + 1;
    }
    return LOOM_OK;
}

static loom_status load_merges_json(loader *L, const cJSON *merges) {
    if (!cJSON_IsArray(merges)) return loom_fail(LOOM_EDATA, "%s: model.merges is not an array", L->file);
    LOOM_TRY(merges_alloc(L, (size_t)cJSON_GetArraySize(merges)));
    uint32_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1])
                return loom_fail(LOOM_EDATA, "%s: merge %u is not \"a b\"", L->file, rank + 1);
            LOOM_TRY(add_merge(L, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), rank, (long)rank + 1));
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            const char *a = m->child->valuestring, *b = m->child->next->valuestring;
            LOOM_TRY(add_merge(L, a, strlen(a), b, strlen(b), rank, (long)rank + 1));
        } else {
            return loom_fail(LOOM_EDATA, "%s: merge %u is neither \"a b\" nor [a, b]", L->file, rank + 1);
        }
    }
    return LOOM_OK;
}

static loom_status parse_json(loader *L, const char *path, cJSON **out) {
    char *text;
    size_t len;
    LOOM_TRY(read_file(path, &text, &len));
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*out) return loom_fail(LOOM_EDATA, "%s: not valid JSON", L->file);
    return LOOM_OK;
}

static loom_status load_pair(loader *L, const char *vocab_path, const char *merges_path) {
    cJSON *vocab;
    L->file = vocab_path;
    LOOM_TRY(parse_json(L, vocab_path, &vocab));
    loom_status st = load_vocab(L, vocab);
    cJSON_Delete(vocab);
    LOOM_TRY(st);
    char *text;
    size_t len;
    L->file = merges_path;
    LOOM_TRY(read_file(merges_path, &text, &len));
    st = load_merges_text(L, text, len);
    free(text);
    return st;
}

/* The pre-tokenizer patterns loom implements, as tokenizer.json spells them. */
static const char *const PATTERN_GPT2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char *const PATTERN_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const PATTERN_QWEN2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int json_true(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static const char *type_of(const cJSON *o) {
    const char *ty = json_str(o, "type");
    return ty ? ty : "(no type)";
}

/* A ByteLevel step: add_prefix_space off, and the GPT-2 split on or off as
 * use_regex wants. */
static loom_status check_byte_level(const loader *L, const cJSON *p, int use_regex) {
    if (json_true(p, "add_prefix_space"))
        return loom_fail(LOOM_EDATA, "%s: pre_tokenizer ByteLevel with add_prefix_space is not supported",
                         L->file);
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    int has = ur ? cJSON_IsTrue(ur) : 1;
    if (has != use_regex)
        return loom_fail(LOOM_EDATA, "%s: pre_tokenizer ByteLevel with use_regex %s is not supported here",
                         L->file, has ? "true" : "false");
    return LOOM_OK;
}

/* pre_tokenizer: ByteLevel (GPT-2's split), or Sequence [Split(Regex P,
 * Isolated), ByteLevel(use_regex false)] with P one of the patterns above. */
static loom_status read_pre_tokenizer(loader *L, const cJSON *p) {
    if (!p) return LOOM_OK; /* a bare file: GPT-2's */
    if (cJSON_IsNull(p) && L->t->sp) return LOOM_OK;
    const char *ty = type_of(p);
    if (strcmp(ty, "Metaspace") == 0 && !L->t->sp) {
        const char *rpl = json_str(p, "replacement"), *scheme = json_str(p, "prepend_scheme");
        if (!rpl || strcmp(rpl, "\xe2\x96\x81") != 0 || json_true(p, "split") || !scheme ||
            (strcmp(scheme, "first") != 0 && strcmp(scheme, "always") != 0))
            return loom_fail(LOOM_EDATA,
                             "%s: pre_tokenizer Metaspace is supported only with replacement U+2581, split "
                             "false and prepend_scheme first or always",
                             L->file);
        L->t->sp = strcmp(scheme, "first") == 0 ? SP_FIRST : SP_ALWAYS;
        return LOOM_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0) return check_byte_level(L, p, 1);
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (strcmp(ty, "Sequence") != 0 || cJSON_GetArraySize(seq) != 2 ||
        strcmp(type_of(seq->child), "Split") != 0 || strcmp(type_of(seq->child->next), "ByteLevel") != 0)
        return loom_fail(LOOM_EDATA,
                         "%s: pre_tokenizer %s is not supported (loom reads ByteLevel, Split(Regex) then "
                         "ByteLevel, or Metaspace / none with a Prepend normalizer for byte-fallback BPE)",
                         L->file, cJSON_IsNull(p) ? "null" : ty);
    const cJSON *split = seq->child;
    const char *re = json_str(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    const char *beh = json_str(split, "behavior");
    if (!re || !beh || strcmp(beh, "Isolated") != 0 || json_true(split, "invert"))
        return loom_fail(LOOM_EDATA,
                         "%s: pre_tokenizer Split must be a Regex pattern, Isolated, not inverted", L->file);
    if (strcmp(re, PATTERN_GPT2) == 0) L->t->pretok = PRE_GPT2;
    else if (strcmp(re, PATTERN_LLAMA3) == 0) L->t->pretok = PRE_LLAMA3;
    else if (strcmp(re, PATTERN_QWEN2) == 0) L->t->pretok = PRE_QWEN2;
    else
        return loom_fail(
            LOOM_EDATA,
            "%s: pre_tokenizer Split regex %.200s is not one loom implements (GPT-2's, Llama 3's, "
            "Qwen2's)",
            L->file, re);
    return check_byte_level(L, seq->child->next, 0);
}

static loom_status read_normalizer(loader *L, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return LOOM_OK;
    const char *ty = type_of(n);
    if (strcmp(ty, "NFC") == 0) {
        L->t->nfc = 1;
        return LOOM_OK;
    }
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
    if (strcmp(ty, "Sequence") == 0 && cJSON_GetArraySize(seq) == 0) return LOOM_OK;
    if (strcmp(ty, "Sequence") == 0 &&
        cJSON_GetArraySize(seq) == 2) { /* Llama 2's: Prepend U+2581, spaces to U+2581 */
        const cJSON *pre = seq->child, *rpl = seq->child->next;
        const char *pv = json_str(pre, "prepend"),
                   *from = json_str(cJSON_GetObjectItemCaseSensitive(rpl, "pattern"), "String"),
                   *to = json_str(rpl, "content");
        if (strcmp(type_of(pre), "Prepend") == 0 && strcmp(type_of(rpl), "Replace") == 0 && pv && from &&
            to && strcmp(pv, "\xe2\x96\x81") == 0 && strcmp(from, " ") == 0 &&
            strcmp(to, "\xe2\x96\x81") == 0) {
            L->t->sp = SP_PREPEND;
            return LOOM_OK;
        }
    }
    return loom_fail(LOOM_EDATA,
                     "%s: normalizer %s is not supported (loom reads none, NFC, or Prepend U+2581 + Replace "
                     "' ' by U+2581)",
                     L->file, ty);
}

static loom_status read_bpe_options(loader *L, const cJSON *model) {
    if (json_true(model, "byte_fallback") != (L->t->sp != 0))
        return loom_fail(
            LOOM_EDATA,
            "%s: model.byte_fallback %s with this normalizer / pre_tokenizer is not supported (loom "
            "reads byte-level BPE, or byte-fallback BPE with U+2581 for spaces as Llama 2's and "
            "Mistral's)",
            L->file, L->t->sp ? "false" : "true");
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const char *v = json_str(model, keys[k]);
        if (v && *v)
            return loom_fail(LOOM_EDATA, "%s: model.%s \"%s\" is not supported", L->file, keys[k], v);
    }
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0)
        return loom_fail(LOOM_EDATA, "%s: model.dropout %g is not supported", L->file, drop->valuedouble);
    L->t->ignore_merges = json_true(model, "ignore_merges");
    return LOOM_OK;
}

/* added_tokens: each id's bytes become its content (the vocabulary grows to
 * hold them), and with allow_special the text is matched against them. */
static loom_status read_added(loader *L, const cJSON *added) {
    loom_tokenizer *t = L->t;
    int n = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    if (n == 0) return LOOM_OK;
    int new_n = t->n_vocab;
    size_t extra = 0;
    for (const cJSON *a = added->child; a; a = a->next) {
        const char *c = json_str(a, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!c || !*c || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 16777216 ||
            id->valuedouble != (int)id->valuedouble)
            return loom_fail(LOOM_EDATA, "%s: an added token has no content or no valid id", L->file);
        const char *flags[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (json_true(a, flags[k]))
                return loom_fail(LOOM_EDATA, "%s: added token \"%s\" has %s, which loom does not implement",
                                 L->file, c, flags[k]);
        if (id->valueint + 1 > new_n) new_n = id->valueint + 1;
        extra += strlen(c);
    }
    /* lay the pool out again with the added contents */
    uint32_t *off = calloc((size_t)new_n + 1, sizeof *off);
    const char **src = calloc((size_t)new_n, sizeof *src);
    size_t *len = calloc((size_t)new_n, sizeof *len);
    char *pool = malloc(t->tok_off[t->n_vocab] + extra + 1);
    t->added = malloc((size_t)n * sizeof *t->added);
    loom_status st = LOOM_OK;
    if (!off || !src || !len || !pool || !t->added) {
        st = loom_fail(LOOM_EOS, "%s: out of memory for the added tokens", L->file);
        goto done;
    }
    for (int i = 0; i < t->n_vocab; i++) src[i] = loom_tokenizer_token_bytes(t, (uint32_t)i, &len[i]);
    for (const cJSON *a = added->child; a; a = a->next) {
        int id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
        src[id] = json_str(a, "content");
        len[id] = strlen(src[id]);
        t->added[t->n_added++] = (uint32_t)id;
        t->added_first[(unsigned char)src[id][0]] = 1;
    }
    size_t o = 0;
    for (int i = 0; i < new_n; i++) {
        off[i] = (uint32_t)o;
        if (len[i]) memcpy(pool + o, src[i], len[i]);
        o += len[i];
    }
    off[new_n] = (uint32_t)o;
    free(t->tok_off);
    free(t->tok_pool);
    t->tok_off = off;
    t->tok_pool = pool;
    t->n_vocab = new_n;
    off = NULL;
    pool = NULL;
done:
    free(off);
    free(src);
    free(len);
    free(pool);
    return st;
}

/* post_processor TemplateProcessing (alone or in a Sequence) whose single
 * template starts with a special token: that token is the BOS. */
static void read_bos(loader *L, const cJSON *pp) {
    if (!pp) return;
    if (strcmp(type_of(pp), "Sequence") == 0) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        for (const cJSON *p = cJSON_IsArray(seq) ? seq->child : NULL; p; p = p->next) read_bos(L, p);
        return;
    }
    if (strcmp(type_of(pp), "TemplateProcessing") != 0) return;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const char *name = json_str(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    const cJSON *sp =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pp, "special_tokens"), name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids");
    if (name && cJSON_GetArraySize(ids) == 1 && cJSON_IsNumber(ids->child) && ids->child->valueint >= 0 &&
        ids->child->valueint < L->t->n_vocab)
        L->t->bos = ids->child->valueint;
}

static long added_by_content(const loom_tokenizer *t, const char *c) {
    for (int k = 0; k < t->n_added; k++) {
        size_t l;
        const char *b = loom_tokenizer_token_bytes(t, t->added[k], &l);
        if (l == strlen(c) && memcmp(b, c, l) == 0) return t->added[k];
    }
    return -1;
}

/* The end-of-text token: tokenizer_config.json's eos_token beside the file
 * when it names an added token, else "<|endoftext|>", else "<|end_of_text|>",
 * else (byte-fallback BPE) "</s>". */
static void read_eos(loader *L, const char *path) {
    loom_tokenizer *t = L->t;
    const char *names[] = {"<|endoftext|>", "<|end_of_text|>", t->sp ? "</s>" : "<|endoftext|>"};
    for (int k = 2; k >= 0; k--) {
        long id = added_by_content(t, names[k]);
        if (id < 0) id = vocab_find(t, names[k], strlen(names[k]));
        if (id >= 0) t->eot = (int)id;
    }
    char cfg[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path) : 1;
    snprintf(cfg, sizeof cfg, "%.*s/tokenizer_config.json", dl, slash ? path : ".");
    FILE *f = fopen(cfg, "rb");
    if (!f) return;
    fclose(f);
    cJSON *root = NULL;
    const char *keep = L->file;
    L->file = cfg;
    if (parse_json(L, cfg, &root) != LOOM_OK) {
        loom_clear_error();
        L->file = keep;
        return; /* tokenizer_config.json is optional; a bad one leaves the default */
    }
    L->file = keep;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token");
    const char *c = cJSON_IsString(e) ? e->valuestring : json_str(e, "content");
    long id = c ? added_by_content(t, c) : -1;
    if (id >= 0) t->eot = (int)id;
    cJSON_Delete(root);
}

/* ByteLevel; for byte-fallback BPE, Sequence [Replace U+2581 -> ' ',
 * ByteFallback, Fuse, Strip(' ', 1, 0)]. */
static int decoder_ok(const loom_tokenizer *t, const cJSON *dec) {
    const char *ty = type_of(dec);
    if (!t->sp) return strcmp(ty, "ByteLevel") == 0;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(dec, "decoders");
    if (strcmp(ty, "Sequence") != 0 || cJSON_GetArraySize(seq) != 4) return 0;
    const cJSON *r = seq->child, *bf = r->next, *fu = bf->next, *strip = fu->next;
    const char *from = json_str(cJSON_GetObjectItemCaseSensitive(r, "pattern"), "String"),
               *to = json_str(r, "content");
    const cJSON *start = cJSON_GetObjectItemCaseSensitive(strip, "start"),
                *stop = cJSON_GetObjectItemCaseSensitive(strip, "stop");
    const char *sc = json_str(strip, "content");
    return strcmp(type_of(r), "Replace") == 0 && from && to && strcmp(from, "\xe2\x96\x81") == 0 &&
           strcmp(to, " ") == 0 && strcmp(type_of(bf), "ByteFallback") == 0 &&
           strcmp(type_of(fu), "Fuse") == 0 && strcmp(type_of(strip), "Strip") == 0 && sc &&
           strcmp(sc, " ") == 0 && cJSON_IsNumber(start) && start->valueint == 1 && cJSON_IsNumber(stop) &&
           stop->valueint == 0;
}

/* Byte-fallback BPE: the bytes each token decodes to - U+2581 as a space,
 * <0xXX> as its byte, added tokens as their text. */
static loom_status sp_decode_pool(loader *L) {
    loom_tokenizer *t = L->t;
    size_t total = t->tok_off[t->n_vocab];
    t->dec_off = calloc((size_t)t->n_vocab + 1, sizeof *t->dec_off);
    t->dec_pool = malloc(total + 1);
    if (!t->dec_off || !t->dec_pool) return loom_fail(LOOM_EOS, "%s: out of memory", L->file);
    size_t o = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        const char *r = t->tok_pool + t->tok_off[id];
        size_t n = t->tok_off[id + 1] - t->tok_off[id];
        t->dec_off[id] = (uint32_t)o;
        int b = -1;
        for (int k = 0; k < 256 && n == 6; k++)
            if (t->byte_tok[k] == (uint32_t)id) b = k;
        if (b >= 0) {
            t->dec_pool[o++] = (char)b;
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            if (i + 2 < n && memcmp(r + i, "\xe2\x96\x81", 3) == 0) {
                t->dec_pool[o++] = ' ';
                i += 2;
            } else {
                t->dec_pool[o++] = r[i];
            }
        }
    }
    t->dec_off[t->n_vocab] = (uint32_t)o;
    return LOOM_OK;
}

static loom_status load_hf_json(loader *L, const char *path) {
    cJSON *root;
    L->file = path;
    LOOM_TRY(parse_json(L, path, &root));
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    loom_status st = LOOM_OK;
    if (!cJSON_IsObject(model) || (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)))
        st = loom_fail(LOOM_EDATA, "%s: model is %s, not a BPE model (loom reads byte-level BPE only)", path,
                       cJSON_IsString(type) ? type->valuestring : "missing");
    if (st == LOOM_OK) st = read_normalizer(L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (st == LOOM_OK) st = read_pre_tokenizer(L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (st == LOOM_OK) st = read_bpe_options(L, model);
    if (st == LOOM_OK && dec && !decoder_ok(L->t, dec))
        st = loom_fail(LOOM_EDATA,
                       "%s: decoder %s is not supported (loom decodes ByteLevel, or for byte-fallback BPE "
                       "Replace U+2581, ByteFallback, Fuse, Strip one leading space)",
                       path, cJSON_IsNull(dec) ? "null" : type_of(dec));
    if (st == LOOM_OK) st = load_vocab(L, cJSON_GetObjectItemCaseSensitive(model, "vocab"));
    if (st == LOOM_OK) st = load_merges_json(L, cJSON_GetObjectItemCaseSensitive(model, "merges"));
    if (st == LOOM_OK) st = read_added(L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (st == LOOM_OK && L->t->sp) st = sp_decode_pool(L);
    if (st == LOOM_OK) {
        read_bos(L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
        read_eos(L, path);
    }
    cJSON_Delete(root);
    return st;
}

static int file_exists(const char *dir, const char *name, char *out, size_t cap) {
    struct stat sb;
    snprintf(out, cap, "%s/%s", dir, name);
    return stat(out, &sb) == 0 && S_ISREG(sb.st_mode);
}

loom_status loom_tokenizer_load(const char *path, loom_tokenizer **out) {
    *out = NULL;
    loader L = {0};
    L.t = calloc(1, sizeof *L.t);
    if (!L.t) return loom_fail(LOOM_EOS, "tokenizer: out of memory");
    L.t->eot = L.t->bos = -1;
    unsigned cp_of[256];
    byte_to_cp_table(cp_of);
    for (int i = 0; i < 324; i++) L.byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) L.byte_of_cp[cp_of[b]] = b;

    struct stat sb;
    static char a[4096], b[4096];
    loom_status st;
    if (stat(path, &sb) != 0) {
        st = loom_fail(LOOM_ENOINPUT, "tokenizer %s: %s", path, strerror(errno));
    } else if (S_ISREG(sb.st_mode)) {
        st = load_hf_json(&L, path);
    } else if (file_exists(path, "tokenizer.json", a, sizeof a)) {
        st = load_hf_json(&L, a);
    } else if (file_exists(path, "vocab.json", a, sizeof a) && file_exists(path, "merges.txt", b, sizeof b)) {
        st = load_pair(&L, a, b);
    } else if (file_exists(path, "encoder.json", a, sizeof a) &&
               file_exists(path, "vocab.bpe", b, sizeof b)) {
        st = load_pair(&L, a, b);
    } else {
        st = loom_fail(
            LOOM_ENOINPUT,
            "tokenizer %s: no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe there",
            path);
    }
    if (st == LOOM_OK && L.t->n_added == 0 && L.t->eot >= 0) { /* GPT-2's files: <|endoftext|> */
        L.t->added = malloc(sizeof *L.t->added);
        if (L.t->added) {
            size_t l = 0;
            const char *b = loom_tokenizer_token_bytes(L.t, (uint32_t)L.t->eot, &l);
            L.t->added[L.t->n_added++] = (uint32_t)L.t->eot;
            if (l > 0) L.t->added_first[(unsigned char)b[0]] = 1;
        }
    }
    if (st == LOOM_OK) {
        L.t->cache = calloc(CACHE_SLOTS, sizeof *L.t->cache);
        if (!L.t->cache) st = loom_fail(LOOM_EOS, "tokenizer: out of memory");
    }
    if (st != LOOM_OK) {
        loom_tokenizer_free(L.t);
        return st;
    }
    *out = L.t;
    return LOOM_OK;
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_pool);
    free(t->merges);
    free(t->vhash);
    free(t->vid);
    free(t->added);
    free(t->dec_off);
    free(t->dec_pool);
    free(t->norm);
    free(t->cache);
    free(t->ckeys);
    loom_ids_free(&t->cids);
    loom_ids_free(&t->sym);
    free(t->nxt);
    free(t->prv);
    free(t->heap);
    free(t);
}
