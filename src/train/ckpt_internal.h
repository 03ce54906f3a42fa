/* ckpt_internal.h - what the checkpoint files share (ckpt.c: files, resolve,
 * signals; ckpt_shards.c: what one rank writes; ckpt_save.c: the manifest
 * and publishing; ckpt_load.c: resume and export); not public API. Nothing
 * declared here is collective. */
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

/* ckpt_shards.c. Expert tensors of an expert-parallel part live in the expert
 * engine (edp.h): its params and moments by kind in arr, the local offset of
 * the first in *lo; the element count, 0 without expert parallelism. */
size_t ckpt_ep_state(const loom_train_run_state *s, int part, float *arr[3], size_t *lo);
/* Write this rank's file (if it holds anything) into tmpdir and describe
 * it, its hash and its shards as JSON (*json, malloc'd). Local. */
loom_status ckpt_write_rank(const loom_train_run_state *s, const char *tmpdir, char **json);

#endif
