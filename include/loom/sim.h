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
 *              (with per-stage costs `stage` set, stage[s].f, .b, .w replace
 *              f, b, w times scale: measured costs, see loom_sim_trace_read)
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

/* The f, b, w of one virtual stage (loom_sim_costs.stage). */
typedef struct loom_sim_stage_cost {
    double f, b, w;
} loom_sim_stage_cost;

typedef struct loom_sim_costs {
    double f;                  /* forward of one chunk */
    double b;                  /* input-gradient part of its backward */
    double w;                  /* weight-gradient part of its backward */
    double comm;               /* latency of one activation or gradient message */
    double opt;                /* OPT_STEP */
    const double *stage_scale; /* (pp*v) per virtual stage factor on f, b, w; NULL: all 1 */
    /* (pp*v) each virtual stage's own f, b, w; when set, it replaces f, b,
     * w and stage_scale (NULL: not used). A schedule that does not split the
     * backward runs b + w as its B, so measured costs give b = the measured
     * full backward and w = 0. */
    const loom_sim_stage_cost *stage;
    /* Ranks that time-share processors (CPU cores; docs/planning.md, "Devices
     * that share cores"). cores = 0 (the default): every rank has its own
     * device, and an action takes its duration. cores > 0: the pipeline
     * ranks sit on nodes of `share` consecutive ranks (0: all on one node),
     * the ranks of a node time-share `cores` processors, and while k of
     * them compute (F, B, W, OPT_STEP) each progresses at min(1, cores / k)
     * of its own speed: durations are those of a rank computing alone, a
     * rank waiting for a message uses no processor (processor sharing). */
    double cores;
    int share;
    /* Waiting for a processor after a synchronisation (cores > 0 only;
     * docs/planning.md, "Devices that share cores"). slice: the OS
     * scheduler's time slice in cost units (0, the default: no such wait).
     * A rank that had to wait for a message (its receive blocked), and a
     * rank at one of the syncs_f / syncs_b / syncs_w synchronisations inside
     * an F, B or W (TP, CP, EP collectives, spread evenly through the
     * action's work: n syncs cut it into n + 1 equal pieces), gets a
     * processor back only after loom_sim_wake_wait(slice, span, C, k): C =
     * cores x replicas processors of its node, k = replicas x (its own stage
     * + the node's other stages that compute or wait for a processor) ranks
     * that want one. Meanwhile a rank woken from a receive holds no
     * processor (the sender went on: sends are non-blocking), while one at
     * a collective keeps its share of them (the group's members that
     * arrived first poll for it on theirs) and makes no progress. replicas:
     * ranks per stage on a node, in lock-step (dp, tp, cp replicas; 0
     * counts as 1). span: the work (at the speed alone) a computing rank
     * does between two of its synchronisations (0: longer than any slice). */
    double slice, span;
    int replicas;
    int syncs_f, syncs_b, syncs_w;
} loom_sim_costs;

/* Expected wait of a rank that becomes runnable (its synchronisation
 * completed) while every one of the node's `cores` processors is held:
 * 0 when runnable <= cores (a processor is free), else
 *   X / (C + 1) + (k - C - 1) / 2 * X / C,   X = min(slice, span)
 * with C = cores, k = runnable (the rank itself included). The C holders
 * each give their processor up at the end of their current run, which
 * lasts X (their slice, or less when they reach their own next
 * synchronisation first), at a phase uniform and independent: the first
 * of C such residuals ends after X / (C + 1) on average. An EEVDF
 * scheduler (Linux >= 6.6) places a waking task at the queue's average
 * virtual time (its lag kept), so half of the k - C - 1 others that wait
 * have earlier deadlines and run first, each for X, C at a time.
 * span <= 0 means no bound (X = slice); slice <= 0 gives 0. */
double loom_sim_wake_wait(double slice, double span, double cores, double runnable);

/* f = b = w = 1, comm = opt = 0, no scale, no per-stage costs, own devices. */
void loom_sim_costs_default(loom_sim_costs *c);
/* LOOM_EUSAGE unless every cost (stage scale, per-stage cost) is in [0, 1e9] ("--cost-f
 * -1: must be a finite number >= 0 (at most 1e9)"). */
loom_status loom_sim_costs_check(const loom_sim_costs *c, int n_stages);

typedef struct loom_sim_result {
    int pp, n_total;
    double makespan;     /* latest end over all ranks */
    double bubble;       /* 1 - sum(busy) / (pp * makespan); 0 when makespan is 0 */
    double *start, *end; /* (n_total) parallel to the schedule's actions */
    double *busy;        /* (pp) compute time per rank (wall time of its F, B, W, OPT_STEP, less
                            the waits for a processor inside them) */
    double *rank_end;    /* (pp) end of each rank's last action */
    double *wake;        /* (pp) time waiting for a processor after synchronisations (costs.slice;
                            not in busy, so in the bubble) */
    int *peak_live;      /* (pp) */
} loom_sim_result;

/* Validate and simulate. LOOM_EDATA if the lists break a rule (message from
 * the validator), LOOM_EUSAGE for bad costs, LOOM_EOS when out of memory. */
loom_status loom_sim_run(const loom_schedule *s, const loom_sim_costs *c, loom_sim_result **out);
void loom_sim_free(loom_sim_result *r);
/* The same with every action's duration given: dur[i] for the flat index i
 * (n_total entries, each finite and >= 0; compute is F, B, W and OPT_STEP,
 * the rest counts as idle), comm the message latency. `loom sim
 * --from-trace` replays each action at its own measured duration with it. */
loom_status loom_sim_run_durations(const loom_schedule *s, const double *dur, double comm,
                                   loom_sim_result **out);

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

/* ---- measured traces (`loom sim --from-trace DIR`) -------------------------
 *
 * DIR is what `loom train --trace DIR` writes: DIR/trace_rank<R>.json for
 * every world rank R = 0..N-1, Chrome trace-event JSON ({"traceEvents": [...]}
 * or a bare array). The pipeline actions of a rank are its "X" events whose
 * name is an action label (loom_pp_action_format: "F3", "B3.1", "W3",
 * "SEND_ACT mb 3 chunk 0 -> rank 1", "RECV_GRAD mb 3 chunk 0 from rank 1",
 * "OPT_STEP"), in time order; other events (phases, collectives) are not
 * actions. Each file's actions must be exactly the list of one rank of s (its
 * pipeline rank; with dp, tp or cp > 1 several files share one): this is what
 * proves the trace belongs to this schedule, pp, micro-batches and v.
 *
 * From the matched actions (times in ms: the trace's microseconds / 1000):
 *   mean[s]     mean duration of the F, B and W of virtual stage s over
 *               every file; schedules that do not split the backward have
 *               no W: b = the mean of their (full) B, w = 0.
 *   comm        message latency: the median, over the messages whose RECV
 *               started before their SEND ended (the receiver waited), of
 *               RECV end - SEND end; 0 when no receiver waited. Ranks' clocks
 *               are aligned on the end of the first all-reduce of the "pp"
 *               group after the pipeline (the trainer's loss all-reduce,
 *               which every pp rank leaves at about the same time); without
 *               one, times are taken as they are (aligned = 0).
 *   delay       per message, RECV end - max(SEND end, RECV start): how long
 *               the message took once both sides were ready. A transport
 *               without background progress shows delays of whole compute
 *               actions here (the simulator's constant latency cannot model
 *               that; see docs/pipeline.md).
 *   bubble      the measured bubble of the traced step, as `loom train`'s
 *               pp_bubble: 1 - sum of F, B, W time / (pp x the longest span
 *               from a rank's first action start to its last action end),
 *               averaged over the pp groups when there are several.
 *   dur         (n_total) each action's own duration in the first pp group
 *               (F, B, W, SEND as measured; RECV and OPT_STEP 0: their time
 *               is waiting, which the replay computes), for
 *               loom_sim_run_durations.
 * Files of one pipeline rank are paired with the other ranks' in world-rank
 * order (the k-th file of each pipeline rank forms pp group k), which is the
 * mesh's order when pp is outermost (the default, tp,cp,dp,pp).
 *
 * Errors: LOOM_ENOINPUT when DIR or a trace_rank<R>.json in 0..N-1 is
 * missing or unreadable; LOOM_EDATA for malformed JSON, an event with a bad
 * ts or dur, or actions that are not those of a rank of s - naming the
 * file, the first differing action and, when another layout fits every
 * file, its flags ("the traces match --schedule gpipe --pp 2
 * --micro-batches 8"). LOOM_EOS when out of memory. */
typedef struct loom_sim_trace {
    int n_files;                    /* trace_rank0..n_files-1.json */
    int per_rank;                   /* files per pipeline rank (n_files / pp) */
    int n_stages;                   /* pp * v */
    loom_sim_stage_cost *mean;      /* (n_stages) ms */
    double comm;                    /* ms */
    int comm_samples;               /* messages the latency is the median of */
    int aligned;                    /* 1: clocks aligned on a pp all-reduce */
    int n_msgs;                     /* messages seen (all groups) */
    double delay_median, delay_max; /* ms */
    int n_late;                     /* messages delayed more than late_threshold */
    double late_threshold;          /* ms: a tenth of the mean F/B/W action (at least 0.05 ms) */
    double bubble;                  /* measured, as pp_bubble */
    double compute_mean;            /* mean F/B/W duration, ms */
    double *dur;                    /* (n_total) ms */
} loom_sim_trace;

loom_status loom_sim_trace_read(const loom_schedule *s, const char *dir, loom_sim_trace **out);
void loom_sim_trace_free(loom_sim_trace *t);

#endif
