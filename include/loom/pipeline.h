/* pipeline.h - pipeline parallelism (the pp mesh axis): schedules as data,
 * their validator, and the stage partitioner. Everything here is pure (no MPI,
 * not collective): every rank can build the same schedule and check it before
 * the first message, and `loom sim` replays exactly the lists the executor runs
 * (DESIGN.md, invariant 3).
 *
 * ## Stages
 *
 * pp ranks, v chunks ("virtual stages") per rank, S = pp*v virtual stages.
 * Chunk c of rank r holds virtual stage s = c*pp + r (Megatron's interleaved
 * placement), or in the V schedules (zbv, dualpipev) c*pp + pp-1-r for odd c
 * (loom_pp_vstage); the model's layers are split into S consecutive virtual stages,
 * stage 0 holds the embedding and stage S-1 the LM head and loss. Worked
 * example, pp=2 v=2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3, and an
 * activation travels r0.c0 -> r1.c0 -> r0.c1 -> r1.c1. With pp=1 and v>1 the
 * "next rank" is the rank itself (a message to self; legal MPI).
 *
 * ## Actions
 *
 * A schedule is, per rank, an ordered list of loom_pp_action {kind, mb, chunk,
 * peer}: mb is the micro-batch (0..m-1), chunk the local chunk (0..v-1), peer
 * the other rank of a SEND/RECV (-1 otherwise). Kinds:
 *   F          forward of (mb, chunk). On stage S-1 it includes the loss.
 *   B          backward of (mb, chunk). In schedules without a split
 *              (split_backward == 0) the full backward (input and weight
 *              gradients); in split schedules (zb) only the input gradient.
 *   W          weight gradient of (mb, chunk); split schedules only.
 *   SEND_ACT   send F(mb, chunk)'s output to peer, which holds stage s+1.
 *   RECV_ACT   receive the input of F(mb, chunk) from peer (stage s-1).
 *   SEND_GRAD  send B(mb, chunk)'s input gradient to peer (stage s-1).
 *   RECV_GRAD  receive the output gradient of B(mb, chunk) from peer (s+1).
 *   OPT_STEP   once per rank, last: the optimizer step (see below).
 *
 * ## The send/recv convention (the executor follows it literally)
 *
 *  1. Placement. A RECV_ACT comes immediately before the F that consumes it,
 *     a RECV_GRAD immediately before the B that consumes it; a SEND_ACT comes
 *     immediately after the F that produced it, a SEND_GRAD immediately after
 *     the B that produced it. Stage 0 has no RECV_ACT/SEND_GRAD, stage S-1 no
 *     SEND_ACT/RECV_GRAD. W needs no message. Every stage boundary is a
 *     message, even between two chunks of one rank (pp=1, v>1: to self).
 *  2. Sends never block. The executor posts a SEND as a non-blocking send
 *     (MPI_Isend) of the buffer the previous compute filled and keeps that
 *     buffer alive until the send completes; it may test for completion at
 *     any later action and must wait for all of its sends before OPT_STEP.
 *  3. Receives block at their place. At a RECV the executor waits until the
 *     message has arrived (a blocking receive, or a wait on a receive it
 *     posted earlier: posting early, e.g. one action ahead, is allowed and only
 *     adds overlap; requiring a receive to complete before its RECV action is
 *     not allowed).
 *  4. Matching. Every SEND has exactly one RECV on peer with the same mb and
 *     the same stage boundary. Its MPI tag is loom_pp_tag() (identical on both
 *     sides, unique per message in a step), so receives may be posted in any
 *     order. Tags are < loom_pp_tag_limit(); the executor checks that against
 *     MPI_TAG_UB once, before the first message.
 *  5. OPT_STEP: wait for all outstanding sends of the step, then gradient
 *     reductions (dp, the tied embedding/LM head between stages 0 and S-1) and
 *     the optimizer. Collectives inside F/B/W (tp, cp, ep) only involve ranks
 *     of one pp stage, which run identical lists; OPT_STEP is the only action
 *     where a list meets other stages or the dp group in a collective.
 * Under rules 2 and 3, loom_schedule_validate() proves the lists cannot
 * deadlock: it replays them with unbounded non-blocking sends and blocking
 * receives and checks that every rank reaches its end.
 *
 * ## Live activations
 *
 * F(mb, chunk) creates an activation set; it dies at the last backward action
 * of (mb, chunk) on that rank: B when the schedule does not split, W when it
 * does (W still needs the layer inputs). loom_schedule_peak_live() counts the
 * most sets alive at once on a rank: the executor sizes its activation arena
 * with it; for v>1 a set is one chunk's (about 1/v of a rank's layers).
 *
 * ## Schedules (F, B, W: one chunk's forward, backward, weight gradient)
 *   gpipe        all F (mb 0..m-1), then all B (mb 0..m-1). v = 1. Peak m.
 *   1f1b         rank r: min(pp-r-1, m) warm-up F, then F,B pairs, then the
 *                remaining B. v = 1. Peak min(pp-r, m).
 *   interleaved  Megatron's interleaved 1F1B over groups of pp micro-batches:
 *                the k-th F of a rank is chunk (k/pp)%v of micro-batch
 *                (k/(pp*v))*pp + k%pp, the k-th B the same with chunk
 *                v-1-(k/pp)%v; rank r does min(m*v, 2*(pp-r-1) + (v-1)*pp)
 *                warm-up F, then F,B pairs, then the remaining B. Needs
 *                m % pp == 0 (so m >= pp). v >= 1. Peak
 *                min(m*v, 2*(pp-r-1) + (v-1)*pp + 1) chunk sets. (With
 *                comm = 0, pp-r-1 instead of 2*(pp-r-1) gives the same
 *                bubble; the extra forwards hide message latency: at
 *                comm = 0.5 for pp=4 m=16 v=2 they cut the bubble from 0.27
 *                to 0.14. `loom sim --cost-comm` shows it.)
 *   zb           ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"):
 *                B is split into B (input gradient) and W (weight gradient).
 *                Rank r: min(pp-r, m) warm-up F, then repeat { B; W if pp sets
 *                are alive or no F is left; F if any is left }, then the W
 *                left. Every rank keeps at most pp sets alive, the peak of
 *                1f1b's rank 0; rank r defers r W, which fill its cool-down.
 *                v = 1.
 *   zbh2, zbv, dualpipev
 *                list-scheduled (src/pipeline/list_schedule.c): the order a
 *                greedy unit-cost simulation of the whole pipeline picks.
 *                zbh2 (ZB-H2): v = 1, B first, else F while fewer than
 *                2p-1 sets live, else W; rank r warms up with 2(p-r)-1 F.
 *                zbv (ZB-V): v = 2 in a V (loom_pp_vstage), the same policy
 *                with at most 2p chunk sets (1f1b's memory). dualpipev
 *                (DeepSeek-V3's DualPipeV): v = 2 in a V; an F of one chunk
 *                and a ready B of another run as one unit F, B, W (the F&B
 *                pair; sequential here), a lone B defers its W; at most
 *                2p+2 chunk sets. Any m >= 1.
 * Bubbles with comm = 0 and uniform stages, measured by loom sim and asserted
 * by tests/pipeline (loom_sim_closed_form_bubble in sim.h): gpipe and 1f1b
 * (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1); zb with f = b = w
 * (p-1)/(3m+p-1), a third of 1f1b's idle time.
 */
#ifndef LOOM_PIPELINE_H
#define LOOM_PIPELINE_H

#include <stddef.h>

#include "loom/layout.h" /* loom_sched_kind, its names, the LOOM_PP_MAX_* limits */
#include "loom/status.h"

typedef enum loom_pp_kind {
    LOOM_PP_F,
    LOOM_PP_B,
    LOOM_PP_W,
    LOOM_PP_SEND_ACT,
    LOOM_PP_RECV_ACT,
    LOOM_PP_SEND_GRAD,
    LOOM_PP_RECV_GRAD,
    LOOM_PP_OPT_STEP,
    LOOM_PP_KIND_COUNT
} loom_pp_kind;

typedef struct loom_pp_action {
    loom_pp_kind kind;
    int mb;    /* micro-batch 0..m-1; -1 for OPT_STEP */
    int chunk; /* local chunk 0..v-1 (virtual stage: loom_pp_vstage); -1 for OPT_STEP */
    int peer;  /* SEND/RECV: the other rank; -1 for compute and OPT_STEP */
} loom_pp_action;

/* The lists of all ranks in one allocation. Rank r's list is
 * actions[offset[r] .. offset[r+1]); arrays indexed by "flat index" (the
 * simulator's times) are parallel to actions. */
typedef struct loom_schedule {
    loom_sched_kind kind;
    int pp, micro_batches, virtual_stages;
    int split_backward;      /* 1: B is input-gradient only and every (mb, stage) has a W */
    int vshape;              /* 1: V placement (zbv, dualpipev; see loom_pp_vstage) */
    int n_total;             /* offset[pp] */
    int *offset;             /* (pp+1) */
    loom_pp_action *actions; /* (n_total) */
} loom_schedule;

/* The (pp, micro-batches, v) a schedule accepts: the validator's schedule
 * section, loom_layout_check_schedule (layout.h), under the name the
 * simulator's trace reader knows. */
loom_status loom_schedule_check(loom_sched_kind k, int pp, int m, int v);

/* Build every rank's list (checks (k, pp, m, v) with
 * loom_layout_check_schedule first). LOOM_EUSAGE naming the numbers and
 * flags ("interleaved needs --micro-batches divisible by pp=4, got 6"),
 * LOOM_EOS when out of memory. The caller frees with loom_schedule_free. */
loom_status loom_schedule_build(loom_sched_kind k, int pp, int m, int v, loom_schedule **out);
void loom_schedule_free(loom_schedule *s);

/* Rank r's list and its length. */
static inline const loom_pp_action *loom_schedule_rank(const loom_schedule *s, int r, int *n) {
    *n = s->offset[r + 1] - s->offset[r];
    return s->actions + s->offset[r];
}
/* Virtual stage of (rank, chunk), and back. Megatron's placement: chunk c
 * of rank r is stage c*pp + r (an activation goes r0.c0 -> r1.c0 -> ... ->
 * r0.c1 -> ...). V placement (s->vshape; zbv, dualpipev, v = 2): odd chunks
 * run back up the ranks, stage c*pp + pp-1-r, so with pp = 4 the stages
 * 0..7 sit on ranks 0 1 2 3 3 2 1 0 and rank 0 holds the first and the last. */
static inline int loom_pp_vstage(const loom_schedule *s, int rank, int chunk) {
    return chunk * s->pp + (s->vshape && chunk % 2 ? s->pp - 1 - rank : rank);
}
static inline int loom_pp_chunk(const loom_schedule *s, int vstage) { return vstage / s->pp; }
static inline int loom_pp_owner(const loom_schedule *s, int vstage) {
    const int i = vstage % s->pp;
    return s->vshape && loom_pp_chunk(s, vstage) % 2 ? s->pp - 1 - i : i;
}

/* The MPI tag of a SEND/RECV action of rank `rank`: the same on the SEND and
 * its RECV, distinct for distinct messages of one step: 2*(mb*(S-1) + e) + g,
 * e the stage boundary (between stages e and e+1), g 1 for gradients. -1 for
 * an action that is not a message. */
int loom_pp_tag(const loom_schedule *s, int rank, const loom_pp_action *a);
/* One more than the largest tag of s: 2*m*(S-1) (0 when S == 1). */
int loom_pp_tag_limit(const loom_schedule *s);

/* Prove the lists deadlock-free and complete. Replays them with unbounded
 * non-blocking sends and blocking receives (the convention above) and checks:
 * field ranges; each (mb, stage) has exactly one F, one B and, when split,
 * one W (none otherwise); each message exactly one SEND and one RECV with the
 * right peers (the owners of the two stages); a SEND right after the compute
 * that produces it and a RECV right before the compute that consumes it; F of
 * stage s after F of s-1 (same mb); B of s after F of s and after B of s+1; W
 * after its B; OPT_STEP once, last. LOOM_EDATA with one message naming the
 * rank, action index and rule ("rank 1 action 7 (F mb 2 chunk 0): its input
 * was not received (no RECV_ACT before it)"; "deadlock: rank 0 waits at action
 * 5 (RECV_GRAD mb 0 chunk 0 from rank 1), ..."). */
loom_status loom_schedule_validate(const loom_schedule *s);

/* Validate (as above) and time the lists: dur[i] is the duration of action i
 * (flat index; NULL = all 0), latency the delay from the end of a SEND to the
 * earliest end of its RECV. An action starts when the previous one of its
 * rank has ended and, for a RECV, when its message has arrived; start/end
 * (n_total each, either may be NULL) receive the times. This is the one
 * engine behind the validator and the simulator. */
loom_status loom_schedule_replay(const loom_schedule *s, const double *dur, double latency, double *start,
                                 double *end);

/* Most activation sets alive at once on rank r (see "Live activations"). */
int loom_schedule_peak_live(const loom_schedule *s, int rank);

/* Short label of a compute action: "F3", "B3", "W3", with ".c" appended for
 * chunk c when v > 1 ("F3.1"). Others: "SEND_ACT mb 3 chunk 1 -> rank 2",
 * "OPT_STEP". snprintf-style return. */
const char *loom_pp_kind_name(loom_pp_kind k);
int loom_pp_action_format(const loom_pp_action *a, int v, char *buf, size_t cap);

/* ---- stage partitioning ----------------------------------------------
 * n_layer transformer blocks, cost 1 each, plus the embedding (cost_embed, on
 * virtual stage 0) and the LM head (cost_head, on stage S-1), split into S =
 * pp*v consecutive virtual stages of at least one block each. counts[s] is
 * the number of blocks of virtual stage s; its blocks are the counts[s] after
 * those of stages 0..s-1. */

/* Balanced split: the least possible max stage cost; among splits with that
 * cost, the most even (least sum of squared stage costs), ties to earlier
 * stages holding more blocks. counts has pp*v entries. LOOM_EUSAGE for a bad
 * layout (loom_layout_check_stages: "pp=4 x v=2 = 8 virtual stages but the
 * model has 6 layers") or a negative / non-finite cost. */
loom_status loom_partition_balance(int n_layer, int pp, int v, double cost_embed, double cost_head,
                                   int *counts);
/* Cost of virtual stage s under counts (blocks + embedding/head). */
double loom_partition_stage_cost(const int *counts, int n_stages, int s, double cost_embed, double cost_head);

#endif
