/* cp.h - context parallelism: the whole sequence, attention included, split
 * over the cp ranks of a group (docs/context-parallel.md).
 *
 * Causal load balance: a sequence of T positions is cut into 2*cp chunks of
 * Tc = T / (2 cp); cp rank i holds chunks i and 2cp-1-i, in that order, as its
 * T_l = T / cp local rows. Early chunks see few keys and late ones many, so
 * every rank does the same attention work. Token ids, targets and positions
 * (wpe) follow the split; everything but attention is per-token and needs no
 * communication. Attention:
 *   ring     K/V of each rank travel around the ring (cp - 1 hops) with
 *            non-blocking send/receive overlapped with the tile compute of
 *            the block already there; partial outputs merge through their
 *            log-sum-exps. Backward sends K/V around again, and the dK/dV
 *            accumulated for each block travel with it back to their owner.
 *   ulysses  all-to-all from sequence-sharded to head-sharded q, k, v, full
 *            causal attention on NH/cp local heads (NKV/cp key/value
 *            heads), all-to-all back.
 * Gradients of all parameters are summed over dp x cp.
 */
#ifndef LOOM_CP_H
#define LOOM_CP_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/layout.h" /* loom_cp_impl, loom_cp_impl_name */
#include "loom/kernels.h"
#include "loom/status.h"

typedef struct loom_cp_buffers loom_cp_buffers;

typedef struct loom_cp {
    loom_device *dev; /* where the region's tensors live (its part's device) */
    loom_comm *comm;  /* the cp group (size 1 or NULL: no CP) */
    int size, rank;
    loom_cp_impl impl;
    loom_cp_buffers *buf; /* exchange buffers, from loom_cp_alloc */
    long tiles;           /* attention tiles computed on this rank, forward + backward */
} loom_cp;

/* Buffers for a model slice of B sequences of T_l local rows with the
 * attention heads h (its qkv rows, kernel_types.h) (once, before the step
 * loop); loom_cp_release frees them. */
loom_status loom_cp_alloc(loom_cp *cp, int B, int T_l, const loom_att_heads *h);
void loom_cp_release(loom_cp *cp);

/* Global position of local row t of a sequence (T_l local rows). */
int loom_cp_position(const loom_cp *cp, int t, int T_l);
/* x (B,T) of whole sequences -> its first B*T/cp entries (B,T/cp): this
 * rank's rows, in place. */
void loom_cp_split_tokens(const loom_cp *cp, int32_t *x, int B, int T);
/* out (n,C) += wpe[position of local row (row0 + i) % T_l]; dwpe += the same. */
void loom_cp_pos_fwd(const loom_cp *cp, float *out, const float *wpe, int row0, int n, int T_l, int C);
void loom_cp_pos_bwd(const loom_cp *cp, float *dwpe, const float *dout, int row0, int n, int T_l, int C);

/* Causal attention of this rank's rows against the whole sequence, as
 * loom_attention_fwd / _bwd for the local (B,T_l,(NH+2NKV)HS) qkv of heads
 * h (grouped-query, sliding window) into out (B,T_l,NH*HS). Collective over
 * the cp group. lse (B*NH*T_l) has a layout of the implementation's
 * choosing. Ulysses needs cp to divide NH and NKV. */
loom_status loom_cp_attention_fwd(loom_cp *cp, float *out, float *lse, const float *qkv, int B, int T_l,
                                  const loom_att_heads *h);
loom_status loom_cp_attention_bwd(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T_l,
                                  const loom_att_heads *h);

#endif
