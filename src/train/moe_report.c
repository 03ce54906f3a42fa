/* moe_report.c - the trainer's Mixture-of-Experts pieces: the MoE options'
 * limits (--ep's are the layout validator's, layout.h), and per step and
 * per MoE block the routing statistics over every rank (JSONL "moe" entry,
 * warnings naming the block).
 *
 * Per block and step, over every rank's micro-batches (routing groups):
 *   tokens     kept assignments per expert (after capacity)
 *   routed     chosen assignments per expert (before capacity)
 *   imbalance  max / mean of routed (1 = perfectly balanced)
 *   dropped    fraction of assignments dropped by capacity
 *   aux_loss, z_loss   mean over the routing groups
 *   a2a_bytes  alltoall(v) bytes the block's dispatch and combine sent,
 *              summed over the ranks (moe.h's formula); a2a_ms the largest
 *              rank's time inside them; a2a_overlapped the dispatches started
 *              non-blocking, the local experts computing while they flew
 *              (summed over the ranks; 0 with LOOM_EP_OVERLAP=0)
 * and once per step "ep_bytes", the EP group's alltoall(v) bytes over every
 * rank as the communicator counted them (the independent instrument for a2a_bytes),
 * "edp_bytes", this rank's expert-gradient all-reduce bytes, and the step's
 * loss split: "router_loss" = the sum over every MoE block (every stage) of
 * its mean aux + z, the part of "loss" they add, and "lm_loss" = loss -
 * router_loss, the language-model loss (what `loom eval` reports).
 * Collective over dp x cp, and over pp for an MoE model; rank 0 writes and warns.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/edp.h"
#include "loom/log.h"
#include "loom/moe.h"
#include "train/internal.h"

loom_status loom_train_moe_check(const loom_train_config *c, const loom_model_config *mc) {
    if (!(c->moe_warn_imbalance >= 1) || !(c->moe_warn_a2a > 0))
        return loom_fail(LOOM_EUSAGE, "--moe-warn-imbalance %g must be >= 1 and --moe-warn-a2a %g > 0",
                         c->moe_warn_imbalance, c->moe_warn_a2a);
    if (c->moe_route_cp < 0 || (c->moe_route_cp > 1 && (mc->n_expert == 0 || c->layout.cp > 1)))
        return loom_fail(LOOM_EUSAGE,
                         "--moe-route-cp %d: needs an MoE model and --cp 1 (with --cp > 1 "
                         "each CP rank's tokens already are its routing group)",
                         c->moe_route_cp);
    if (c->moe_route_cp > 1 && c->seq % (2 * c->moe_route_cp))
        return loom_fail(LOOM_EUSAGE, "--moe-route-cp %d: 2*%d = %d does not divide --seq %d",
                         c->moe_route_cp, c->moe_route_cp, 2 * c->moe_route_cp, c->seq);
    return LOOM_OK;
}

/* Per block: routed E, kept E, assignments, dropped, aux, z, groups, a2a
 * bytes, overlapped dispatches. */
#define PER_BLOCK(E) (2 * (E) + 7)

/* The router losses' share of the step's loss: sum over every part's MoE
 * blocks of (aux + z) summed over the routing groups of the step, over the
 * groups (the loss weighs each group equally), then over the stages.
 * Collective over dp x cp and pp; called on every rank of an MoE model. */
static loom_status router_loss(loom_train_run_state *s, double *out) {
    double v[2] = {0, 0}; /* aux + z of every block and group; groups of one block */
    for (int p = 0; p < s->n_parts; p++) {
        int n = 0;
        const loom_moe_stats *ms = loom_moe_stats_get(s->parts[p], &n);
        for (int b = 0; b < n; b++) {
            v[0] += ms[b].aux + ms[b].z;
            v[1] = ms[b].groups;
        }
    }
    LOOM_TRY(loom_comm_allreduce(loom_comm_host(s->mesh->dpcp), v, 2, LOOM_F64, LOOM_SUM)); /* host doubles */
    *out = v[1] > 0 ? v[0] / v[1] : 0;
    return loom_comm_allreduce(loom_comm_host(s->mesh->pp), out, 1, LOOM_F64, LOOM_SUM);
}

/* This rank's figures of the n blocks, PER_BLOCK(E) values each, into v,
 * and each block's all-to-all seconds into tmax. */
static void block_values(const loom_moe_stats *ms, int n, int E, double *v, double *tmax) {
    for (int b = 0; b < n; b++) {
        double *x = v + (size_t)b * PER_BLOCK(E);
        for (int e = 0; e < E; e++) {
            x[e] = (double)ms[b].routed[e];
            x[E + e] = (double)ms[b].kept[e];
        }
        x[2 * E] = (double)ms[b].assignments;
        x[2 * E + 1] = (double)ms[b].dropped;
        x[2 * E + 2] = ms[b].aux;
        x[2 * E + 3] = ms[b].z;
        x[2 * E + 4] = ms[b].groups;
        x[2 * E + 5] = (double)ms[b].a2a.bytes;
        x[2 * E + 6] = (double)ms[b].a2a.overlapped;
        tmax[b] = ms[b].a2a.seconds;
    }
}

/* Rank 0's warnings on block b (global layer): imbalance above the
 * threshold (once until it recovers) and all-to-all over its share. */
static void warn_block(loom_train_run_state *s, int step, int b, int layer, double imb, double drop,
                       double share) {
    int above = imb > s->cfg->moe_warn_imbalance;
    if (s->mesh->rank == 0 && above && (b >= 64 || !s->moe_warned[b]))
        loom_warn("step %d: MoE block h.%d: expert load imbalance %.2f (max/mean tokens per expert) "
                  "exceeds %g; %.1f%% of assignments dropped by capacity",
                  step + 1, layer, imb, s->cfg->moe_warn_imbalance, 100 * drop);
    if (b < 64) s->moe_warned[b] = (unsigned char)above; /* warn again after it recovers */
    if (s->mesh->rank == 0 && share > s->cfg->moe_warn_a2a)
        loom_warn("step %d: MoE block h.%d: expert all-to-all took %.0f%% of the step (over %g)", step + 1,
                  layer, 100 * share, s->cfg->moe_warn_a2a);
}

loom_status loom_train_moe_step(loom_train_run_state *s, int step, loom_step_stats *st) {
    st->moe_json = NULL;
    double router = 0;
    if (s->model_cfg.n_expert > 0) LOOM_TRY(router_loss(s, &router));
    int n = 0;
    const loom_moe_stats *ms = loom_moe_stats_get(s->parts[0], &n);
    if (n == 0) return LOOM_OK;
    const int E = ms[0].n_expert, W = PER_BLOCK(E);
    double *v = calloc((size_t)n * W + 1, sizeof *v), *tmax = calloc((size_t)n, sizeof *tmax);
    if (!v || !tmax) {
        free(v);
        free(tmax);
        return loom_fail(LOOM_EOS, "out of memory for the MoE statistics");
    }
    block_values(ms, n, E, v, tmax);
    const loom_comm_stats *eps = loom_comm_get_stats(s->mesh->ep);
    v[(size_t)n * W] = (double)(eps->bytes[LOOM_OP_ALLTOALL] + eps->bytes[LOOM_OP_ALLTOALLV]);
    loom_comm *edp = loom_edp_comm(s->edp);
    const double edp_bytes = edp ? (double)loom_comm_get_stats(edp)->bytes[LOOM_OP_ALLREDUCE] : 0;
    loom_comm *dpcp = loom_comm_host(s->mesh->dpcp); /* host doubles */
    loom_status rc = loom_comm_allreduce(dpcp, v, (size_t)n * W + 1, LOOM_F64, LOOM_SUM);
    if (rc == LOOM_OK) rc = loom_comm_allreduce(dpcp, tmax, (size_t)n, LOOM_F64, LOOM_MAX);
    if (edp) loom_comm_reset_stats(edp);
    for (int p = 0; p < s->n_parts; p++) loom_moe_stats_reset(s->parts[p]);
    size_t need = 256 + (size_t)n * (256 + (size_t)E * 48);
    if (rc == LOOM_OK && need > s->moe_json_cap) {
        free(s->moe_json);
        s->moe_json = malloc(need);
        s->moe_json_cap = s->moe_json ? need : 0;
        if (!s->moe_json) rc = loom_fail(LOOM_EOS, "out of memory for the MoE statistics");
    }
    if (rc != LOOM_OK) {
        free(v);
        free(tmax);
        return rc;
    }
    char *j = s->moe_json;
    size_t cap = s->moe_json_cap, o = 0;
#define PUT(...) o += (size_t)snprintf(j + o, o < cap ? cap - o : 0, __VA_ARGS__)
    PUT("\"moe\": [");
    for (int b = 0; b < n; b++) {
        const double *x = v + (size_t)b * W;
        double mx = 0, sum = 0;
        for (int e = 0; e < E; e++) {
            mx = x[e] > mx ? x[e] : mx;
            sum += x[e];
        }
        loom_moe_balance(s->parts[0], b, x); /* the blocks of parts[0], as the stats */
        const double imb = sum > 0 ? mx / (sum / E) : 0, groups = x[2 * E + 4] > 0 ? x[2 * E + 4] : 1;
        const double drop = x[2 * E] > 0 ? x[2 * E + 1] / x[2 * E] : 0;
        PUT("%s{\"layer\": %d, \"tokens\": [", b ? ", " : "", ms[b].layer);
        for (int e = 0; e < E; e++) PUT("%s%.0f", e ? ", " : "", x[E + e]);
        PUT("], \"routed\": [");
        for (int e = 0; e < E; e++) PUT("%s%.0f", e ? ", " : "", x[e]);
        PUT("], \"imbalance\": %.6g, \"dropped\": %.6g, \"aux_loss\": %.9g, \"z_loss\": %.9g, "
            "\"a2a_bytes\": %.0f, \"a2a_ms\": %.4f, \"a2a_overlapped\": %.0f}",
            imb, drop, x[2 * E + 2] / groups, x[2 * E + 3] / groups, x[2 * E + 5], 1e3 * tmax[b],
            x[2 * E + 6]);
        warn_block(s, step, b, ms[b].layer, imb, drop, st->seconds > 0 ? tmax[b] / st->seconds : 0);
    }
    PUT("], \"ep_bytes\": %.0f, \"edp_bytes\": %.0f, \"router_loss\": %.9g, \"lm_loss\": %.9g, ",
        v[(size_t)n * W], edp_bytes, router, st->loss - router);
#undef PUT
    free(v);
    free(tmax);
    st->moe_json = s->moe_json;
    return LOOM_OK;
}

void loom_train_moe_free(loom_train_run_state *s) {
    free(s->moe_json);
    s->moe_json = NULL;
    s->moe_json_cap = 0;
}
