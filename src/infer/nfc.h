/* nfc.h - Unicode Normalization Form C for the tokenizer's NFC normalizer
 * (Qwen2's tokenizer.json): a fast check that text is already NFC, and the
 * normalization itself (UAX #15: full canonical decomposition, canonical
 * ordering of combining marks, canonical composition), from Python's
 * unicodedata tables (nfc_table.h). Bytes that are not UTF-8 pass through
 * unchanged and block composition across them. Internal to src/infer. */
#ifndef LOOM_INFER_NFC_H
#define LOOM_INFER_NFC_H

#include <stddef.h>

#include "loom/status.h"

/* Decode one UTF-8 sequence at s[0..n) (n >= 1): its length; *cp = -1 for
 * an ill-formed sequence (overlong, surrogate, beyond U+10FFFF, truncated),
 * length 1. Shared with tokenizer.c. */
size_t loom_utf8_next(const unsigned char *s, size_t n, long *cp);

/* n when s[0..n) is certainly NFC; else the offset of the first code point
 * that may change under NFC (conservative: a few NFC strings are flagged,
 * and normalizing them gives the same text back). */
size_t loom_nfc_quick_check(const unsigned char *s, size_t n);

/* s[0..n) in NFC, into a new buffer (*out, *out_n; the caller frees it).
 * LOOM_EOS when it cannot be allocated. */
loom_status loom_nfc_normalize(const unsigned char *s, size_t n, unsigned char **out, size_t *out_n);

#endif
