/* pp_exec.h - the pipeline executor: runs one rank's action list (from
 * pipeline.h) on real model parts with real messages.
 *
 * It follows pipeline.h's convention: a RECV completes at its place but is
 * posted ahead (the next two receives of each chunk and kind, into staging
 * buffers, so messages move while this rank computes), a SEND is non-blocking and its buffer (the slot's output or input
 * gradient) stays untouched until the send completes - a slot is only reused
 * after its sends are done - and OPT_STEP waits for every send. Activation
 * slots are taken at a micro-batch's first action on a chunk (RECV_ACT or F)
 * and given back after its last (B, or W when the schedule splits). The
 * executor records the start and end of every action for traces and the
 * measured bubble. Collective over the pp group (point-to-point only).
 */
#ifndef LOOM_PP_EXEC_H
#define LOOM_PP_EXEC_H

#include <stdint.h>

#include "loom/comm.h"
#include "loom/model.h"
#include "loom/pipeline.h"
#include "loom/status.h"

typedef struct loom_pp_exec_io {
    void *ctx;
    /* Fill inputs and/or targets (B*T each) of micro-batch mb; either may be NULL. */
    void (*batch)(void *ctx, int mb, int32_t *inputs, int32_t *targets);
    /* Before the backward work (B, and W when split) of micro-batch mb. */
    void (*before_backward)(void *ctx, int mb, int last_mb);
} loom_pp_exec_io;

typedef struct loom_pp_event {
    loom_pp_action a;
    double t0, t1; /* seconds, loom_comm_wtime */
} loom_pp_event;

typedef struct loom_pp_exec loom_pp_exec;

/* parts[c] is chunk c of this rank (virtual stage c*pp + rank); each created
 * with n_slots >= loom_schedule_peak_live(s, rank) and split_backward as the
 * schedule. Local. */
loom_status loom_pp_exec_create(const loom_schedule *s, int rank, loom_gpt **parts, loom_comm *pp,
                                loom_pp_exec **out);
void loom_pp_exec_free(loom_pp_exec *x);
/* One step: every action of the list but the optimizer; the last stage adds
 * its losses to *loss_sum. dloss scales each token's loss (1 / global tokens). */
loom_status loom_pp_exec_run(loom_pp_exec *x, const loom_pp_exec_io *io, float dloss, double *loss_sum);
/* Most activation slots this rank held at once over all chunks, last run. */
int loom_pp_exec_peak_live(const loom_pp_exec *x);
/* The events of the last run (one per action, in list order). */
const loom_pp_event *loom_pp_exec_events(const loom_pp_exec *x, int *n);

#endif
