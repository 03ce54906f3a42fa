/* ckpt_manifest.h - parse and validate a checkpoint manifest (ckpt.c's
 * reader trusts what this accepts). Not public API. */
#ifndef LOOM_TRAIN_CKPT_MANIFEST_H
#define LOOM_TRAIN_CKPT_MANIFEST_H

#include <cjson/cJSON.h>

#include "loom/status.h"

#define CKPT_FORMAT "loom-checkpoint"
#define CKPT_VERSION 2
#define CKPT_VERSION_TEXT "2"
/* The member holding the manifest's own SHA-256: of the file's bytes with
 * its 64 digits read as zeros. */
#define CKPT_HASH_KEY "manifest_sha256"
/* Largest tensor the reader accepts, in elements (2^40). */
#define CKPT_MAX_NUMEL 1099511627776.0

/* Parse `text` (NUL-terminated) as a manifest; `what` names it in
 * messages. On success *out owns the tree. LOOM_EDATA naming the first
 * problem: format/version, step, optimizer_steps, the run id, the
 * manifest_sha256 member, a file entry without a plain name and a
 * 64-digit SHA-256, a tensor shape that is not 1 or 2 non-negative dims
 * below CKPT_MAX_NUMEL elements, a shard whose tensor is unknown, whose
 * kind is not param/exp_avg/exp_avg_sq, whose file is not listed, or whose
 * runs ([start, len, stride, count], len and count >= 1) are not integers,
 * leave [range) or the tensor, or do not add up to its numel. */
loom_status ckpt_manifest_parse(const char *text, const char *what, cJSON **out);
/* Write the SHA-256 into text's one "manifest_sha256": "<64 zeros>" member
 * (LOOM_EINTERNAL without one). */
loom_status ckpt_manifest_sign(char *text);
/* text (len bytes, NUL-terminated) holds exactly one "manifest_sha256"
 * member and it matches: else LOOM_EDATA naming `what`. */
loom_status ckpt_manifest_verify_hash(const char *text, size_t len, const char *what);

#endif
