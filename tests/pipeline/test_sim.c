/* test_sim.c - the pipeline simulator: bubbles equal their closed forms
 * (gpipe, 1f1b, interleaved for any f, b, w; zb for f = b = w and over random
 * costs), zb beats 1f1b, peak live activations, hand-timed runs with
 * non-uniform costs, message latency and stage scales, ranks that share
 * processors (costs.cores), the text timeline and the Chrome trace. Pure, no MPI.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "loom/sim.h"

static loom_sim_result *simulate(loom_sched_kind k, int p, int m, int v, const loom_sim_costs *c,
                                 loom_schedule **keep) {
    loom_schedule *s = NULL;
    loom_sim_result *r = NULL;
    if (loom_schedule_build(k, p, m, v, &s) != LOOM_OK || loom_sim_run(s, c, &r) != LOOM_OK) {
        CHECK(0, "%s p=%d m=%d v=%d: %s", loom_schedule_name(k), p, m, v, loom_errmsg());
        loom_schedule_free(s);
        return NULL;
    }
    if (keep) *keep = s;
    else loom_schedule_free(s);
    return r;
}

/* The next of a fixed pseudo-random sequence, in 0..n-1. */
static int draw(unsigned *x, int n) {
    *x = *x * 1103515245u + 12345u;
    return (int)(*x >> 16) % n;
}

/* f, b, w drawn from the quarters 0.25 .. 2. */
static void draw_costs(unsigned *x, loom_sim_costs *c) {
    c->f = (1 + draw(x, 8)) / 4.0;
    c->b = (1 + draw(x, 8)) / 4.0;
    c->w = (1 + draw(x, 8)) / 4.0;
}

/* ---- closed forms ------------------------------------------------------------ */

static void test_gpipe_1f1b(void) {
    const double cost[][3] = {{1, 1, 1}, {1, 0.5, 1.5}, {2, 1, 0}, {0.5, 3, 1}};
    for (int kc = 0; kc < 2; kc++) {
        const loom_sched_kind k = kc ? LOOM_SCHED_1F1B : LOOM_SCHED_GPIPE;
        for (size_t ci = 0; ci < sizeof cost / sizeof cost[0]; ci++)
            for (int p = 1; p <= 8; p++)
                for (int m = 1; m <= 4 * p; m++) {
                    loom_sim_costs c;
                    loom_sim_costs_default(&c);
                    c.f = cost[ci][0], c.b = cost[ci][1], c.w = cost[ci][2];
                    loom_sim_result *r = simulate(k, p, m, 1, &c, NULL);
                    if (!r) continue;
                    const double want = (double)(p - 1) / (m + p - 1);
                    CHECK(fabs(r->bubble - want) < 1e-12,
                          "%s p=%d m=%d costs %zu: bubble %.15f, closed %.15f", loom_schedule_name(k), p, m,
                          ci, r->bubble, want);
                    CHECK(fabs(r->makespan - (m + p - 1) * (c.f + c.b + c.w)) < 1e-9,
                          "%s p=%d m=%d: makespan %g", loom_schedule_name(k), p, m, r->makespan);
                    CHECK(fabs(loom_sim_closed_form_bubble(k, p, m, 1, &c) - want) < 1e-15,
                          "closed form function");
                    for (int q = 0; q < p; q++) {
                        const int peak = k == LOOM_SCHED_GPIPE ? m : (p - q < m ? p - q : m);
                        CHECK(r->peak_live[q] == peak, "%s p=%d m=%d rank %d: peak %d, want %d",
                              loom_schedule_name(k), p, m, q, r->peak_live[q], peak);
                        CHECK(fabs(r->busy[q] - m * (c.f + c.b + c.w)) < 1e-9, "busy of rank %d", q);
                    }
                    loom_sim_free(r);
                }
    }
}

static void test_interleaved(void) {
    const double cost[][3] = {{1, 1, 1}, {1, 0.25, 0.25}, {1, 1.5, 1.5}, {0.5, 1, 2}};
    for (size_t ci = 0; ci < sizeof cost / sizeof cost[0]; ci++)
        for (int p = 1; p <= 8; p++)
            for (int v = 1; v <= 3; v++)
                for (int m = p; m <= 4 * p; m += p) {
                    loom_sim_costs c;
                    loom_sim_costs_default(&c);
                    c.f = cost[ci][0], c.b = cost[ci][1], c.w = cost[ci][2];
                    loom_sim_result *r = simulate(LOOM_SCHED_INTERLEAVED, p, m, v, &c, NULL);
                    if (!r) continue;
                    /* each rank works v*m units of f+b+w and idles (p-1) of them */
                    const double want = (double)(p - 1) / ((double)v * m + p - 1);
                    CHECK(fabs(r->bubble - want) < 1e-12,
                          "interleaved p=%d m=%d v=%d costs %zu: bubble %.15f, closed %.15f", p, m, v, ci,
                          r->bubble, want);
                    CHECK(fabs(r->makespan - (v * m + p - 1) * (c.f + c.b + c.w)) < 1e-9, "makespan %g",
                          r->makespan);
                    loom_sim_free(r);
                }
    /* v divides the bubble time of 1f1b: p=4 m=8, v=1 -> 3 of 11 units, v=2 -> 3 of 19 */
    loom_sim_costs c;
    loom_sim_costs_default(&c);
    loom_sim_result *a = simulate(LOOM_SCHED_1F1B, 4, 8, 1, &c, NULL),
                    *b = simulate(LOOM_SCHED_INTERLEAVED, 4, 8, 2, &c, NULL);
    if (a && b) {
        /* idle time per rank in units of one full-stage forward+backward (3 for v=1, 3*2 chunk units for v=2) */
        const double idle_a = a->makespan - 8 * 3.0, idle_b = (b->makespan - 16 * 3.0) / 2;
        CHECK(fabs(idle_a - 9) < 1e-12 && fabs(idle_b - 4.5) < 1e-12, "idle %g vs %g: interleaving halves it",
              idle_a, idle_b);
    }
    loom_sim_free(a);
    loom_sim_free(b);
}

static void test_zb(void) {
    loom_sim_costs c;
    loom_sim_costs_default(&c); /* f = b = w = 1 */
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 4 * p; m++) {
            loom_sim_result *z = simulate(LOOM_SCHED_ZB, p, m, 1, &c, NULL),
                            *o = simulate(LOOM_SCHED_1F1B, p, m, 1, &c, NULL);
            if (!z || !o) continue;
            const double want = (double)(p - 1) / (3.0 * m + p - 1);
            CHECK(fabs(z->bubble - want) < 1e-12, "zb p=%d m=%d: bubble %.15f, closed %.15f", p, m, z->bubble,
                  want);
            if (p > 1)
                CHECK(z->bubble < o->bubble, "zb p=%d m=%d: %g not below 1f1b's %g", p, m, z->bubble,
                      o->bubble);
            /* a third of 1f1b's idle time */
            CHECK(fabs(3 * (z->makespan - 3 * m) - (o->makespan - 3 * m)) < 1e-12, "zb p=%d m=%d idle", p, m);
            for (int q = 0; q < p; q++)
                CHECK(z->peak_live[q] == p && z->peak_live[q] <= o->peak_live[0],
                      "zb p=%d m=%d rank %d: peak %d", p, m, q, z->peak_live[q]);
            loom_sim_free(z);
            loom_sim_free(o);
        }
    /* random costs on a grid of quarters: idle per rank (p-1)*max(f, b, f+b-w) */
    unsigned x = 12345;
    for (int it = 0; it < 400; it++) {
        const int p = 1 + draw(&x, 8);
        const int m = p + draw(&x, 3 * p + 1);
        draw_costs(&x, &c);
        loom_sim_result *z = simulate(LOOM_SCHED_ZB, p, m, 1, &c, NULL),
                        *o = simulate(LOOM_SCHED_1F1B, p, m, 1, &c, NULL);
        if (!z || !o) continue;
        const double want = loom_sim_closed_form_bubble(LOOM_SCHED_ZB, p, m, 1, &c);
        CHECK(fabs(z->bubble - want) < 1e-12, "zb p=%d m=%d f=%g b=%g w=%g: bubble %.15f, closed %.15f", p, m,
              c.f, c.b, c.w, z->bubble, want);
        if (p > 1)
            CHECK(z->makespan < o->makespan, "zb p=%d m=%d f=%g b=%g w=%g not faster than 1f1b", p, m, c.f,
                  c.b, c.w);
        loom_sim_free(z);
        loom_sim_free(o);
    }
    loom_sim_costs_default(&c);
    CHECK(isnan(loom_sim_closed_form_bubble(LOOM_SCHED_ZB, 4, 3, 1, &c)), "zb m < p has no closed form");
}

/* ---- hand-timed runs --------------------------------------------------------- */

/* Start and end of (kind, mb, chunk) on rank r. */
static int when(const loom_schedule *s, const loom_sim_result *r, int rank, loom_pp_kind k, int mb,
                double *t0, double *t1) {
    for (int i = s->offset[rank]; i < s->offset[rank + 1]; i++)
        if (s->actions[i].kind == k && s->actions[i].mb == mb) {
            *t0 = r->start[i], *t1 = r->end[i];
            return 1;
        }
    return 0;
}

static void expect_at(const loom_schedule *s, const loom_sim_result *r, int rank, loom_pp_kind k, int mb,
                      double t0, double t1) {
    double a = -1, b = -1;
    CHECK(when(s, r, rank, k, mb, &a, &b) && fabs(a - t0) < 1e-12 && fabs(b - t1) < 1e-12,
          "rank %d %s%d: [%g, %g], want [%g, %g]", rank, loom_pp_kind_name(k), mb, a, b, t0, t1);
}

static void test_cost_model(void) {
    /* 1f1b p=2 m=2, f=1, full backward b+w = 3, latency 0.5. Rank 0: F0, F1,
     * then B0 once rank 1's B0 gradient arrives, then B1. By hand:
     *   rank 0  F0 [0,1]  F1 [1,2]  B0 [6,9]   B1 [10,13]
     *   rank 1  F0 [1.5,2.5]  B0 [2.5,5.5]  F1 [5.5,6.5]  B1 [6.5,9.5]
     * (F1's input arrived at 2.5, waits for B0; B0's gradient reaches rank 0
     * at 6, B1's at 10.) */
    loom_sim_costs c = {.f = 1, .b = 2, .w = 1, .comm = 0.5};
    loom_schedule *s = NULL;
    loom_sim_result *r = simulate(LOOM_SCHED_1F1B, 2, 2, 1, &c, &s);
    if (r) {
        expect_at(s, r, 0, LOOM_PP_F, 0, 0, 1);
        expect_at(s, r, 0, LOOM_PP_F, 1, 1, 2);
        expect_at(s, r, 0, LOOM_PP_B, 0, 6, 9);
        expect_at(s, r, 0, LOOM_PP_B, 1, 10, 13);
        expect_at(s, r, 1, LOOM_PP_F, 0, 1.5, 2.5);
        expect_at(s, r, 1, LOOM_PP_B, 0, 2.5, 5.5);
        expect_at(s, r, 1, LOOM_PP_F, 1, 5.5, 6.5);
        expect_at(s, r, 1, LOOM_PP_B, 1, 6.5, 9.5);
        expect_at(s, r, 0, LOOM_PP_RECV_GRAD, 0, 2, 6); /* the wait shows as the receive */
        CHECK(r->makespan == 13 && r->rank_end[1] == 9.5, "makespan %g, rank 1 ends %g", r->makespan,
              r->rank_end[1]);
        CHECK(r->busy[0] == 8 && r->busy[1] == 8, "busy %g %g", r->busy[0], r->busy[1]);
        CHECK(fabs(r->bubble - (1 - 16.0 / 26)) < 1e-12, "bubble %.15f", r->bubble);
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    /* zb splits the same backward: p=2 m=1, f=1 b=2 w=1, no latency:
     *   rank 0 F0 [0,1]            B0 [4,6] W0 [6,7]
     *   rank 1        F0 [1,2] B0 [2,4]     W0 [4,5] */
    c = (loom_sim_costs){.f = 1, .b = 2, .w = 1};
    r = simulate(LOOM_SCHED_ZB, 2, 1, 1, &c, &s);
    if (r) {
        expect_at(s, r, 0, LOOM_PP_B, 0, 4, 6);
        expect_at(s, r, 0, LOOM_PP_W, 0, 6, 7);
        expect_at(s, r, 1, LOOM_PP_B, 0, 2, 4);
        expect_at(s, r, 1, LOOM_PP_W, 0, 4, 5);
        CHECK(r->makespan == 7, "zb makespan %g", r->makespan);
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    /* stage scales and the optimizer: gpipe p=2 m=1, stage 1 three times as
     * heavy, opt 0.5: F0 [0,1] F0' [1,4] B0' [4,10] B0 [10,12], OPT after */
    const double scale[2] = {1, 3};
    c = (loom_sim_costs){.f = 1, .b = 1, .w = 1, .opt = 0.5, .stage_scale = scale};
    r = simulate(LOOM_SCHED_GPIPE, 2, 1, 1, &c, &s);
    if (r) {
        expect_at(s, r, 1, LOOM_PP_F, 0, 1, 4);
        expect_at(s, r, 1, LOOM_PP_B, 0, 4, 10);
        expect_at(s, r, 0, LOOM_PP_B, 0, 10, 12);
        CHECK(r->makespan == 12.5 && r->rank_end[1] == 10.5, "makespan %g / %g", r->makespan, r->rank_end[1]);
        CHECK(r->busy[0] == 3.5 && r->busy[1] == 9.5, "busy %g %g", r->busy[0], r->busy[1]);
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    /* bad costs are usage errors */
    c = (loom_sim_costs){.f = -1, .b = 1, .w = 1};
    s = NULL;
    if (loom_schedule_build(LOOM_SCHED_1F1B, 2, 2, 1, &s) == LOOM_OK) {
        r = (loom_sim_result *)&c;
        CHECK(loom_sim_run(s, &c, &r) == LOOM_EUSAGE && r == NULL, "negative cost accepted");
        CHECK(strstr(loom_errmsg(), "--cost-f -1: must be a finite number >= 0") != NULL, "msg '%s'",
              loom_errmsg());
        c = (loom_sim_costs){.f = 1, .b = NAN, .w = 1};
        CHECK(loom_sim_run(s, &c, &r) == LOOM_EUSAGE, "NaN cost accepted");
        c = (loom_sim_costs){.f = 1, .b = 1, .w = 1, .comm = 1e300};
        CHECK(loom_sim_run(s, &c, &r) == LOOM_EUSAGE && strstr(loom_errmsg(), "--cost-comm 1e+300"),
              "huge cost: %s", loom_errmsg());
        /* a broken list is refused by the simulator as by the validator */
        c = (loom_sim_costs){.f = 1, .b = 1, .w = 1};
        s->actions[s->offset[1]].peer = 1;
        CHECK(loom_sim_run(s, &c, &r) == LOOM_EDATA && strstr(loom_errmsg(), "peer must be rank 0"),
              "broken list: %s", loom_errmsg());
    }
    loom_schedule_free(s);
}

/* ---- ranks that share processors (costs.cores) ------------------------------------ */

static void test_shared_cores(void) {
    /* enough cores for every rank: the same timeline as own devices, for
     * every schedule, with latency and uneven stages */
    const loom_sched_kind kinds[] = {LOOM_SCHED_GPIPE, LOOM_SCHED_1F1B, LOOM_SCHED_INTERLEAVED,
                                     LOOM_SCHED_ZB};
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++)
        for (int p = 2; p <= 4; p++)
            for (int m = p; m <= 2 * p; m += p) {
                const int v = kinds[ki] == LOOM_SCHED_INTERLEAVED ? 2 : 1;
                double scale[8];
                for (int q = 0; q < p * v; q++) scale[q] = 1 + 0.25 * ((q * 7) % 5);
                loom_sim_costs own = {
                    .f = 1, .b = 1.5, .w = 0.75, .comm = 0.25, .opt = 0.5, .stage_scale = scale};
                loom_sim_costs shared = own;
                shared.cores = p;
                loom_schedule *s = NULL;
                loom_sim_result *a = simulate(kinds[ki], p, m, v, &own, &s);
                loom_sim_result *b = simulate(kinds[ki], p, m, v, &shared, NULL);
                if (a && b) {
                    double worst = 0;
                    for (int i = 0; i < s->n_total; i++)
                        worst =
                            fmax(worst, fmax(fabs(a->start[i] - b->start[i]), fabs(a->end[i] - b->end[i])));
                    CHECK(worst < 1e-9 && fabs(a->bubble - b->bubble) < 1e-12,
                          "%s p=%d m=%d: cores %d = own devices (largest time difference %g)",
                          loom_schedule_name(kinds[ki]), p, m, p, worst);
                    /* one core, no latency: never idle, so the makespan is all the work */
                    loom_sim_costs one = own;
                    one.cores = 1, one.comm = 0;
                    loom_sim_result *c = simulate(kinds[ki], p, m, v, &one, NULL);
                    double work = 0;
                    for (int q = 0; q < p; q++) work += a->busy[q];
                    if (c)
                        CHECK(fabs(c->makespan - work) < 1e-9 * work,
                              "%s p=%d m=%d one core: makespan %g = all the work %g",
                              loom_schedule_name(kinds[ki]), p, m, c->makespan, work);
                    /* two cores: no faster than own devices nor than the work over two cores */
                    loom_sim_costs two = own;
                    two.cores = 2;
                    loom_sim_result *d = simulate(kinds[ki], p, m, v, &two, NULL);
                    if (d)
                        CHECK(d->makespan >= a->makespan - 1e-9 && d->makespan >= work / 2 - 1e-9 &&
                                  (p == 2 || d->makespan > a->makespan),
                              "%s p=%d m=%d two cores: makespan %g (own devices %g, work / 2 %g)",
                              loom_schedule_name(kinds[ki]), p, m, d->makespan, a->makespan, work / 2);
                    loom_sim_free(c);
                    loom_sim_free(d);
                }
                loom_sim_free(a);
                loom_sim_free(b);
                loom_schedule_free(s);
            }

    /* by hand: gpipe p=2 m=2, f = 1, full backward 1, one core. Rank 0's F1
     * and rank 1's F0 share it from t = 1 (half speed each, both end at 3);
     * rank 1's B1 and rank 0's B0 from t = 5:
     *   rank 0  F0 [0,1]  F1 [1,3]            B0 [5,7]  B1 [7,8]
     *   rank 1            F0 [1,3]  F1 [3,4]  B0 [4,5]  B1 [5,7] */
    loom_sim_costs c = {.f = 1, .b = 1, .w = 0, .cores = 1};
    loom_schedule *s = NULL;
    loom_sim_result *r = simulate(LOOM_SCHED_GPIPE, 2, 2, 1, &c, &s);
    if (r) {
        expect_at(s, r, 0, LOOM_PP_F, 0, 0, 1);
        expect_at(s, r, 0, LOOM_PP_F, 1, 1, 3);
        expect_at(s, r, 1, LOOM_PP_F, 0, 1, 3);
        expect_at(s, r, 1, LOOM_PP_F, 1, 3, 4);
        expect_at(s, r, 1, LOOM_PP_B, 0, 4, 5);
        expect_at(s, r, 1, LOOM_PP_B, 1, 5, 7);
        expect_at(s, r, 0, LOOM_PP_B, 0, 5, 7);
        expect_at(s, r, 0, LOOM_PP_B, 1, 7, 8);
        CHECK(r->makespan == 8 && r->busy[0] == 6 && r->busy[1] == 6, "makespan %g busy %g %g", r->makespan,
              r->busy[0], r->busy[1]);
        CHECK(fabs(r->bubble - 0.25) < 1e-12, "bubble %g: 1 - 12 / (2 x 8), busy is wall time computing",
              r->bubble);
    }
    loom_sim_free(r);
    /* 1.5 cores: two computing ranks run at 0.75 each; makespan 1 + 4/3 + 2 + 4/3 + 1 */
    c.cores = 1.5;
    r = simulate(LOOM_SCHED_GPIPE, 2, 2, 1, &c, NULL);
    if (r) CHECK(fabs(r->makespan - 20.0 / 3) < 1e-12, "1.5 cores: makespan %.15g, want 20/3", r->makespan);
    loom_sim_free(r);
    /* two nodes of one rank each (share 1): nothing shared, own devices' timeline */
    c.cores = 1, c.share = 1;
    r = simulate(LOOM_SCHED_GPIPE, 2, 2, 1, &c, NULL);
    if (r) CHECK(r->makespan == 6, "share 1, one core each: makespan %g = own devices' 6", r->makespan);
    loom_sim_free(r);
    /* bad values are usage errors */
    c = (loom_sim_costs){.f = 1, .b = 1, .w = 1, .cores = -2};
    r = (loom_sim_result *)&c;
    CHECK(loom_sim_run(s, &c, &r) == LOOM_EUSAGE && r == NULL && strstr(loom_errmsg(), "--cores -2"),
          "negative cores: %s", loom_errmsg());
    c = (loom_sim_costs){.f = 1, .b = 1, .w = 1, .cores = 2, .share = -1};
    CHECK(loom_sim_run(s, &c, &r) == LOOM_EUSAGE && strstr(loom_errmsg(), "--share -1"), "negative share: %s",
          loom_errmsg());
    loom_schedule_free(s);
}

/* ---- waiting for a processor after a synchronisation (costs.slice) --------------- */

static void test_wake_waits(void) {
    /* the expected wait, by hand: X / (C+1) + (k-C-1)/2 * X / C, X = min(slice, span) */
    const struct {
        double slice, span, cores, runnable, want;
    } w[] = {
        {1.5, 0, 2, 4, 1.5 / 3 + 0.5 * 1 * 1.5 / 2}, /* 0.875: 4 ranks on 2 cores */
        {1.5, 0, 2, 8, 1.5 / 3 + 0.5 * 5 * 1.5 / 2}, /* 2.375: 8 ranks on 2 cores */
        {1.5, 0, 2, 3, 0.5},                         /* nobody else queued: the first holder's residual */
        {1.5, 0.6, 2, 4, 0.6 / 3 + 0.5 * 0.6 / 2},   /* holders synchronise before their slice ends */
        {1.5, 3, 2, 4, 0.875},                       /* a span longer than the slice: the slice */
        {1.5, 0, 2, 2, 0},                           /* a processor for every rank */
        {0, 0, 2, 8, 0},                             /* no slice: no wait */
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        const double got = loom_sim_wake_wait(w[i].slice, w[i].span, w[i].cores, w[i].runnable);
        CHECK(fabs(got - w[i].want) < 1e-12,
              "wake wait (slice %g, span %g, %g cores, %g runnable) = %.15g, want %.15g", w[i].slice,
              w[i].span, w[i].cores, w[i].runnable, got, w[i].want);
    }

    /* by hand: gpipe p=2 m=2 on one core, f = 1, full backward 1, slice 0.3
     * (every wait here has k = 2 on C = 1: 0.3 / 2 = 0.15), one
     * synchronisation inside each F (two pieces of 0.5).
     *   t = 1     rank 1's message lands while rank 0 computes F1: it waits
     *             [1, 1.15] holding no core (rank 0 at full speed: 0.35 of
     *             its first piece left), then F0 from 1.15
     *   t = 1.85  rank 0 at F1's synchronisation, rank 1 computing: waits
     *             [1.85, 2], its group keeping its half of the core (rank 1
     *             still at 0.5)
     *   t = 2.15  rank 1 at F0's synchronisation: [2.15, 2.3], the same
     *   t = 3     rank 0's F1 ends; rank 1 alone ends F0 at 3.15, F1 (its
     *             message came at 3, before it asked: no wait) [3.15, 4.15],
     *             B0 [4.15, 5.15]
     *   t = 5.15  rank 0's gradient lands while rank 1 runs B1: [5.15, 5.3]
     *             holding nothing; B0 [5.3, 7.15], rank 1's B1 ends at 7
     *   rank 0 B1 [7.15, 8.15]: makespan 8.15, where without the waits it is
     *   8 (test_shared_cores): only the one wait that held a core's share on
     *   the critical path cost time */
    loom_sim_costs c = {.f = 1, .b = 1, .w = 0, .cores = 1, .slice = 0.3, .syncs_f = 1};
    loom_schedule *s = NULL;
    loom_sim_result *r = simulate(LOOM_SCHED_GPIPE, 2, 2, 1, &c, &s);
    if (r) {
        expect_at(s, r, 0, LOOM_PP_F, 0, 0, 1);
        expect_at(s, r, 0, LOOM_PP_F, 1, 1, 3);
        expect_at(s, r, 1, LOOM_PP_F, 0, 1.15, 3.15);
        expect_at(s, r, 1, LOOM_PP_F, 1, 3.15, 4.15);
        expect_at(s, r, 1, LOOM_PP_B, 0, 4.15, 5.15);
        expect_at(s, r, 1, LOOM_PP_B, 1, 5.15, 7);
        expect_at(s, r, 0, LOOM_PP_B, 0, 5.3, 7.15);
        expect_at(s, r, 0, LOOM_PP_B, 1, 7.15, 8.15);
        CHECK(fabs(r->makespan - 8.15) < 1e-12, "makespan %.15g, want 8.15", r->makespan);
        CHECK(fabs(r->wake[0] - 0.3) < 1e-12 && fabs(r->wake[1] - 0.3) < 1e-12, "waits %g %g, want 0.3 each",
              r->wake[0], r->wake[1]);
        /* busy: the wall time computing, the waits inside F1 / F0 taken out */
        CHECK(fabs(r->busy[0] - 5.7) < 1e-12 && fabs(r->busy[1] - 5.7) < 1e-12, "busy %.15g %.15g, want 5.7",
              r->busy[0], r->busy[1]);
    }
    loom_sim_free(r);
    /* two cores for the two ranks: never a wait, the timeline of no slice */
    c.cores = 2;
    loom_sim_costs c0 = c;
    c0.slice = 0;
    r = simulate(LOOM_SCHED_GPIPE, 2, 2, 1, &c, NULL);
    loom_sim_result *r0 = simulate(LOOM_SCHED_GPIPE, 2, 2, 1, &c0, NULL);
    if (r && r0)
        CHECK(r->makespan == r0->makespan && r->wake[0] == 0 && r->wake[1] == 0 && r->busy[0] == r0->busy[0],
              "cores for every rank: makespan %g = %g without a slice", r->makespan, r0->makespan);
    loom_sim_free(r);
    loom_sim_free(r0);
    c = (loom_sim_costs){.f = 1, .b = 1, .w = 1, .cores = 1, .slice = -1};
    r = (loom_sim_result *)&c;
    CHECK(loom_sim_run(s, &c, &r) == LOOM_EUSAGE && r == NULL && strstr(loom_errmsg(), "--slice -1"),
          "negative slice: %s", loom_errmsg());
    loom_schedule_free(s);
}

/* ---- timeline and trace ---------------------------------------------------------- */

static void test_timeline(void) {
    loom_sim_costs c;
    loom_sim_costs_default(&c);
    loom_schedule *s = NULL;
    loom_sim_result *r = simulate(LOOM_SCHED_1F1B, 2, 2, 1, &c, &s);
    if (r) {
        /* F0 [0,1] F1 [1,2] on rank 0; rank 1 F0 [1,2] B0 [2,4] F1 [4,5]
         * B1 [5,7]; rank 0 B0 [4,6] B1 [7,9] */
        const char *want = "one column = 1 time unit; \"..\" = idle\n"
                           "stage 0: F0 F1 .. .. B0 B0 .. B1 B1\n"
                           "stage 1: .. F0 B0 B0 F1 B1 B1 .. ..\n";
        char buf[512];
        const size_t n = loom_sim_format_timeline(s, r, 400, buf, sizeof buf);
        CHECK(n == strlen(want) && strcmp(buf, want) == 0, "timeline:\n%s\nwant:\n%s", buf, want);
        char small[20];
        CHECK(loom_sim_format_timeline(s, r, 400, small, sizeof small) == n &&
                  strlen(small) == sizeof small - 1,
              "cut to fit");
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    c = (loom_sim_costs){.f = 0.5, .b = 0.25, .w = 0.25};
    r = simulate(LOOM_SCHED_GPIPE, 2, 1, 1, &c, &s);
    if (r) {
        char buf[512];
        loom_sim_format_timeline(s, r, 400, buf, sizeof buf);
        const char *want =
            "one column = 0.5 time units; \"..\" = idle\nstage 0: F0 .. .. B0\nstage 1: .. F0 B0 ..\n";
        CHECK(strcmp(buf, want) == 0, "half-unit timeline:\n%s", buf);
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    c = (loom_sim_costs){.f = 1, .b = 1, .w = 1};
    r = simulate(LOOM_SCHED_1F1B, 12, 12, 1, &c, &s);
    if (r) {
        char buf[16384];
        loom_sim_format_timeline(s, r, 400, buf, sizeof buf);
        CHECK(strstr(buf, "\nstage  0: F0  F1  F2") && strstr(buf, "\nstage 11: ..  ..  .."),
              "wide stage labels:\n%s", buf);
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    c = (loom_sim_costs){.f = 0, .b = 0, .w = 0};
    r = simulate(LOOM_SCHED_1F1B, 2, 2, 1, &c, &s);
    if (r) {
        char buf[256];
        loom_sim_format_timeline(s, r, 400, buf, sizeof buf);
        CHECK(strcmp(buf, "makespan 0: nothing to draw\n") == 0 && r->bubble == 0, "zero costs:\n%s", buf);
    }
    loom_sim_free(r);
    loom_schedule_free(s);

    c = (loom_sim_costs){.f = 1, .b = 0.7, .w = 0.3, .comm = 0.1};
    r = simulate(LOOM_SCHED_INTERLEAVED, 2, 2, 2, &c, &s);
    if (r) {
        char buf[4096];
        loom_sim_format_timeline(s, r, 20, buf, sizeof buf);
        CHECK(strstr(buf, "(rounded: costs are not on a common grid)") != NULL, "rounded header:\n%s", buf);
        CHECK(strstr(buf, "stage 0: F0.0") != NULL && strstr(buf, "stage 1: ..   ..   F0.0 F0.0") != NULL,
              "chunk labels:\n%s", buf);
    }
    loom_sim_free(r);
    loom_schedule_free(s);
}

static void test_trace(void) {
    char dir[] = "/tmp/loom_pp_traceXXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char path[256], tmp[300];
    snprintf(path, sizeof path, "%s/zb.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    loom_sim_costs c;
    loom_sim_costs_default(&c);
    loom_schedule *s = NULL;
    loom_sim_result *r = simulate(LOOM_SCHED_ZB, 4, 8, 1, &c, &s);
    if (!r) return;
    FILE *f = fopen(path, "w"); /* an old file, replaced whole */
    if (f) fputs("old", f), fclose(f);
    CHECK(loom_sim_write_trace(s, r, path) == LOOM_OK, "write: %s", loom_errmsg());
    struct stat sb;
    CHECK(stat(tmp, &sb) != 0, "the .tmp file is left behind");
    f = fopen(path, "r");
    char *text = NULL;
    long len = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        len = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = calloc((size_t)len + 1, 1);
        CHECK(fread(text, 1, (size_t)len, f) == (size_t)len, "read back");
        fclose(f);
    }
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECK(j != NULL, "trace is not JSON");
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    int n_x = 0, n_wait = 0, found = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"),
                    *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") != 0) continue;
        if (cJSON_IsString(cat) && strcmp(cat->valuestring, "wait") == 0) {
            n_wait++;
            continue;
        }
        n_x++;
        const double ts = cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble;
        const double dur = cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble;
        const int tid = cJSON_GetObjectItemCaseSensitive(e, "tid")->valueint;
        /* zb p=4 m=8: rank 3 runs W0 at [11,12] (hand: F0 B0 F1 B1 F2 B2 F3 B3 from 3 to 11) */
        if (tid == 3 && strcmp(name->valuestring, "W0") == 0)
            found = fabs(ts - 11000) < 1e-6 && fabs(dur - 1000) < 1e-6;
    }
    /* per rank: 8 F, 8 B, 8 W and the OPT_STEP; idle time before a receive
     * shows as a "wait" event (rank 0 waits for its first gradient) */
    CHECK(n_x == 4 * 25, "%d X events", n_x);
    CHECK(n_wait > 0, "no wait events");
    CHECK(found, "W0 of stage 3 not at ts 11000 dur 1000");
    cJSON_Delete(j);
    free(text);

    /* a path that cannot be created is refused with the path named */
    snprintf(path, sizeof path, "%s/missing/x.json", dir);
    CHECK(loom_sim_write_trace(s, r, path) == LOOM_ECANTCREAT && strstr(loom_errmsg(), path), "bad dir: %s",
          loom_errmsg());
    snprintf(path, sizeof path, "%s/zb.json", dir);
    unlink(path);
    rmdir(dir);
    loom_sim_free(r);
    loom_schedule_free(s);
}

/* Idle time of rank r inside its own span: from its first computation's
 * start to its last action's end, less its busy time (the Zero Bubble
 * paper's measure, where the next step's forwards fill the start). */
static double span_idle(const loom_schedule *s, const loom_sim_result *r, int rank) {
    int n;
    const loom_pp_action *a = loom_schedule_rank(s, rank, &n);
    double first = -1;
    for (int i = 0; i < n && first < 0; i++)
        if (a[i].kind <= LOOM_PP_W) first = r->start[s->offset[rank] + i];
    return r->rank_end[rank] - first - r->busy[rank];
}

/* zbh2, zbv and dualpipev (list-scheduled) at f = b = w: ZB-H2 leaves no
 * rank idle inside its own span ((p-1)(f+b-2w) = 0) with zb's bubble from
 * the pipeline's start; ZB-V and DualPipeV, whose chunks are half a rank's
 * layers (f = b = w = 1/2 for the same work per rank), beat zb. */
static void test_list_scheduled(void) {
    loom_sim_costs c, h;
    loom_sim_costs_default(&c);
    loom_sim_costs_default(&h);
    h.f = h.b = h.w = 0.5;
    for (int p = 2; p <= 8; p++)
        for (int m = 2 * p - 1; m <= 4 * p; m++) {
            loom_schedule *s = NULL, *sd = NULL;
            loom_sim_result *z2 = simulate(LOOM_SCHED_ZBH2, p, m, 1, &c, &s),
                            *z1 = simulate(LOOM_SCHED_ZB, p, m, 1, &c, NULL),
                            *zv = simulate(LOOM_SCHED_ZBV, p, m, 2, &h, NULL),
                            *dv = simulate(LOOM_SCHED_DUALPIPEV, p, m, 2, &h, &sd);
            if (z2 && z1 && zv && dv) {
                for (int q = 0; q < p; q++)
                    CHECK(fabs(span_idle(s, z2, q)) < 1e-12,
                          "zbh2 p=%d m=%d rank %d: idle %g inside its span", p, m, q, span_idle(s, z2, q));
                CHECK(fabs(z2->bubble - z1->bubble) < 1e-12, "zbh2 p=%d m=%d: bubble %g, zb's %g", p, m,
                      z2->bubble, z1->bubble);
                CHECK(z2->peak_live[0] == 2 * p - 1, "zbh2 p=%d m=%d: peak %d", p, m, z2->peak_live[0]);
                CHECK(zv->bubble < z1->bubble, "zbv p=%d m=%d: bubble %g not below zb's %g", p, m, zv->bubble,
                      z1->bubble);
                CHECK(dv->bubble < z1->bubble, "dualpipev p=%d m=%d: bubble %g not below zb's %g", p, m,
                      dv->bubble, z1->bubble);
                for (int q = 0; q < p; q++)
                    CHECK(zv->peak_live[q] <= 2 * p, "zbv p=%d m=%d rank %d: peak %d chunk sets > 2p", p, m,
                          q, zv->peak_live[q]);
                /* the least time any schedule can take is 6m chunk units of
                 * work per rank plus the p-1 forwards rank p-1 waits for its
                 * first input; the greedy zbv reaches it up to p = 4 and
                 * stays within two chunk units of it up to p = 8 (ZB-V's
                 * hand-made order reaches it) */
                const double bound = 0.5 * (6 * m + p - 1), over = zv->makespan - bound;
                CHECK(over > -1e-12 && over < (p <= 4 ? 1e-12 : 1.0 + 1e-12),
                      "zbv p=%d m=%d: makespan %g, bound %g", p, m, zv->makespan, bound);
                /* DualPipeV (DeepSeek-V3 Table 2, on p devices): idle inside each
                 * rank's span (p-1)(F&B + B - 3W) = 0 with F&B = F + B (the pair
                 * run one after the other) and F = B = W. The greedy order
                 * reaches it on every rank but 0, which idles at most one
                 * chunk unit */
                for (int q = 0; q < p; q++)
                    CHECK(span_idle(sd, dv, q) > -1e-12 && span_idle(sd, dv, q) < (q ? 1e-12 : 0.5 + 1e-12),
                          "dualpipev p=%d m=%d rank %d: idle %g in its span", p, m, q, span_idle(sd, dv, q));
            }
            loom_schedule_free(s);
            loom_schedule_free(sd);
            loom_sim_free(z2);
            loom_sim_free(z1);
            loom_sim_free(zv);
            loom_sim_free(dv);
        }
}

/* ZB-H2 beyond f = b = w (Qi et al. 2023, Table 1: bubble (p-1)(T_F + T_B -
 * 2 T_W), memory (2p-1) M_B): random costs on a grid of quarters, p = 2..8
 * and m = 2p-1 .. 4p. Rank r idles (p-1-r) max(f+b-2w, b-f, 0) inside its
 * own span (its warm-up's extra forwards fill the rest), so the largest,
 * rank 0's, is the paper's form wherever T_W <= T_F and 2 T_W <= T_F + T_B
 * (the paper's setting); beyond it the backward's excess over the forward
 * (b - f per stage) or nothing. Rank 0 holds 2p-1 sets, no rank more. */
static void test_zbh2_costs(void) {
    unsigned x = 2024;
    int paper = 0;
    for (int it = 0; it < 400; it++) {
        loom_sim_costs c;
        loom_sim_costs_default(&c);
        const int p = 2 + draw(&x, 7);
        const int m = 2 * p - 1 + draw(&x, 2 * p + 2);
        draw_costs(&x, &c);
        loom_schedule *s = NULL;
        loom_sim_result *r = simulate(LOOM_SCHED_ZBH2, p, m, 1, &c, &s);
        if (!r) continue;
        const double form = c.f + c.b - 2 * c.w, excess = c.b - c.f;
        const double per = form > excess ? (form > 0 ? form : 0) : (excess > 0 ? excess : 0);
        double most = 0;
        for (int q = 0; q < p; q++) {
            const double idle = span_idle(s, r, q);
            most = idle > most ? idle : most;
            CHECK(fabs(idle - (p - 1 - q) * per) < 1e-9,
                  "zbh2 p=%d m=%d f=%g b=%g w=%g rank %d: idle %g in its span, want %g", p, m, c.f, c.b, c.w,
                  q, idle, (p - 1 - q) * per);
            CHECK(r->peak_live[q] <= 2 * p - 1, "zbh2 p=%d m=%d rank %d: peak %d", p, m, q, r->peak_live[q]);
        }
        if (c.w <= c.f && form >= 0) {
            CHECK(fabs(most - (p - 1) * form) < 1e-9,
                  "zbh2 p=%d m=%d f=%g b=%g w=%g: bubble %g, (p-1)(f+b-2w) = %g", p, m, c.f, c.b, c.w, most,
                  (p - 1) * form);
            paper++;
        }
        CHECK(r->peak_live[0] == 2 * p - 1, "zbh2 p=%d m=%d: rank 0's peak %d, want 2p-1", p, m,
              r->peak_live[0]);
        loom_schedule_free(s);
        loom_sim_free(r);
    }
    CHECK(paper >= 100, "only %d cost draws in the paper's setting", paper);
}

int main(void) {
    test_gpipe_1f1b();
    test_interleaved();
    test_zb();
    test_list_scheduled();
    test_zbh2_costs();
    test_cost_model();
    test_shared_cores();
    test_wake_waits();
    test_timeline();
    test_trace();
    return check_done();
}
