/* train.h - the training loop, optimizer, LR schedule, evaluation and
 * parameter files.
 *
 * loom_train_run is collective over the world: every rank calls it with the
 * same config. All checks that depend only on the config (layout, batch
 * divisibility, model sizes) run before the first collective so every rank
 * fails the same way; checks that could differ between ranks (a file missing
 * on one node) are agreed on with one all-reduce of the status, so no rank is
 * left waiting. Rank 0 alone prints, writes metrics and writes parameters.
 *
 * Failures from the first step on follow one rule. A failure every rank sees
 * together - the non-finite loss or gradient norm, known on every rank after
 * the loss all-reduce - returns through the normal path: rank 0 prints it,
 * every rank returns the same status, and the CLI exits with it (65). Any
 * other failure is local to the rank that hit it (an I/O error writing
 * metrics, traces or the parameter file; out of memory; an internal error; a
 * failed MPI call) while its peers wait in a collective. That rank returns at
 * once, with no further collective, and loom_train_run aborts the whole job
 * through loom_comm_abort: one line "loom: error: rank R: <cause> (aborting
 * all ranks, exit code N)" and MPI_Abort with the status as the code (74 I/O
 * error, 73 cannot create, 71 out of memory / OS, 70 internal, 69 MPI). The
 * launcher exits with N; it ends the other ranks with a signal. Outputs are
 * written as FILE.tmp and renamed when complete, so an earlier FILE survives.
 * The mechanisms: train_phase (all work after set-up, returning the first
 * failure), failed_together (set only where a failure is seen by all), and
 * fail_fast (abort unless failed_together) - see trainer.c. One agreement
 * after the phase keeps a rank that finished from exiting 0 while a peer is
 * still writing and may yet abort.
 */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include "loom/adamw.h"
#include "loom/comm.h"
#include "loom/mesh.h"
#include "loom/model.h"
#include "loom/status.h"

#define LOOM_PATH_MAX 1024

/* Non-finite loss or gradients: abort the run (exit 65), or skip that
 * step's update. */
typedef enum { LOOM_NAN_POLICY_ABORT, LOOM_NAN_POLICY_SKIP, LOOM_NAN_POLICY_COUNT } loom_nan_policy;
extern const char *const loom_nan_policy_names[]; /* abort skip, NULL-terminated */

typedef struct loom_train_config {
    /* degrees, mesh order, ZeRO stage, sp, cp_impl, schedule, virtual stages,
     * micro-batches, stage layers, grad accumulation, recompute, precision and
     * communication precision (layout.h; checked by loom_layout_validate) */
    loom_layout layout;
    char model[LOOM_PATH_MAX];       /* built-in name or config.json */
    char data[LOOM_PATH_MAX];        /* token shard (.bin) */
    char metrics[LOOM_PATH_MAX];     /* JSONL output, "" = none */
    char save_params[LOOM_PATH_MAX]; /* safetensors output, "" = none */
    char load_params[LOOM_PATH_MAX]; /* safetensors input, "" = init from seed */
    int steps;
    uint64_t seed;
    int batch;                                        /* global, in sequences */
    int seq;                                          /* T */
    float lr, min_lr_frac;                            /* cosine decays lr to lr * min_lr_frac */
    int warmup;                                       /* linear warmup steps */
    float weight_decay, beta1, beta2, eps, grad_clip; /* grad_clip <= 0: off */
    char trace[LOOM_PATH_MAX];                        /* directory for the job's Chrome trace, "" = none */
    int trace_first, trace_last;                      /* traced steps, 1-based, inclusive; 0: the last step */
    char tensorboard[LOOM_PATH_MAX];                  /* directory for TensorBoard event files, "" = none */
    double bucket_mb;                                 /* DDP gradient bucket size */
    int threads;                                      /* per rank; 0 = auto */
    double peak_flops;                                /* per rank FLOP/s for MFU; 0 = calibrate (cached) */
    int log_every;                                    /* plain log line every N steps */
    int progress;                                     /* -1 auto (terminal), 0 off, 1 on */
    int quiet;
    /* checkpoints (docs/checkpoints.md) */
    char save_dir[LOOM_PATH_MAX]; /* sharded checkpoints DIR/step_N, "" = none */
    int save_every;               /* steps between checkpoints (0: only at the end) */
    int keep;                     /* newest checkpoints kept in save_dir (0: all) */
    char resume[LOOM_PATH_MAX];   /* DIR (newest complete) or DIR/step_N, "" = none */
    int overwrite;                /* delete what save_dir holds (another run's checkpoints) first */
    loom_nan_policy nan_policy;   /* non-finite loss/gradients: abort (default) or skip the update */
    /* MoE (moe.h): warn naming the block when the expert load imbalance
     * (max / mean tokens per expert) or the all-to-all share of the step
     * exceeds these */
    float moe_warn_imbalance, moe_warn_a2a;
    /* MoE routing groups: with cp = 1, route each micro-batch as the tokens
     * of this many CP ranks (loom_gpt_opts.moe_route_cp); 0 = one group */
    int moe_route_cp;
} loom_train_config;

void loom_train_config_default(loom_train_config *c);

/* What a finished run reports. */
typedef struct loom_train_result {
    int steps_done;
    double final_loss;
    double tokens_per_s; /* mean over the run after the first step */
    double mfu;
} loom_train_result;

loom_status loom_train_run(const loom_train_config *c, loom_device *dev, loom_comm *world,
                           loom_train_result *res);
/* From now on SIGTERM / SIGINT only ask a run with --save-dir to stop after
 * its next step with a checkpoint (loom_train_run does this itself; a
 * program calls it earlier to cover its own start-up); `pending`, if not
 * 0, is such a signal that arrived before. Local; for the process. */
void loom_train_catch_stop_signals(int pending);

typedef struct loom_eval_config {
    char model[LOOM_PATH_MAX], data[LOOM_PATH_MAX], load_params[LOOM_PATH_MAX];
    int batch, seq, batches, threads;
} loom_eval_config;
/* Mean loss over sequences 0 .. batch*batches-1 read sequentially, on dev. Collective. */
loom_status loom_eval_run(const loom_eval_config *c, loom_device *dev, loom_comm *world, double *mean_loss);

/* Learning rate at 0-based step s of n: linear warmup to lr over `warmup`
 * steps, then cosine down to lr * min_frac at the last step. */
float loom_lr_at(const loom_train_config *c, int s);

/* AdamW on one whole model part with no engine - the single-device
 * reference the tests compare against: one run of the AdamW driver
 * (adamw.h) per parameter of the table, over m's param_mem and grad_mem;
 * the moments in one arena of m's device, t the step count. Local. */
typedef struct loom_adamw {
    loom_device *dev;
    float *m, *v;
    loom_adamw_run *runs; /* (n_runs) one per parameter */
    int n_runs;
    int t;
    loom_arena arena;
} loom_adamw;
loom_status loom_adamw_create(loom_adamw *o, loom_gpt *m);
void loom_adamw_free(loom_adamw *o);
/* One step over every parameter (weight decay where the table says so). */
void loom_adamw_step(loom_adamw *o, const loom_adamw_hparams *hp, float lr);

/* Parameters as safetensors with Hugging Face GPT-2 names, the whole model
 * whatever the layout. Save assembles the shards and rank 0 writes PATH.tmp
 * then renames it. Load accepts the "transformer." prefix and skips the tied
 * lm_head.weight and the attn.bias / attn.masked_bias mask buffers; a missing
 * tensor, wrong shape or non-finite value is LOOM_EDATA naming it. Both are
 * collective over mesh->world; with mesh NULL, one process reads or writes
 * alone. With a DP engine `dp`, parameters are read and written where the
 * engine keeps them (loom_dp_param_runs: ZeRO-3's shards, each dp rank its
 * own slices, never gathered into a whole part); with dp NULL, in each
 * part's param_mem. The file itself is still assembled in one whole-model
 * buffer per rank; sharded checkpoints (--save-dir, --resume) never assemble
 * the model: src/train/ckpt.c, docs/checkpoints.md. */
struct loom_dp_engine;
loom_status loom_params_save(loom_gpt *const *parts, int n_parts, const loom_mesh *mesh,
                             const struct loom_dp_engine *dp, const char *path);
loom_status loom_params_load(loom_gpt *const *parts, int n_parts, const loom_mesh *mesh,
                             const struct loom_dp_engine *dp, const char *path);

#endif
