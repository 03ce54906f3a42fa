/* tokenizer.h - GPT-2's byte-level BPE tokenizer: encode text to token ids
 * and decode ids to bytes, identical to OpenAI's encoder and Hugging Face's
 * GPT2TokenizerFast.
 *
 * Files it reads (loom_tokenizer_load, given a directory or one file):
 *   tokenizer.json              Hugging Face's single file (model.vocab,
 *                               model.merges as "a b" strings or [a, b] pairs,
 *                               added_tokens)
 *   vocab.json + merges.txt     Hugging Face's GPT-2 pair
 *   encoder.json + vocab.bpe    OpenAI's GPT-2 pair (the same content)
 *
 * Encoding: the text is split into pre-tokens by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * implemented by hand (src/infer/tokenizer.c) over Unicode code points; letter and
 * number classes come from a generated table (scripts/gen_unicode_table.py,
 * Unicode version in LOOM_UNICODE_VERSION), \s is Unicode's White_Space.
 * Each pre-token's UTF-8 bytes start as one token per byte and the merge with
 * the lowest rank is applied, everywhere in the pre-token, until none applies.
 * A byte that does not start a valid UTF-8 sequence counts as one code point
 * of class "other", so any byte string encodes and decodes back exactly.
 * With allow_special, each occurrence of a special token's text (GPT-2:
 * "<|endoftext|>") becomes that token, as Hugging Face's tokenizer does.
 *
 * A tokenizer keeps a cache of encoded pre-tokens: one tokenizer must not be
 * used by two threads at once.
 */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "loom/data.h"
#include "loom/status.h"

typedef struct loom_tokenizer loom_tokenizer;

/* path: a directory holding one of the file sets above (tried in that
 * order), or a tokenizer.json file. Missing files: LOOM_ENOINPUT naming what
 * was looked for; malformed JSON, a merge naming a token the vocabulary lacks,
 * a byte without its single-byte token: LOOM_EDATA naming the file (and
 * line). */
loom_status loom_tokenizer_load(const char *path, loom_tokenizer **out);
void loom_tokenizer_free(loom_tokenizer *tok);

int loom_tokenizer_vocab_size(const loom_tokenizer *tok); /* max id + 1 */
int loom_tokenizer_eot(const loom_tokenizer *tok);        /* "<|endoftext|>" id, or -1 */

/* Append the tokens of text[0..len) to ids. LOOM_EOS when out of memory. */
loom_status loom_tokenizer_encode(loom_tokenizer *tok, const char *text, size_t len, int allow_special,
                                  loom_ids *ids);

/* The bytes of token id (NULL, *len = 0 for an id outside the vocabulary). */
const char *loom_tokenizer_token_bytes(const loom_tokenizer *tok, uint32_t id, size_t *len);
/* Decode ids[0..n) into a malloc'd buffer (*out, *out_len; NUL-terminated).
 * LOOM_EDATA naming the first id outside the vocabulary; LOOM_EOS. */
loom_status loom_tokenizer_decode(const loom_tokenizer *tok, const uint32_t *ids, size_t n, char **out,
                                  size_t *out_len);

/* ---- UTF-8 ------------------------------------------------------------------ */

/* An incremental decoder from bytes to valid UTF-8, as Hugging Face decodes
 * tokens: well-formed sequences are copied, each maximal subpart of an
 * ill-formed one becomes one U+FFFD (Python's errors="replace" and Rust's
 * from_utf8_lossy agree on this). A sequence incomplete at the end of a piece
 * is held (at most 3 bytes) until the next piece, so feeding the bytes in any
 * pieces and then flushing gives the same text as decoding them at once.
 * Zero-initialise. */
typedef struct loom_utf8_dec {
    char held[4];
    int n;
} loom_utf8_dec;

/* Decode in[0..n) into out (room for 3 * (n + 1) bytes); returns the bytes
 * written, all valid UTF-8. */
size_t loom_utf8_feed(loom_utf8_dec *d, const char *in, size_t n, char *out);
/* The held incomplete sequence as U+FFFD (3 bytes, or 0 if none). */
size_t loom_utf8_flush(loom_utf8_dec *d, char *out);
/* Length of the longest prefix of s[0..n) that is valid UTF-8 (n if all of it). */
size_t loom_utf8_valid_len(const char *s, size_t n);

#endif
