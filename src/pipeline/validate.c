/* validate.c - the schedule validator and replay engine (pp axis; pure, not
 * collective).
 *
 * loom_schedule_replay checks a set of per-rank action lists in two passes.
 * The static pass looks at each list alone: field ranges, peers, the
 * placement of every SEND/RECV next to its computation, OPT_STEP last. The
 * dynamic pass executes all lists together the way the executor will:
 * computations and sends never wait, a RECV waits until its SEND has run
 * (unbounded, matched point-to-point messages). It checks every data
 * dependency as it goes and, with durations, times every action. If some
 * rank can never move again, the lists deadlock. The validator is the replay
 * with zero durations; the simulator (src/plan/sim.c) is the replay with a
 * cost model. Same engine, same lists: what you simulate is what you run.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/pipeline.h"

/* LOOM_EDATA "rank r action i (LABEL): why". */
static loom_status fail_at(const loom_schedule *s, int r, int i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static loom_status fail_at(const loom_schedule *s, int r, int i, const char *fmt, ...) {
    char what[96], why[320];
    loom_pp_action_format(&s->actions[s->offset[r] + i], s->virtual_stages, what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_EDATA, "rank %d action %d (%s): %s", r, i, what, why);
}

static int same_unit(const loom_pp_action *a, loom_pp_kind k, int mb, int chunk) {
    return a->kind == k && a->mb == mb && a->chunk == chunk;
}

/* The neighbour at offset d (+1 next, -1 previous) is kind k of the same unit. */
static int neighbour_is(const loom_pp_action *a, int n, int i, int d, loom_pp_kind k) {
    return i + d >= 0 && i + d < n && same_unit(&a[i + d], k, a[i].mb, a[i].chunk);
}

/* ---- static pass: one list at a time ---------------------------------------- */

static loom_status check_fields(const loom_schedule *s, int r, int i) {
    const loom_pp_action *x = &s->actions[s->offset[r] + i];
    if ((unsigned)x->kind >= LOOM_PP_KIND_COUNT)
        return loom_fail(LOOM_EDATA, "rank %d action %d: unknown kind %d", r, i, (int)x->kind);
    if (x->kind == LOOM_PP_OPT_STEP) {
        if (x->mb != -1 || x->chunk != -1 || x->peer != -1)
            return fail_at(s, r, i, "OPT_STEP carries mb, chunk and peer -1");
        return LOOM_OK;
    }
    if (x->mb < 0 || x->mb >= s->micro_batches)
        return fail_at(s, r, i, "micro-batch %d out of range 0..%d", x->mb, s->micro_batches - 1);
    if (x->chunk < 0 || x->chunk >= s->virtual_stages)
        return fail_at(s, r, i, "chunk %d out of range 0..%d", x->chunk, s->virtual_stages - 1);
    const int is_msg = x->kind >= LOOM_PP_SEND_ACT && x->kind <= LOOM_PP_RECV_GRAD;
    if (!is_msg && x->peer != -1) return fail_at(s, r, i, "a computation has peer -1, not %d", x->peer);
    if (x->kind == LOOM_PP_W && !s->split_backward)
        return fail_at(s, r, i, "W in a schedule that does not split the backward");
    return LOOM_OK;
}

/* Rule 1 of the convention, and peers. */
static loom_status check_placement(const loom_schedule *s, int r, int i) {
    int n;
    const loom_pp_action *a = loom_schedule_rank(s, r, &n), *x = &a[i];
    const int S = s->pp * s->virtual_stages, st = loom_pp_vstage(s, r, x->chunk);
    const int first = st == 0, last = st == S - 1;
    const int prev = first ? -1 : loom_pp_owner(s, st - 1), next = last ? -1 : loom_pp_owner(s, st + 1);
    switch (x->kind) {
    case LOOM_PP_F:
        if (!first && !neighbour_is(a, n, i, -1, LOOM_PP_RECV_ACT))
            return fail_at(s, r, i, "its input was not received (no RECV_ACT right before it)");
        if (!last && !neighbour_is(a, n, i, +1, LOOM_PP_SEND_ACT))
            return fail_at(s, r, i, "its output is not sent on (no SEND_ACT right after it)");
        break;
    case LOOM_PP_B:
        if (!last && !neighbour_is(a, n, i, -1, LOOM_PP_RECV_GRAD))
            return fail_at(s, r, i, "its output gradient was not received (no RECV_GRAD right before it)");
        if (!first && !neighbour_is(a, n, i, +1, LOOM_PP_SEND_GRAD))
            return fail_at(s, r, i, "its input gradient is not sent back (no SEND_GRAD right after it)");
        break;
    case LOOM_PP_RECV_ACT:
    case LOOM_PP_SEND_GRAD:
        if (first) return fail_at(s, r, i, "stage 0 has no previous stage to talk to");
        if (x->peer != prev)
            return fail_at(s, r, i, "peer must be rank %d, the owner of stage %d", prev, st - 1);
        if (x->kind == LOOM_PP_RECV_ACT && !neighbour_is(a, n, i, +1, LOOM_PP_F))
            return fail_at(s, r, i, "not right before the F that needs it");
        if (x->kind == LOOM_PP_SEND_GRAD && !neighbour_is(a, n, i, -1, LOOM_PP_B))
            return fail_at(s, r, i, "not right after the B that produces it");
        break;
    case LOOM_PP_SEND_ACT:
    case LOOM_PP_RECV_GRAD:
        if (last) return fail_at(s, r, i, "the last stage %d has no next stage to talk to", st);
        if (x->peer != next)
            return fail_at(s, r, i, "peer must be rank %d, the owner of stage %d", next, st + 1);
        if (x->kind == LOOM_PP_SEND_ACT && !neighbour_is(a, n, i, -1, LOOM_PP_F))
            return fail_at(s, r, i, "not right after the F that produces it");
        if (x->kind == LOOM_PP_RECV_GRAD && !neighbour_is(a, n, i, +1, LOOM_PP_B))
            return fail_at(s, r, i, "not right before the B that needs it");
        break;
    case LOOM_PP_OPT_STEP:
        if (i != n - 1) return fail_at(s, r, i, "OPT_STEP must be the last action, once");
        break;
    default: break;
    }
    return LOOM_OK;
}

static loom_status check_static(const loom_schedule *s) {
    for (int r = 0; r < s->pp; r++) {
        int n;
        const loom_pp_action *a = loom_schedule_rank(s, r, &n);
        for (int i = 0; i < n; i++) LOOM_TRY(check_fields(s, r, i));
        for (int i = 0; i < n; i++) LOOM_TRY(check_placement(s, r, i));
        if (n == 0 || a[n - 1].kind != LOOM_PP_OPT_STEP)
            return loom_fail(LOOM_EDATA, "rank %d: the list does not end with OPT_STEP", r);
    }
    return LOOM_OK;
}

/* ---- dynamic pass: all lists together ---------------------------------------- */

typedef struct replay {
    const loom_schedule *s;
    int S, n_msg;
    unsigned char *f, *b, *w;    /* (m*S): times F/B/W of (mb, stage) ran */
    unsigned char *sent, *recvd; /* (2*n_msg): act messages, then grad messages */
    double *arrive;              /* (2*n_msg) */
    int *pc;                     /* (pp) next action of each rank */
    double *clock;               /* (pp) end of each rank's last action */
} replay;

/* Message index: boundary e (stages e, e+1), micro-batch mb, g 1 for grads. */
static int msg_index(const replay *R, int mb, int e, int g) { return g * R->n_msg + mb * (R->S - 1) + e; }

/* Run rank r's next action if it can. 1: ran; 0: waits for a message;
 * -1: broke a rule (status set in *st). */
static int step(replay *R, int r, const double *dur, double latency, double *start, double *end,
                loom_status *st) {
    const loom_schedule *s = R->s;
    const int i = R->pc[r], flat = s->offset[r] + i;
    const loom_pp_action *x = &s->actions[flat];
    const int S = R->S;
    const int stg = x->kind == LOOM_PP_OPT_STEP ? 0 : loom_pp_vstage(s, r, x->chunk);
    const int u = x->kind == LOOM_PP_OPT_STEP ? 0 : x->mb * S + stg;
    const double t0 = R->clock[r], d = dur ? dur[flat] : 0.0;
    double t1 = t0 + d;
#define BREAK_RULE(...)                                                                                      \
    do {                                                                                                     \
        *st = fail_at(s, r, i, __VA_ARGS__);                                                                 \
        return -1;                                                                                           \
    } while (0)
    switch (x->kind) {
    case LOOM_PP_F:
        if (R->f[u]) BREAK_RULE("a second F of micro-batch %d stage %d", x->mb, stg);
        if (stg > 0 && !R->f[u - 1]) BREAK_RULE("runs before F of stage %d", stg - 1);
        R->f[u] = 1;
        break;
    case LOOM_PP_B:
        if (!R->f[u]) BREAK_RULE("runs before its F");
        if (R->b[u]) BREAK_RULE("a second B of micro-batch %d stage %d", x->mb, stg);
        if (stg < S - 1 && !R->b[u + 1]) BREAK_RULE("runs before B of stage %d", stg + 1);
        R->b[u] = 1;
        break;
    case LOOM_PP_W:
        if (!R->b[u]) BREAK_RULE("runs before its B");
        if (R->w[u]) BREAK_RULE("a second W of micro-batch %d stage %d", x->mb, stg);
        R->w[u] = 1;
        break;
    case LOOM_PP_SEND_ACT:
    case LOOM_PP_SEND_GRAD: {
        const int g = x->kind == LOOM_PP_SEND_GRAD;
        const int k = msg_index(R, x->mb, g ? stg - 1 : stg, g);
        if (R->sent[k]) BREAK_RULE("sends the same message twice");
        R->sent[k] = 1;
        R->arrive[k] = t0 + d + latency;
        break;
    }
    case LOOM_PP_RECV_ACT:
    case LOOM_PP_RECV_GRAD: {
        const int g = x->kind == LOOM_PP_RECV_GRAD;
        const int k = msg_index(R, x->mb, g ? stg : stg - 1, g);
        if (!R->sent[k]) return 0;
        if (R->recvd[k]) BREAK_RULE("receives the same message twice");
        R->recvd[k] = 1;
        t1 = (R->arrive[k] > t0 ? R->arrive[k] : t0) + d; /* waits for the message */
        break;
    }
    default: break;
    }
#undef BREAK_RULE
    if (start) start[flat] = t0;
    if (end) end[flat] = t1;
    R->clock[r] = t1;
    R->pc[r]++;
    return 1;
}

static loom_status report_deadlock(const replay *R) {
    const loom_schedule *s = R->s;
    char msg[1024];
    int len = snprintf(msg, sizeof msg, "deadlock:"), shown = 0;
    for (int r = 0; r < s->pp; r++) {
        if (R->pc[r] == s->offset[r + 1] - s->offset[r]) continue;
        if (shown++ == 4) {
            len += snprintf(msg + len, sizeof msg - (size_t)len, " ...");
            break;
        }
        char what[96];
        loom_pp_action_format(&s->actions[s->offset[r] + R->pc[r]], s->virtual_stages, what, sizeof what);
        len += snprintf(msg + len, sizeof msg - (size_t)len, "%s rank %d waits at action %d (%s)",
                        shown > 1 ? ";" : "", r, R->pc[r], what);
        if (len >= (int)sizeof msg) break;
    }
    return loom_fail(LOOM_EDATA, "%s", msg);
}

/* After the run: every unit computed, every message received. */
static loom_status check_complete(const replay *R) {
    const loom_schedule *s = R->s;
    const int S = R->S, m = s->micro_batches;
    for (int mb = 0; mb < m; mb++)
        for (int st = 0; st < S; st++) {
            const int u = mb * S + st;
            const char *missing = !R->f[u]                        ? "F"
                                  : !R->b[u]                      ? "B"
                                  : s->split_backward && !R->w[u] ? "W"
                                                                  : NULL;
            if (missing)
                return loom_fail(LOOM_EDATA, "micro-batch %d stage %d (rank %d chunk %d) never runs %s", mb,
                                 st, loom_pp_owner(s, st), loom_pp_chunk(s, st), missing);
        }
    for (int k = 0; k < 2 * R->n_msg; k++)
        if (R->sent[k] && !R->recvd[k]) {
            const int g = k >= R->n_msg, mb = (k % R->n_msg) / (S - 1), e = (k % R->n_msg) % (S - 1);
            const int from = g ? e + 1 : e;
            return loom_fail(LOOM_EDATA, "%s of micro-batch %d from stage %d (rank %d) is never received",
                             g ? "SEND_GRAD" : "SEND_ACT", mb, from, loom_pp_owner(s, from));
        }
    return LOOM_OK;
}

static void replay_free(replay *R) {
    free(R->f);
    free(R->sent);
    free(R->arrive);
    free(R->pc);
    free(R->clock);
}

static loom_status replay_init(replay *R, const loom_schedule *s) {
    const size_t m = (size_t)s->micro_batches, S = (size_t)s->pp * (size_t)s->virtual_stages;
    *R = (replay){.s = s, .S = (int)S, .n_msg = (int)(m * (S - 1))};
    const size_t nm = 2 * (size_t)R->n_msg + 1;
    R->f = calloc(3 * m * S, 1);
    R->sent = calloc(2 * nm, 1);
    R->arrive = calloc(nm, sizeof *R->arrive);
    R->pc = calloc((size_t)s->pp, sizeof *R->pc);
    R->clock = calloc((size_t)s->pp, sizeof *R->clock);
    if (!R->f || !R->sent || !R->arrive || !R->pc || !R->clock) {
        replay_free(R);
        return loom_fail(LOOM_EOS, "out of memory replaying a schedule of %d actions", s->n_total);
    }
    R->b = R->f + m * S;
    R->w = R->b + m * S;
    R->recvd = R->sent + nm;
    return LOOM_OK;
}

loom_status loom_schedule_replay(const loom_schedule *s, const double *dur, double latency, double *start,
                                 double *end) {
    if (!s || s->pp < 1 || s->micro_batches < 1 || s->virtual_stages < 1 || !s->offset || !s->actions)
        return loom_fail(LOOM_EDATA, "not a schedule (pp, micro-batches, v must be >= 1)");
    if ((long long)s->pp * s->micro_batches * s->virtual_stages > LOOM_PP_MAX_WORK)
        return loom_fail(LOOM_EDATA, "schedule too large: pp=%d x m=%d x v=%d", s->pp, s->micro_batches,
                         s->virtual_stages);
    if (s->offset[0] != 0 || s->offset[s->pp] != s->n_total)
        return loom_fail(LOOM_EDATA, "schedule offsets do not cover its %d actions", s->n_total);
    for (int r = 0; r < s->pp; r++)
        if (s->offset[r + 1] < s->offset[r]) return loom_fail(LOOM_EDATA, "rank %d: negative list length", r);
    LOOM_TRY(check_static(s));
    replay R;
    LOOM_TRY(replay_init(&R, s));
    loom_status st = LOOM_OK;
    for (int moved = 1; moved && st == LOOM_OK;) {
        moved = 0;
        for (int r = 0; r < s->pp && st == LOOM_OK; r++) {
            const int n = s->offset[r + 1] - s->offset[r];
            int got;
            while (R.pc[r] < n && (got = step(&R, r, dur, latency, start, end, &st)) != 0) {
                if (got < 0) break;
                moved = 1;
            }
        }
    }
    if (st == LOOM_OK)
        for (int r = 0; r < s->pp; r++)
            if (R.pc[r] < s->offset[r + 1] - s->offset[r]) {
                st = report_deadlock(&R);
                break;
            }
    if (st == LOOM_OK) st = check_complete(&R);
    replay_free(&R);
    return st;
}

loom_status loom_schedule_validate(const loom_schedule *s) {
    return loom_schedule_replay(s, NULL, 0.0, NULL, NULL);
}
