/* ckpt.h - sharded training checkpoints outside a training run
 * (docs/checkpoints.md). The trainer's save and resume live in
 * src/train/ckpt.c. */
#ifndef LOOM_CKPT_H
#define LOOM_CKPT_H

#include "loom/status.h"

/* Consolidate the parameters of checkpoint ARG (a step directory, or a
 * --save-dir whose latest complete checkpoint is taken; hashes verified)
 * into one safetensors file OUT with Hugging Face GPT-2 names (as
 * --save-params writes, loadable with --load-params) and a Hugging Face
 * config.json beside it. OUT is written as OUT.tmp and renamed; an existing
 * config.json is replaced the same way. One process, no communication.
 * LOOM_ENOINPUT / LOOM_EDATA for a missing or damaged checkpoint (a missing
 * element is named), LOOM_ECANTCREAT / LOOM_EIO for the outputs. */
loom_status loom_ckpt_export(const char *arg, const char *out);

/* Parse and validate manifest text (NUL-terminated) as --resume and export
 * do before reading any shard: LOOM_EDATA naming the first problem. Local;
 * the entry point of the manifest fuzzer. */
loom_status loom_ckpt_manifest_check(const char *text);

#endif
