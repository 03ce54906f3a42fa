/* moe.h - Mixture-of-Experts blocks: router, top-k gating, load-balancing
 * losses, capacity with token dropping, and the experts' forward/backward.
 *
 * A block is MoE when the config has n_expert > 0 and (l + 1) % moe_every
 * == 0 (moe_every = 1: every block). Its MLP becomes
 *
 *   x (N,C) = ln_2 output rows of one routing group (one micro-batch)
 *   p = softmax(x @ router (C,E))                       router probabilities
 *   choose the top_k experts of each token by p (ties: the lower index)
 *   gate = p of the chosen, or renormalised to sum 1 (norm_topk)
 *   expert e: y = c_proj_e(gelu(c_fc_e(x)))            hidden expert_hidden
 *   out_i = sum over token i's kept choices j of gate_ij * y_{e_ij}(x_i)
 *
 * Capacity. With capacity_factor f > 0 each expert takes at most
 * cap = ceil(f * N * top_k / E) tokens of a routing group; choices are
 * admitted choice-major then by position (every token's first choice in
 * token order, then every second choice, ...) and an assignment over the
 * capacity is dropped: it adds nothing to out (the token keeps its residual).
 * f = 0 is dropless (cap = N). The routing group is one micro-batch of one
 * (dp, cp) rank - its N = B x T/cp rows in its order - so a one-rank run with
 * the same micro-batches drops the same tokens; a part made with
 * opts.moe_route_cp = G > 1 (no CP) routes each micro-batch as G groups, group
 * g = the rows CP rank g of G would hold (cp.h's split, in that order), each
 * with its own capacity and losses (the block's a->aux is their mean), which
 * is how one rank reproduces a --cp G run.
 *
 * Losses, per routing group, added to the model loss with the weight of one
 * group (the mean over the groups of a step):
 *   aux = aux_coef * E * sum_e f_e P_e,  f_e = tokens choosing e (before
 *         dropping) / N,  P_e = mean over tokens of p_e  (Switch / GShard;
 *         f sums to top_k, as in Hugging Face's Mixtral)
 *   z   = z_coef * mean over tokens of logsumexp(router logits)^2  (ST-MoE)
 * Gradients flow through P and the logits, not through the counts.
 *
 * Auxiliary-loss-free balancing (DeepSeek-V3), bias_rate g > 0: a per-expert
 * bias b is added to p for choosing the top_k only (gates use p); after
 * each step b_e += g * sign(mean load - load_e), the load being the
 * assignments chosen for e over every routing group of the step (every
 * rank), so every layout keeps the same b. b starts at 0 (a Hugging Face
 * directory's e_score_correction_bias for DeepSeek-V3's router, moe_sigmoid:
 * p = sigmoid(logits), gates p of the chosen, renormalised with norm_topk,
 * times routed_scale; no aux or z loss; params_io.c loads and saves b).
 *
 * Parameters of an MoE block replace mlp.c_fc / mlp.c_proj with
 * mlp.router.weight (C,E) and mlp.experts.<e>.c_fc.{weight (C,H), bias (H)},
 * mlp.experts.<e>.c_proj.{weight (H,C), bias (C)}; with tp > 1 (and sp)
 * the experts are cut as the dense MLP is (c_fc by columns, c_proj by
 * rows), the router replicated.
 *
 * Expert parallelism (part.ep, a group of P ranks inside dp x cp, P
 * dividing E): rank r of the group holds experts [r E/P, (r+1) E/P) (named
 * by their global index), in unit LOOM_UNIT_EXPERTS at the end of the flat
 * buffers, outside every DP bucket: the expert-data-parallel engine
 * (edp.h) reduces their gradients over the ranks holding the same experts
 * and steps them. Each rank routes its own tokens (its micro-batch is its routing group, capacity
 * applied before anything is sent) and moves them with the EP region
 * (ep.h); per MoE block and micro-batch
 *   forward:  alltoall of the kept counts (E/P int32 per destination), then
 *             alltoallv dispatch of the kept rows (A x C floats sent) and
 *             alltoallv combine of the expert outputs (R x C floats sent back)
 *   backward: the same two alltoallv for the output and input gradients
 * where A = this rank's kept assignments and R = the assignments the group
 * sent to this rank's experts; the communicator counts 2 (A + R) C 4 bytes
 * of alltoallv per rank (the rows a rank keeps for itself included) plus
 * P (E/P) 4 bytes of alltoall.
 */
#ifndef LOOM_MOE_H
#define LOOM_MOE_H

#include <stdint.h>
#include "loom/ep.h"
#include "loom/model.h"
#include "loom/status.h"

/* The unit of the expert tensors of an expert-parallel part (model.h units). */
#define LOOM_UNIT_EXPERTS (-2)

/* Block l of the config is an MoE block. */
int loom_moe_layer(const loom_model_config *cfg, int l);
/* The MoE blocks keep a selection bias: aux-loss-free balancing
 * (bias_rate > 0) or DeepSeek-V3's router (moe_sigmoid), whose bias a
 * Hugging Face directory carries as e_score_correction_bias. */
int loom_moe_has_bias(const loom_model_config *cfg);
/* The experts' hidden size (expert_hidden, default 4 n_embd). */
int loom_moe_hidden(const loom_model_config *cfg);
/* Capacity per expert of a routing group of N tokens. */
int loom_moe_capacity(const loom_model_config *cfg, int N);
/* Matmul parameters a token meets in the MoE blocks minus those of the dense
 * MLPs they replace: per MoE block C E (router) + top_k 2 C H - 8 C^2. For
 * FLOPs per token (MFU counts the experts a token is routed to). */
double loom_moe_active_params_delta(const loom_model_config *cfg);
/* MoE keys consistent (top_k <= n_expert, coefficients >= 0, ...):
 * LOOM_ECONFIG naming the key and the numbers. Dense configs pass. */
loom_status loom_moe_config_check(const loom_model_config *cfg);

/* Per-step statistics of one MoE block on this rank (summed over the
 * micro-batches since loom_moe_stats_reset). */
typedef struct loom_moe_stats {
    int layer; /* global block index */
    int n_expert;
    int64_t *routed;     /* (E) assignments chosen (before capacity) */
    int64_t *kept;       /* (E) assignments computed (after capacity) */
    int64_t assignments; /* tokens x top_k */
    int64_t dropped;     /* assignments over capacity */
    double aux, z;       /* sum over routing groups of the two losses */
    int groups;          /* routing groups seen */
    int64_t sent_rows;   /* expert parallelism: rows dispatched by this rank (A, summed) */
    int64_t recv_rows;   /* rows this rank's experts received (R, summed) */
    loom_ep_tally a2a;   /* alltoall(v) bytes this rank sent for the block, fwd + bwd,
                             and seconds inside those calls (ep.h) */
} loom_moe_stats;

/* Where an expert-parallel part keeps its expert tensors (unit
 * LOOM_UNIT_EXPERTS, flat range [*lo, *lo + *n)): parameters and gradients
 * laid out like that range of the flat buffers - inside param_mem /
 * grad_mem, or, when the part was created with external_params /
 * external_grads (ZeRO-2/3 leave those to the DP engine, whose buckets never
 * hold experts), in storage of their own. *n = 0: none. */
void loom_moe_expert_storage(const loom_gpt *m, float **params, float **grads, size_t *lo, size_t *n);

/* Bytes the part's MoE blocks allocate outside its arenas: the expert
 * tensors' own parameter and gradient storage (external_params /
 * external_grads, see above) and the routing, dispatch and expert
 * activation buffers (all slots, scratch included). Zeros for a dense part. */
void loom_moe_memory_bytes(const loom_gpt *m, size_t *params, size_t *grads, size_t *buffers);

/* Aux-loss-free balancing: one step of the selection bias of the part's MoE
 * block b (index into the stats) from its step's chosen counts over every
 * rank, routed (E). No-op at bias_rate 0. Local. */
void loom_moe_balance(loom_gpt *m, int b, const double *routed);

/* The stats of this part's MoE blocks: *n of them (0 for a dense part). */
/* MoE block b's aux-loss-free selection bias (n_expert floats in the part's
 * device memory, the same on every rank) and its global layer, for
 * checkpoints; NULL when b is no block of m or it keeps none (loom_moe_has_bias). */
float *loom_moe_selection_bias(const loom_gpt *m, int b, int *layer);
const loom_moe_stats *loom_moe_stats_get(const loom_gpt *m, int *n);
void loom_moe_stats_reset(loom_gpt *m);

#endif
