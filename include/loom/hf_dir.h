/* hf_dir.h - the weight files of a Hugging Face model directory.
 *
 * A directory from save_pretrained holds config.json and its weights as
 * model.safetensors, or, when large, shards model-0000K-of-0000N.safetensors
 * named by model.safetensors.index.json ({"weight_map": {tensor: file}}).
 * Local; no collectives.
 */
#ifndef LOOM_HF_DIR_H
#define LOOM_HF_DIR_H

#include <stddef.h>

#include "loom/status.h"

#define LOOM_HF_MAX_FILES 4096

typedef struct loom_hf_files {
    int n;
    char **path; /* each file once, in the index's order of first mention */
} loom_hf_files;

/* 1 when dir holds model.safetensors or model.safetensors.index.json. */
int loom_hf_has_weights(const char *dir);
/* The weight files of dir: model.safetensors, else every file the index
 * names (each must exist: LOOM_ENOINPUT naming the missing shard; a
 * malformed index is LOOM_EDATA). LOOM_ENOINPUT when dir has neither. */
loom_status loom_hf_weight_files(const char *dir, loom_hf_files *out);
void loom_hf_files_free(loom_hf_files *f);
/* The parameters a command loads: load_params when given, else model when
 * it is a Hugging Face directory with weights (as from_pretrained), else "". */
const char *loom_hf_params_path(const char *load_params, const char *model);
/* The tokenizer a command loads: tokenizer when given, else model when it is
 * a directory holding tokenizer.json, else "". */
const char *loom_hf_tokenizer_path(const char *tokenizer, const char *model);

#endif
