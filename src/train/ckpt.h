/* ckpt.h - sharded checkpoints of a training run (the trainer's side; the
 * format is described in docs/checkpoints.md and ckpt.c, which names the
 * files that implement it). Not public API. */
#ifndef LOOM_TRAIN_CKPT_H
#define LOOM_TRAIN_CKPT_H

#include "train/internal.h"

typedef struct loom_ckpt_run loom_ckpt_run;

/* Write DIR/step_<step>/ (every rank its own shards, rank 0 the manifest)
 * and publish it atomically, then apply --keep. Collective over the world;
 * every failure is agreed on, so all ranks return the same status. */
loom_status loom_ckpt_save(loom_train_run_state *s, int step);
/* Read the checkpoint named by --resume into this rank's parameters and
 * optimizer state, whatever layout wrote it; *step gets the step to run
 * next. Collective over the world (agreed failures). */
loom_status loom_ckpt_load(loom_train_run_state *s, int *step);
/* The checkpoint --resume ARG names: ARG itself when it holds a manifest,
 * else ARG/latest, else the newest ARG/step_N; each candidate must parse
 * and every file must match its SHA-256. Local; out gets the directory. */
loom_status loom_ckpt_resolve(const char *arg, char *out, size_t cap);

/* The run a checkpoint directory belongs to (ckpt_run.c): made on every
 * rank when --save-dir or --resume is set (*out NULL otherwise); reads the
 * head of --data. Local. */
loom_status loom_ckpt_run_create(const loom_train_config *c, const loom_model_config *mc,
                                 loom_ckpt_run **out);
void loom_ckpt_run_free(loom_ckpt_run *r);
/* Rank 0, before training: create --save-dir (one level, as mkdir(1)) if
 * missing and check it is a writable directory (LOOM_ECANTCREAT naming it),
 * so a long run does not fail at its first save; refuse (LOOM_EUSAGE) a
 * fresh run into a directory that already holds checkpoints - naming the
 * first difference when they are another run's - and a resumed run into a
 * directory of another run, unless --overwrite. LOOM_OK without --save-dir. */
loom_status loom_ckpt_prepare(const loom_train_config *c, const loom_ckpt_run *run);
/* After setup (and a resume), before the first step: with --overwrite rank 0
 * deletes what --save-dir held, records run.json, finds the newest step
 * there that verifies and points DIR/latest at it. Collective over the
 * world (agreed). */
loom_status loom_ckpt_begin(loom_train_run_state *s);
/* SIGTERM / SIGINT only set a flag from now on, for the rest of the
 * process (a signal after the last step, during the final save or while
 * the job ends, changes nothing: the run finished); a flag set before
 * (loom_train_catch_stop_signals) is kept. Local. */
void loom_ckpt_signals(void);
/* After step `step` (0-based) completed: every --save-every steps, or at
 * once when any rank caught SIGTERM/SIGINT (agreed over the world, one
 * small all-reduce per step), save DIR/step_<step+1>; after a signal return
 * LOOM_EINTERRUPTED (every rank together, s->failed_together set) so the
 * job exits with 75. Collective over the world when --save-dir is set;
 * returns LOOM_OK at once otherwise. */
loom_status loom_ckpt_after_step(loom_train_run_state *s, int step);

#endif
