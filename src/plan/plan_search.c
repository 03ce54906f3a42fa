/* plan_search.c - the planner's search over every layout of a job
 * (loom_plan_search: every dp, tp, pp, cp, ep degree that divides the
 * devices, then CP implementation, SP, ZeRO stage, micro-batches, schedule,
 * virtual stages, recompute and mesh order; the best of the closed-form
 * pass re-timed with the simulator and ranked by tokens/s/device), the rule
 * of thumb it is compared with (loom_plan_heuristic) and the `loom train`
 * command line of a layout. Pure: nothing here is collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"

/* ---- search ------------------------------------------------------------ */

static int divisors(long n, int *out, int cap, long maxv) {
    int k = 0;
    for (long d = 1; d <= n && d <= maxv && k < cap; d++)
        if (n % d == 0) out[k++] = (int)d;
    return k;
}

typedef struct topk {
    loom_plan_result *r;
    int n, cap;
} topk;

static int better(const loom_plan_result *a, const loom_plan_result *b) {
    if (a->tokens_per_s_dev != b->tokens_per_s_dev) return a->tokens_per_s_dev > b->tokens_per_s_dev;
    return a->mem_total < b->mem_total;
}

static void topk_add(topk *t, const loom_plan_result *r) {
    if (t->n < t->cap) {
        t->r[t->n++] = *r;
    } else {
        int worst = 0;
        for (int i = 1; i < t->n; i++)
            if (better(&t->r[worst], &t->r[i])) worst = i;
        if (!better(r, &t->r[worst])) return;
        t->r[worst] = *r;
    }
}

static int cmp_result(const void *a, const void *b) {
    const loom_plan_result *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

static void count_reject(loom_plan_search_stats *st, const loom_plan_result *r) {
    if (strncmp(r->reason, "memory", 6) == 0) {
        st->rejected_memory++;
        if (!st->example_memory[0]) snprintf(st->example_memory, sizeof st->example_memory, "%s", r->reason);
    } else {
        st->rejected_divide++;
        if (!st->example_divide[0]) snprintf(st->example_divide, sizeof st->example_divide, "%s", r->reason);
    }
}

#define COARSE 48

/* The state of one search: the job, the statistics, the best layouts of
 * the closed-form pass, and one result to evaluate into. */
typedef struct search {
    const loom_plan_model *m;
    const loom_plan_cluster *c;
    const loom_plan_job *j;
    loom_plan_search_stats *st;
    topk tk;
    loom_plan_result *r;
} search;

static const int ORDERS[2][LOOM_PLAN_NAXES] = {{LOOM_PLAN_TP, LOOM_PLAN_CP, LOOM_PLAN_DP, LOOM_PLAN_PP},
                                               {LOOM_PLAN_TP, LOOM_PLAN_CP, LOOM_PLAN_PP, LOOM_PLAN_DP}};

/* 1 if l's order (the second one) moves the dp or pp group across nodes
 * compared with the first: the other order is tried only then. */
static int order_moves_group(const loom_plan_layout *l, const loom_plan_cluster *c) {
    loom_plan_layout l0 = *l;
    memcpy(l0.order, ORDERS[0], sizeof l0.order);
    return plan_axis_inter(&l0, c, LOOM_PLAN_DP) != plan_axis_inter(l, c, LOOM_PLAN_DP) ||
           plan_axis_inter(&l0, c, LOOM_PLAN_PP) != plan_axis_inter(l, c, LOOM_PLAN_PP);
}

/* Evaluate l in the closed form, count it, and keep it if it is among the
 * best; *fits: it is feasible. */
/* 1 if l agrees with every knob the job pins (--fix) that the search
 * enumerates; recompute, order and async_tp are set from the pins instead
 * (search_recompute). */
static int pinned_ok(const loom_plan_job *j, const loom_plan_layout *l) {
    const unsigned f = j->fix;
    const loom_plan_layout *p = j->fixed;
    if (!f || !p) return 1;
#define PIN(bit, x)                                                                                          \
    if ((f & (bit)) && l->x != p->x) return 0
    PIN(LOOM_PLAN_FIX_DP, dp);
    PIN(LOOM_PLAN_FIX_TP, tp);
    PIN(LOOM_PLAN_FIX_PP, pp);
    PIN(LOOM_PLAN_FIX_CP, cp);
    PIN(LOOM_PLAN_FIX_EP, ep);
    PIN(LOOM_PLAN_FIX_ZERO, zero);
    PIN(LOOM_PLAN_FIX_SP, sp);
    PIN(LOOM_PLAN_FIX_SCHEDULE, sched);
    PIN(LOOM_PLAN_FIX_MBS, mbs);
    PIN(LOOM_PLAN_FIX_M, m);
    PIN(LOOM_PLAN_FIX_V, v);
#undef PIN
    return !(f & LOOM_PLAN_FIX_CP_IMPL) || l->cp == 1 || l->cp_impl == p->cp_impl;
}

static loom_status search_one(search *sr, const loom_plan_layout *l, int *fits) {
    *fits = 0;
    if (!pinned_ok(sr->j, l)) return LOOM_OK;
    sr->st->considered++;
    LOOM_TRY(loom_plan_evaluate(sr->m, sr->c, sr->j, l, 0, sr->r));
    *fits = sr->r->feasible;
    if (!*fits) {
        count_reject(sr->st, sr->r);
        return LOOM_OK;
    }
    sr->st->feasible++;
    topk_add(&sr->tk, sr->r);
    return LOOM_OK;
}

/* l with each recompute mode (more recompute only adds time: the cheapest
 * that fits wins) and mesh order. */
static loom_status search_recompute(search *sr, loom_plan_layout *l) {
    if (l->sched == LOOM_SCHED_INTERLEAVED && l->v == 1) return LOOM_OK;
    if (l->cp_impl == LOOM_PLAN_CP_ULYSSES && (sr->m->heads / l->tp) % l->cp) return LOOM_OK;
    const unsigned fx = sr->j->fixed ? sr->j->fix : 0;
    const loom_plan_layout *pin = sr->j->fixed;
    if (fx & LOOM_PLAN_FIX_ASYNC_TP) l->async_tp = pin->async_tp;
    const int n_rc = sr->j->serve || (fx & LOOM_PLAN_FIX_RECOMPUTE) ? 1 : 3;
    const int n_o = (fx & LOOM_PLAN_FIX_ORDER) ? 1 : l->pp > 1 && l->dp > 1 ? 2 : 1;
    for (int rc = 0, rc_done = 0; rc < n_rc && !rc_done; rc++)
        for (int o = 0; o < n_o; o++) {
            l->recompute = (fx & LOOM_PLAN_FIX_RECOMPUTE) ? pin->recompute : (loom_recompute)rc;
            memcpy(l->order, (fx & LOOM_PLAN_FIX_ORDER) ? pin->order : ORDERS[o], sizeof l->order);
            if (o == 1 && !order_moves_group(l, sr->c)) continue;
            int fits;
            LOOM_TRY(search_one(sr, l, &fits));
            if (fits) rc_done = 1;
        }
    return LOOM_OK;
}

/* Every layout with the degrees of `deg` (dp, tp, pp, cp, ep): CP
 * implementation (cp > 1: ring and, where the heads divide, Ulysses, the
 * two loom runs), SP, ZeRO stage, micro-batch size, schedule, virtual
 * stages, recompute and mesh order. */
static loom_status search_degrees(search *sr, const loom_plan_layout *deg, const int *mbss, int nmbs,
                                  int local) {
    const int serve = sr->j->serve, tp = deg->tp, pp = deg->pp, cp = deg->cp, dp = deg->dp;
    for (int ci = 0; ci < (cp > 1 ? 2 : 1); ci++)
        for (int sp = 0; sp <= (tp > 1 && !serve); sp++)
            for (int zero = 0; zero <= (serve || dp * cp < 2 ? 0 : 3); zero++)
                for (int mq = 0; mq < nmbs; mq++)
                    for (int sk = 0; sk < (pp > 1 && !serve ? LOOM_SCHED_COUNT : 1); sk++)
                        for (int v = loom_schedule_vshape((loom_sched_kind)sk) ? 2 : 1;
                             v <= (sk == LOOM_SCHED_INTERLEAVED                ? 8
                                   : loom_schedule_vshape((loom_sched_kind)sk) ? 2
                                                                               : 1);
                             v *= 2) {
                            loom_plan_layout l = *deg;
                            l.cp_impl = (loom_plan_cp_impl)ci, l.zero = zero, l.sp = sp;
                            l.mbs = mbss[mq], l.m = local / mbss[mq], l.v = v;
                            l.sched = pp > 1 && !serve ? (loom_sched_kind)sk : LOOM_SCHED_1F1B;
                            LOOM_TRY(search_recompute(sr, &l));
                        }
    return LOOM_OK;
}

/* The closed-form pass over every (tp, pp, cp, dp, ep) of N devices. */
static loom_status search_all(search *sr, int N) {
    const loom_plan_model *m = sr->m;
    const loom_plan_job *j = sr->j;
    int tps[64], pps[64], cps[64], eps[64], mbss[64];
    const int ntp = divisors(N, tps, 64, m->heads);
    for (int a = 0; a < ntp; a++) {
        const int tp = tps[a];
        const int npp = divisors(N / tp, pps, 64, m->layers);
        for (int bq = 0; bq < npp; bq++) {
            const int pp = pps[bq];
            const int ncp = j->serve ? 1 : divisors(N / tp / pp, cps, 64, 64);
            if (j->serve) cps[0] = 1;
            for (int cq = 0; cq < ncp; cq++) {
                const int cp = cps[cq], dp = N / tp / pp / cp;
                if (j->seq % cp) continue;
                if (!j->serve && j->batch % dp) {
                    sr->st->considered++, sr->st->rejected_batch++;
                    continue;
                }
                const int nep = m->experts > 1 ? divisors((long)dp * cp, eps, 64, m->experts) : 1;
                if (m->experts <= 1) eps[0] = 1;
                const int local = j->serve ? 1 : j->batch / dp;
                const int nmbs = j->serve ? 1 : divisors(local, mbss, 64, 16);
                if (j->serve) mbss[0] = 1;
                for (int eq = 0; eq < nep; eq++) {
                    if (m->experts > 1 && m->experts % eps[eq]) continue;
                    const loom_plan_layout deg = {.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = eps[eq]};
                    LOOM_TRY(search_degrees(sr, &deg, mbss, nmbs, local));
                }
            }
        }
    }
    return LOOM_OK;
}

/* The best of the closed-form pass re-evaluated with the simulator,
 * feasible ones kept, best first. */
static loom_status search_resimulate(search *sr, int *n_out) {
    int n = 0;
    for (int i = 0; i < sr->tk.n; i++) {
        LOOM_TRY(loom_plan_evaluate(sr->m, sr->c, sr->j, &sr->tk.r[i].l, 1, sr->r));
        sr->st->simulated++;
        if (sr->r->feasible) sr->tk.r[n++] = *sr->r;
    }
    qsort(sr->tk.r, n, sizeof *sr->tk.r, cmp_result);
    *n_out = n;
    return LOOM_OK;
}

loom_status loom_plan_search(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                             int top, loom_plan_result *out, int *n_out, loom_plan_search_stats *stats) {
    loom_plan_search_stats dummy;
    loom_plan_search_stats *st = stats ? stats : &dummy;
    memset(st, 0, sizeof *st);
    const int N = job_gpus(c, j);
    if (N < 1) return loom_fail(LOOM_EUSAGE, "--gpus %d: must be >= 1", N);
    const int cap = COARSE > top ? COARSE : top;
    search sr = {.m = m, .c = c, .j = j, .st = st, .tk = {malloc(sizeof(loom_plan_result) * cap), 0, cap}};
    sr.r = malloc(sizeof *sr.r);
    int n = 0;
    loom_status s = sr.tk.r && sr.r ? search_all(&sr, N) : loom_fail(LOOM_EOS, "out of memory");
    if (s == LOOM_OK) s = search_resimulate(&sr, &n);
    if (s == LOOM_OK) {
        *n_out = n < top ? n : top;
        memcpy(out, sr.tk.r, sizeof *out * *n_out);
    }
    free(sr.tk.r);
    free(sr.r);
    return s;
}

/* ---- the rule of thumb --------------------------------------------------- */

void loom_plan_heuristic(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                         loom_plan_layout *l, char *buf, size_t cap) {
    const int N = job_gpus(c, j), G = c->gpus_per_node < N ? c->gpus_per_node : N;
    const eval_ctx e = plan_ctx_of(m, c, j);
    const double P = loom_plan_model_params(m, NULL);
    const double per_param = j->serve ? e.wb : e.wb + e.gb + e.ob;
    size_t n = strlen(buf);
#define SAY(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__), n = n < cap ? n : cap)
    memset(l, 0, sizeof *l);
    l->ep = l->v = l->cp = 1;
    l->sched = LOOM_SCHED_1F1B;
    for (int i = 0; i < LOOM_PLAN_NAXES; i++) l->order[i] = i;
    /* 1. TP inside a node until the model state fits in half the memory */
    int tp = 1;
    while (tp < G && P * per_param / tp > 0.5 * c->memory && m->heads % (tp * 2) == 0 && N % (tp * 2) == 0)
        tp *= 2;
    SAY("1. TP by intra-node links and memory: tp=%d (model state %.1f GB; %.1f GB per rank at tp=%d, "
        "a node has %d devices)\n",
        tp, P * per_param / GB, P * per_param / tp / GB, tp, c->gpus_per_node);
    /* 2. PP across nodes until it fits */
    int pp = 1;
    while (P * per_param / (tp * pp) > 0.5 * c->memory && pp * 2 <= m->layers && N % (tp * pp * 2) == 0)
        pp *= 2;
    SAY("2. PP by depth and inter-node bandwidth: pp=%d (%d layers, %.1f GB per rank of model state)\n", pp,
        m->layers, P * per_param / (tp * pp) / GB);
    /* 3. DP for the rest */
    int dp = N / (tp * pp);
    SAY("3. DP for the rest: dp=%d%s\n", dp, dp > 1 && !j->serve ? ", ZeRO-1 to shard the optimizer" : "");
    l->tp = tp, l->pp = pp, l->dp = dp;
    l->zero = dp > 1 && !j->serve ? 1 : 0;
    /* 4. SP with TP, CP for long sequences */
    l->sp = tp > 1 && !j->serve && j->seq % tp == 0;
    if (!j->serve && j->seq >= 32768) {
        int cp = 1;
        while (cp * 2 <= dp && dp % (cp * 2) == 0 && j->seq / cp > 16384) cp *= 2;
        l->cp = cp, l->dp = dp / cp;
    }
    SAY("4. SP/CP for activations: sp=%d cp=%d (sequence %d)\n", l->sp, l->cp, j->seq);
    /* 5. EP for MoE */
    if (m->experts > 1) {
        int ep = 1;
        while (ep * 2 <= m->experts && m->experts % (ep * 2) == 0 && (l->dp * l->cp) % (ep * 2) == 0) ep *= 2;
        l->ep = ep;
        SAY("5. EP for MoE: ep=%d (%d experts)\n", ep, m->experts);
    } else {
        SAY("5. EP for MoE: dense model, ep=1\n");
    }
    if (j->serve) {
        l->mbs = 1, l->m = 1;
    } else {
        const int local = j->batch / (l->dp > 0 ? l->dp : 1);
        l->m = pp > 1 ? 4 * pp : 1;
        while (l->m > 1 && local % l->m) l->m /= 2;
        if (l->m < 1) l->m = 1;
        l->mbs = local / l->m > 0 ? local / l->m : 1;
        l->recompute = LOOM_RECOMPUTE_SELECTIVE;
        SAY("   then 1f1b with m=%d micro-batches of %d, selective recompute\n", l->m, l->mbs);
    }
#undef SAY
}

void loom_plan_train_flags(const loom_plan_model *m, const loom_plan_job *j, const loom_plan_layout *l,
                           char *buf, size_t cap) {
    if (j->serve) {
        /* loom serve's --dp counts replicas; its --ep ranks are dp ranks of one replica */
        const int ep = l->ep > 1 ? l->ep : 1;
        int k = snprintf(buf, cap, "loom serve --model %s --dp %d --tp %d --pp %d", m->name, l->dp / ep,
                         l->tp, l->pp);
        if (ep > 1 && k >= 0 && (size_t)k < cap) snprintf(buf + k, cap - (size_t)k, " --ep %d", ep);
        return;
    }
    size_t n = (size_t)snprintf(buf, cap, "loom train --model %s --batch %d --seq %d --dp %d --tp %d --pp %d",
                                m->name, j->batch, j->seq, l->dp, l->tp, l->pp);
#define ADD(...) (n += (size_t)snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__))
    if (l->cp > 1) ADD(" --cp %d", l->cp);
    if (l->cp > 1 && l->cp_impl == LOOM_PLAN_CP_ULYSSES) ADD(" --cp-impl ulysses");
    if (l->ep > 1) ADD(" --ep %d", l->ep);
    if (l->sp) ADD(" --sp");
    if (l->zero) ADD(" --zero %d", l->zero);
    if (l->pp > 1) {
        ADD(" --schedule %s --micro-batches %d", loom_schedule_name(l->sched), l->m);
        if (l->v > 1) ADD(" --virtual-stages %d", l->v);
    } else if (l->m > 1) {
        ADD(" --grad-accum %d", l->m);
    }
    static const char *ax[] = {"tp", "cp", "dp", "pp"};
    if (l->order[2] != LOOM_PLAN_DP)
        ADD(" --mesh-order %s,%s,%s,%s", ax[l->order[0]], ax[l->order[1]], ax[l->order[2]], ax[l->order[3]]);
    if (l->recompute == LOOM_RECOMPUTE_FULL || l->recompute == LOOM_RECOMPUTE_SELECTIVE)
        ADD(" --recompute %s", l->recompute == LOOM_RECOMPUTE_FULL ? "full" : "selective");
    if (j->bf16) ADD(" --precision bf16");
    if (l->cp > 1 && l->cp_impl == LOOM_PLAN_CP_ALLGATHER)
        ADD("  # cp_impl=allgather: not in loom train (ring, ulysses)");
    if (l->recompute == LOOM_PLAN_RECOMPUTE_OP || l->recompute == LOOM_PLAN_RECOMPUTE_LAYER2)
        ADD("  # recompute=%s: not in loom train (none, selective, full)",
            l->recompute == LOOM_PLAN_RECOMPUTE_OP ? "op" : "layer2");
    if (l->async_tp) ADD("  # async_tp: not in loom train");
    if (l->n_stages) ADD("  # stages=: the layers per stage loom train balances itself");
    if (!m->loom_trains) ADD("  # loom trains GPT-2 shapes only");
#undef ADD
}
