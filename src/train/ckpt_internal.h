/* ckpt_internal.h - what the checkpoint files share (ckpt_read.c: files,
 * verifying, resolving, reading shards; ckpt_run.c: the run a save
 * directory belongs to; ckpt.c: signals and the save after a step;
 * ckpt_state.c: a part's state as host memory; ckpt_shards.c: what one rank
 * writes; ckpt_save.c: the manifest and publishing; ckpt_load.c: resume and
 * export); not public API. Nothing declared here is collective. */
#ifndef LOOM_TRAIN_CKPT_INTERNAL_H
#define LOOM_TRAIN_CKPT_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "loom/ckpt.h"
#include "loom/safetensors.h"
#include "loom/sha256.h"
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

/* ckpt_read.c: files, verifying, resolving and reading (no run state, no
 * communication). fsync a file or directory (LOOM_EIO naming it). */
loom_status ckpt_fsync_path(const char *path);
/* Replace path with text atomically: path.tmp written, fsynced, renamed. */
loom_status ckpt_write_text(const char *path, const char *text);
/* The whole file as a NUL-terminated string (*len bytes, NULL allowed). */
loom_status ckpt_read_text(const char *path, char **out, size_t *len);
/* Remove dir and the files in it (one level; errors ignored). */
void ckpt_remove_tree(const char *dir);
/* step_N directory names in dir (published ones only), newest first; how many. */
int ckpt_list_steps(const char *dir, int *steps, int cap);
/* The manifest of checkpoint `dir`: its own SHA-256 checked, then parsed and
 * validated (ckpt_manifest.c); not its files. LOOM_EDATA naming the problem. */
loom_status ckpt_manifest_open(const char *dir, cJSON **out);
/* The manifest as above and every file's SHA-256 (*man: the tree, or NULL
 * to drop it). */
loom_status ckpt_verify(const char *dir, cJSON **man);

/* A rank file's own account of its shards (safetensors metadata): per key
 * "TENSOR KIND NUMEL LO HI RUNS" (RUNS: 16 hex digits of the SHA-256 of
 * the runs as "start,len,stride,count;" each), and the step and optimizer
 * step it belongs to. A reader takes a shard only when the manifest says
 * the same, so a manifest that maps a key to the wrong tensor or kind, or
 * to another checkpoint's files, is refused even if it was re-hashed. */
#define CKPT_META_STEP "loom_step"
#define CKPT_META_OPT "loom_optimizer_steps"
void ckpt_runs_hash(loom_sha256 *h, int64_t start, int64_t len, int64_t stride, int64_t count);
void ckpt_shard_desc(char *out, size_t cap, const char *tensor, const char *kind, int64_t numel, int64_t lo,
                     int64_t hi, loom_sha256 *runs);

/* Reads shards of one verified checkpoint; files opened on first use
 * (hashed first unless `verified`), each checked against the manifest's
 * step and optimizer step. */
typedef struct ckpt_reader {
    const char *dir;
    const cJSON *man;
    int verified; /* every file's hash was checked just now */
    struct {
        const char *name;
        loom_st_file *f;
    } open[256];
    int n_open;
} ckpt_reader;
void ckpt_reader_close(ckpt_reader *rd);
/* Fill buf/have over [lo, hi) of tensor `name` (numel elements) from every
 * shard of `kind` whose range meets it. */
loom_status ckpt_fill_tensor(ckpt_reader *rd, const char *name, int kind, int64_t numel, int64_t lo,
                             int64_t hi, float *buf, unsigned char *have);
/* Global element count of tensor `name` in the manifest, -1 if absent. */
int64_t ckpt_tensor_numel(const cJSON *man, const char *name);

/* What a reader expects of the tensors: name and global shape. */
typedef struct ckpt_spec {
    const char *name;
    int ndim;
    int64_t shape[2];
} ckpt_spec;
/* The manifest lists exactly these tensors with these shapes (LOOM_EDATA
 * naming the first difference); checked before anything is allocated. */
loom_status ckpt_check_tensors(const cJSON *man, const char *dir, const ckpt_spec *spec, int n);

/* A whole checkpoint read into memory (export). */
typedef struct ckpt_whole {
    char dir[CKPT_DIR];
    cJSON *man;
    int step, optimizer_steps;
    int n;
    struct {
        const char *name; /* in man */
        int ndim;
        int64_t shape[2], numel;
        float *val[K_COUNT]; /* NULL for kinds not read */
    } * t;
} ckpt_whole;
/* Checkpoint dir, which loom_ckpt_resolve verified just now: check its
 * tensors against spec (n > 0) and read every element of the kinds in
 * `kinds` (bit K_PARAM, ...); an element no shard holds is LOOM_EDATA
 * naming it. */
loom_status ckpt_read_whole(const char *dir, const ckpt_spec *spec, int n, unsigned kinds, ckpt_whole *out);
void ckpt_whole_free(ckpt_whole *w);

/* ckpt_run.c. */
struct loom_ckpt_run {
    cJSON *identity;        /* {"model", "train", "seed", "data"} of this run (every rank) */
    char id[65];            /* SHA-256 of its unformatted text */
    int newest;             /* rank 0: the newest step of --save-dir known to verify, -1 none */
    char resumed[CKPT_DIR]; /* rank 0: the checkpoint --resume resolved to, "" none */
};
/* The identity with its id, for a manifest's "run" and run.json (owned by the caller). */
cJSON *ckpt_run_json(const loom_ckpt_run *r);
/* 0 if `theirs` (a manifest's "run" or run.json) is this run; else 1 and
 * msg says the first difference ("lr = 0.001 there, 0.002 in this run (--lr)"). */
int ckpt_identity_diff(const cJSON *theirs, const loom_ckpt_run *mine, char *msg, size_t cap);
/* DIR/latest names step_<step> (replaced atomically, DIR fsynced, when it did not). */
loom_status ckpt_set_latest(const char *dir, int step);

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
loom_status ckpt_write_rank(const loom_train_run_state *s, const char *tmpdir, int step, char **json);

#endif
