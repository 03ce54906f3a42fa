/* infer.h - inference: a model part with a KV cache, forward only, and
 * token sampling.
 *
 * loom_infer holds this rank's part of the model (the same loom_gpt part,
 * parameter table and shards as training: tensor parallel by heads / MLP
 * columns / vocabulary rows, pipeline stages by blocks) and, per local block,
 * a key/value cache for up to max_seqs sequences of max_len positions each,
 * planned and allocated at creation: (L_l, max_seqs, max_len, KV_l) floats
 * for keys and as many for values, or, paged, a pool of (L_l, n_blocks,
 * block_size, KV_l) whose blocks each sequence's block table names.
 *
 * One step runs a ragged batch: entry j appends n_new[j] tokens to sequence
 * seq[j] (a prefill when its cache is empty, one token per step after), all
 * rows through every block in one pass; attention reads each sequence's own
 * cache. The last pipeline stage returns the logits of each entry's last row
 * over the whole vocabulary (gathered over tp). A step is collective over the
 * tp group and the pipeline: every rank of the model calls it with the same
 * arguments, stages pass the (rows, C) activations on with point-to-point
 * messages through the communicator.
 */
#ifndef LOOM_INFER_H
#define LOOM_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "loom/data.h"
#include "loom/mesh.h"
#include "loom/model.h"
#include "loom/status.h"

typedef struct loom_infer_opts {
    loom_device *dev; /* where the part, its cache and every step run (device.h) */
    int max_seqs;     /* sequences with a cache at once */
    int max_len;      /* positions per sequence, <= n_positions */
    int max_rows;     /* new tokens per step over all sequences */
    /* Paged KV cache: block_size > 0 makes the cache a pool of n_blocks
     * blocks of block_size positions (0: max_seqs * ceil(max_len /
     * block_size), the contiguous cache's memory) that the caller hands to
     * sequences (loom_infer_set_blocks). block_size 0: one contiguous run
     * of max_len positions per sequence, as if each slot s held block s of
     * max_len positions. */
    int block_size;
    int n_blocks;
} loom_infer_opts;

typedef struct loom_infer loom_infer;

/* This rank's part under mesh (NULL: the whole model in one process; else
 * tp = mesh tp degree, the blocks split over mesh pp stages as training
 * balances them). LOOM_EUSAGE for degrees the model cannot take or options
 * out of range; LOOM_EOS when the cache does not fit. Local. */
loom_status loom_infer_create(const loom_model_config *cfg, const loom_mesh *mesh, const loom_infer_opts *o,
                              loom_infer **out);
void loom_infer_free(loom_infer *inf);
/* Safetensors with Hugging Face GPT-2 names (loom_params_load). Collective over mesh->world. */
loom_status loom_infer_load(loom_infer *inf, const char *path);
/* Parameters from the counter RNG, as training initialises them. Local. */
void loom_infer_init_random(loom_infer *inf, uint64_t seed);

/* One forward step (see above). Entries name distinct sequences in
 * [0, max_seqs). LOOM_EUSAGE when a sequence would pass max_len or the rows
 * pass max_rows (checked before any communication, on every rank alike).
 * On the last stage *logits points at (n, vocab_size) floats valid until the
 * next step; elsewhere it is NULL. */
loom_status loom_infer_step(loom_infer *inf, int n, const int *seq, const int *n_new, const int32_t *tokens,
                            const float **logits);
/* Forget sequence s: its slot is free for a new one (paged: its block table
 * emptied; the blocks are the caller's to reuse). */
void loom_infer_reset(loom_infer *inf, int s);
/* Paged cache: sequence s holds its first len positions in blocks[0..nb)
 * (distinct ids < n_blocks, nb <= ceil(max_len / block_size)); a step may
 * extend it up to nb * block_size positions. Blocks may be shared between
 * sequences (a common prefix) as long as no step writes a position another
 * sequence reads. Local (host bookkeeping only); LOOM_EUSAGE for ids or
 * lengths out of range, or a contiguous cache. */
loom_status loom_infer_set_blocks(loom_infer *inf, int s, int len, int nb, const int32_t *blocks);
/* Paged cache: the first n positions of block src copied into block dst
 * (a partly filled block continued by another sequence). Local. */
loom_status loom_infer_copy_block(loom_infer *inf, int dst, int src, int n);
int loom_infer_len(const loom_infer *inf, int s);
int loom_infer_last_stage(const loom_infer *inf);
const loom_model_config *loom_infer_config(const loom_infer *inf);
const loom_infer_opts *loom_infer_options(const loom_infer *inf);
/* Bytes of the KV cache on this rank, and of one block of it (paged; a
 * whole slot when contiguous). */
size_t loom_infer_cache_bytes(const loom_infer *inf);
size_t loom_infer_block_bytes(const loom_infer *inf);

/* ---- sampling ------------------------------------------------------------ */

typedef struct loom_sample_opts {
    float temperature; /* 0: greedy (argmax, the lowest id among ties) */
    int top_k;         /* 0: all */
    float top_p;       /* 1: all; else the smallest most-probable set with mass >= top_p */
    uint64_t seed;
} loom_sample_opts;

/* A token from logits (V): draw `index` of the counter RNG keyed by seed,
 * so the same (seed, index) picks the same token on every rank. scratch: 2V
 * floats + V ints, or NULL for greedy. */
int loom_sample(const float *logits, int V, const loom_sample_opts *o, uint64_t index, float *scratch,
                int *iscratch);
/* LOOM_EUSAGE naming the bad value. */
loom_status loom_sample_check(const loom_sample_opts *o);

/* ---- generation ------------------------------------------------------------ */

typedef struct loom_gen_opts {
    int max_new; /* new tokens per prompt at most */
    loom_sample_opts sample;
    const int32_t *stop; /* a sampled stop token ends its sequence (and is kept) */
    int n_stop;
    float *prompt_logits; /* (n, V) or NULL: each prompt's last-position logits (last stage) */
    int check_kv;         /* after generating, recompute each whole sequence in one pass */
    double kv_max_diff;   /* out: max |logit(cached decode) - logit(recomputed)| (last stage) */
} loom_gen_opts;

/* Generate for n prompts at once in sequences 0 .. n-1 (n + check_kv <=
 * max_seqs): the prompts are prefilled together (in steps of at most
 * max_rows tokens), then every unfinished sequence advances by one token per
 * step. Collective over world (NULL: one process; every rank passes the same
 * prompts and options): the last stage's tp rank 0 (`root` in world) samples
 * and broadcasts the new tokens, so outs[j] holds prompt j's new tokens on
 * every rank. LOOM_EUSAGE when a prompt is empty or prompt + max_new passes
 * max_len; out of memory: LOOM_EOS. */
loom_status loom_generate(loom_infer *f, loom_comm *world, int root, int n, const loom_ids *prompts,
                          loom_gen_opts *o, loom_ids *outs);

#endif
