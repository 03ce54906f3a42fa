/* dp.h - the data-parallel engine: gradient synchronisation and the
 * optimizer step over the DP group, plain (DDP) or sharded (ZeRO-1/2/3).
 *
 * The trainer drives one step as
 *   loom_dp_begin_step          zero the gradients (or gradient shards)
 *   forward/backward of each micro-batch (model hooks installed by the engine
 *   fire per unit; loom_dp_set_last_micro marks the micro-batch whose
 *   backward should communicate)
 *   loom_dp_finish_grads        every reduction complete
 *   loom_dp_grad_norm           the exact global norm (tp, pp, dp shards)
 *   loom_dp_step                clip scale, AdamW on what this rank owns,
 *                               parameters made whole again where sharded
 * and, to initialise, load or save the parameters, loom_dp_param_runs.
 * The engine covers every model part of this rank (one per pipeline chunk).
 * Collective over the mesh groups named in each function.
 *
 * Buckets. Each part's flat gradient buffer is cut into buckets: runs of
 * whole units (a unit is never split) taken in the order their gradients
 * complete in the backward (blocks L-1 .. 0, then the outer unit), each
 * closed once it reaches bucket_mb; bucket_mb = 0 gives one bucket per unit,
 * and ZeRO-3 always uses one bucket per unit (a unit is what it gathers).
 * A bucket's non-blocking reduction starts in the post-backward hook that
 * completes it (on the last micro-batch at zero 0/1); without the
 * communicator's progress thread every hook tests what is in flight once
 * (Open MPI progresses non-blocking collectives only inside MPI calls).
 * LOOM_DP_OVERLAP=0 in the environment starts every zero 0/1 reduction in
 * loom_dp_finish_grads instead (a baseline for measuring overlap).
 *
 * Early wte. At zero 0, dp > 1, on a part holding both the embedding and
 * the head (the tied wte is most of a GPT-2 gradient), wte is a bucket of
 * its own, first: the model computes the head's share of wte's gradient
 * before the rest of the head's backward, and on the last micro-batch its
 * all-reduce starts there (post_head_wte), behind the whole remaining
 * backward. The token embedding's rows of that micro-batch (B x T rows of
 * C, with their ids) are kept out of wte and all-gathered over dp, and every
 * rank adds all of them, in rank order, once the reduction completes - when
 * dp x B x T <= V_l / 2, so the rows stay small next to wte itself.
 * At zero 0/1 a bucket whose gradients
 * the caller still completes after the backward (SP partials summed by
 * loom_gpt_finish_grads, the pipeline's shared tied embedding) is reduced
 * in loom_dp_finish_grads instead.
 *
 * Shards (ZeRO >= 1). Bucket b of n_b floats is padded to P_b = N * S_b,
 * S_b = ceil(n_b / N) (N = dp size); rank r owns floats [r S_b, (r+1) S_b)
 * of the bucket, the padding [n_b, P_b) sitting at the end of rank N-1's
 * slice. A rank's shard is its slices of every bucket, back to back:
 * S = sum_b S_b floats, at most (number of buckets) x (N-1) floats of
 * padding over Psi / N. The model pads every tensor to 16 floats, so for
 * N dividing 16 there is no padding at all. ZeRO-1 reduces a padded bucket
 * in loom_dp_finish_grads through a scratch of P_b floats (counted with the
 * gradients); ZeRO-1/2 gather a padded bucket in loom_dp_step, blocking,
 * through that scratch or the bucket's staging buffer.
 *
 * Per stage, per rank (Psi = the part's flat floats, P = sum_b P_b; bytes
 * are 4 x floats; "slots" = two buffers of the largest bucket without the
 * outer unit, used in turn, plus one of the bucket holding it):
 *   zero 0  all-reduce of Psi per step; params Psi, grads Psi, optimizer 2 Psi
 *           (early wte: + two all-gathers of dp x B x T x (C + 1) x 4 bytes,
 *           and their buffer, counted with the gradients)
 *   zero 1  reduce-scatter of P + all-gather of P per step; params Psi,
 *           grads Psi (+ the scratch), optimizer 2 S; gradients accumulate
 *           over micro-batches in the model's full buffer
 *   zero 2  reduce-scatter of P per micro-batch (a rank keeps only its
 *           slice, so micro-batches cannot accumulate locally) + all-gather
 *           of P per step; params Psi, grads S + slots (staging: a bucket's
 *           gradients for one backward), optimizer 2 S
 *   zero 3  as zero 2, plus each unit all-gathered before its forward and
 *           again before its backward (P twice per micro-batch), the next
 *           unit's gather started while the current one runs; params S +
 *           slots (gathered units), grads S + slots, optimizer 2 S
 * Bytes follow comm.h's convention (all-reduce: the buffer; reduce-scatter:
 * the full input; all-gather: the full output). ZeRO >= 1 adds one 16-byte
 * all-reduce over dp for the gradient norm. At dp = 1 nothing is
 * communicated over dp. With comm_bf16 (loom_dp_config) the gradient
 * reductions carry 2-byte bf16 elements: their bytes halve; the rest is as
 * above.
 */
#ifndef LOOM_DP_H
#define LOOM_DP_H

#include <stddef.h>

#include "loom/adamw.h"
#include "loom/mesh.h"
#include "loom/model.h"
#include "loom/status.h"

typedef struct loom_dp_config {
    int zero;         /* 0 DDP, 1 optimizer state sharded, 2 + gradients, 3 + parameters */
    double bucket_mb; /* gradient bucket size for overlapped reductions (0: one per unit) */
    /* 1: the engine sums over tp the gradients sequence parallelism leaves
     * partial (before reducing them over dp, so their buckets overlap the
     * backward too) and the caller must not call loom_gpt_finish_grads.
     * 0: the caller calls loom_gpt_finish_grads after the backward; at
     * zero 0/1 the engine then defers the buckets holding such gradients to
     * loom_dp_finish_grads. ZeRO-2/3 always sum them in the engine (the
     * model's own gradient buffer is not used there). */
    int sum_tp_partials;
    /* 1: the gradient reductions over dp (zero 0's all-reduce, zero 1-3's
     * reduce-scatters) carry bf16, the communicator's wire format (comm.h,
     * loom_comm_*_as): each bucket is rounded into a bf16 wire buffer of the
     * dp group, summed as LOOM_BF16 (every partial sum rounded) and
     * converted back to fp32 when its reduction completes - half the bytes.
     * The early wte's embedding rows, the parameter all-gathers and the norm
     * stay fp32. The engine reserves the group's wire buffers when it is
     * made, one per reduction that can be in flight at once (the largest
     * buckets, 2 bytes a value; counted with the gradients). Host-memory
     * backends only (LOOM_EUSAGE otherwise). */
    int comm_bf16;
} loom_dp_config;

/* Bytes per rank by lifetime class, from the engine's and the model's own
 * accounting: what the stage needs (buffers the model allocates but the
 * stage leaves unused - its gradients at zero 2/3, its parameters at zero 3 -
 * are not counted). */
typedef struct loom_dp_memory {
    size_t params, grads, optimizer, activations;
} loom_dp_memory;

/* Where the last step's DP communication time went, on this rank. */
typedef struct loom_dp_timing {
    double exposed_s; /* inside loom_dp_finish_grads: gradient communication
                          the backward did not hide (blocking reductions of
                          deferred buckets included) */
    double reduce_s;  /* gradient reductions, start to completion, summed */
    double gather_s;  /* waiting for parameter all-gathers (ZeRO-3 before a
                          unit runs, ZeRO-1/2 after the update) */
    double poll_s;    /* inside the model's hooks testing what is in flight
                          (only without the communicator's progress thread:
                          MPI then progresses only inside calls) */
    double comm_s;    /* the calling (compute) thread's wall time inside
                          communication calls on the dp group from the step's
                          start to the end of loom_dp_finish_grads: starts,
                          tests (polling), waits, blocking calls - measured by
                          the communicator (call_seconds). Overlap of the
                          reductions = 1 - comm_s / (the same reductions'
                          duration run alone) */
    int reductions;   /* gradient reductions issued this step */
    int overlapped;   /* of which were started during the backward */
    /* When loom_dp_finish_grads began (the backward's compute was over) and
     * when every reduction had completed, in seconds on loom_comm_wtime's
     * clock (monotonic; comparable between the ranks of one host, so
     * max t_synced - max t_backward_end over the ranks is the communication
     * time no rank could hide, free of the ranks' skew). */
    double t_backward_end, t_synced;
} loom_dp_timing;

typedef struct loom_dp_engine loom_dp_engine;

/* Local: sizes buffers and installs hooks on the parts. Every stage runs
 * with every pipeline schedule: a split backward (zero-bubble) gathers
 * ZeRO-3 parameters for its input half and binds ZeRO-2/3 gradient staging
 * for its weight half; the bucket holding a tied wte shared between a
 * pipeline's first and last stage (and, at zero 0/1, a bucket of SP
 * partials the caller sums) is deferred: at zero 2/3 it accumulates over the
 * micro-batches in the outer unit's staging buffer, where the caller sums
 * the two halves through the parts' gradient views, and is reduced in
 * loom_dp_finish_grads. LOOM_EUSAGE for a --zero outside 0..3, LOOM_EOS
 * without memory.
 * Storage: a part created with external_grads (external_params) gets its
 * gradient (parameter) views bound by the engine; ZeRO-2 needs no full
 * gradient buffer and ZeRO-3 no full parameter buffer, so the trainer
 * creates the parts without them and sharded state is the only state.
 * Starting point: write the parameters through loom_dp_param_runs before
 * the first step. */
loom_status loom_dp_engine_create(loom_gpt **parts, int n_parts, const loom_mesh *mesh,
                                  const loom_dp_config *cfg, const loom_adamw_hparams *hp,
                                  loom_dp_engine **out);
/* Gives the parts back their own parameter and gradient buffers and no hooks. */
void loom_dp_engine_free(loom_dp_engine *e);

loom_status loom_dp_begin_step(loom_dp_engine *e);
void loom_dp_set_last_micro(loom_dp_engine *e, int last);
/* Collective over dp (and tp for partial gradients the engine sums). */
loom_status loom_dp_finish_grads(loom_dp_engine *e);
/* Collective over tp, pp and dp. */
loom_status loom_dp_grad_norm(loom_dp_engine *e, double *norm);
/* grads *= grad_scale, then AdamW; collective over dp (parameter gathers). */
loom_status loom_dp_step(loom_dp_engine *e, float lr, float grad_scale);
/* Where this rank keeps part `part`'s parameters: runs of the part's flat
 * layout, data[0..n) holding flat floats [lo, lo + n). ZeRO-3: this rank's
 * slice of every unit (a run per unit, dp ranks holding disjoint runs);
 * below: one run, the whole param_mem, on every dp rank. Valid for the
 * engine's lifetime; *n_runs gets the count. Local. */
typedef struct loom_param_run {
    float *data;
    size_t lo, n;
} loom_param_run;
const loom_param_run *loom_dp_param_runs(const loom_dp_engine *e, int part, int *n_runs);
/* 1 when the runs of different dp ranks are disjoint slices (ZeRO-3). */
int loom_dp_params_sharded(const loom_dp_engine *e);
void loom_dp_memory_bytes(const loom_dp_engine *e, loom_dp_memory *out);

/* Where this rank keeps AdamW's state for part `part` (checkpoints): one
 * run per (parameter, bucket slice) this rank updates - param indexes
 * m->params, floats [lo, lo + n) of the part's flat layout, m[0..n) and
 * v[0..n) the moments. Fills at most cap runs and returns how many there
 * are. Local. */
typedef struct loom_opt_run {
    int param;
    size_t lo, n;
    float *m, *v;
} loom_opt_run;
int loom_dp_opt_runs(const loom_dp_engine *e, int part, loom_opt_run *out, int cap);
/* 1 when different dp ranks hold disjoint optimizer slices (ZeRO >= 1, dp > 1). */
int loom_dp_opt_sharded(const loom_dp_engine *e);
/* AdamW's step count t (bias correction); set when resuming. Local. */
int loom_dp_steps_taken(const loom_dp_engine *e);
void loom_dp_set_steps_taken(loom_dp_engine *e, int t);
/* 1 when every reduced gradient element of parts[part]->params[param] this
 * rank updates is finite (no NaN or Inf). Call between loom_dp_finish_grads
 * and loom_dp_step. Local. */
int loom_dp_grad_finite(const loom_dp_engine *e, int part, int param);
/* Timings of the last step (reset by loom_dp_begin_step). With the
 * environment variable LOOM_DP_TIMINGS=PREFIX set, every rank also appends
 * them as one JSON line per step to PREFIX.rank<R>.jsonl (R the world rank;
 * the file is opened when the engine is created - LOOM_ECANTCREAT if it
 * cannot be), for benchmarks that need every rank's view. */
void loom_dp_get_timing(const loom_dp_engine *e, loom_dp_timing *out);

/* One rank's parameter-gradient sum of squares split by whether tensor
 * parallelism cuts the tensor (summed over tp) or replicates it (counted
 * once); the tied wte is counted on the part holding the embedding only. */
void loom_dp_sumsq_parts(loom_gpt **parts, int n_parts, const float *const *grads, double sq[2]);

#endif
