/* sim.c - the pipeline simulator (pp axis; pure, not collective): durations
 * from a cost model, the replay engine of src/pipeline/validate.c for the
 * times, then the bubble, a text timeline and a Chrome trace of the result.
 * It never builds or reorders a schedule itself: it times the lists the
 * executor runs.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/sim.h"

void loom_sim_costs_default(loom_sim_costs *c) {
    *c = (loom_sim_costs){
        .f = 1, .b = 1, .w = 1, .comm = 0, .opt = 0, .stage_scale = NULL, .stage = NULL, .cores = 0, .share = 0,
        .slice = 0, .span = 0, .replicas = 0, .syncs_f = 0, .syncs_b = 0, .syncs_w = 0};
}

double loom_sim_wake_wait(double slice, double span, double cores, double runnable) {
    if (!(slice > 0) || !(cores > 0) || runnable <= cores) return 0;
    const double X = span > 0 && span < slice ? span : slice;
    const double ahead = runnable - cores - 1 > 0 ? runnable - cores - 1 : 0;
    return X / (cores + 1) + 0.5 * ahead * X / cores;
}

/* Costs above 1e9 could overflow a makespan of millions of actions. */
#define LOOM_SIM_MAX_COST 1e9

static loom_status check_cost(const char *flag, double x) {
    if (!(isfinite(x) && x >= 0 && x <= LOOM_SIM_MAX_COST))
        return loom_fail(LOOM_EUSAGE, "%s %g: must be a finite number >= 0 (at most 1e9)", flag, x);
    return LOOM_OK;
}

loom_status loom_sim_costs_check(const loom_sim_costs *c, int n_stages) {
    LOOM_TRY(check_cost("--cost-f", c->f));
    LOOM_TRY(check_cost("--cost-b", c->b));
    LOOM_TRY(check_cost("--cost-w", c->w));
    LOOM_TRY(check_cost("--cost-comm", c->comm));
    LOOM_TRY(check_cost("--cost-opt", c->opt));
    LOOM_TRY(check_cost("--cores", c->cores));
    if (c->share < 0) return loom_fail(LOOM_EUSAGE, "--share %d: must be >= 0 (0: every rank on one node)", c->share);
    LOOM_TRY(check_cost("--slice", c->slice));
    LOOM_TRY(check_cost("span", c->span));
    if (c->replicas < 0 || c->syncs_f < 0 || c->syncs_b < 0 || c->syncs_w < 0)
        return loom_fail(LOOM_EUSAGE, "replicas %d, syncs %d %d %d: must be >= 0", c->replicas, c->syncs_f,
                         c->syncs_b, c->syncs_w);
    for (int s = 0; c->stage_scale && s < n_stages; s++)
        if (!(isfinite(c->stage_scale[s]) && c->stage_scale[s] >= 0 &&
              c->stage_scale[s] <= LOOM_SIM_MAX_COST))
            return loom_fail(LOOM_EUSAGE, "cost scale of stage %d is %g: must be a finite number in [0, 1e9]",
                             s, c->stage_scale[s]);
    for (int s = 0; c->stage && s < n_stages; s++) {
        const double x[3] = {c->stage[s].f, c->stage[s].b, c->stage[s].w};
        for (int k = 0; k < 3; k++)
            if (!(isfinite(x[k]) && x[k] >= 0 && x[k] <= LOOM_SIM_MAX_COST))
                return loom_fail(LOOM_EUSAGE, "cost %c of stage %d is %g: must be a finite number in [0, 1e9]",
                                 "fbw"[k], s, x[k]);
    }
    return LOOM_OK;
}

double loom_sim_duration(const loom_schedule *s, int rank, const loom_pp_action *a, const loom_sim_costs *c) {
    const int in_range = a->chunk >= 0 && a->chunk < s->virtual_stages && rank >= 0 && rank < s->pp;
    if (c->stage && in_range && a->kind <= LOOM_PP_W) {
        const loom_sim_stage_cost *x = &c->stage[loom_pp_vstage(s->pp, rank, a->chunk)];
        return a->kind == LOOM_PP_F ? x->f : a->kind == LOOM_PP_W ? x->w : s->split_backward ? x->b : x->b + x->w;
    }
    const double scale = a->kind <= LOOM_PP_W && c->stage_scale && in_range
                             ? c->stage_scale[loom_pp_vstage(s->pp, rank, a->chunk)]
                             : 1.0;
    switch (a->kind) {
    case LOOM_PP_F: return c->f * scale;
    case LOOM_PP_B: return (s->split_backward ? c->b : c->b + c->w) * scale;
    case LOOM_PP_W: return c->w * scale;
    case LOOM_PP_OPT_STEP: return c->opt;
    default: return 0.0;
    }
}

static int is_compute(loom_pp_kind k) { return k <= LOOM_PP_W || k == LOOM_PP_OPT_STEP; }

void loom_sim_free(loom_sim_result *r) {
    if (!r) return;
    free(r->start);
    free(r->busy);
    free(r->peak_live);
    free(r);
}

/* A result for s's actions (start/end times, per-rank busy and end, peak
 * live), zeroed; NULL without memory. */
static loom_sim_result *result_alloc(const loom_schedule *s) {
    const size_t n = (size_t)s->n_total, pp = (size_t)s->pp;
    loom_sim_result *r = calloc(1, sizeof *r);
    if (r) {
        r->start = malloc((2 * n + 1) * sizeof *r->start);
        r->busy = calloc(3 * pp, sizeof *r->busy);
        r->peak_live = calloc(pp, sizeof *r->peak_live);
    }
    if (!r || !r->start || !r->busy || !r->peak_live) {
        loom_sim_free(r);
        return NULL;
    }
    r->end = r->start + n;
    r->rank_end = r->busy + pp;
    r->wake = r->busy + 2 * pp;
    r->pp = s->pp;
    r->n_total = s->n_total;
    return r;
}

/* From the replayed start/end times: each rank's busy time (the compute
 * actions' durations dur, or with dur NULL their wall time end - start, as
 * when ranks share processors, less less[k] when given: the waits for a
 * processor inside them), end, peak live sets; the makespan and the bubble
 * 1 - busy / (pp x makespan). */
static void result_finish(const loom_schedule *s, const double *dur, const double *less, loom_sim_result *r) {
    double total_busy = 0;
    for (int k = 0; k < s->pp; k++) {
        for (int i = s->offset[k]; i < s->offset[k + 1]; i++)
            if (is_compute(s->actions[i].kind)) r->busy[k] += dur ? dur[i] : r->end[i] - r->start[i];
        if (less) r->busy[k] -= less[k];
        r->rank_end[k] = s->offset[k + 1] > s->offset[k] ? r->end[s->offset[k + 1] - 1] : 0;
        if (r->rank_end[k] > r->makespan) r->makespan = r->rank_end[k];
        r->peak_live[k] = loom_schedule_peak_live(s, k);
        total_busy += r->busy[k];
    }
    r->bubble = r->makespan > 0 ? 1.0 - total_busy / ((double)s->pp * r->makespan) : 0.0;
}

/* Replay with durations dur (already validated by the caller's checks). */
static loom_status simulate(const loom_schedule *s, const double *dur, double comm, loom_sim_result **out) {
    loom_sim_result *r = result_alloc(s);
    if (!r) return loom_fail(LOOM_EOS, "out of memory simulating %d actions", s->n_total);
    loom_status st = loom_schedule_replay(s, dur, comm, r->start, r->end);
    if (st != LOOM_OK) {
        loom_sim_free(r);
        return st;
    }
    result_finish(s, dur, NULL, r);
    *out = r;
    return LOOM_OK;
}

/* ---- ranks that share processors ---------------------------------------------
 *
 * The replay of validate.c runs each rank as far as it can and times an
 * action from its own rank's clock, which is right when no rank slows
 * another. With shared processors an action's speed depends on what the
 * other ranks of its node do at each instant, so this replay moves all
 * ranks forward in time together, event by event: between two events (an
 * action ends, a message arrives) the set of computing ranks is fixed, and
 * on a node where k ranks compute each does min(1, cores/k) seconds of its
 * own work per second. Sends and receives are as in validate.c: a send
 * takes no time and its message arrives `comm` later; a receive ends when
 * its message has arrived. The lists were validated first, so every
 * receive has its send and nothing deadlocks (checked again: an instant
 * with nothing to wait for and ranks unfinished is an error). */

/* Index of the message an action sends or receives: boundary e between
 * virtual stages e and e+1, activations (g = 0) or gradients (g = 1). */
static int ps_msg(const loom_schedule *s, int r, const loom_pp_action *a) {
    const int S = s->pp * s->virtual_stages, stg = loom_pp_vstage(s->pp, r, a->chunk);
    const int g = a->kind == LOOM_PP_SEND_GRAD || a->kind == LOOM_PP_RECV_GRAD;
    const int e = a->kind == LOOM_PP_SEND_ACT || a->kind == LOOM_PP_RECV_GRAD ? stg : stg - 1;
    return (g * s->micro_batches + a->mb) * (S - 1) + e;
}

/* A rank's state in the shared-processor replay. */
enum {
    PS_BEFORE,    /* before its current action */
    PS_COMPUTE,   /* computing it (rem left of this piece, syncs more pieces after it) */
    PS_RECV,      /* waiting in a receive */
    PS_WAKE_RECV, /* waiting for a processor after its receive's message came (wait left; it holds none) */
    PS_WOKEN,     /* woken from that wait: the receive ends */
    PS_WAKE_SYNC, /* waiting for a processor at a synchronisation inside its action: the group's
                     members that arrived first poll for the collective on their processors, so
                     the group keeps its share of them meanwhile */
};
#define PS_BIT(x) (1u << (x))

/* The ranks of rank k's node (stages k / share * share ..) whose state is
 * in the set `states` (PS_BIT of each), k itself left out if skip_self. */
static int ps_count(const int *state, int k, int pp, int share, unsigned states, int skip_self) {
    int n = 0;
    for (int q = k / share * share; q < pp && q < (k / share + 1) * share; q++)
        n += !(skip_self && q == k) && (states & PS_BIT(state[q])) != 0;
    return n;
}

/* Speed of computing rank k: min(1, cores / the ranks of its node that
 * hold a share of the processors: those computing, and those whose group
 * waits inside a collective for its last member). */
static double ps_rate(const int *state, int k, int pp, int share, double cores) {
    const int busy = ps_count(state, k, pp, share, PS_BIT(PS_COMPUTE) | PS_BIT(PS_WAKE_SYNC), 0);
    return busy > cores ? cores / busy : 1.0;
}

/* What rank k waits for a processor when its synchronisation completes now:
 * loom_sim_wake_wait over its node's processors and the ranks that want one
 * (its own stage, and the node's other stages that compute or already wait
 * for a processor), each stage counted `replicas` times. */
static double ps_wake(const int *state, int k, int pp, int share, const loom_sim_costs *c) {
    if (!(c->slice > 0)) return 0;
    const int rep = c->replicas > 0 ? c->replicas : 1;
    const int want =
        1 + ps_count(state, k, pp, share, PS_BIT(PS_COMPUTE) | PS_BIT(PS_WAKE_RECV) | PS_BIT(PS_WAKE_SYNC), 1);
    return loom_sim_wake_wait(c->slice, c->span, c->cores * rep, (double)want * rep);
}

/* Synchronisations inside a compute action (costs.syncs_*; a schedule that
 * does not split the backward runs B's and W's in its B). */
static int ps_syncs(const loom_schedule *s, const loom_pp_action *a, const loom_sim_costs *c) {
    switch (a->kind) {
    case LOOM_PP_F: return c->syncs_f;
    case LOOM_PP_B: return s->split_backward ? c->syncs_b : c->syncs_b + c->syncs_w;
    case LOOM_PP_W: return c->syncs_w;
    default: return 0;
    }
}

static loom_status simulate_shared(const loom_schedule *s, const double *dur, const loom_sim_costs *c,
                                   loom_sim_result **out) {
    const int pp = s->pp, S = pp * s->virtual_stages;
    const size_t nmsg = 2 * (size_t)s->micro_batches * (size_t)(S > 1 ? S - 1 : 1);
    const int share = c->share > 0 && c->share < pp ? c->share : pp;
    loom_sim_result *r = result_alloc(s);
    /* per rank: work left of the current piece, the piece, processor wait
     * left, waits inside compute actions (not busy) */
    double *rem = calloc(4 * (size_t)pp, sizeof *rem), *arrive = malloc(nmsg * sizeof *arrive);
    double *piece = rem + pp, *wait = rem + 2 * pp, *wait_in = rem + 3 * pp;
    int *pc = calloc(3 * (size_t)pp, sizeof *pc);
    int *state = pc + pp, *syncs = pc + 2 * pp;
    loom_status st = LOOM_OK;
    if (!r || !rem || !arrive || !pc) st = loom_fail(LOOM_EOS, "out of memory simulating %d actions", s->n_total);
    /* state[k]: PS_* above (PS_BEFORE, 0, from calloc) */
    for (size_t k = 0; st == LOOM_OK && k < nmsg; k++) arrive[k] = -1; /* not sent */
    double t = 0;
    for (int left = pp; st == LOOM_OK && left > 0;) {
        /* everything that happens at time t */
        for (int moved = 1; moved;) {
            moved = 0;
            for (int k = 0; k < pp; k++)
                for (const int len = s->offset[k + 1] - s->offset[k]; pc[k] < len;) {
                    const int i = s->offset[k] + pc[k];
                    const loom_pp_action *a = &s->actions[i];
                    if (state[k] == PS_BEFORE) r->start[i] = t;
                    if (state[k] == PS_WAKE_RECV || state[k] == PS_WAKE_SYNC) {
                        if (wait[k] > 0) break;
                        state[k] = is_compute(a->kind) ? PS_COMPUTE : PS_WOKEN;
                        if (state[k] == PS_COMPUTE) rem[k] = piece[k];
                        moved = 1;
                    }
                    if (is_compute(a->kind)) {
                        if (state[k] == PS_BEFORE) {
                            syncs[k] = ps_syncs(s, a, c);
                            piece[k] = dur[i] / (syncs[k] + 1);
                            rem[k] = piece[k], state[k] = PS_COMPUTE;
                        }
                        if (rem[k] > 0) break;
                        if (syncs[k] > 0) { /* a synchronisation inside the action */
                            syncs[k]--;
                            const double w = ps_wake(state, k, pp, share, c);
                            if (w > 0) {
                                wait[k] = w, state[k] = PS_WAKE_SYNC, r->wake[k] += w, wait_in[k] += w;
                                break;
                            }
                            rem[k] = piece[k];
                            continue;
                        }
                    } else if (a->kind == LOOM_PP_SEND_ACT || a->kind == LOOM_PP_SEND_GRAD) {
                        arrive[ps_msg(s, k, a)] = t + c->comm;
                    } else if ((a->kind == LOOM_PP_RECV_ACT || a->kind == LOOM_PP_RECV_GRAD) && state[k] != PS_WOKEN) {
                        const double at = arrive[ps_msg(s, k, a)];
                        if (at < 0 || at > t) {
                            state[k] = PS_RECV;
                            break;
                        }
                        if (state[k] == PS_RECV) { /* it blocked: it needs a processor back */
                            const double w = ps_wake(state, k, pp, share, c);
                            if (w > 0) {
                                wait[k] = w, state[k] = PS_WAKE_RECV, r->wake[k] += w;
                                break;
                            }
                        }
                    }
                    r->end[i] = t;
                    state[k] = PS_BEFORE;
                    pc[k]++;
                    moved = 1;
                    if (pc[k] == len) left--;
                }
        }
        if (left == 0) break;
        /* the next event: a computation or a wait for a processor ends, or
         * an awaited message arrives */
        double dt = INFINITY;
        for (int k = 0; k < pp; k++) {
            if (state[k] == PS_COMPUTE) {
                const double rate = ps_rate(state, k, pp, share, c->cores);
                if (rem[k] / rate < dt) dt = rem[k] / rate;
            } else if (state[k] == PS_RECV) {
                const double at = arrive[ps_msg(s, k, &s->actions[s->offset[k] + pc[k]])];
                if (at >= 0 && at - t < dt) dt = at - t;
            } else if ((state[k] == PS_WAKE_RECV || state[k] == PS_WAKE_SYNC) && wait[k] < dt) {
                dt = wait[k];
            }
        }
        if (!isfinite(dt)) {
            st = loom_fail(LOOM_EDATA, "shared-processor replay stalled at time %g with %d ranks unfinished", t, left);
            break;
        }
        const double t1 = t + dt;
        for (int k = 0; k < pp; k++) {
            if (state[k] == PS_WAKE_RECV || state[k] == PS_WAKE_SYNC) {
                wait[k] = wait[k] <= dt * (1 + 1e-12) ? 0 : wait[k] - dt;
                continue;
            }
            if (state[k] != PS_COMPUTE) continue;
            const double rate = ps_rate(state, k, pp, share, c->cores);
            /* the one(s) that set dt end exactly now */
            rem[k] = rem[k] / rate <= dt * (1 + 1e-12) ? 0 : rem[k] - rate * dt;
        }
        t = t1;
    }
    if (st == LOOM_OK) result_finish(s, NULL, wait_in, r);
    free(rem);
    free(arrive);
    free(pc);
    if (st != LOOM_OK) {
        loom_sim_free(r);
        return st;
    }
    *out = r;
    return LOOM_OK;
}

loom_status loom_sim_run(const loom_schedule *s, const loom_sim_costs *c, loom_sim_result **out) {
    *out = NULL;
    LOOM_TRY(loom_sim_costs_check(c, s->pp * s->virtual_stages));
    LOOM_TRY(loom_schedule_validate(s)); /* before any field is used as an index */
    double *dur = malloc(((size_t)s->n_total + 1) * sizeof *dur);
    if (!dur) return loom_fail(LOOM_EOS, "out of memory simulating %d actions", s->n_total);
    for (int k = 0; k < s->pp; k++)
        for (int i = s->offset[k]; i < s->offset[k + 1]; i++)
            dur[i] = loom_sim_duration(s, k, &s->actions[i], c);
    loom_status st = c->cores > 0 ? simulate_shared(s, dur, c, out) : simulate(s, dur, c->comm, out);
    free(dur);
    return st;
}

loom_status loom_sim_run_durations(const loom_schedule *s, const double *dur, double comm,
                                   loom_sim_result **out) {
    *out = NULL;
    LOOM_TRY(check_cost("--cost-comm", comm));
    LOOM_TRY(loom_schedule_validate(s));
    for (int i = 0; i < s->n_total; i++)
        if (!(isfinite(dur[i]) && dur[i] >= 0 && dur[i] <= LOOM_SIM_MAX_COST))
            return loom_fail(LOOM_EUSAGE, "duration of action %d is %g: must be a finite number in [0, 1e9]", i,
                             dur[i]);
    return simulate(s, dur, comm, out);
}

double loom_sim_closed_form_bubble(loom_sched_kind k, int pp, int m, int v, const loom_sim_costs *c) {
    const double p1 = pp - 1;
    switch (k) {
    case LOOM_SCHED_GPIPE:
    case LOOM_SCHED_1F1B: return p1 / (m + p1);
    case LOOM_SCHED_INTERLEAVED: return p1 / ((double)v * m + p1);
    case LOOM_SCHED_ZB: {
        if (m < pp) return NAN;        /* the pipe never fills: no closed form */
        double x = c->f + c->b - c->w; /* idle time per rank is (p-1)*x */
        if (c->f > x) x = c->f;
        if (c->b > x) x = c->b;
        const double work = m * (c->f + c->b + c->w);
        return work + p1 * x > 0 ? p1 * x / (work + p1 * x) : 0.0;
    }
    default: return NAN;
    }
}

/* ---- text timeline -------------------------------------------------------- */

typedef struct text {
    char *buf;
    size_t cap, len;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const size_t room = t->len < t->cap ? t->cap - t->len : 0;
    const int k = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (k > 0) t->len += (size_t)k;
}

static int on_grid(double x, double q) {
    const double k = x / q;
    return fabs(k - nearbyint(k)) < 1e-9 * (1 + fabs(k));
}

/* The largest q = d/k (d the shortest computation, k = 1..64) with every
 * computation's start and end on the grid and at most max_cols columns; 0 if
 * there is none. */
static double grid_quantum(const loom_schedule *s, const loom_sim_result *r, int max_cols) {
    double d = 0;
    for (int i = 0; i < s->n_total; i++) {
        const double x = r->end[i] - r->start[i];
        if (is_compute(s->actions[i].kind) && x > 0 && (d == 0 || x < d)) d = x;
    }
    if (d == 0) return 0;
    for (int k = 1; k <= 64; k++) {
        const double q = d / k;
        if (r->makespan / q > max_cols + 1e-9) return 0;
        int ok = 1;
        for (int i = 0; i < s->n_total && ok; i++)
            if (is_compute(s->actions[i].kind)) ok = on_grid(r->start[i], q) && on_grid(r->end[i], q);
        if (ok) return q;
    }
    return 0;
}

/* The label of an action in the timeline, or 0 for one it does not show. */
static int cell_label(const loom_pp_action *a, int v, char *lab, size_t cap) {
    if (a->kind <= LOOM_PP_W) return loom_pp_action_format(a, v, lab, cap);
    if (a->kind == LOOM_PP_OPT_STEP) return snprintf(lab, cap, "OPT");
    return 0;
}

size_t loom_sim_format_timeline(const loom_schedule *s, const loom_sim_result *r, int max_cols, char *buf,
                                size_t cap) {
    text t = {buf, cap, 0};
    if (cap) buf[0] = '\0';
    if (!(r->makespan > 0)) {
        put(&t, "makespan 0: nothing to draw\n");
        return t.len;
    }
    if (max_cols < 1) max_cols = 1;
    double q = grid_quantum(s, r, max_cols);
    const int exact = q > 0;
    if (!exact) q = r->makespan / max_cols;
    const int cols = (int)ceil(r->makespan / q - 1e-9);
    int width = 2;
    char lab[32];
    for (int i = 0; i < s->n_total; i++) {
        const int k = cell_label(&s->actions[i], s->virtual_stages, lab, sizeof lab);
        if (k > width && r->end[i] > r->start[i]) width = k;
    }
    int digits = 1;
    for (int x = s->pp - 1; x >= 10; x /= 10) digits++;
    put(&t, "one column = %g time unit%s%s; \"..\" = idle\n", q, q == 1 ? "" : "s",
        exact ? "" : " (rounded: costs are not on a common grid)");
    for (int rk = 0; rk < s->pp; rk++) {
        put(&t, "stage %*d:", digits, rk);
        int i = s->offset[rk];
        const int n_end = s->offset[rk + 1];
        for (int col = 0; col < cols; col++) {
            const double mid = (col + 0.5) * q;
            /* actions of a rank are sequential in time: skip the ones over */
            while (i < n_end && (!cell_label(&s->actions[i], 1, lab, sizeof lab) || r->end[i] <= mid)) i++;
            if (!(i < n_end && r->start[i] <= mid &&
                  cell_label(&s->actions[i], s->virtual_stages, lab, sizeof lab)))
                snprintf(lab, sizeof lab, "..");
            put(&t, " %-*s", width, lab);
        }
        put(&t, "\n");
    }
    return t.len;
}

/* ---- Chrome trace --------------------------------------------------------- */

static void trace_events(FILE *f, const loom_schedule *s, const loom_sim_result *r) {
    const double us = 1000.0; /* one cost unit = 1 ms */
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"loom sim %s pp=%d m=%d "
            "v=%d\"}}",
            loom_schedule_name(s->kind), s->pp, s->micro_batches, s->virtual_stages);
    for (int rk = 0; rk < s->pp; rk++)
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"stage "
                "%d\"}}",
                rk, rk);
    for (int rk = 0; rk < s->pp; rk++)
        for (int i = s->offset[rk]; i < s->offset[rk + 1]; i++) {
            const loom_pp_action *a = &s->actions[i];
            const double dur = r->end[i] - r->start[i];
            const int recv = a->kind == LOOM_PP_RECV_ACT || a->kind == LOOM_PP_RECV_GRAD;
            if (!is_compute(a->kind) && !(recv && dur > 0)) continue;
            char name[96];
            loom_pp_action_format(a, s->virtual_stages, name, sizeof name);
            fprintf(f,
                    ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":0,"
                    "\"tid\":%d",
                    recv ? (a->kind == LOOM_PP_RECV_ACT ? "wait act" : "wait grad") : name,
                    recv ? "wait" : loom_pp_kind_name(a->kind), r->start[i] * us, dur * us, rk);
            if (a->kind == LOOM_PP_OPT_STEP)
                fprintf(f, "}");
            else
                fprintf(f, ",\"args\":{\"mb\":%d,\"chunk\":%d,\"stage\":%d}}", a->mb, a->chunk,
                        loom_pp_vstage(s->pp, rk, a->chunk));
        }
    fprintf(f, "\n]}\n");
}

loom_status loom_sim_write_trace(const loom_schedule *s, const loom_sim_result *r, const char *path) {
    if (!path || !path[0]) return loom_fail(LOOM_EUSAGE, "--trace needs a file name");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return loom_fail(LOOM_ECANTCREAT, "trace %s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return loom_fail(LOOM_ECANTCREAT, "trace %s: cannot create %s: %s", path, tmp, strerror(errno));
    trace_events(f, s, r);
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        const int e = errno;
        unlink(tmp);
        return loom_fail(LOOM_EIO, "trace %s: write failed: %s", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return loom_fail(LOOM_ECANTCREAT, "trace %s: cannot rename %s into place: %s", path, tmp,
                         strerror(e));
    }
    return LOOM_OK;
}

/* ---- measured traces (loom sim --from-trace) ------------------------------ */

typedef struct tr_file {
    int world;     /* R of trace_rank<R>.json */
    int n, cap;    /* pipeline actions, in time order */
    char **name;
    double *t0, *t1; /* ms */
    double sync;   /* end of the first pp all-reduce after the actions; NAN if none */
    int rank;      /* matched pipeline rank */
} tr_file;

static void tr_file_free(tr_file *f) {
    for (int i = 0; i < f->n; i++) free(f->name[i]);
    free(f->name);
    free(f->t0);
    free(f->t1);
    memset(f, 0, sizeof *f);
}

/* 1 if name is a label loom_pp_action_format can produce. */
static int is_action_label(const char *n) {
    if ((n[0] == 'F' || n[0] == 'B' || n[0] == 'W') && n[1] >= '0' && n[1] <= '9') {
        const char *p = n + 1;
        while (*p >= '0' && *p <= '9') p++;
        if (*p == '.') {
            if (!(p[1] >= '0' && p[1] <= '9')) return 0;
            for (p++; *p >= '0' && *p <= '9'; p++) {}
        }
        return *p == '\0';
    }
    return strncmp(n, "SEND_ACT ", 9) == 0 || strncmp(n, "RECV_ACT ", 9) == 0 ||
           strncmp(n, "SEND_GRAD ", 10) == 0 || strncmp(n, "RECV_GRAD ", 10) == 0 || strcmp(n, "OPT_STEP") == 0;
}

static loom_status tr_push(tr_file *f, const char *path, const char *name, double t0, double t1) {
    if (f->n == f->cap) {
        const int cap = f->cap ? 2 * f->cap : 256;
        char **nm = realloc(f->name, (size_t)cap * sizeof *nm);
        if (nm) f->name = nm;
        double *a = realloc(f->t0, (size_t)cap * sizeof *a);
        if (a) f->t0 = a;
        double *b = realloc(f->t1, (size_t)cap * sizeof *b);
        if (b) f->t1 = b;
        if (!nm || !a || !b) return loom_fail(LOOM_EOS, "%s: out of memory", path);
        f->cap = cap;
    }
    if (!(f->name[f->n] = strdup(name))) return loom_fail(LOOM_EOS, "%s: out of memory", path);
    f->t0[f->n] = t0;
    f->t1[f->n] = t1;
    f->n++;
    return LOOM_OK;
}

/* Sort the actions by start time, keeping file order among equal starts. */
static void tr_sort(tr_file *f) {
    for (int i = 1; i < f->n; i++) { /* insertion sort: already sorted in practice */
        char *nm = f->name[i];
        const double a = f->t0[i], b = f->t1[i];
        int j = i;
        for (; j > 0 && f->t0[j - 1] > a; j--) {
            f->name[j] = f->name[j - 1];
            f->t0[j] = f->t0[j - 1];
            f->t1[j] = f->t1[j - 1];
        }
        f->name[j] = nm;
        f->t0[j] = a;
        f->t1[j] = b;
    }
}

static loom_status slurp(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            return loom_fail(LOOM_EOS, "%s: out of memory", path);
        }
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) break;
        if (cap >= ((size_t)1 << 31)) {
            free(buf);
            fclose(fp);
            return loom_fail(LOOM_EDATA, "%s: larger than 2 GiB: not a trace of one step", path);
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    const int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return loom_fail(LOOM_ENOINPUT, "%s: read failed", path);
    }
    *out = buf;
    *len = n;
    return LOOM_OK;
}

/* Read one trace file: its pipeline actions (sorted by time) and the end of
 * the first all-reduce of the "pp" group that starts after them. */
static loom_status tr_read(const char *path, tr_file *f) {
    char *buf = NULL;
    size_t len = 0;
    LOOM_TRY(slurp(path, &buf, &len));
    cJSON *root = cJSON_ParseWithLength(buf, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        const long off = at && at >= buf && at <= buf + len ? (long)(at - buf) : -1;
        free(buf);
        return loom_fail(LOOM_EDATA, "%s: not valid JSON (near byte %ld): not a Chrome trace", path, off);
    }
    free(buf);
    const cJSON *events = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    loom_status st = LOOM_OK;
    if (!cJSON_IsArray(events))
        st = loom_fail(LOOM_EDATA, "%s: no \"traceEvents\" array: not a Chrome trace", path);
    double *ar0 = NULL, *ar1 = NULL; /* pp all-reduces */
    int n_ar = 0, cap_ar = 0, idx = -1;
    const cJSON *e;
    const cJSON *walk = st == LOOM_OK ? events : NULL;
    cJSON_ArrayForEach(e, walk) {
        idx++;
        if (!cJSON_IsObject(e)) {
            st = loom_fail(LOOM_EDATA, "%s: event %d is not a JSON object", path, idx);
            break;
        }
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        if (!cJSON_IsString(ph)) {
            st = loom_fail(LOOM_EDATA, "%s: event %d has no \"ph\" string", path, idx);
            break;
        }
        if (strcmp(ph->valuestring, "X") != 0) continue;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"),
                    *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"),
                    *du = cJSON_GetObjectItemCaseSensitive(e, "dur"),
                    *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        if (!cJSON_IsString(nm)) {
            st = loom_fail(LOOM_EDATA, "%s: event %d has no \"name\" string", path, idx);
            break;
        }
        if (!cJSON_IsNumber(ts) || !isfinite(ts->valuedouble) || fabs(ts->valuedouble) > 1e15) {
            st = loom_fail(LOOM_EDATA, "%s: event %d (%s): \"ts\" must be a finite number of microseconds", path,
                           idx, nm->valuestring);
            break;
        }
        if (!cJSON_IsNumber(du) || !isfinite(du->valuedouble) || du->valuedouble < 0 || du->valuedouble > 1e15) {
            st = loom_fail(LOOM_EDATA, "%s: event %d (%s): \"dur\" must be a finite number of microseconds >= 0",
                           path, idx, nm->valuestring);
            break;
        }
        const double t0 = ts->valuedouble / 1000.0, t1 = (ts->valuedouble + du->valuedouble) / 1000.0;
        if (is_action_label(nm->valuestring)) {
            if ((st = tr_push(f, path, nm->valuestring, t0, t1)) != LOOM_OK) break;
        } else if (cJSON_IsString(cat) && strcmp(cat->valuestring, "pp") == 0 &&
                   strncmp(nm->valuestring, "allreduce", 9) == 0) {
            if (n_ar == cap_ar) {
                cap_ar = cap_ar ? 2 * cap_ar : 16;
                double *a = realloc(ar0, (size_t)cap_ar * sizeof *a);
                if (a) ar0 = a;
                double *b = realloc(ar1, (size_t)cap_ar * sizeof *b);
                if (b) ar1 = b;
                if (!a || !b) {
                    st = loom_fail(LOOM_EOS, "%s: out of memory", path);
                    break;
                }
            }
            ar0[n_ar] = t0;
            ar1[n_ar++] = t1;
        }
    }
    cJSON_Delete(root);
    f->sync = NAN;
    if (st == LOOM_OK) {
        tr_sort(f);
        const double last = f->n ? f->t1[f->n - 1] : 0;
        double first = INFINITY;
        for (int i = 0; i < n_ar; i++)
            if (ar0[i] >= last - 1e-6 && ar0[i] < first) {
                first = ar0[i];
                f->sync = ar1[i];
            }
    }
    free(ar0);
    free(ar1);
    return st;
}

/* Length of the common prefix of f's actions and rank r's list (v for the
 * labels); the first difference is described in why (if not NULL). Returns 1
 * when they are equal. */
static int tr_match(const tr_file *f, const loom_schedule *s, int r, int *prefix, char *why, size_t cap) {
    int n;
    const loom_pp_action *a = loom_schedule_rank(s, r, &n);
    char lab[96];
    int i = 0;
    for (; i < n && i < f->n; i++) {
        loom_pp_action_format(&a[i], s->virtual_stages, lab, sizeof lab);
        if (strcmp(lab, f->name[i]) != 0) break;
    }
    *prefix = i;
    if (i == n && i == f->n) return 1;
    if (why) {
        if (i < n && i < f->n)
            snprintf(why, cap, "its action %d is '%s' where rank %d runs '%s'", i, f->name[i], r,
                     (loom_pp_action_format(&a[i], s->virtual_stages, lab, sizeof lab), lab));
        else if (i < n)
            snprintf(why, cap, "it ends after %d actions where rank %d runs %d", f->n, r, n);
        else
            snprintf(why, cap, "it has %d actions where rank %d runs %d (the next is '%s')", f->n, r, n, f->name[i]);
    }
    return 0;
}

/* Match every file to a pipeline rank of s; 1 if each matches one and every
 * rank has n_files / pp of them. */
static int tr_match_all(tr_file *files, int n_files, const loom_schedule *s) {
    if (n_files % s->pp) return 0;
    int *count = calloc((size_t)s->pp, sizeof *count), ok = count != NULL;
    for (int i = 0; ok && i < n_files; i++) {
        int prefix, found = -1;
        for (int r = 0; r < s->pp && found < 0; r++)
            if (tr_match(&files[i], s, r, &prefix, NULL, 0)) found = r;
        files[i].rank = found;
        ok = found >= 0 && ++count[found] <= n_files / s->pp;
    }
    free(count);
    return ok;
}

/* Some layout (schedule, pp, m, v) other than s's that every file fits, as
 * flags in hint; "" if none. */
static void tr_guess(tr_file *files, int n_files, const loom_schedule *cur, char *hint, size_t cap) {
    hint[0] = '\0';
    if (n_files < 1) return;
    int n_f = 0, v = 1;
    for (int i = 0; i < files[0].n; i++) {
        const char *nm = files[0].name[i];
        if (nm[0] != 'F' || nm[1] < '0' || nm[1] > '9') continue;
        n_f++;
        const char *dot = strchr(nm, '.');
        if (dot && atoi(dot + 1) + 1 > v) v = atoi(dot + 1) + 1;
    }
    if (n_f == 0 || n_f % v) return;
    const int m = n_f / v;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", loom_errmsg()); /* the checks below overwrite it */
    for (int k = 0; k < LOOM_SCHED_COUNT && !hint[0]; k++)
        for (int pp = 1; pp <= n_files && pp <= LOOM_PP_MAX_PP && !hint[0]; pp++) {
            if (n_files % pp || ((loom_sched_kind)k == cur->kind && pp == cur->pp && m == cur->micro_batches &&
                                 v == cur->virtual_stages))
                continue;
            loom_schedule *s = NULL;
            if (loom_schedule_check((loom_sched_kind)k, pp, m, v) != LOOM_OK ||
                loom_schedule_build((loom_sched_kind)k, pp, m, v, &s) != LOOM_OK)
                continue;
            if (tr_match_all(files, n_files, s))
                snprintf(hint, cap, "; the traces match --schedule %s --pp %d --micro-batches %d%s",
                         loom_schedule_name(s->kind), pp, m, v > 1 ? " --virtual-stages" : "");
            if (hint[0] && v > 1) {
                const size_t l = strlen(hint);
                snprintf(hint + l, cap > l ? cap - l : 0, " %d", v);
            }
            loom_schedule_free(s);
        }
    loom_fail(LOOM_OK, "%s", saved);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    if (n <= 0) return 0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

void loom_sim_trace_free(loom_sim_trace *t) {
    if (!t) return;
    free(t->mean);
    free(t->dur);
    free(t);
}

/* The trace files of dir: count (0..n-1 all present) or a failure. */
static loom_status tr_list(const char *dir, int *n_out) {
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return loom_fail(LOOM_ENOINPUT, "--from-trace %s: cannot open the directory: %s", dir, strerror(errno));
    int count = 0, max = -1;
    const struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int r, end = 0;
        if (sscanf(de->d_name, "trace_rank%d.json%n", &r, &end) != 1 || de->d_name[end] != '\0' || r < 0 ||
            r >= (1 << 20))
            continue;
        char canon[64];
        snprintf(canon, sizeof canon, "trace_rank%d.json", r);
        if (strcmp(canon, de->d_name) != 0) continue; /* "trace_rank01.json" is not ours */
        count++;
        if (r > max) max = r;
    }
    closedir(d);
    if (count == 0)
        return loom_fail(LOOM_ENOINPUT,
                         "--from-trace %s: no trace_rank<R>.json files (write them with loom train --trace %s)",
                         dir, dir);
    if (count != max + 1) {
        for (int r = 0; r <= max; r++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/trace_rank%d.json", dir, r);
            if (access(path, F_OK) != 0)
                return loom_fail(LOOM_ENOINPUT,
                                 "--from-trace %s: trace_rank%d.json is missing (the directory has traces up to "
                                 "trace_rank%d.json; a run writes one per rank)",
                                 dir, r, max);
        }
    }
    *n_out = max + 1;
    return LOOM_OK;
}

loom_status loom_sim_trace_read(const loom_schedule *s, const char *dir, loom_sim_trace **out) {
    *out = NULL;
    LOOM_TRY(loom_schedule_validate(s));
    int n_files;
    LOOM_TRY(tr_list(dir, &n_files));
    const int pp = s->pp, S = pp * s->virtual_stages;
    tr_file *files = calloc((size_t)n_files, sizeof *files);
    if (!files) return loom_fail(LOOM_EOS, "out of memory reading %d traces", n_files);
    loom_status st = LOOM_OK;
    char path[4200];
    for (int i = 0; i < n_files && st == LOOM_OK; i++) {
        snprintf(path, sizeof path, "%s/trace_rank%d.json", dir, i);
        files[i].world = i;
        st = tr_read(path, &files[i]);
    }
    /* which pipeline rank wrote each file */
    char desc[160];
    snprintf(desc, sizeof desc, "%s pp=%d micro-batches=%d virtual-stages=%d", loom_schedule_name(s->kind), pp,
             s->micro_batches, s->virtual_stages);
    int *per = calloc((size_t)pp, sizeof *per);
    if (st == LOOM_OK && !per) st = loom_fail(LOOM_EOS, "out of memory");
    for (int i = 0; i < n_files && st == LOOM_OK; i++) {
        int best = -1, best_prefix = -1, prefix;
        files[i].rank = -1;
        for (int r = 0; r < pp && files[i].rank < 0; r++) {
            if (tr_match(&files[i], s, r, &prefix, NULL, 0)) files[i].rank = r;
            else if (prefix > best_prefix) best = r, best_prefix = prefix;
        }
        if (files[i].rank >= 0) {
            per[files[i].rank]++;
            continue;
        }
        char why[400], hint[200];
        if (files[i].n == 0) snprintf(why, sizeof why, "it has no pipeline actions (F0, SEND_ACT ..., OPT_STEP)");
        else tr_match(&files[i], s, best, &prefix, why, sizeof why);
        tr_guess(files, n_files, s, hint, sizeof hint);
        st = loom_fail(LOOM_EDATA, "%s/trace_rank%d.json is not a trace of %s: %s%s", dir, i, desc, why,
                       hint[0] ? hint
                               : "; pass the --schedule, --pp, --micro-batches and --virtual-stages of the run "
                                 "that wrote it");
    }
    for (int r = 0; r < pp && st == LOOM_OK; r++)
        if (per[r] * pp != n_files) {
            char hint[200], why[200];
            tr_guess(files, n_files, s, hint, sizeof hint);
            if (n_files % pp)
                snprintf(why, sizeof why, "%d trace file(s) is not a multiple of pp=%d", n_files, pp);
            else
                snprintf(why, sizeof why, "pipeline rank %d wrote %d of the %d trace files, not %d", r, per[r],
                         n_files, n_files / pp);
            st = loom_fail(LOOM_EDATA, "--from-trace %s is not a trace of %s: %s%s", dir, desc, why,
                           hint[0] ? hint : "");
        }
    const int G = n_files / pp;
    int *gf = malloc((size_t)n_files * sizeof *gf); /* gf[k*pp + r]: file of rank r in group k */
    loom_sim_trace *t = calloc(1, sizeof *t);
    double *sums = calloc(3 * (size_t)S, sizeof *sums), *delays = NULL, *lat = NULL, *send_end = NULL;
    const int tags = loom_pp_tag_limit(s) + 1;
    if (st == LOOM_OK) {
        delays = malloc(((size_t)G * (size_t)tags + 1) * sizeof *delays);
        lat = malloc(((size_t)G * (size_t)tags + 1) * sizeof *lat);
        send_end = malloc((size_t)tags * sizeof *send_end);
        if (t) {
            t->mean = calloc((size_t)S, sizeof *t->mean);
            t->dur = calloc((size_t)s->n_total + 1, sizeof *t->dur);
        }
        if (!gf || !t || !sums || !delays || !lat || !send_end || !t->mean || !t->dur)
            st = loom_fail(LOOM_EOS, "out of memory reading %d traces", n_files);
    }
    if (st == LOOM_OK) {
        memset(per, 0, (size_t)pp * sizeof *per);
        for (int i = 0; i < n_files; i++) gf[per[files[i].rank]++ * pp + files[i].rank] = i;
        t->n_files = n_files;
        t->per_rank = G;
        t->n_stages = S;
        t->aligned = 1;
        /* per-stage means over every file, and the measured bubble per group */
        int n_compute = 0;
        double compute = 0, bubble = 0;
        for (int k = 0; k < G; k++) {
            double busy = 0, span = 0;
            for (int r = 0; r < pp; r++) {
                const tr_file *f = &files[gf[k * pp + r]];
                int n;
                const loom_pp_action *a = loom_schedule_rank(s, r, &n);
                for (int i = 0; i < n; i++) {
                    const double d = f->t1[i] - f->t0[i];
                    if (a[i].kind <= LOOM_PP_W) {
                        sums[3 * loom_pp_vstage(pp, r, a[i].chunk) + (int)a[i].kind] += d;
                        busy += d;
                        compute += d;
                        n_compute++;
                    }
                    if (k == 0)
                        t->dur[s->offset[r] + i] =
                            a[i].kind <= LOOM_PP_W || a[i].kind == LOOM_PP_SEND_ACT || a[i].kind == LOOM_PP_SEND_GRAD
                                ? d
                                : 0.0;
                }
                if (n && f->t1[n - 1] - f->t0[0] > span) span = f->t1[n - 1] - f->t0[0];
            }
            bubble += span > 0 ? 1.0 - busy / (pp * span) : 0.0;
        }
        t->bubble = bubble / G;
        t->compute_mean = n_compute ? compute / n_compute : 0;
        const double per_stage = (double)G * s->micro_batches; /* samples of each kind per virtual stage */
        for (int v = 0; v < S; v++) {
            t->mean[v].f = sums[3 * v] / per_stage;
            t->mean[v].b = sums[3 * v + 1] / per_stage;
            t->mean[v].w = s->split_backward ? sums[3 * v + 2] / per_stage : 0.0;
        }
        /* messages: clocks aligned per group on the pp all-reduce after the step */
        int n_del = 0, n_lat = 0;
        for (int k = 0; k < G; k++) {
            const double ref = files[gf[k * pp]].sync;
            int aligned = isfinite(ref);
            for (int r = 0; r < pp; r++) aligned = aligned && isfinite(files[gf[k * pp + r]].sync);
            if (!aligned) t->aligned = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int r = 0; r < pp; r++) {
                    const tr_file *f = &files[gf[k * pp + r]];
                    const double off = aligned ? f->sync - ref : 0.0;
                    int n;
                    const loom_pp_action *a = loom_schedule_rank(s, r, &n);
                    for (int i = 0; i < n; i++) {
                        const int tag = loom_pp_tag(s, r, &a[i]);
                        if (tag < 0) continue;
                        const int is_send = a[i].kind == LOOM_PP_SEND_ACT || a[i].kind == LOOM_PP_SEND_GRAD;
                        if (pass == 0 && is_send) send_end[tag] = f->t1[i] - off;
                        if (pass == 1 && !is_send) {
                            const double rs = f->t0[i] - off, re = f->t1[i] - off, se = send_end[tag];
                            delays[n_del++] = re - (se > rs ? se : rs);
                            if (rs < se) lat[n_lat++] = re - se;
                        }
                    }
                }
        }
        t->n_msgs = n_del;
        t->late_threshold = 0.1 * t->compute_mean > 0.05 ? 0.1 * t->compute_mean : 0.05;
        for (int i = 0; i < n_del; i++) {
            if (delays[i] > t->late_threshold) t->n_late++;
            if (delays[i] > t->delay_max) t->delay_max = delays[i];
        }
        t->delay_median = median(delays, n_del);
        t->comm_samples = n_lat;
        t->comm = n_lat ? median(lat, n_lat) : 0.0;
        if (t->comm < 0) t->comm = 0;
        for (int i = 0; i < s->n_total; i++)
            if (t->dur[i] < 0) t->dur[i] = 0;
    }
    for (int i = 0; i < n_files; i++) tr_file_free(&files[i]);
    free(files);
    free(per);
    free(gf);
    free(sums);
    free(delays);
    free(lat);
    free(send_end);
    if (st != LOOM_OK) {
        loom_sim_trace_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}
