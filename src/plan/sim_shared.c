/* sim_shared.c - the simulator's replay of pipeline ranks that time-share
 * processors (loom_sim_costs.cores: CPU ranks, more of them than cores on
 * a node; pp axis; pure, not collective). sim.c's replay times each rank
 * on its own clock; here every rank moves forward in time together, event
 * by event, each computing rank at its share of its node's cores, and a
 * rank that blocked in a synchronisation waits for a processor back
 * (loom_sim_wake_wait). docs/planning.md, "Devices that share cores". */
#include <math.h>
#include <stdlib.h>

#include "plan/sim_internal.h"

/* The replay of validate.c runs each rank as far as it can and times an
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
    const int S = s->pp * s->virtual_stages, stg = loom_pp_vstage(s, r, a->chunk);
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
    const int want = 1 + ps_count(state, k, pp, share,
                                  PS_BIT(PS_COMPUTE) | PS_BIT(PS_WAKE_RECV) | PS_BIT(PS_WAKE_SYNC), 1);
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

/* The replay's state: per rank its position in its list (pc), state (PS_*),
 * work left of the current piece (rem), the piece (a compute action's
 * duration over its synchronisations + 1), syncs left, the wait for a
 * processor left, and the waits inside compute actions (not busy); per
 * message its arrival time (-1: not sent). */
typedef struct ps_replay {
    const loom_schedule *s;
    const double *dur;
    const loom_sim_costs *c;
    loom_sim_result *r;
    int pp, share, left; /* ranks, ranks per node, ranks not finished */
    double t;            /* now */
    double *rem, *piece, *wait, *wait_in, *arrive;
    int *pc, *state, *syncs;
} ps_replay;

/* Rank k's compute action a at index i: start it, end a piece of it, or
 * meet a synchronisation inside it. 1: the action is over; 0: the rank
 * stays in it (computing or waiting for a processor). */
static int ps_compute(ps_replay *p, int k, int i, const loom_pp_action *a) {
    if (p->state[k] == PS_BEFORE) {
        p->syncs[k] = ps_syncs(p->s, a, p->c);
        p->piece[k] = p->dur[i] / (p->syncs[k] + 1);
        p->rem[k] = p->piece[k], p->state[k] = PS_COMPUTE;
    }
    while (!(p->rem[k] > 0) && p->syncs[k] > 0) { /* a synchronisation inside the action */
        p->syncs[k]--;
        const double w = ps_wake(p->state, k, p->pp, p->share, p->c);
        if (w > 0) {
            p->wait[k] = w, p->state[k] = PS_WAKE_SYNC, p->r->wake[k] += w, p->wait_in[k] += w;
            return 0;
        }
        p->rem[k] = p->piece[k];
    }
    return !(p->rem[k] > 0);
}

/* Rank k's receive a: 1 when its message has come (and, if the rank
 * blocked, it has a processor back). */
static int ps_receive(ps_replay *p, int k, const loom_pp_action *a) {
    const double at = p->arrive[ps_msg(p->s, k, a)];
    if (at < 0 || at > p->t) {
        p->state[k] = PS_RECV;
        return 0;
    }
    if (p->state[k] == PS_RECV) { /* it blocked: it needs a processor back */
        const double w = ps_wake(p->state, k, p->pp, p->share, p->c);
        if (w > 0) {
            p->wait[k] = w, p->state[k] = PS_WAKE_RECV, p->r->wake[k] += w;
            return 0;
        }
    }
    return 1;
}

/* Everything rank k does at time t: the actions that end now, one after
 * the other, until one takes time. 1 if anything changed. */
static int ps_run_rank(ps_replay *p, int k) {
    const loom_schedule *s = p->s;
    int *state = p->state, moved = 0;
    for (const int len = s->offset[k + 1] - s->offset[k]; p->pc[k] < len;) {
        const int i = s->offset[k] + p->pc[k];
        const loom_pp_action *a = &s->actions[i];
        if (state[k] == PS_BEFORE) p->r->start[i] = p->t;
        if (state[k] == PS_WAKE_RECV || state[k] == PS_WAKE_SYNC) {
            if (p->wait[k] > 0) break;
            state[k] = is_compute(a->kind) ? PS_COMPUTE : PS_WOKEN;
            if (state[k] == PS_COMPUTE) p->rem[k] = p->piece[k];
            moved = 1;
        }
        if (is_compute(a->kind)) {
            if (!ps_compute(p, k, i, a)) break;
        } else if (a->kind == LOOM_PP_SEND_ACT || a->kind == LOOM_PP_SEND_GRAD) {
            p->arrive[ps_msg(s, k, a)] = p->t + p->c->comm;
        } else if ((a->kind == LOOM_PP_RECV_ACT || a->kind == LOOM_PP_RECV_GRAD) && state[k] != PS_WOKEN) {
            if (!ps_receive(p, k, a)) break;
        }
        p->r->end[i] = p->t;
        state[k] = PS_BEFORE;
        p->pc[k]++;
        moved = 1;
        if (p->pc[k] == len) p->left--;
    }
    return moved;
}

/* Time to the next event: a computation or a wait for a processor ends, or
 * an awaited message arrives (INFINITY: none). */
static double ps_next_event(const ps_replay *p) {
    double dt = INFINITY;
    for (int k = 0; k < p->pp; k++) {
        if (p->state[k] == PS_COMPUTE) {
            const double rate = ps_rate(p->state, k, p->pp, p->share, p->c->cores);
            if (p->rem[k] / rate < dt) dt = p->rem[k] / rate;
        } else if (p->state[k] == PS_RECV) {
            const double at = p->arrive[ps_msg(p->s, k, &p->s->actions[p->s->offset[k] + p->pc[k]])];
            if (at >= 0 && at - p->t < dt) dt = at - p->t;
        } else if ((p->state[k] == PS_WAKE_RECV || p->state[k] == PS_WAKE_SYNC) && p->wait[k] < dt) {
            dt = p->wait[k];
        }
    }
    return dt;
}

/* Move every rank dt forward: waits for a processor run down, computing
 * ranks do their share of work (the one(s) that set dt end exactly now). */
static void ps_advance(ps_replay *p, double dt) {
    for (int k = 0; k < p->pp; k++) {
        if (p->state[k] == PS_WAKE_RECV || p->state[k] == PS_WAKE_SYNC) {
            p->wait[k] = p->wait[k] <= dt * (1 + 1e-12) ? 0 : p->wait[k] - dt;
            continue;
        }
        if (p->state[k] != PS_COMPUTE) continue;
        const double rate = ps_rate(p->state, k, p->pp, p->share, p->c->cores);
        p->rem[k] = p->rem[k] / rate <= dt * (1 + 1e-12) ? 0 : p->rem[k] - rate * dt;
    }
    p->t += dt;
}

/* The replay itself, once p is set up. */
static loom_status ps_replay_all(ps_replay *p) {
    while (p->left > 0) {
        /* everything that happens at time t */
        for (int moved = 1; moved;) {
            moved = 0;
            for (int k = 0; k < p->pp; k++) moved |= ps_run_rank(p, k);
        }
        if (p->left == 0) break;
        const double dt = ps_next_event(p);
        if (!isfinite(dt))
            return loom_fail(LOOM_EDATA,
                             "shared-processor replay stalled at time %g with %d ranks unfinished", p->t,
                             p->left);
        ps_advance(p, dt);
    }
    return LOOM_OK;
}

loom_status sim_simulate_shared(const loom_schedule *s, const double *dur, const loom_sim_costs *c,
                                loom_sim_result **out) {
    const int pp = s->pp, S = pp * s->virtual_stages;
    const size_t nmsg = 2 * (size_t)s->micro_batches * (size_t)(S > 1 ? S - 1 : 1);
    ps_replay p = {.s = s, .dur = dur, .c = c, .pp = pp, .left = pp, .t = 0};
    p.share = c->share > 0 && c->share < pp ? c->share : pp;
    p.r = sim_result_alloc(s);
    p.rem = calloc(4 * (size_t)pp, sizeof *p.rem), p.arrive = malloc(nmsg * sizeof *p.arrive);
    p.pc = calloc(3 * (size_t)pp, sizeof *p.pc);
    loom_status st = LOOM_OK;
    if (!p.r || !p.rem || !p.arrive || !p.pc) {
        st = loom_fail(LOOM_EOS, "out of memory simulating %d actions", s->n_total);
    } else {
        p.piece = p.rem + pp, p.wait = p.rem + 2 * pp, p.wait_in = p.rem + 3 * pp;
        /* state: PS_BEFORE (0) from calloc */
        p.state = p.pc + pp, p.syncs = p.pc + 2 * pp;
        for (size_t k = 0; k < nmsg; k++) p.arrive[k] = -1; /* not sent */
        st = ps_replay_all(&p);
    }
    if (st == LOOM_OK) sim_result_finish(s, NULL, p.wait_in, p.r);
    free(p.rem);
    free(p.arrive);
    free(p.pc);
    if (st != LOOM_OK) {
        loom_sim_free(p.r);
        return st;
    }
    *out = p.r;
    return LOOM_OK;
}
