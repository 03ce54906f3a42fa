/* edp.h - the expert-data-parallel engine: gradients and optimizer step of
 * the expert tensors of an expert-parallel model part (moe.h), which are in
 * no DP bucket. An engine that drives the model (src/distributed/, beside
 * dp.h's); the tokens' dispatch to the experts is a region the model calls
 * (ep.h, src/parallel/ep.c).
 *
 * Groups. The EP group (mesh.h: ep consecutive ranks of dp x cp) splits the
 * experts; the ranks with the same EP rank in every EP group hold the same
 * experts and form the expert-data-parallel group "edp" (dp*cp/ep ranks).
 * Expert gradients are summed over edp only - never over dp x cp, where the
 * ranks at one offset hold different experts - and every other gradient
 * over dp (dp x cp when cp > 1) by the DP engine as before (the expert
 * tensors are in no DP bucket: unit LOOM_UNIT_EXPERTS). With cp > 1 each CP
 * rank dispatches its own tokens, so the edp sum covers every token of the
 * step routed to those experts. Per step and rank the edp all-reduce
 * moves the local experts' floats x 4 bytes (comm.h's convention).
 *
 * Storage: the part's flat buffers, or at ZeRO-2/3 (which leave those to the
 * DP engine) the expert tensors' own (moe.h: loom_moe_expert_storage);
 * ZeRO-3's parameter runs (dp.h) include them as one more run.
 *
 * Optimizer. AdamW on the local experts, replicated over edp (each replica
 * takes the same step from the same reduced gradient). The global gradient
 * norm adds the experts' sum of squares, summed over the EP group (distinct
 * experts), to the DP engine's.
 *
 * At ep = 1 (or a dense model) there are no such tensors and every call
 * returns at once.
 */
#ifndef LOOM_EDP_H
#define LOOM_EDP_H

#include "loom/dp.h"
#include "loom/mesh.h"
#include "loom/model.h"
#include "loom/status.h"

typedef struct loom_edp_engine loom_edp_engine;

/* Local: the edp group is the mesh's (mesh->edp). LOOM_EOS without memory. */
loom_status loom_edp_engine_create(loom_gpt **parts, int n_parts, const loom_mesh *mesh,
                                   const loom_adamw_hparams *hp, loom_edp_engine **out);
void loom_edp_engine_free(loom_edp_engine *e);
/* Sum the expert gradients over edp. Collective over edp. */
loom_status loom_edp_finish_grads(loom_edp_engine *e);
/* *norm = sqrt(norm^2 + the experts' sum of squares over the EP group and
 * the pipeline stages). Collective over ep, then pp. */
loom_status loom_edp_grad_norm(loom_edp_engine *e, double *norm);
/* grads *= grad_scale, then AdamW on the local experts. Local. */
loom_status loom_edp_step(loom_edp_engine *e, float lr, float grad_scale);
/* Checkpoints (ckpt.c): part `part`'s local expert params, AdamW m and v,
 * each laid out like the expert unit's flat range [*lo, *lo + n); returns n
 * (0: no expert-parallel tensors; the outputs untouched). */
size_t loom_edp_state(const loom_edp_engine *e, int part, float **par, float **m, float **v, size_t *lo);
/* The experts' optimizer step count (AdamW bias correction), for resume. */
void loom_edp_set_steps_taken(loom_edp_engine *e, int t);
/* Add to *mem what the DP engine's plan (loom_dp_memory_bytes) leaves out
 * of an MoE model: the local experts' AdamW moments (2 floats each, when
 * expert-parallel: the experts are in no DP bucket), their own parameter /
 * gradient storage at ZeRO-2/3, and the MoE blocks' routing and dispatch
 * buffers (counted as activations). Local. */
void loom_edp_memory_bytes(const loom_edp_engine *e, loom_dp_memory *mem);
/* The edp group (NULL when there are no expert tensors), for byte counts. */
loom_comm *loom_edp_comm(const loom_edp_engine *e);

#endif
