/* sim.h - the pipeline simulator behind `loom sim` and the planner (pp axis;
 * pure, not collective).
 *
 * The simulator replays the very lists loom_schedule_build gives the executor
 * (loom_schedule_replay: same engine as the validator), with a duration for
 * every action from a cost model:
 *   F          f * scale[stage]
 *   B          b * scale[stage] in split schedules (input gradient only),
 *              (b + w) * scale[stage] otherwise (a full backward)
 *   W          w * scale[stage]
 *   OPT_STEP   opt
 *   SEND/RECV  0 on the rank; a message arrives `comm` after its SEND, and
 *              its RECV ends at max(arrival, the rank's clock).
 * So splitting the backward moves work, it does not add any: b + w is the
 * backward of every schedule, and default costs f = b = w = 1 give the
 * classic F=1, B=2 of an unsplit backward.
 *
 * Results: per-action start/end, per-rank busy time (F, B, W, OPT_STEP),
 * makespan (the latest end), bubble = 1 - sum(busy) / (pp * makespan), and
 * peak live activation sets per rank (loom_schedule_peak_live).
 */
#ifndef LOOM_SIM_H
#define LOOM_SIM_H

#include <stddef.h>

#include "loom/pipeline.h"
#include "loom/status.h"

typedef struct loom_sim_costs {
    double f;                  /* forward of one chunk */
    double b;                  /* input-gradient part of its backward */
    double w;                  /* weight-gradient part of its backward */
    double comm;               /* latency of one activation or gradient message */
    double opt;                /* OPT_STEP */
    const double *stage_scale; /* (pp*v) per virtual stage factor on f, b, w; NULL: all 1 */
} loom_sim_costs;

/* f = b = w = 1, comm = opt = 0, no scale. */
void loom_sim_costs_default(loom_sim_costs *c);
/* LOOM_EUSAGE unless every cost (and stage scale) is in [0, 1e9] ("--cost-f
 * -1: must be a finite number >= 0 (at most 1e9)"). */
loom_status loom_sim_costs_check(const loom_sim_costs *c, int n_stages);

typedef struct loom_sim_result {
    int pp, n_total;
    double makespan;     /* latest end over all ranks */
    double bubble;       /* 1 - sum(busy) / (pp * makespan); 0 when makespan is 0 */
    double *start, *end; /* (n_total) parallel to the schedule's actions */
    double *busy;        /* (pp) compute time per rank */
    double *rank_end;    /* (pp) end of each rank's last action */
    int *peak_live;      /* (pp) */
} loom_sim_result;

/* Validate and simulate. LOOM_EDATA if the lists break a rule (message from
 * the validator), LOOM_EUSAGE for bad costs, LOOM_EOS when out of memory. */
loom_status loom_sim_run(const loom_schedule *s, const loom_sim_costs *c, loom_sim_result **out);
void loom_sim_free(loom_sim_result *r);

/* Duration of one action under the cost model (see the table above). */
double loom_sim_duration(const loom_schedule *s, int rank, const loom_pp_action *a, const loom_sim_costs *c);

/* The closed-form bubble of a schedule for costs c with comm = 0 and no
 * stage_scale; NAN where there is none. tests/pipeline asserts the simulator
 * reproduces it to 1e-12 (zb: over random f, b, w):
 *   gpipe, 1f1b   (p-1) / (m+p-1)              any f, b, w; any m >= 1
 *   interleaved   (p-1) / (v*m+p-1)            any f, b, w; m % p == 0
 *   zb            (p-1)x / (m(f+b+w) + (p-1)x), x = max(f, b, f+b-w); m >= p
 *                 (f = b = w: (p-1)/(3m+p-1), a third of 1f1b's idle time;
 *                 x = f+b-w is the paper's (p-1)(T_F+T_B-T_W) when W is
 *                 the cheapest pass) */
double loom_sim_closed_form_bubble(loom_sched_kind k, int pp, int m, int v, const loom_sim_costs *c);

/* The timeline as text, one line per rank:
 *   stage 0: F0 F1 F2 F3 .. .. B0 B0 F4 ...
 * Each column is one time quantum q: the largest q with every action
 * boundary on a multiple of q when that needs at most max_cols columns (for
 * uniform costs, one column per time unit); otherwise q = makespan/max_cols.
 * A column shows the computation running in its middle, ".." when the rank
 * is idle. A header line gives q ("makespan 0: nothing to draw" when all
 * costs are 0). Returns the length of the whole text
 * (snprintf-style: the text is cut to fit cap, NUL-terminated if cap > 0). */
size_t loom_sim_format_timeline(const loom_schedule *s, const loom_sim_result *r, int max_cols, char *buf,
                                size_t cap);

/* Chrome trace-event JSON (open in Perfetto or chrome://tracing): one "X"
 * event per computation, pid 0, tid = rank, ts/dur in microseconds with one
 * cost unit = 1000 us, args {mb, chunk, stage}; thread names "stage r".
 * Written to PATH.tmp and renamed, so an existing file is replaced whole or
 * not at all. LOOM_ECANTCREAT / LOOM_EIO naming the path. */
loom_status loom_sim_write_trace(const loom_schedule *s, const loom_sim_result *r, const char *path);

#endif
