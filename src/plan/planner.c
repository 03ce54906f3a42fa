/* planner.c - loom_plan_evaluate, the cost model of one layout over every
 * mesh axis (dp, tp, pp, cp, ep): the rules a layout must meet
 * (loom_layout_validate's, through loom_plan_layout_validate), the split of the layers over the pipeline stages, the
 * bytes per rank (plan_memory.c) and the costs of a micro-batch
 * (plan_time.c), then the step: the pipeline replayed by the simulator of
 * sim.c on the executor's schedule lists (or its closed-form bubble in the
 * search's coarse pass), the exposed DP reductions and the optimizer, and
 * the failure modes; serving layouts by prefill and decode. docs/planning.md
 * is the reference for every formula. Pure: nothing here is collective. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"
#include "plan/internal.h"

/* ---- schedule helpers (cached: the search asks for the same lists often) */

static int peak_live_formula(const loom_plan_layout *l) {
    const int p = l->pp, m = l->m, v = l->v;
    switch (l->sched) {
    case LOOM_SCHED_GPIPE: return m;
    case LOOM_SCHED_INTERLEAVED: {
        const int w = 2 * (p - 1) + (v - 1) * p + 1;
        return m * v < w ? m * v : w;
    }
    case LOOM_SCHED_ZBH2: return m < 2 * p - 1 ? m : 2 * p - 1; /* list_schedule.c's limits */
    case LOOM_SCHED_ZBV: return 2 * m < 2 * p ? 2 * m : 2 * p;
    case LOOM_SCHED_DUALPIPEV: return 2 * m < 2 * p + 2 ? 2 * m : 2 * p + 2;
    default: return p < m ? p : m;
    }
}

/* ---- evaluation -------------------------------------------------------- */

static void add_failure(loom_plan_result *r, const char *fmt, double x) {
    char t[160];
    snprintf(t, sizeof t, fmt, x);
    size_t n = strlen(r->failures);
    snprintf(r->failures + n, sizeof r->failures - n, "%s%s", n ? "; " : "", t);
}

static loom_status reject(loom_plan_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static loom_status reject(loom_plan_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
    r->feasible = 0;
    return LOOM_OK;
}

/* Over the device's memory: rejected with the breakdown. */
static loom_status reject_memory(loom_plan_result *r, const loom_plan_cluster *c) {
    char bd[256];
    plan_format_gb(bd, sizeof bd, r);
    return reject(r, "memory %.1f GB/rank > %.1f GB (over by %.1f GB: %s)", r->mem_total / GB, c->memory / GB,
                  (r->mem_total - c->memory) / GB, bd);
}

/* ---- training: stages, per micro-batch costs, the pipeline, the step ---- */

/* GEMM efficiency at this layout's GEMM sizes (one number per layer), a
 * layer's forward FLOPs on a rank, and the head's cost in layers. */
static void split_costs(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                        const loom_plan_layout *l, const eval_ctx *e, stage_split *sp) {
    const double t = l->tp, cp = l->cp, b = l->mbs, s = j->seq, s_loc = s / cp;
    const double score_bytes = e->ab == 2 && !e->flash ? 2 * e->ab * b * s_loc * s * m->heads / t : 0;
    sp->attn_share = 0;
    sp->eff = e->peak * plan_layer_gemm_eff(m, &e->sc, c, b * s_loc, s, t, l->ep, e->flash, score_bytes,
                                            e->peak / c->hbm_bw, &sp->attn_share);
    /* layers per rank: the partitioner's split with the head's cost in blocks */
    sp->f_layer = plan_layer_flops(m, &e->sc, b * s, s) / (t * cp);
    const double f_head = 2 * b * s * e->sc.head_w / (t * cp);
    /* a tiled kernel the cluster measured (attention_tflops): the
     * attention's forward and backward at its speeds at this head size and
     * length, in place of the GEMM-curve share; causal, the FLOPs the
     * kernel runs are half the 4 b s^2 h model FLOPs, its backward 2.5 x
     * its forward's (FlashAttention's counting) */
    sp->attn_bwd_extra = 0;
    double gemm_t = sp->f_layer / sp->eff * (1 - sp->attn_share),
           attn_f = sp->f_layer / sp->eff * sp->attn_share;
    /* FP8: the layers' GEMMs (not the attention, not the head) at the FP8
     * time of the layer's MLP up-projection relative to its bf16 time */
    if (e->fp8) {
        const double M = b * s_loc, N = (m->gated ? 2.0 : 1.0) * n_topk(m) * m->ffn / t, K = m->hidden;
        gemm_t *= plan_gemm_time(c, M, N, K, 1, e->peak) / plan_gemm_time(c, M, N, K, 0, e->peak);
    }
    double af, ab;
    if (e->ab == 2 && e->flash && plan_attn_speed(c, e->attn, e->sc.hd, s_loc, &af, &ab)) {
        const double causal = 2 * b * s_loc * s * m->hidden / t;
        attn_f = causal / af;
        sp->attn_bwd_extra = 2.5 * causal / ab - 2 * attn_f;
    }
    sp->eff = sp->f_layer / (gemm_t + attn_f);
    sp->attn_share = attn_f / (gemm_t + attn_f);
    /* in time, layer units */
    sp->head_cost = (f_head / (e->peak * loom_plan_gemm_eff(c, f_head))) / (sp->f_layer / sp->eff);
}

/* The layers of the most loaded rank: the partitioner's split when
 * simulating a pipeline (sp->counts), else an even split rounded up with
 * the head on the last rank. 0 if the partitioner refuses (loom_errmsg). */
static int split_layers(const loom_plan_model *m, const loom_plan_layout *l, int simulate, stage_split *sp) {
    const int S = l->pp * l->v;
    const double head_cost = sp->head_cost;
    sp->max_rank_cost = 0, sp->mean_cost = (m->layers + head_cost) / l->pp;
    sp->layers_max = 0, sp->first = 1, sp->last = l->pp == 1;
    if ((simulate && l->pp > 1) || l->n_stages) {
        if (l->n_stages) /* the layout's own counts (the validator checked them) */
            for (int s = 0; s < S; s++) sp->counts[s] = l->stages[s];
        else if (loom_partition_balance(m->layers, l->pp, l->v, 0, head_cost, sp->counts) != LOOM_OK)
            return 0;
        for (int rk = 0; rk < l->pp; rk++) {
            double cost = 0;
            int ly = 0;
            for (int ch = 0; ch < l->v; ch++) {
                cost += loom_partition_stage_cost(sp->counts, S, ch * l->pp + rk, 0, head_cost);
                ly += sp->counts[ch * l->pp + rk];
            }
            if (cost > sp->max_rank_cost) {
                sp->max_rank_cost = cost, sp->layers_max = ly;
                sp->first = rk == 0, sp->last = rk == l->pp - 1;
            }
        }
    } else {
        /* coarse: even split rounded up, the head on the last rank */
        sp->layers_max = (m->layers + S - 1) / S * l->v;
        sp->max_rank_cost = sp->layers_max + (l->pp == 1 ? head_cost : 0);
        if (l->pp > 1 && (m->layers / S) * l->v + head_cost > sp->max_rank_cost) {
            sp->max_rank_cost = (m->layers / S) * l->v + head_cost;
        }
        if (l->pp == 1) sp->mean_cost = sp->max_rank_cost;
    }
    return 1;
}

/* The step's pipeline: processor sharing, the wait per synchronisation,
 * makespan and busy time of the slowest rank. */
typedef struct pipe_time {
    sharing sh;
    int shared_pipe; /* pipeline stages time-share a node's cores (the replay shares them) */
    double solo;     /* speed factor of the replayed work */
    double syncs_mb; /* synchronisations per micro-batch, pipeline messages included */
    double wake;     /* the wait for a processor per synchronisation */
    double makespan, busy;
} pipe_time;

/* The costs the simulator runs with (r->sim_*), and the wait per
 * synchronisation with all D ranks of the node wanting a core (every layout
 * but a pipeline's, whose replay counts them), X = the slice, or the work
 * between two synchronisations if shorter. */
static void sim_setup(const loom_plan_cluster *c, const loom_plan_job *j, const loom_plan_layout *l,
                      const mb_costs *k, pipe_time *pt, loom_plan_result *r) {
    const int split = loom_schedule_splits_backward(l->sched) && l->pp > 1;
    /* devices sharing cores: the pipeline replays each stage's work at its
     * speed alone and lets the simulator share the node's cores; all else
     * runs with every device busy (all_busy = 1 on the calibrated node) */
    const sharing sh = plan_sharing_of(c, j, l);
    const int shared_pipe = l->pp > 1 && sh.cores > 0;
    const double solo = shared_pipe ? sh.solo : 1;
    const double F = k->F, Bi = k->Bi, W = k->W;
    r->sim_f = solo * F / l->v;
    r->sim_b = solo * (split ? Bi : Bi + W) / l->v;
    r->sim_w = split ? solo * W / l->v : 0;
    r->sim_comm = k->msg;
    r->sim_cores = shared_pipe ? sh.cores : 0, r->sim_share = shared_pipe ? sh.share : 0;
    const double syncs_mb = k->sync_f + k->sync_b + (l->pp > 1 ? 2.0 * l->v : 0);
    const double span = syncs_mb > 0 ? sh.solo * (F + Bi + W) / syncs_mb : 0;
    const double wake =
        sh.node_ranks > 0 ? loom_sim_wake_wait(c->slice, span, sh.node_cores, sh.node_ranks) : 0;
    const int sim_waits = shared_pipe && wake > 0; /* the replay does the pipeline's waits */
    r->sim_slice = sim_waits ? c->slice : 0, r->sim_span = sim_waits ? span : 0;
    r->sim_replicas = shared_pipe ? (int)lround(sh.node_ranks / sh.share) : 0;
    r->sim_syncs_f = sim_waits ? (int)lround(k->sync_f / l->v) : 0;
    r->sim_syncs_b = sim_waits ? (int)lround(k->sync_b / l->v) : 0;
    r->t_wake = 0;
    *pt = (pipe_time){.sh = sh, .shared_pipe = shared_pipe, .solo = solo, .syncs_mb = syncs_mb, .wake = wake};
}

/* No pipeline: the micro-batches one after the other. */
static void pipe_none(const loom_plan_layout *l, const mb_costs *k, pipe_time *pt, loom_plan_result *r) {
    pt->busy = l->m * (k->F + k->Bi + k->W) * pt->sh.all_busy;
    r->t_wake = l->m * (k->sync_f + k->sync_b) * pt->wake;
    pt->makespan = pt->busy + r->t_wake;
    r->bubble = 0;
}

/* The pipeline replayed by the simulator on the schedule's lists, each
 * virtual stage's costs scaled by its layers relative to the slowest rank's
 * mean chunk. */
static loom_status pipe_simulated(const loom_plan_layout *l, const stage_split *sp, pipe_time *pt,
                                  loom_plan_result *r) {
    const int S = l->pp * l->v;
    loom_schedule *sch = NULL;
    loom_sim_result *res = NULL;
    double *scale = malloc(sizeof(double) * S);
    loom_status st =
        scale ? loom_schedule_build(l->sched, l->pp, l->m, l->v, &sch) : loom_fail(LOOM_EOS, "oom");
    if (st == LOOM_OK) {
        /* chunk-level costs: per virtual stage, relative to the slowest rank's mean chunk */
        const double per_chunk = sp->max_rank_cost / l->v;
        for (int v = 0; v < S; v++)
            scale[v] = loom_partition_stage_cost(sp->counts, S, v, 0, sp->head_cost) / per_chunk;
        loom_sim_costs sc;
        loom_sim_costs_default(&sc);
        sc.f = r->sim_f, sc.b = r->sim_b, sc.w = r->sim_w, sc.comm = r->sim_comm, sc.opt = 0;
        sc.stage_scale = scale;
        sc.cores = r->sim_cores, sc.share = r->sim_share;
        sc.slice = r->sim_slice, sc.span = r->sim_span, sc.replicas = r->sim_replicas;
        sc.syncs_f = r->sim_syncs_f, sc.syncs_b = r->sim_syncs_b;
        st = loom_sim_run(sch, &sc, &res);
    }
    if (st == LOOM_OK) {
        pt->makespan = res->makespan;
        pt->busy = 0;
        for (int k = 0; k < l->pp; k++)
            if (res->busy[k] > pt->busy) pt->busy = res->busy[k], r->t_wake = res->wake[k];
        r->bubble = res->bubble;
        r->in_flight = loom_schedule_peak_live(sch, 0);
        r->simulated = 1;
    }
    loom_sim_free(res);
    loom_schedule_free(sch);
    free(scale);
    return st;
}

/* The coarse pass: the schedule's closed-form bubble. */
static void pipe_closed_form(const loom_plan_layout *l, const mb_costs *k, pipe_time *pt,
                             loom_plan_result *r) {
    const double F = k->F, Bi = k->Bi, W = k->W;
    loom_sim_costs sc;
    loom_sim_costs_default(&sc);
    sc.f = r->sim_f, sc.b = r->sim_b, sc.w = r->sim_w;
    double bub = loom_sim_closed_form_bubble(l->sched, l->pp, l->m, l->v, &sc);
    if (isnan(bub)) bub = (l->pp - 1.0) / (l->m + l->pp - 1.0);
    pt->busy = l->m * (F + Bi + W) * pt->solo;
    pt->makespan = pt->busy / (1 - bub) + 2 * (l->pp - 1) * k->msg;
    /* shared cores: the node's work cannot finish faster than with every
     * stage busy; each synchronisation of the slowest rank (receives
     * included) waits for a core as if every rank wanted one */
    if (pt->shared_pipe) pt->makespan = fmax(pt->makespan, l->m * (F + Bi + W) * pt->sh.all_busy);
    r->t_wake = l->m * pt->syncs_mb * pt->wake;
    pt->makespan += r->t_wake;
    r->bubble = 1 - pt->busy / pt->makespan;
}

/* The step: the pipeline, the exposed DP reductions and the optimizer, and
 * the parts of the slowest rank's time. */
static void finish_step(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                        const loom_plan_layout *l, const eval_ctx *e, const stage_split *sp,
                        const mb_costs *k, const pipe_time *pt, loom_plan_result *r) {
    const double F = k->F, Bi = k->Bi, W = k->W, makespan = pt->makespan, busy = pt->busy;
    /* DP reductions hide behind the last micro-batch's backward */
    const double window = j->no_dp_overlap ? 0
                          : k->z3 > 0      ? fmax(0, c->overlap * k->z3_bwd - k->z3_ag)
                                           : c->overlap * (Bi + W);
    r->t_dp = fmax(0, k->dp_t - window) * pt->sh.all_busy;
    /* after the pipeline: every rank waits for its reductions */
    const double wake_dp = k->sync_dp * pt->wake;
    r->t_wake += wake_dp;
    r->t_step = makespan + r->t_dp + k->opt * pt->sh.all_busy + wake_dp;
    /* the parts of the slowest rank's busy time (with shared cores: its wall
     * time computing in the replay, in the proportions of its work) */
    const double part = pt->shared_pipe ? busy / (l->m * (F + Bi + W)) : pt->sh.all_busy;
    r->t_compute = l->m * (k->fwd + k->bwd_in + W + k->recompute) * part;
    r->t_tp = l->m * (k->tp_f + k->tp_b) * part, r->t_cp = l->m * (k->cp_f + k->cp_b) * part;
    r->t_ep = l->m * (k->ep_f + k->ep_b) * part;
    r->t_pp = k->msg;
    r->cp_bytes = k->cp_layer_bytes * sp->layers_max * l->m;
    r->t_bubble = makespan - busy - (r->t_wake - wake_dp);
    const double tokens = (double)j->batch * j->seq;
    const int N = job_gpus(c, j);
    r->model_flops = plan_model_flops(m, tokens, j->seq);
    r->tokens_per_s_dev = tokens / r->t_step / N;
    r->mfu = r->model_flops / (r->t_step * N * e->peak);
    /* the FLOPs the devices run (a tiled causal kernel skips the masked half
     * of the scores) can not come faster than peak: if they do, a term
     * (an efficiency, a kernel's measured speed) is used outside the range
     * it was measured in; said, and the MFU capped at 100 % */
    const double hw = r->model_flops - (e->flash ? 6.0 * m->layers * tokens * j->seq * m->hidden : 0);
    const double util = hw / (r->t_step * N * e->peak);
    if (util > 1) {
        r->mfu_capped = 1;
        r->mfu = fmin(r->mfu, 1);
        add_failure(r,
                    "impossible speed: the step would run %.0f%% of peak FLOP/s (a cost term outside its "
                    "measured range; MFU capped at 100%%)",
                    100 * util);
    }
    r->feasible = 1;
}

/* The named failure modes of a feasible training layout. */
static void failure_modes(const loom_plan_cluster *c, const loom_plan_layout *l, const mb_costs *k,
                          loom_plan_result *r) {
    const double st_ = r->t_step, recompute = k->recompute;
    if (r->t_tp > 0.2 * st_)
        add_failure(r, "too much TP: collectives are %.0f%% of the step", 100 * r->t_tp / st_);
    if (r->stage_imbalance > 0.1)
        add_failure(r, "pipeline imbalance: slowest stage %.0f%% above the mean", 100 * r->stage_imbalance);
    if (r->bubble > 0.15) add_failure(r, "too few micro-batches: bubble %.0f%% of the step", 100 * r->bubble);
    if (r->mem_act > 0.5 * c->memory)
        add_failure(r, "too many micro-batches in flight: activations use %.0f%% of memory",
                    100 * r->mem_act / c->memory);
    if (r->t_ep > 0.2 * st_)
        add_failure(r, "expert all-to-all dominates: %.0f%% of the step", 100 * r->t_ep / st_);
    if (r->t_cp > 0.05 * st_)
        add_failure(r, "CP communication exposed: %.0f%% of the step", 100 * r->t_cp / st_);
    if (r->t_dp > 0.15 * st_) add_failure(r, "DP reduction exposed: %.0f%% of the step", 100 * r->t_dp / st_);
    if (recompute > 0 && l->pp > 1)
        add_failure(r, "recompute changes stage times: backward +%.0f%%",
                    100 * recompute / (k->bwd_in + k->bwd_w));
    else if (recompute > 0)
        add_failure(r, "recompute costs %.0f%% more compute", 100 * recompute / (3 * k->fwd));
}

/* A training layout once its stages are split: memory, the costs of a
 * micro-batch, the pipeline (simulated or closed form), the step. */
static loom_status eval_train(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                              const loom_plan_layout *l, const eval_ctx *e, int simulate,
                              const stage_split *sp, loom_plan_result *r) {
    r->stage_imbalance = sp->max_rank_cost / sp->mean_cost - 1;
    r->head_cost = sp->head_cost;
    r->in_flight = l->pp > 1 ? peak_live_formula(l) : 1;
    plan_memory(m, c, j, l, e, sp->layers_max, sp->first, sp->last, r);
    if (r->mem_total > c->memory) return reject_memory(r, c);
    mb_costs k;
    plan_mb_costs(m, c, j, l, e, sp, &k);
    pipe_time pt;
    sim_setup(c, j, l, &k, &pt, r);
    if (l->pp == 1) {
        pipe_none(l, &k, &pt, r);
    } else if (simulate) {
        LOOM_TRY(pipe_simulated(l, sp, &pt, r));
        /* the schedule's real in-flight count may differ from the formula */
        plan_memory(m, c, j, l, e, sp->layers_max, sp->first, sp->last, r);
        if (r->mem_total > c->memory) return reject_memory(r, c);
    } else {
        pipe_closed_form(l, &k, &pt, r);
    }
    finish_step(m, c, j, l, e, sp, &k, &pt, r);
    failure_modes(c, l, &k, r);
    return LOOM_OK;
}

/* Per-micro-batch costs of the slowest stage, and the whole step. */
loom_status loom_plan_evaluate(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                               const loom_plan_layout *l, int simulate, loom_plan_result *r) {
    memset(r, 0, sizeof *r);
    r->l = *l;
    if (loom_plan_layout_validate(m, j, job_gpus(c, j), l) != LOOM_OK) return reject(r, "%s", loom_errmsg());
    const eval_ctx e = plan_ctx_of(m, c, j);
    if (j->serve) return plan_eval_serve(m, c, j, l, &e, r);
    const int S = l->pp * l->v;
    stage_split sp;
    split_costs(m, c, j, l, &e, &sp);
    sp.counts = S <= 64 ? sp.counts_small : malloc(sizeof(int) * S);
    if (!sp.counts) return loom_fail(LOOM_EOS, "out of memory");
    loom_status st = split_layers(m, l, simulate, &sp) ? eval_train(m, c, j, l, &e, simulate, &sp, r)
                                                       : reject(r, "%s", loom_errmsg());
    if (sp.counts != sp.counts_small) free(sp.counts);
    return st;
}
