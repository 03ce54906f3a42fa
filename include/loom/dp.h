/* dp.h - the data-parallel engine: gradient synchronisation and the
 * optimizer step over the DP group, plain (DDP) or sharded (ZeRO-1/2/3).
 *
 * The trainer drives one step as
 *   loom_dp_begin_step          zero the gradients (or gradient shards)
 *   forward/backward of each micro-batch (model hooks installed by the engine
 *   fire per unit; loom_dp_set_last_micro marks the micro-batch whose
 *   backward should communicate)
 *   loom_dp_finish_grads        every reduction complete
 *   loom_dp_grad_norm           the exact global norm (tp, pp, dp shards)
 *   loom_dp_step                clip scale, AdamW on what this rank owns,
 *                               parameters made whole again where sharded
 * The engine covers every model part of this rank (one per pipeline chunk).
 * Collective over the mesh groups named in each function.
 */
#ifndef LOOM_DP_H
#define LOOM_DP_H

#include <stddef.h>

#include "loom/mesh.h"
#include "loom/model.h"
#include "loom/status.h"

typedef struct loom_dp_config {
    int zero;          /* 0 DDP, 1 optimizer state sharded, 2 + gradients, 3 + parameters */
    double bucket_mb;  /* gradient bucket size for overlapped reductions (0: one per unit) */
} loom_dp_config;

typedef struct loom_adamw_hparams {
    float beta1, beta2, eps, weight_decay;
} loom_adamw_hparams;

/* Bytes per rank by lifetime class, from the engine's and the model's own
 * accounting. */
typedef struct loom_dp_memory {
    size_t params, grads, optimizer, activations;
} loom_dp_memory;

typedef struct loom_dp_engine loom_dp_engine;

/* Local: sizes buffers and installs hooks on the parts. */
loom_status loom_dp_engine_create(loom_gpt **parts, int n_parts, const loom_mesh *mesh,
                                  const loom_dp_config *cfg, const loom_adamw_hparams *hp,
                                  loom_dp_engine **out);
void loom_dp_engine_free(loom_dp_engine *e);

loom_status loom_dp_begin_step(loom_dp_engine *e);
void loom_dp_set_last_micro(loom_dp_engine *e, int last);
/* Collective over dp. */
loom_status loom_dp_finish_grads(loom_dp_engine *e);
/* Collective over tp, pp and dp. */
loom_status loom_dp_grad_norm(loom_dp_engine *e, double *norm);
/* grads *= grad_scale, then AdamW; collective over dp (parameter gathers). */
loom_status loom_dp_step(loom_dp_engine *e, float lr, float grad_scale);
void loom_dp_memory_bytes(const loom_dp_engine *e, loom_dp_memory *out);

/* One rank's parameter-gradient sum of squares split by whether tensor
 * parallelism cuts the tensor (summed over tp) or replicates it (counted
 * once); the tied wte is counted on the part holding the embedding only. */
void loom_dp_sumsq_parts(loom_gpt **parts, int n_parts, const float *const *grads, double sq[2]);

#endif
