/* data.h - token shards (llm.c's .bin layout), a byte-level tokenizer, and the
 * layout-independent batch sampler.
 *
 * A shard is a header of 256 little-endian int32 - [0] magic 20240520,
 * [1] version (1: uint16 tokens, 2: uint32 tokens), [2] token count - followed
 * by the tokens. Opening checks the magic, version and that the file holds
 * exactly the announced tokens, so a truncated shard is LOOM_EDATA naming the
 * file and both sizes.
 *
 * Training batches are a pure function of (seed, step, global sample index):
 * sample j of step s starts at a position drawn by the counter RNG from
 * (seed, "data", s*global_batch + j). A data-parallel rank reads only its
 * slice of samples and every layout sees the same global batch.
 */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "loom/status.h"

#define LOOM_TOKENS_MAGIC 20240520
#define LOOM_TOKENS_HEADER_INTS 256

typedef struct loom_tokens {
    char path[1024];
    int version;      /* 1 or 2 */
    size_t n;         /* number of tokens */
    const void *data; /* n uint16 (v1) or uint32 (v2) */
    void *map;        /* mmap base */
    size_t map_len;
} loom_tokens;

/* Missing: LOOM_ENOINPUT; bad magic/version/size: LOOM_EDATA. */
loom_status loom_tokens_open(const char *path, loom_tokens *t);
void loom_tokens_close(loom_tokens *t);
static inline uint32_t loom_tokens_get(const loom_tokens *t, size_t i) {
    return t->version == 1 ? ((const uint16_t *)t->data)[i] : ((const uint32_t *)t->data)[i];
}
/* LOOM_EDATA if any token >= vocab_size, naming the file, the index, the
 * token and the vocab size. */
loom_status loom_tokens_check_vocab(const loom_tokens *t, int vocab_size);
/* Write a v1 (all tokens < 65536) or v2 shard to path.tmp, fsync, rename.
 * LOOM_EDATA for n = 0 or n > INT32_MAX; LOOM_ECANTCREAT / LOOM_EIO when the
 * file cannot be created / written (path is then untouched). */
loom_status loom_tokens_write(const char *path, const uint32_t *tokens, size_t n);

/* Byte-level tokenizer (vocab 256): token = byte value. Reads the input files
 * in order, concatenated, and writes the last round(total * val_fraction)
 * tokens to val_path and the rest to train_path (val_path may be NULL: all to
 * train). Reports the counts through n_train / n_val (may be NULL). Missing
 * input: LOOM_ENOINPUT naming it; no bytes, or an empty split: LOOM_EDATA;
 * val_fraction outside [0, 1): LOOM_EUSAGE. The outputs are written only
 * when everything succeeded. */
loom_status loom_data_build_bytes(const char *const *inputs, int n_inputs, const char *train_path,
                                  const char *val_path, double val_fraction, size_t *n_train, size_t *n_val);

/* A growable array of token ids (the tokenizer's output). */
typedef struct loom_ids {
    uint32_t *v;
    size_t n, cap;
} loom_ids;
void loom_ids_free(loom_ids *ids);
loom_status loom_ids_reserve(loom_ids *ids, size_t need); /* LOOM_EOS when out of memory */
loom_status loom_ids_push(loom_ids *ids, uint32_t id);    /* LOOM_EOS when out of memory */

/* Appends the tokens of text[0..len) to out. */
typedef loom_status (*loom_data_encode_fn)(void *ctx, const char *text, size_t len, loom_ids *out);
/* As loom_data_build_bytes, but each input file is one document whose bytes
 * go through encode (a BPE tokenizer); the split is by tokens. */
loom_status loom_data_build_encoded(const char *const *inputs, int n_inputs, const char *train_path,
                                    const char *val_path, double val_fraction, loom_data_encode_fn encode,
                                    void *ctx, size_t *n_train, size_t *n_val);

/* Sampled training batch: for j in [0, n): sample g = first + j of step `step`
 * (global_batch samples per step) fills inputs[j*T .. j*T+T) and the targets
 * shifted by one. Requires t->n >= T + 1 (checked by loom_data_check_len);
 * with fewer tokens the batch is all zeros. */
void loom_data_sample(const loom_tokens *t, uint64_t seed, int64_t step, int64_t global_batch, int64_t first,
                      int n, int T, int32_t *inputs, int32_t *targets);
/* Sequential batch for eval: sequence j (j = first .. first+n-1) has inputs
 * tokens[j*T .. j*T+T) and targets tokens[j*T+1 .. j*T+T]. j wraps modulo the
 * (t->n - 1) / T whole sequences the shard holds; none: all zeros. */
void loom_data_sequential(const loom_tokens *t, int64_t first, int n, int T, int32_t *inputs,
                          int32_t *targets);
/* LOOM_EDATA unless the shard has at least `need` tokens, naming the file and
 * what needs them (e.g. "--seq 256"). */
loom_status loom_data_check_len(const loom_tokens *t, size_t need, const char *why);

#endif
