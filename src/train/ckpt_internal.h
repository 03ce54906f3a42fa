/* ckpt_internal.h - what the checkpoint files share (ckpt.c: files, resolve,
 * signals; ckpt_state.c: a part's state as host memory; ckpt_shards.c: what
 * one rank writes; ckpt_save.c: the manifest and publishing; ckpt_load.c:
 * resume and export); not public API. Nothing declared here is collective. */
#ifndef LOOM_TRAIN_CKPT_INTERNAL_H
#define LOOM_TRAIN_CKPT_INTERNAL_H

#include <cjson/cJSON.h>

#include "loom/ckpt.h"
#include "train/ckpt.h"

#define CKPT_DIR (LOOM_PATH_MAX + 64) /* --save-dir plus step_N(.tmp) */
#define CKPT_PATH (CKPT_DIR + 320)    /* such a directory plus a file name */

/* What a shard holds: a tensor's values or one of its AdamW moments. */
enum { K_PARAM, K_EXP_AVG, K_EXP_AVG_SQ, K_COUNT };
extern const char *const ckpt_kind_names[K_COUNT]; /* "param", "exp_avg", "exp_avg_sq" */

/* The aux-loss-free selection biases (moe.h), replicated on every rank: the
 * dp/cp/tp coordinate-0 rank of each stage puts them, as numbers, in the
 * manifest's "buffers" (cJSON's 15 digits give every float back exactly). */
#define BIAS_NAME "h.%d.mlp.selection_bias"

/* The string member k of o, or NULL. */
static inline const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ckpt.c. fsync a file or directory (LOOM_EIO naming it). */
loom_status ckpt_fsync_path(const char *path);
/* Replace path with text atomically: path.tmp written, fsynced, renamed. */
loom_status ckpt_write_text(const char *path, const char *text);
/* Remove dir and the files in it (one level; errors ignored). */
void ckpt_remove_tree(const char *dir);
/* step_N directory names in dir (published ones only), newest first; how many. */
int ckpt_list_steps(const char *dir, int *steps, int cap);
/* The manifest of checkpoint `dir`, validated (ckpt_manifest.c), not its files. */
loom_status ckpt_manifest_open(const char *dir, cJSON **out);

/* ckpt_state.c. What a checkpoint holds of one model part, as host code
 * walks it element by element: the DP engine's parameter runs (dp.h), its
 * AdamW runs, and - under expert parallelism - the expert engine's (edp.h)
 * storage: params and moments by kind, the local offset of the first
 * element, the count; 0 without expert parallelism). Every pointer of pr,
 * orun and ea is host memory: the engines' own buffers when the part's
 * device memory is host memory, else host copies made through the device
 * (downloaded by open; uploaded by close when `upload`, after a load). */
typedef struct ckpt_state {
    loom_device *dev;             /* the part's */
    const loom_param_run *dev_pr; /* the DP engine's parameter runs ... */
    loom_param_run *pr;           /* ... and as host memory */
    int nr;
    loom_opt_run *dev_or, *orun; /* its AdamW runs (m, v), and as host memory */
    int no;
    float *dev_ea[K_COUNT], *ea[K_COUNT]; /* the expert storage by kind, and as host memory */
    size_t elo, en;                       /* its first element's local offset; its floats (0: none) */
} ckpt_state;
/* LOOM_EOS without memory (nothing left open). Local. */
loom_status ckpt_state_open(const loom_train_run_state *s, int part, ckpt_state *st);
void ckpt_state_close(ckpt_state *st, int upload);

/* ckpt_shards.c. */
/* Write this rank's file (if it holds anything) into tmpdir and describe
 * it, its hash and its shards as JSON (*json, malloc'd). Local. */
loom_status ckpt_write_rank(const loom_train_run_state *s, const char *tmpdir, char **json);

#endif
