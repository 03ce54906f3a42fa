/* sim_internal.h - what the simulator's two replays share (sim.c's, where
 * each rank runs on its own device, and sim_shared.c's, where ranks
 * time-share processors); not public API. pp axis; pure, not collective. */
#ifndef LOOM_PLAN_SIM_INTERNAL_H
#define LOOM_PLAN_SIM_INTERNAL_H

#include "loom/sim.h"

/* F, B, W and the optimizer step: the actions that take a rank's time. */
static inline int is_compute(loom_pp_kind k) { return k <= LOOM_PP_W || k == LOOM_PP_OPT_STEP; }

/* A result for s's actions (start/end times, per-rank busy and end, peak
 * live), zeroed; NULL without memory. */
loom_sim_result *sim_result_alloc(const loom_schedule *s);
/* From the replayed start/end times: each rank's busy time (the compute
 * actions' durations dur, or with dur NULL their wall time end - start, as
 * when ranks share processors, less less[k] when given: the waits for a
 * processor inside them), end, peak live sets; the makespan and the bubble
 * 1 - busy / (pp x makespan). */
void sim_result_finish(const loom_schedule *s, const double *dur, const double *less, loom_sim_result *r);
/* The replay of ranks that time-share c->cores processors per node of
 * c->share ranks (sim_shared.c), with durations dur (already validated). */
loom_status sim_simulate_shared(const loom_schedule *s, const double *dur, const loom_sim_costs *c,
                                loom_sim_result **out);

#endif
