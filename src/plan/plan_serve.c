/* plan_serve.c - the cost model of a serving layout (loom plan --mode
 * serve): `batch` closed-loop clients over dp/ep replicas of tp x pp x ep
 * ranks; time to first token, per-token latency, tokens/s; on devices that
 * share cores (CPU ranks) the share each computing rank gets and the waits
 * of a replica's other ranks for the next step's plan. docs/planning.md,
 * "Serving", is the reference for every formula. Pure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "loom/sim.h"
#include "plan/internal.h"

static void serve_failure(loom_plan_result *r, const char *fmt, double x) {
    char t[160];
    snprintf(t, sizeof t, fmt, x);
    size_t n = strlen(r->failures);
    snprintf(r->failures + n, sizeof r->failures - n, "%s%s", n ? "; " : "", t);
}

/* Occupancy of closed-loop clients: each of `batch` clients sends its next
 * request when the last one ended, spread evenly over the replicas, so
 * min(batch, replicas) replicas work, each on ceil(batch / replicas)
 * sequences (at most what its KV cache holds). */
typedef struct serve_load {
    int replicas, ranks; /* replicas, ranks per replica */
    int busy, seqs;      /* replicas with work, sequences each */
    double stretch;      /* compute time x this: the share of a core each busy rank gets */
    double wake;         /* per step: the last of a replica's other ranks to take the plan */
    double wake_request; /* per request: the replica's rank 0, idle between requests, woken by it */
} serve_load;

/* Devices that share cores (cores_per_node, CPU ranks; 0: none of this).
 * The cluster's rates were measured with gpus_per_node ranks all busy, each
 * getting min(1, C/D) of a core; with k ranks of the node computing, each
 * gets min(1, C/k). Each step, a replica's rank 0 plans (admission, the
 * previous step's tokens out to the clients) while its other ranks sleep
 * in short naps waiting for the plan (serve.c's share_plan: they block
 * rather than spin): each must then be woken and find a core among the
 * runnable threads - the node's computing ranks, per running sequence the
 * connection thread that its token wakes, and the other work on the node
 * (background_runnable) - which takes loom_sim_wake_wait(slice, C,
 * runnable) (EEVDF, as for the pipeline's waits), and the step starts when
 * the last of the n = ranks - 1 has: the wait times H(n) = 1 + 1/2 + ... +
 * 1/n (the last of n independent exponential waits). A replica's rank 0,
 * idle between requests, waits for a core once when a request wakes it. */
static serve_load serve_load_of(const loom_plan_cluster *c, const loom_plan_job *j, const loom_plan_layout *l,
                                int max_seqs) {
    serve_load s = {0};
    s.ranks = l->tp * l->pp * l->ep;
    s.replicas = l->dp / l->ep;
    s.busy = j->batch < s.replicas ? j->batch : s.replicas;
    s.seqs = (j->batch + s.replicas - 1) / s.replicas;
    if (s.seqs > max_seqs) s.seqs = max_seqs;
    s.stretch = 1;
    if (!(c->cores > 0)) return s;
    const double D = c->gpus_per_node, node = D < job_gpus(c, j) ? D : job_gpus(c, j);
    const double k = fmin(node, (double)s.busy * s.ranks);
    s.stretch = fmin(1, c->cores / D) * fmax(1, k / c->cores);
    const double w = loom_sim_wake_wait(c->slice, 0, c->cores, k + (double)s.busy * s.seqs + c->background);
    double h = 0;
    for (int i = 1; i < s.ranks; i++) h += 1.0 / i;
    s.wake = h * w;
    s.wake_request = w;
    return s;
}

loom_status plan_eval_serve(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                            const loom_plan_layout *l, const eval_ctx *e, loom_plan_result *r) {
    const int Ls = (m->layers + l->pp - 1) / l->pp;
    plan_memory(m, c, j, l, e, Ls, 1, l->pp == 1, r);
    if (r->max_seqs < 1) {
        char b[256];
        plan_format_gb(b, sizeof b, r);
        snprintf(r->reason, sizeof r->reason,
                 "memory: weights leave no room for one sequence's KV cache (%s; device %.1f GB)", b,
                 c->memory / GB);
        r->feasible = 0;
        return LOOM_OK;
    }
    const serve_load ld = serve_load_of(c, j, l, r->max_seqs);
    const double t = l->tp, eff = e->peak * c->gemm_eff, x = ld.stretch;
    const int tin = plan_axis_inter(l, c, LOOM_PLAN_TP), pin = plan_axis_inter(l, c, LOOM_PLAN_PP);
    /* prefill of one prompt: every stage in turn */
    const double s = j->seq;
    const double pre =
        (m->layers * plan_layer_flops(m, &e->sc, s, s) / t / eff + 2 * s * e->sc.head_w / t / eff) * x;
    const double pre_tp =
        2.0 * m->layers * loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, l->tp, tin, s * m->hidden * e->ab);
    const double pre_pp = (l->pp - 1) * loom_plan_coll_time(c, LOOM_COLL_P2P, 2, pin, s * m->hidden * e->ab);
    r->ttft = pre + pre_tp + pre_pp + ld.wake + ld.wake_request;
    /* decode: B sequences per stage, one token each, bound by weights + KV reads or FLOPs */
    const double B = ceil((double)ld.seqs / l->pp), ctx = s + j->gen / 2.0;
    double active;
    loom_plan_model_params(m, &active);
    const double total_w = loom_plan_model_params(m, NULL);
    /* expert weights read: the experts the batch touches on this rank */
    const double frac_read = m->experts > 1 ? fmin(1.0, B * m->topk / (double)m->experts) : 1.0;
    const double w_read =
        (total_w - (m->experts > 1 ? (1 - frac_read) * (total_w - active) : 0)) * e->wb / (t * l->pp);
    const int kvl = m->kv_heads >= l->tp ? m->kv_heads / l->tp : 1;
    const double kv_read = B * 2.0 * m->layers / l->pp * ctx * e->sc.hd * kvl * e->ab;
    const double mem_t = (w_read / (m->experts > 1 && l->ep > 1 ? l->ep : 1) + kv_read) / c->hbm_bw * x;
    const double fl_t = (2 * active * B + 4.0 * B * ctx * m->hidden * m->layers) / (t * l->pp) / eff * x;
    const double tp_t = 2.0 * m->layers / l->pp *
                        loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, l->tp, tin, B * m->hidden * e->ab);
    const double ep_t = l->ep > 1 ? 2.0 * m->layers / l->pp *
                                        loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->ep, plan_ep_inter(l, c),
                                                            B * m->topk * m->hidden * e->ab / t)
                                  : 0;
    const double stage = fmax(mem_t, fl_t) + tp_t + ep_t;
    r->tpot = l->pp * stage +
              (l->pp - 1) * loom_plan_coll_time(c, LOOM_COLL_P2P, 2, pin, B * m->hidden * e->ab) + ld.wake;
    r->t_compute = fmax(mem_t, fl_t) * l->pp, r->t_tp = tp_t * l->pp, r->t_ep = ep_t * l->pp;
    r->t_wake = ld.wake;
    r->t_step = r->tpot;
    r->in_flight = ld.seqs;
    /* closed loop: every busy replica's sequences each take TTFT + gen x TPOT per request */
    const double latency = r->ttft + j->gen * r->tpot;
    r->tokens_per_s_dev = (double)ld.busy * ld.seqs * j->gen / latency / job_gpus(c, j);
    r->mfu = 2 * active * r->tokens_per_s_dev / e->peak;
    if (tp_t > 0.3 * stage)
        serve_failure(r, "too much TP: all-reduces are %.0f%% of a decode step", 100 * tp_t / stage);
    if (ep_t > 0.3 * stage)
        serve_failure(r, "expert all-to-all dominates: %.0f%% of a decode step", 100 * ep_t / stage);
    if (ld.wake > 0.3 * r->tpot)
        serve_failure(r, "ranks waiting for a core take %.0f%% of a decode step", 100 * ld.wake / r->tpot);
    if (mem_t > fl_t)
        serve_failure(r, "decode bound by memory bandwidth (%.0f%% of the FLOP bound is used)",
                      100 * fl_t / mem_t);
    if (r->max_seqs < (j->batch + ld.replicas - 1) / ld.replicas)
        serve_failure(r, "KV cache holds only %.0f concurrent sequences per replica", r->max_seqs);
    if (ld.busy < ld.replicas) serve_failure(r, "only %.0f replicas have work", ld.busy);
    r->feasible = 1;
    return LOOM_OK;
}
