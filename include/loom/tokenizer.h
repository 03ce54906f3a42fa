/* tokenizer.h - BPE tokenizers: GPT-2's byte-level BPE (identical to
 * OpenAI's encoder and Hugging Face's GPT2TokenizerFast), the Llama 3 and
 * Qwen2 kinds of Hugging Face tokenizer.json, and the byte-fallback BPE of
 * Llama 2 / Mistral tokenizer.json files (identical to the `tokenizers`
 * library reading the same file).
 *
 * Files it reads (loom_tokenizer_load, given a directory or one file):
 *   tokenizer.json              Hugging Face's single file (model.vocab,
 *                               model.merges as "a b" strings or [a, b] pairs,
 *                               added_tokens, normalizer, pre_tokenizer,
 *                               post_processor, decoder)
 *   vocab.json + merges.txt     Hugging Face's GPT-2 pair
 *   encoder.json + vocab.bpe    OpenAI's GPT-2 pair (the same content)
 *
 * Pre-tokenization: the text is split by one of three patterns, each
 * implemented by hand (src/infer/tokenizer.c) over Unicode code points and
 * chosen by recognising tokenizer.json's pre_tokenizer - ByteLevel
 * (use_regex) is GPT-2's
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * and Sequence [Split(Regex P, Isolated), ByteLevel(use_regex false)] takes
 * P verbatim: GPT-2's, Llama 3's
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * or Qwen2's (the same with \p{N} for \p{N}{1,3}). Letter and number classes
 * come from a generated table (scripts/gen_unicode_table.py, Unicode version
 * in LOOM_UNICODE_VERSION), \s is Unicode's White_Space.
 * Each pre-token's UTF-8 bytes start as one token per byte and the merge with
 * the lowest rank is applied, everywhere in the pre-token, until none applies
 * (with model.ignore_merges, as Llama 3's file, a pre-token that is itself in
 * the vocabulary is that token). A byte that does not start a valid UTF-8
 * sequence counts as one code point of class "other", so any byte string
 * encodes and decodes back exactly.
 * With allow_special, each occurrence of an added token's text (added_tokens,
 * special or not: "<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", ...;
 * GPT-2's pair files: "<|endoftext|>") becomes that token, leftmost first and
 * the longest among those starting at one place, as Hugging Face's tokenizer
 * does; without it they are plain text.
 * Normalizer: none, or NFC (Qwen2's), which loom checks instead of applying:
 * text not already in NFC is LOOM_EDATA naming the code point (normalize it
 * first). The check never passes text that NFC changes; it also refuses the
 * rare NFC text where a combining mark follows a precomposed letter whose
 * decomposition ends in a mark of a higher class.
 *
 * Byte-fallback BPE (Llama 2, Mistral): model.byte_fallback with the
 * normalizer Sequence [Prepend U+2581, Replace ' ' by U+2581] and no
 * pre_tokenizer (a U+2581 before every segment between added tokens), or the
 * pre_tokenizer Metaspace (U+2581, split false, prepend_scheme first: only
 * before the text's first segment; always: every segment; neither where the
 * segment already starts with a space); decoder Sequence [Replace U+2581 by
 * ' ', ByteFallback, Fuse, Strip one leading space]. Each segment is one word
 * of characters, each its vocabulary token or else its UTF-8 bytes' <0xXX>
 * tokens, merged as above; decode turns U+2581 into spaces and <0xXX> into
 * bytes, and drops one leading space.
 *
 * Refused with LOOM_EDATA naming the component (not implemented): other
 * model types (Unigram, WordPiece), a subword prefix/suffix or dropout,
 * byte_fallback without the normalizer / pre-tokenizer above (or the reverse),
 * other pre-tokenizers, split regexes other than the three above, other
 * normalizers and decoders, added tokens with lstrip, rstrip or
 * single_word.
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
/* End of text: tokenizer_config.json's eos_token (beside tokenizer.json)
 * when it is an added token, else "<|endoftext|>", else "<|end_of_text|>",
 * else (byte-fallback BPE) "</s>"; -1 when none. */
int loom_tokenizer_eot(const loom_tokenizer *tok);
/* Beginning of text: the special token a TemplateProcessing post_processor
 * puts first (Llama 3: "<|begin_of_text|>"), or -1. encode never adds it. */
int loom_tokenizer_bos(const loom_tokenizer *tok);

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
