/* dp_internal.h - the data-parallel engine's state, shared by dp_layout.c
 * (buckets, shard layout, optimizer segments; local), dp.c (the step:
 * hooks, gradient reductions, norm, optimizer) and zero3.c (ZeRO-3
 * parameter gathers). Not public API; see dp.h for the design.
 *
 * Rule that keeps ranks in step: whether and when a collective starts never
 * depends on the result of loom_comm_test (which differs between ranks), only
 * on the hook order, which is the same on every rank of a group.
 */
#ifndef LOOM_DP_INTERNAL_H
#define LOOM_DP_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "loom/arena.h"
#include "loom/comm.h"
#include "loom/dp.h"

#define DP_SLOTS 3 /* staging / gather buffers: two rotating, one for the outer bucket */
/* Gradient reductions in flight at once per engine: MPI's non-blocking
 * collectives hold temporary buffers the size of their message until they
 * complete (tens of MB per bucket in Open MPI's libnbc), so an unbounded
 * number of buckets in flight would cost a transient gradient-sized copy. */
#define DP_MAX_INFLIGHT 2
#define DP_SLOT_OUTER 2

typedef enum { DP_IDLE, DP_ACQUIRED, DP_REDUCING, DP_DONE } dp_grad_state;
typedef enum { DP_NONE, DP_GATHERING, DP_READY } dp_param_state;

typedef struct dp_unit {
    int unit;     /* LOOM_UNIT_OUTER or a block index */
    size_t lo, n; /* float range in the model's flat buffers */
    int bucket;
} dp_unit;

typedef struct dp_bucket {
    int u_begin, u_end;     /* units [u_begin, u_end) of the part's backward order */
    size_t lo, n;           /* float range in the model's flat buffers (contiguous) */
    size_t S, P;            /* floats per rank's slice, padded floats P = N S */
    size_t so;              /* offset of this rank's slice in its shard */
    size_t mine_lo, mine_n; /* model-flat range of this rank's slice, clipped to the bucket */
    int slot;               /* zero 2/3: staging (and zero 3 gather) buffer index */
    int outer;              /* holds the outer unit */
    int defer;              /* zero 0/1: reduce in finish_grads only (see dp.c) */
    int has_partial;        /* holds gradients SP leaves partial over tp */
    int head_wte;           /* the early wte bucket (dp_part.early): no units */
    int done_units;         /* post-backward calls seen in this backward */
    dp_grad_state gstate;
    loom_req *rs;    /* in-flight gradient reduction */
    unsigned rs_seq; /* reductions of this bucket started so far */
    double rs_t0;
    dp_param_state pstate; /* zero 3 */
    loom_req *ag;          /* zero 3: in-flight parameter gather */
    double ag_t0;
} dp_bucket;

/* A run of one parameter inside this rank's shard: what the optimizer and
 * the norm walk. Offsets in floats from the base of the storage named. */
typedef struct dp_seg {
    int param; /* index into m->params */
    size_t n;
    size_t p_off; /* parameters: param_mem (zero 0-2) or the shard (zero 3) */
    size_t g_off; /* gradients: grad_mem (zero 0/1) or the shard (zero 2/3) */
    size_t s_off; /* optimizer state */
    size_t flat;  /* the first float in the model's flat layout */
    int decay, replicated, skip_norm;
} dp_seg;

typedef struct dp_part {
    struct loom_dp_engine *e;
    loom_gpt *m;
    int n_units, n_buckets, n_segs;
    dp_unit *units;     /* backward order */
    dp_bucket *buckets; /* backward order */
    dp_seg *segs;
    size_t S; /* shard floats (sum of the buckets' S) */
    size_t slot_floats[DP_SLOTS];
    size_t scratch_floats;  /* zero 1: the largest padded bucket (0 if none) */
    float *gshard;          /* zero 2/3: this rank's reduced gradients (S) */
    float *stage[DP_SLOTS]; /* zero 2/3: gradient staging */
    int stage_owner[DP_SLOTS];
    float *pshard;           /* zero 3: this rank's parameters (S) */
    float *gather[DP_SLOTS]; /* zero 3: gathered unit parameters */
    int gather_owner[DP_SLOTS];
    float *scratch;        /* zero 1: padded buckets' reductions and gathers */
    float *opt_m, *opt_v;  /* AdamW state (S each) */
    loom_adamw_run *adamw; /* per seg: what the step hands the AdamW driver (adamw.h) */
    /* zero 0/1 with segs covering every float of grad_mem (zero 0, or one
     * rank): the update zeroes the gradients it reads (loom_adamw_update_
     * zero), and grads_zeroed says the last update did, so the next step
     * need not zero them again */
    int zero_in_update, grads_zeroed;
    loom_arena a_grads, a_params, a_opt;
    size_t mem_params, mem_grads, mem_opt; /* bytes this stage needs */
    loom_param_run *runs;                  /* where this rank keeps the parameters (dp.h) */
    int n_runs;
    /* Early wte (zero 0, a part with both the embedding and the head, dp > 1,
     * dp x B x T <= V_l / 2): bucket 0 is the tied wte alone, reduced as soon
     * as the head's backward has produced its share (post_head_wte, last
     * micro-batch); the outer unit's bucket is the rest of it. The token
     * embedding's rows of the last micro-batch are kept out of wte, gathered
     * over dp (ids and rows) and added to the reduced gradient in
     * loom_dp_finish_grads, in rank order on every rank. */
    int early;
    size_t wte_lo, wte_n; /* wte's padded range in the flat buffers */
    size_t rows_max;      /* rows per rank the buffers hold (B x T planned) */
    int rows_n;           /* rows per rank gathered this step (0: none) */
    float *rows_all;      /* (dp, rows_max, C) */
    int32_t *ids_all;     /* (dp, rows_max) */
    loom_req *rows_req, *ids_req;
} dp_part;

struct loom_dp_engine {
    loom_dp_config cfg;
    loom_adamw_hparams hp;
    const loom_mesh *mesh;
    loom_comm *dp;
    loom_comm *hier; /* LOOM_DP_ALLREDUCE=hier: the host-aware wrapper e->dp is (owned), else NULL */
    int N, r;        /* dp size and rank */
    loom_gpt **parts;
    int n_parts;
    dp_part *p;
    int last_micro;
    int no_overlap; /* LOOM_DP_OVERLAP=0 (dp.h) */
    int t;          /* optimizer steps taken */
    loom_dp_timing timing;
    struct dp_part *fifo_part[64]; /* reductions started, oldest first (a ring) */
    int fifo_bucket[64];
    unsigned fifo_seq[64]; /* the bucket's rs_seq when it started */
    int fifo_head, fifo_n;
    double comm_call0; /* dp group's call_seconds when the step began */
    FILE *timing_log;  /* LOOM_DP_TIMINGS */
    size_t mem_wire;   /* comm_bf16: bytes of the dp group's wire buffers it needs */
};

/* dp_layout.c: units, buckets, slices, segments and buffer sizes of one
 * part (local; no memory but the tables). */
loom_status loom_dp_layout_build(loom_dp_engine *e, dp_part *p);
void loom_dp_layout_free(dp_part *p);
/* Index into p->units of a model unit, -1 if the part has none such. */
int loom_dp_unit_index(const dp_part *p, int unit);

/* dp.c: test every in-flight request of every part once. */
loom_status loom_dp_progress(loom_dp_engine *e);

/* zero3.c */
loom_status loom_dp_z3_use(dp_part *p, int unit, int backward); /* pre hooks */
void loom_dp_z3_release(dp_part *p, int unit);                  /* post hooks */
loom_status loom_dp_z3_test(dp_part *p, dp_bucket *b);          /* poll a gather */
loom_status loom_dp_z3_wait_all(dp_part *p);

#endif
