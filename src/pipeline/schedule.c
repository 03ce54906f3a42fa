/* schedule.c - pipeline schedule generators (pp axis): per rank, the ordered
 * list of forward / backward / weight-gradient computations, wrapped in the
 * sends and receives of the convention in pipeline.h, and closed by OPT_STEP.
 * Pure and deterministic: every rank builds the same lists; nothing here is
 * collective.
 *
 * Each generator decides only the order of computations on one rank
 * (gen_gpipe, gen_1f1b, gen_interleaved, gen_zb); emit_compute adds the
 * messages around each computation, so the placement rule lives in one place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/pipeline.h"
#include "pipeline/internal.h"

/* The rule is the validator's (layout.h); the simulator's trace reader calls it by this name. */
loom_status loom_schedule_check(loom_sched_kind k, int pp, int m, int v) {
    return loom_layout_check_schedule(k, pp, m, v);
}

/* ---- emitting one rank's list -------------------------------------------- */

typedef struct emitter {
    const loom_schedule *s;
    int pp, S, rank;
    loom_pp_action *out; /* room for 7*m*v + 1 actions */
    int n;
} emitter;

static void push(emitter *e, loom_pp_kind k, int mb, int chunk, int peer) {
    e->out[e->n++] = (loom_pp_action){.kind = k, .mb = mb, .chunk = chunk, .peer = peer};
}

/* A computation with its messages (pipeline.h, convention rule 1). */
static void emit_compute(emitter *e, loom_pp_kind k, int mb, int chunk) {
    const int s = loom_pp_vstage(e->s, e->rank, chunk);
    const int prev = s > 0 ? loom_pp_owner(e->s, s - 1) : -1;
    const int next = s < e->S - 1 ? loom_pp_owner(e->s, s + 1) : -1;
    if (k == LOOM_PP_F) {
        if (prev >= 0) push(e, LOOM_PP_RECV_ACT, mb, chunk, prev);
        push(e, LOOM_PP_F, mb, chunk, -1);
        if (next >= 0) push(e, LOOM_PP_SEND_ACT, mb, chunk, next);
    } else if (k == LOOM_PP_B) {
        if (next >= 0) push(e, LOOM_PP_RECV_GRAD, mb, chunk, next);
        push(e, LOOM_PP_B, mb, chunk, -1);
        if (prev >= 0) push(e, LOOM_PP_SEND_GRAD, mb, chunk, prev);
    } else {
        push(e, k, mb, chunk, -1);
    }
}

static int imin(int a, int b) { return a < b ? a : b; }

/* ---- generators: the order of computations on one rank --------------------- */

static void gen_gpipe(emitter *e, int m) {
    for (int i = 0; i < m; i++) emit_compute(e, LOOM_PP_F, i, 0);
    for (int i = 0; i < m; i++) emit_compute(e, LOOM_PP_B, i, 0);
}

/* Warm-up of pp-r-1 forwards fills the pipe up to this rank; then each
 * forward is paired with the oldest backward; the cool-down drains. */
static void gen_1f1b(emitter *e, int m) {
    const int warm = imin(e->pp - e->rank - 1, m);
    for (int i = 0; i < warm; i++) emit_compute(e, LOOM_PP_F, i, 0);
    for (int i = 0; i < m - warm; i++) {
        emit_compute(e, LOOM_PP_F, warm + i, 0);
        emit_compute(e, LOOM_PP_B, i, 0);
    }
    for (int i = m - warm; i < m; i++) emit_compute(e, LOOM_PP_B, i, 0);
}

/* Interleaved: micro-batches go through in groups of pp; within a group, all
 * of chunk 0, then all of chunk 1, ... (backward: chunk v-1 first). The
 * k-th forward of a rank is (mb, chunk) = ((k/(pp*v))*pp + k%pp, (k/pp)%v). */
static void interleaved_unit(int pp, int v, int k, int backward, int *mb, int *chunk) {
    const int group = k / (pp * v), in_group = k % (pp * v);
    const int c = in_group / pp;
    *mb = group * pp + in_group % pp;
    *chunk = backward ? v - 1 - c : c;
}

/* The warm-up: the first backward a rank runs is of its last chunk, so it
 * must first forward (v-1)*pp units of its earlier chunks; on top of that,
 * rank r waits for the round trip through the pp-r-1 ranks after it, during
 * which it can run two forwards per rank. */
static int interleaved_warmup(int pp, int v, int m, int rank) {
    const long long w = 2LL * (pp - rank - 1) + (long long)(v - 1) * pp;
    return w < (long long)m * v ? (int)w : m * v;
}

static void gen_interleaved(emitter *e, int m, int v) {
    const int total = m * v, warm = interleaved_warmup(e->pp, v, m, e->rank);
    int mb, c;
    for (int k = 0; k < warm; k++) {
        interleaved_unit(e->pp, v, k, 0, &mb, &c);
        emit_compute(e, LOOM_PP_F, mb, c);
    }
    for (int j = 0; j < total - warm; j++) {
        interleaved_unit(e->pp, v, warm + j, 0, &mb, &c);
        emit_compute(e, LOOM_PP_F, mb, c);
        interleaved_unit(e->pp, v, j, 1, &mb, &c);
        emit_compute(e, LOOM_PP_B, mb, c);
    }
    for (int j = total - warm; j < total; j++) {
        interleaved_unit(e->pp, v, j, 1, &mb, &c);
        emit_compute(e, LOOM_PP_B, mb, c);
    }
}

/* ZB-H1: a warm-up of pp-r forwards (1f1b's, plus the first steady one); then
 * for each backward B (input gradient only, so it can be sent upstream at
 * once), a W only when pp activation sets are alive or no forward is left,
 * and the next forward. Rank r so defers r weight gradients, which fill the
 * cool-down bubble at its end, and keeps at most pp sets alive. */
static void gen_zb(emitter *e, int m) {
    int nf = 0, nb = 0, nw = 0;
    const int warm = imin(e->pp - e->rank, m);
    while (nf < warm) emit_compute(e, LOOM_PP_F, nf++, 0);
    while (nb < m) {
        emit_compute(e, LOOM_PP_B, nb++, 0);
        if (nf - nw == e->pp || nf == m) emit_compute(e, LOOM_PP_W, nw++, 0);
        if (nf < m) emit_compute(e, LOOM_PP_F, nf++, 0);
    }
    while (nw < m) emit_compute(e, LOOM_PP_W, nw++, 0);
}

loom_status loom_schedule_build(loom_sched_kind k, int pp, int m, int v, loom_schedule **out) {
    *out = NULL;
    LOOM_TRY(loom_layout_check_schedule(k, pp, m, v));
    const int cap = 7 * m * v + 1; /* F,B,W and at most 4 messages per unit, + OPT_STEP */
    loom_schedule *s = calloc(1, sizeof *s);
    loom_pp_action *tmp = malloc((size_t)cap * sizeof *tmp);
    if (s) s->offset = malloc((size_t)(pp + 1) * sizeof *s->offset);
    if (s) s->actions = malloc((size_t)cap * pp * sizeof *s->actions);
    if (!s || !tmp || !s->offset || !s->actions) {
        free(tmp);
        loom_schedule_free(s);
        return loom_fail(LOOM_EOS, "out of memory building a %s schedule for pp=%d m=%d v=%d",
                         loom_schedule_name(k), pp, m, v);
    }
    *s = (loom_schedule){.kind = k,
                         .pp = pp,
                         .micro_batches = m,
                         .virtual_stages = v,
                         .split_backward = loom_schedule_splits_backward(k),
                         .vshape = loom_schedule_vshape(k),
                         .offset = s->offset,
                         .actions = s->actions};
    int n = 0, *order = NULL; /* list-scheduled kinds: every rank's computations */
    loom_status st = LOOM_OK;
    if (k == LOOM_SCHED_ZBH2 || k == LOOM_SCHED_ZBV || k == LOOM_SCHED_DUALPIPEV)
        st = loom_pp_list_schedule(s, &order);
    if (st != LOOM_OK) {
        free(tmp);
        loom_schedule_free(s);
        return st;
    }
    for (int r = 0; r < pp; r++) {
        emitter e = {.s = s, .pp = pp, .S = pp * v, .rank = r, .out = tmp, .n = 0};
        switch (k) {
        case LOOM_SCHED_GPIPE: gen_gpipe(&e, m); break;
        case LOOM_SCHED_1F1B: gen_1f1b(&e, m); break;
        case LOOM_SCHED_INTERLEAVED: gen_interleaved(&e, m, v); break;
        case LOOM_SCHED_ZB: gen_zb(&e, m); break;
        case LOOM_SCHED_ZBH2:
        case LOOM_SCHED_ZBV:
        case LOOM_SCHED_DUALPIPEV:
            for (int i = 0; i < 3 * m * v; i++) {
                const int x = order[(size_t)r * 3 * m * v + i];
                emit_compute(&e, (loom_pp_kind)(x % 3), x / 3 / v, x / 3 % v);
            }
            break;
        case LOOM_SCHED_COUNT: break;
        }
        push(&e, LOOM_PP_OPT_STEP, -1, -1, -1);
        s->offset[r] = n;
        memcpy(s->actions + n, tmp, (size_t)e.n * sizeof *tmp);
        n += e.n;
    }
    s->offset[pp] = n;
    s->n_total = n;
    free(order);
    free(tmp);
    *out = s;
    return LOOM_OK;
}

void loom_schedule_free(loom_schedule *s) {
    if (!s) return;
    free(s->offset);
    free(s->actions);
    free(s);
}

/* ---- helpers ------------------------------------------------------------- */

int loom_pp_tag(const loom_schedule *s, int rank, const loom_pp_action *a) {
    const int S = s->pp * s->virtual_stages;
    const int st = loom_pp_vstage(s, rank, a->chunk);
    int e, g;
    switch (a->kind) {
    case LOOM_PP_SEND_ACT: e = st, g = 0; break;
    case LOOM_PP_RECV_ACT: e = st - 1, g = 0; break;
    case LOOM_PP_SEND_GRAD: e = st - 1, g = 1; break;
    case LOOM_PP_RECV_GRAD: e = st, g = 1; break;
    default: return -1;
    }
    return 2 * (a->mb * (S - 1) + e) + g;
}

int loom_pp_tag_limit(const loom_schedule *s) {
    return 2 * s->micro_batches * (s->pp * s->virtual_stages - 1);
}

int loom_schedule_peak_live(const loom_schedule *s, int rank) {
    int n, live = 0, peak = 0;
    const loom_pp_action *a = loom_schedule_rank(s, rank, &n);
    const loom_pp_kind frees = s->split_backward ? LOOM_PP_W : LOOM_PP_B;
    for (int i = 0; i < n; i++) {
        if (a[i].kind == LOOM_PP_F && ++live > peak) peak = live;
        if (a[i].kind == frees) live--;
    }
    return peak;
}

static const char *KIND_NAMES[LOOM_PP_KIND_COUNT] = {"F",        "B",         "W",         "SEND_ACT",
                                                     "RECV_ACT", "SEND_GRAD", "RECV_GRAD", "OPT_STEP"};

const char *loom_pp_kind_name(loom_pp_kind k) {
    return (unsigned)k < LOOM_PP_KIND_COUNT ? KIND_NAMES[k] : "?";
}

int loom_pp_action_format(const loom_pp_action *a, int v, char *buf, size_t cap) {
    switch (a->kind) {
    case LOOM_PP_F:
    case LOOM_PP_B:
    case LOOM_PP_W:
        if (v > 1) return snprintf(buf, cap, "%s%d.%d", KIND_NAMES[a->kind], a->mb, a->chunk);
        return snprintf(buf, cap, "%s%d", KIND_NAMES[a->kind], a->mb);
    case LOOM_PP_SEND_ACT:
    case LOOM_PP_SEND_GRAD:
        return snprintf(buf, cap, "%s mb %d chunk %d -> rank %d", KIND_NAMES[a->kind], a->mb, a->chunk,
                        a->peer);
    case LOOM_PP_RECV_ACT:
    case LOOM_PP_RECV_GRAD:
        return snprintf(buf, cap, "%s mb %d chunk %d from rank %d", KIND_NAMES[a->kind], a->mb, a->chunk,
                        a->peer);
    case LOOM_PP_OPT_STEP: return snprintf(buf, cap, "OPT_STEP");
    default:
        return snprintf(buf, cap, "kind %d mb %d chunk %d peer %d", (int)a->kind, a->mb, a->chunk, a->peer);
    }
}
