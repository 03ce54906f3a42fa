/* internal.h - pieces shared by the trainer's files; not public API. */
#ifndef LOOM_TRAIN_INTERNAL_H
#define LOOM_TRAIN_INTERNAL_H

#include <stdio.h>

#include "loom/data.h"
#include "loom/dp.h"
#include "loom/pipeline.h"
#include "loom/pp_exec.h"
#include "loom/trace.h"
#include "loom/train.h"

#define LOOM_MAX_PARTS 64   /* pipeline chunks per rank (virtual stages) */
#define LOOM_MAX_PHASES 256 /* traced phases of one step */

/* The mesh groups whose traffic a step reports. */
#define LOOM_REPORT_GROUPS 7
extern const char *const loom_report_group_names[LOOM_REPORT_GROUPS]; /* tp cp dp pp dpcp ep world */

typedef struct loom_step_stats {
    double loss, grad_norm, seconds, tokens_per_s, mfu;
    float lr;
    uint64_t comm_bytes;                      /* bytes this rank moved this step, all groups */
    loom_comm_stats comm[LOOM_REPORT_GROUPS]; /* per group, loom_report_group_names order */
    loom_dp_memory mem;                       /* bytes per rank by lifetime class (loom's plan) */
    size_t peak_rss;                          /* this rank's peak resident bytes from the OS (VmHWM) */
    size_t peak_rss_max;                      /* the largest of every rank's */
    loom_dp_timing dp;                        /* where the step's DP communication time went */
    double pp_bubble;                         /* measured pipeline bubble this step (-1: no pipeline) */
    int pp_peak_live;                         /* most activation sets alive at once on this rank */
    int pp_ranks;                             /* entries of pp_idle_ms, pp_wait_ms (pipeline ranks) */
    double *pp_idle_ms;                       /* per pipeline rank: longest span - its F/B/W time */
    double *pp_wait_ms;                       /* per pipeline rank: time inside its RECVs and OPT_STEP */
    int skipped;                              /* non-finite gradients, update skipped (--nan-policy skip) */
    const char *moe_json;                     /* "\"moe\": [...], " per MoE block, or NULL (moe_report.c) */
} loom_step_stats;

/* Progress on a terminal, log lines otherwise, and the metrics file. Rank 0
 * writes; on other ranks every call is a no-op. */
typedef struct loom_report {
    const loom_train_config *cfg;
    int active; /* rank 0 */
    int bar;    /* progress bar on a terminal */
    FILE *metrics;
    char metrics_tmp[LOOM_PATH_MAX + 8];
    struct loom_tboard *tb; /* --tensorboard DIR's event file (tboard.h), or NULL */
    double t_start;
} loom_report;

/* Open: LOOM_ECANTCREAT when --metrics is a directory or its .tmp cannot be
 * created, or --tensorboard DIR's event file cannot be. */
loom_status loom_report_open(loom_report *r, const loom_train_config *c, int rank);
/* The first row of the metrics: the run's settings and environment
 * (run_header.c): {"run": {model, layout, batch, seq, steps, lr, ...},
 * "env": {loom, commit, compiler, mpi, blas, ..., host, cpu, started}}. Rank 0;
 * nothing without --metrics. LOOM_EIO when the write fails. Local. */
struct loom_train_run_state;
loom_status loom_report_header(loom_report *r, const struct loom_train_run_state *s);
/* The model's shape into m: name, n_layer, n_head, n_embd, vocab_size,
 * n_positions (the metrics header's "model" and a checkpoint's run identity). */
struct cJSON;
void loom_train_model_shape_json(struct cJSON *m, const loom_model_config *mc);
loom_status loom_report_step(loom_report *r, int step, const loom_step_stats *s);
/* Close, given the run's status st. Success: rename metrics into place and
 * print the summary; returns LOOM_OK, or LOOM_EIO / LOOM_ECANTCREAT (with the
 * message set, the metrics left under the .tmp name, no summary) when the
 * metrics cannot be completed or renamed. Failure: keep the partial metrics
 * under the .tmp name, say so and return st unchanged. Local (rank 0 writes;
 * on other ranks it returns st). */
loom_status loom_report_close(loom_report *r, loom_status st, const loom_train_result *res);

typedef struct loom_train_run_state {
    const loom_train_config *cfg;
    loom_device *dev; /* where every part computes (device.h) */
    loom_mesh *mesh;
    loom_model_config model_cfg;
    loom_gpt *parts[LOOM_MAX_PARTS]; /* one per pipeline chunk on this rank */
    int n_parts;
    loom_dp_engine *dp;
    struct loom_edp_engine *edp; /* expert tensors of an expert-parallel model (edp.h) */
    char *moe_json;              /* the step's MoE line fragment (moe_report.c) */
    size_t moe_json_cap;
    unsigned char moe_warned[64]; /* per MoE block: already above the imbalance threshold */
    int have_tokens;
    /* pipeline (pp > 1 or virtual stages > 1) */
    int pipelined;
    loom_schedule *sched;
    loom_pp_exec *exec;
    double *pp_times; /* (2 pp) per pipeline rank: idle ms, then wait ms (loom_train_pp_bubble) */
    int step;         /* the step being run (for the data callback) */
    /* phases of the traced step (non-pipelined runs) */
    struct {
        char name[32];
        double t0, t1;
    } phase[LOOM_MAX_PHASES];
    int n_phase, tracing;
    loom_tokens tokens;
    int32_t *inputs, *targets;                     /* (B_l, T) */
    double flops_per_token, peak_flops, fma_flops; /* peaks per rank (calibrate.c) */
    int peak_raised; /* a step beat the sgemm calibration; peak_flops is that rate now */
    loom_report report;
    int failed_together; /* the failure being returned was seen by every rank at once */
    /* --trace (trace_run.c): this rank's events of the traced steps, in rank 0's time */
    FILE *trace_mem;
    char *trace_text;
    size_t trace_len;
    double *trace_offs, *trace_rtts; /* (world) clock offsets and round trips vs rank 0, seconds */
    double trace_base;               /* rank 0's clock at the alignment: ts 0 */
    int start_step;                  /* the first step to run (a resumed checkpoint's step) */
    struct loom_ckpt_run *ckpt;      /* the run's identity for checkpoints (ckpt_run.c); NULL without them */
} loom_train_run_state;

/* Per-rank peak FLOP/s: `given` if > 0, else the best sgemm of the chosen
 * kernel on this rank's thread count, measured on rank 0 (cached per CPU,
 * flags and kernel: loom/calibrate.h) and broadcast; *fma the FMA peak from
 * flags and clock (never below *out). Collective over world. */
loom_status loom_peak_flops(loom_comm *world, const loom_device *dev, double given, double *out, double *fma);
/* achieved / peak, raising *peak to `achieved` first when a run beats it (so
 * MFU never reads above 100%); sets *raised then. */
double loom_mfu(double *peak, double achieved, int *raised);
/* Pipeline pieces of the trainer (pipeline.c). */
loom_status loom_train_pp_setup(loom_train_run_state *s, const loom_model_config *mc, int Bm);
loom_status loom_train_pp_step(loom_train_run_state *s, int step, double *loss_sum);
void loom_train_pp_teardown(loom_train_run_state *s);
/* Measured bubble of the last step over the pp group. Collective over pp. */
/* The step's measured bubble from the executor's timestamps (collective
 * over pp), and per pipeline rank its idle and waiting time into
 * idle_ms/wait_ms (pp entries each, on every rank). */
loom_status loom_train_pp_bubble(loom_train_run_state *s, double *bubble, double *idle_ms, double *wait_ms);
/* The last step's pipeline actions as trace events (row 0 of this rank). */
void loom_train_pp_trace(loom_train_run_state *s, loom_trace *t);

/* --trace DIR (trace_run.c). setup: align the ranks' clocks to rank 0's
 * (ping-pong, reported by rank 0). Collective over the world. */
loom_status loom_train_trace_setup(loom_train_run_state *s);
/* 1 when 0-based step is in --trace-steps (default: the last step). */
int loom_train_trace_on(const loom_train_run_state *s, int step);
/* After a traced step (t_step: its start): keep its events; at the last
 * traced step write DIR/trace_rank<R>.json and merge every rank's events
 * into DIR/trace.json (collective over the world then; local failures:
 * fail_fast). */
loom_status loom_train_trace_step(loom_train_run_state *s, int step, double t_step);
void loom_train_trace_free(loom_train_run_state *s);

/* The step's MoE statistics over every rank (after the step's communication
 * statistics were taken), into st->moe_json, with warnings on rank 0; then
 * reset. Collective over dp x cp. */
loom_status loom_train_moe_step(loom_train_run_state *s, int step, loom_step_stats *st);
void loom_train_moe_free(loom_train_run_state *s);

/* The device (--device, LOOM_DEVICE_COMM) as the layout validator's device
 * section sees it (layout.h): its name and its groups' implementation.
 * The same on every rank (made from the command line and environment). */
loom_layout_device loom_train_device(const loom_device *dev);
/* The MoE options' limits (--moe-warn-*, --moe-route-cp; moe_report.c).
 * Depends only on the config. */
loom_status loom_train_moe_check(const loom_train_config *c, const loom_model_config *mc);

/* LOOM_ECANTCREAT unless the directory of `path` is writable. */
loom_status loom_check_output_path(const char *path, const char *flag);
/* This rank's tensor-parallel group for a model part (size 1 without --tp). */
loom_tp loom_train_tp_group(const loom_train_run_state *s);
/* This rank's context-parallel group for a model part (size 1 without --cp). */
loom_cp loom_train_cp_group(const loom_train_run_state *s);
/* Sample micro-batch tokens as loom_data_sample does for whole sequences of
 * --seq, then keep this rank's context-parallel rows (B x seq/cp) of each. */
void loom_train_sample(loom_train_run_state *s, int step, int64_t first, int Bm, int32_t *inputs,
                       int32_t *targets);

/* Host code walking device state element by element (parameter files,
 * checkpoints; params_io.c): n floats of dev's memory at src as host
 * memory - src itself when dev's memory is host memory, else a malloc'd
 * copy downloaded from it (NULL without memory: LOOM_EOS set). _done puts a
 * copy back (upload) when `upload` and frees it; nothing for src itself or
 * NULL. Local. */
float *loom_train_host_view(loom_device *dev, float *src, size_t n);
void loom_train_host_view_done(loom_device *dev, float *src, float *view, size_t n, int upload);

/* Whether this rank writes parameter p's elements (and, in a checkpoint,
 * their optimizer moments) when saving: one holder per element - dp and cp
 * coordinate 0, or every dp x cp rank when `sharded` (the runs are the DP
 * engine's disjoint ZeRO slices; it shards over dp x cp when cp > 1); tp rank
 * 0 for tensors tensor parallelism does not cut; the first pipeline stage for
 * the tied wte. mesh NULL: one process. Experts under expert parallelism
 * have their own rule (params_io.c, ckpt.c). Local (params_io.c). */
int loom_train_param_holder(const loom_gpt *m, const loom_mesh *mesh, int sharded, const loom_param *p);

/* A non-finite loss or gradient norm at `step` (seen by every rank): name
 * the first parameter (whole-model order) whose gradient is non-finite on
 * any rank, then with --nan-policy skip warn and return LOOM_OK (the caller
 * skips the update), else return LOOM_EDATA with the message. Collective
 * over the world (nan.c). */
loom_status loom_train_nonfinite(loom_train_run_state *s, int step, double loss, double grad_norm);

#endif
