/* list_schedule.c - the schedules whose order comes from list scheduling
 * (pp axis; pure, not collective): zbh2, zbv and dualpipev.
 *
 * Every rank's order of computations is the one a greedy simulation of the
 * whole pipeline picks at unit cost (F = B = W = 1, messages free): at each
 * time step, every idle rank starts the first ready computation its policy
 * prefers. A computation is ready when its inputs exist (F: the previous
 * stage's F of that micro-batch; B: its F and the next stage's B; W: its B)
 * and, for F, when the rank holds fewer live activation sets than the
 * schedule's limit. Each chunk runs its F and its B in micro-batch order, W
 * in the order of the Bs. Because the simulation ran the lists, they cannot
 * deadlock; loom_schedule_validate proves it again for every list built.
 *
 * Policies (v = 1 for zbh2; zbv and dualpipev place 2 chunks per rank in a
 * V, pipeline.h):
 *   zbh2       B first, else F while fewer than 2p-1 sets are alive (ZB-H2's
 *              memory: the warm-up runs 2(p-r)-1 forwards on rank r, enough
 *              to cover the round trip of the first micro-batch), else W.
 *   zbv        the same with two chunks per rank and at most 2p chunk sets
 *              alive (1f1b's memory: a chunk is half a rank's layers). Among
 *              ready Bs the lower stage goes first (nearer the end of the
 *              backward), among Fs the higher stage.
 *   dualpipev  DualPipeV's pairing: when a forward of one chunk and a
 *              backward of another micro-batch are both ready, the rank runs
 *              them as one unit F, B, W (the F&B chunk pair that DeepSeek-V3
 *              overlaps; run one after the other here). A lone B defers its
 *              W, which fills idle time; lone Fs fill the warm-up while fewer
 *              than 2p+2 chunk sets are alive (DualPipe's p+1 micro-batches).
 */
#include <stdlib.h>

#include "pipeline/internal.h"

typedef struct lsched {
    const loom_schedule *s;
    int pp, m, v, S, limit;
    int *fdone, *bdone; /* (m*S) time step at which F/B of (mb, stage) ended; 0 = not yet */
    int *nf, *nb;       /* (pp*v) next micro-batch to forward / backward per (rank, chunk) */
    int *wq, *wh, *wt;  /* per rank a FIFO of (mb*v + chunk) whose W is due: wq[r*m*v + i], head, tail */
    int *live, *busy, *len;
    int *order; /* (pp * 3*m*v) */
} lsched;

static int done_by(int end, int t) { return end > 0 && end <= t; }

/* The chunk of rank r whose next F (backward 0) or B (1) is ready at t and
 * comes first in the policy's preference, or -1. */
static int ready_chunk(const lsched *L, int r, int t, int backward) {
    int best = -1, best_st = 0;
    for (int c = 0; c < L->v; c++) {
        const int st = loom_pp_vstage(L->s, r, c);
        const int mb = backward ? L->nb[r * L->v + c] : L->nf[r * L->v + c];
        if (mb >= L->m) continue;
        const int u = mb * L->S + st;
        const int ok = backward ? done_by(L->fdone[u], t) && (st == L->S - 1 || done_by(L->bdone[u + 1], t))
                                : st == 0 || done_by(L->fdone[u - 1], t);
        if (ok && (best < 0 || (backward ? st < best_st : st > best_st))) best = c, best_st = st;
    }
    return best;
}

/* Run computation `kind` of chunk c on rank r, ending at t+1; for W, c 0
 * runs the oldest W due, c 1 the newest (the W of the B just run). */
static void run(lsched *L, int r, int kind, int c, int t) {
    const int mv = L->m * L->v;
    int mb;
    if (kind == LOOM_PP_W) {
        const int x = c ? L->wq[r * mv + --L->wt[r]] : L->wq[r * mv + L->wh[r]++];
        mb = x / L->v, c = x % L->v;
        L->live[r]--;
    } else {
        int *next = kind == LOOM_PP_F ? &L->nf[r * L->v + c] : &L->nb[r * L->v + c];
        mb = (*next)++;
        const int u = mb * L->S + loom_pp_vstage(L->s, r, c);
        if (kind == LOOM_PP_F) L->fdone[u] = t + 1, L->live[r]++;
        else L->bdone[u] = t + 1, L->wq[r * mv + L->wt[r]++] = mb * L->v + c;
    }
    L->order[(size_t)r * 3 * mv + L->len[r]++] = (mb * L->v + c) * 3 + kind;
    L->busy[r] = t + 1;
}

/* One decision of rank r at time t; 1 if it started something. */
static int decide(lsched *L, int r, int t) {
    const int b = ready_chunk(L, r, t, 1), f = L->live[r] < L->limit ? ready_chunk(L, r, t, 0) : -1;
    const int w = L->wh[r] < L->wt[r];
    if (L->s->kind == LOOM_SCHED_DUALPIPEV && b >= 0 && f >= 0 && f != b) {
        run(L, r, LOOM_PP_F, f, t); /* the F&B pair, then its W */
        run(L, r, LOOM_PP_B, b, t + 1);
        run(L, r, LOOM_PP_W, 1, t + 2);
        return 1;
    }
    if (b >= 0) run(L, r, LOOM_PP_B, b, t);
    else if (f >= 0) run(L, r, LOOM_PP_F, f, t);
    else if (w) run(L, r, LOOM_PP_W, 0, t);
    else return 0;
    return 1;
}

static void lsched_free(lsched *L) {
    free(L->fdone);
    free(L->nf);
    free(L->wq);
    free(L->live);
}

loom_status loom_pp_list_schedule(const loom_schedule *s, int **order) {
    *order = NULL;
    const int pp = s->pp, m = s->micro_batches, v = s->virtual_stages, S = pp * v, mv = m * v;
    lsched L = {.s = s, .pp = pp, .m = m, .v = v, .S = S};
    L.limit = s->kind == LOOM_SCHED_ZBH2 ? 2 * pp - 1 : s->kind == LOOM_SCHED_ZBV ? 2 * pp : 2 * pp + 2;
    L.fdone = calloc(2 * (size_t)m * S, sizeof *L.fdone);
    L.nf = calloc(2 * (size_t)pp * v, sizeof *L.nf);
    L.wq = calloc((size_t)pp * mv + 2 * (size_t)pp, sizeof *L.wq);
    L.live = calloc(3 * (size_t)pp, sizeof *L.live);
    L.order = malloc((size_t)pp * 3 * mv * sizeof *L.order);
    if (!L.fdone || !L.nf || !L.wq || !L.live || !L.order) {
        lsched_free(&L);
        free(L.order);
        return loom_fail(LOOM_EOS, "out of memory list-scheduling %s for pp=%d m=%d",
                         loom_schedule_name(s->kind), pp, m);
    }
    L.bdone = L.fdone + (size_t)m * S;
    L.nb = L.nf + (size_t)pp * v;
    L.wh = L.wq + (size_t)pp * mv;
    L.wt = L.wh + pp;
    L.busy = L.live + pp;
    L.len = L.busy + pp;
    for (int t = 0, left = pp;; t++) {
        int moved = 0;
        for (int r = 0; r < pp; r++) {
            if (L.len[r] == 3 * mv) continue;
            if (L.busy[r] > t) {
                moved = 1;
                continue;
            }
            if (decide(&L, r, t)) {
                moved = 1;
                if (L.len[r] == 3 * mv) left--;
            }
        }
        if (!left) break;
        if (!moved) {
            lsched_free(&L);
            free(L.order);
            return loom_fail(LOOM_EINTERNAL, "list-scheduling %s for pp=%d m=%d stalled at step %d",
                             loom_schedule_name(s->kind), pp, m, t);
        }
    }
    lsched_free(&L);
    *order = L.order;
    return LOOM_OK;
}
