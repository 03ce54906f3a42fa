/* sim.c - the pipeline simulator (pp axis; pure, not collective): durations
 * from a cost model, the replay engine of src/pipeline/validate.c for the
 * times (sim_shared.c when ranks time-share processors), then the bubble, a
 * text timeline and a Chrome trace of the result. It never builds or
 * reorders a schedule itself: it times the lists the executor runs.
 * Measured traces (--from-trace) are read by sim_trace.c.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan/sim_internal.h"

void loom_sim_costs_default(loom_sim_costs *c) {
    *c = (loom_sim_costs){.f = 1, .b = 1, .w = 1}; /* every other cost, count and pointer 0 */
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
    if (c->share < 0)
        return loom_fail(LOOM_EUSAGE, "--share %d: must be >= 0 (0: every rank on one node)", c->share);
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
                return loom_fail(LOOM_EUSAGE,
                                 "cost %c of stage %d is %g: must be a finite number in [0, 1e9]", "fbw"[k],
                                 s, x[k]);
    }
    return LOOM_OK;
}

double loom_sim_duration(const loom_schedule *s, int rank, const loom_pp_action *a, const loom_sim_costs *c) {
    const int in_range = a->chunk >= 0 && a->chunk < s->virtual_stages && rank >= 0 && rank < s->pp;
    if (c->stage && in_range && a->kind <= LOOM_PP_W) {
        const loom_sim_stage_cost *x = &c->stage[loom_pp_vstage(s, rank, a->chunk)];
        return a->kind == LOOM_PP_F   ? x->f
               : a->kind == LOOM_PP_W ? x->w
               : s->split_backward    ? x->b
                                      : x->b + x->w;
    }
    const double scale = a->kind <= LOOM_PP_W && c->stage_scale && in_range
                             ? c->stage_scale[loom_pp_vstage(s, rank, a->chunk)]
                             : 1.0;
    switch (a->kind) {
    case LOOM_PP_F: return c->f * scale;
    case LOOM_PP_B: return (s->split_backward ? c->b : c->b + c->w) * scale;
    case LOOM_PP_W: return c->w * scale;
    case LOOM_PP_OPT_STEP: return c->opt;
    default: return 0.0;
    }
}

void loom_sim_free(loom_sim_result *r) {
    if (!r) return;
    free(r->start);
    free(r->busy);
    free(r->peak_live);
    free(r);
}

/* A result for s's actions (start/end times, per-rank busy and end, peak
 * live), zeroed; NULL without memory. */
loom_sim_result *sim_result_alloc(const loom_schedule *s) {
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
void sim_result_finish(const loom_schedule *s, const double *dur, const double *less, loom_sim_result *r) {
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
    loom_sim_result *r = sim_result_alloc(s);
    if (!r) return loom_fail(LOOM_EOS, "out of memory simulating %d actions", s->n_total);
    loom_status st = loom_schedule_replay(s, dur, comm, r->start, r->end);
    if (st != LOOM_OK) {
        loom_sim_free(r);
        return st;
    }
    sim_result_finish(s, dur, NULL, r);
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
    loom_status st = c->cores > 0 ? sim_simulate_shared(s, dur, c, out) : simulate(s, dur, c->comm, out);
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
            return loom_fail(LOOM_EUSAGE, "duration of action %d is %g: must be a finite number in [0, 1e9]",
                             i, dur[i]);
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
            if (a->kind == LOOM_PP_OPT_STEP) fprintf(f, "}");
            else
                fprintf(f, ",\"args\":{\"mb\":%d,\"chunk\":%d,\"stage\":%d}}", a->mb, a->chunk,
                        loom_pp_vstage(s, rk, a->chunk));
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
