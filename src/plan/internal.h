/* internal.h - what the planner's files share; not public API. The shape
 * costs of a model and the byte sizes of a job's precision (plan_time.c,
 * plan_memory.c), the links a mesh axis's group crosses (every axis: tp, cp,
 * dp, pp, and ep inside dp x cp), and the per-micro-batch costs that
 * loom_plan_evaluate (planner.c) hands from one step of its model to the
 * next. Pure: nothing here is collective. */
#ifndef LOOM_PLAN_INTERNAL_H
#define LOOM_PLAN_INTERNAL_H

#include "loom/plan.h"

#define GB 1e9

/* Parameters of one layer and of the ends of the model. */
typedef struct shape_costs {
    double attn_w, mlp_w, router_w, norm_w; /* parameters per layer (mlp_w: one expert) */
    double embed_w, head_w;                 /* input embedding (+ positions), LM head */
    double hd;
} shape_costs;

typedef struct eval_ctx {
    shape_costs sc;
    double wb, gb, ob, ab; /* bytes: weight, grad (kept and reduced), optimizer state per param, activation */
    double peak;
    int flash;           /* the job's attention keeps no s x s scores */
    loom_plan_attn attn; /* the kernel (DEFAULT resolved) */
    int fp8, fp8_params, dropout, elementwise, loss_chunks;
    double logit_bytes;  /* per logit at the loss's peak (the logits and the gradient the loss writes) */
    int logits_bf16;     /* the loss a fused kernel on bf16 logits */
    int zero3_per_param; /* ZeRO-3 gathers one collective per parameter tensor (else per unit) */
} eval_ctx;

/* Element-wise HBM bytes of one layer for one micro-batch (plan_layer_elem). */
typedef struct elem_bytes {
    double fwd, bwd, sel;
} elem_bytes;

/* Devices that time-share processors (plan_sharing_of). */
typedef struct sharing {
    double solo, all_busy, cores;
    int share;
    double node_ranks, node_cores; /* D and C when they share (node_ranks > node_cores), else 0 */
} sharing;

/* The layers of the slowest pipeline rank and what one of them costs
 * (planner.c's stage split). */
typedef struct stage_split {
    double eff;                      /* achieved FLOP/s of a layer's GEMMs at this layout's sizes */
    double attn_share;               /* the attention GEMMs' share of a layer's GEMM time */
    double attn_bwd_extra;           /* per layer: a measured kernel's backward beyond 2 x its forward, s */
    double f_layer;                  /* forward FLOPs of one layer on one rank */
    double head_cost;                /* the LM head's time in layers (the partitioner's cost) */
    double max_rank_cost, mean_cost; /* in layers: the slowest rank's, the mean */
    int layers_max, first, last;     /* the slowest rank's layers; it holds the embedding, the head */
    int *counts;                     /* layers per virtual stage (the partitioner's, when simulated) */
    int counts_small[64];            /* counts' storage up to 64 virtual stages */
} stage_split;

/* Per-micro-batch costs of the slowest rank, s, and the per-step DP work
 * (plan_time.c fills them in this order). */
typedef struct mb_costs {
    double fwd, bwd_in, bwd_w, recompute; /* compute, element-wise work included */
    double attn_part;                     /* the attention's share of fwd (all layers) */
    double tp_f, tp_b, cp_f, cp_b;        /* exposed tp and cp communication */
    double cp_layer_bytes;                /* cp bytes a rank sends per layer */
    double ep_f, ep_b;                    /* exposed ep all-to-alls */
    double msg;                           /* one pipeline message */
    double dense_p, exp_p;                /* parameters of the rank: dense, experts */
    int zg, eg;                           /* ZeRO group dp*cp, expert-data group */
    double dp_t, z3;                      /* DP/ZeRO reductions, ZeRO-3 gathers */
    double z3_ag, z3_bwd;                 /* half of z3, the backward it hides behind */
    double z3_n;                          /* ZeRO-3 all-gathers a pass (plan_zero3_gathers) */
    double F, Bi, W;                      /* forward, backward, weight pass simulated */
    double opt;                           /* the optimizer step */
    double sync_f, sync_b, sync_dp;       /* synchronisations per micro-batch, per step */
} mb_costs;

static inline int n_experts(const loom_plan_model *m) { return m->experts > 1 ? m->experts : 1; }
static inline int n_topk(const loom_plan_model *m) { return m->experts > 1 ? m->topk : 1; }

static inline int job_gpus(const loom_plan_cluster *c, const loom_plan_job *j) {
    return j->gpus > 0 ? j->gpus : c->gpus_per_node * c->nodes;
}

/* Stride (in ranks) between neighbours of an axis's group. */
long plan_axis_stride(const loom_plan_layout *l, int axis);
/* 1 if the group of `axis` spans more than one node. */
int plan_axis_inter(const loom_plan_layout *l, const loom_plan_cluster *c, int axis);
/* Ranks of the axis's group that share a node (its degree: one node). */
int plan_axis_k(const loom_plan_layout *l, const loom_plan_cluster *c, int axis);
/* 1 if an EP group (consecutive ranks of the dp x cp sub-mesh) spans nodes. */
int plan_ep_inter(const loom_plan_layout *l, const loom_plan_cluster *c);

/* plan_hw.c: the cluster file's hardware keys (peak_tflops.fp8,
 * gemm_fp8_top, clock_scale, inter_node.nics_per_node.., attention_tflops);
 * a kernel's attention speed (FLOP/s, forward and backward; 0 if the
 * cluster has no table for it); a GEMM's time. */
struct cJSON;
loom_status plan_parse_hw(const char *path, const struct cJSON *root, loom_plan_cluster *c);
int plan_attn_speed(const loom_plan_cluster *c, loom_plan_attn k, double hd, double s, double *fwd,
                    double *bwd);
double plan_gemm_time(const loom_plan_cluster *c, double M, double N, double K, int fp8, double peak);

/* plan_time.c: FLOPs and GEMM efficiency of a layer, element-wise traffic. */
shape_costs plan_shape_of(const loom_plan_model *m);
double plan_layer_flops(const loom_plan_model *m, const shape_costs *sc, double tok, double s);
double plan_layer_gemm_eff(const loom_plan_model *m, const shape_costs *sc, const loom_plan_cluster *c,
                           double tok, double s, double t, int ep, int flash, double score_bytes,
                           double peak_per_bw, double *attn_share);
double plan_model_flops(const loom_plan_model *m, double tokens, double s);
elem_bytes plan_layer_elem(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l, double b,
                           double s_loc, double s);
sharing plan_sharing_of(const loom_plan_cluster *c, const loom_plan_job *j, const loom_plan_layout *l);
/* The per-micro-batch costs of the slowest rank (sp: its layers). */
void plan_mb_costs(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                   const loom_plan_layout *l, const eval_ctx *e, const stage_split *sp, mb_costs *k);

/* plan_memory.c: bytes per rank. */
eval_ctx plan_ctx_of(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j);
double plan_layer_act(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l, double b,
                      double s_loc, double s);
double plan_rank_dense_params(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l,
                              int layers_max, int first, int last);
void plan_memory(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                 const loom_plan_layout *l, const eval_ctx *e, int layers_max, int first, int last,
                 loom_plan_result *r);
/* ZeRO-3 all-gathers of one pass over the rank's dense parameters (per
 * unit, or per parameter tensor with e->zero3_per_param). */
double plan_zero3_gathers(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l,
                          int layers_max, int first, int last);
void plan_format_gb(char *buf, size_t cap, const loom_plan_result *r);

/* plan_serve.c: a serving layout (j->serve): TTFT, per-token latency and
 * tokens/s of closed-loop clients, the failure modes; infeasible sets
 * feasible = 0 and the reason. */
loom_status plan_eval_serve(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                            const loom_plan_layout *l, const eval_ctx *e, loom_plan_result *r);

#endif
