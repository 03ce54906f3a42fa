/* layout_check.c - loom_layout_validate: every rule a parallel layout must
 * meet, for each use of it (layout.h): training, inference, the planner's
 * candidates and the schedule simulator. Every mesh axis has its section
 * here: the mesh itself (degrees, world size, ep inside dp x cp), tensor
 * parallelism (heads, MLP width, sp), context parallelism (the balanced
 * split, Ulysses' heads), expert parallelism, the batch split over dp and
 * micro-batches, and the pipeline (schedule, stages, blocks per stage),
 * then the limits of the backend. Where the uses differ, the difference is
 * written next to the rule. Pure: no communication, nothing collective.
 */
#include <limits.h>
#include <stddef.h>

#include "loom/layout.h"

static const char *ranks_word(long long n) { return n == 1 ? "rank" : "ranks"; }

static const char *precision_name(loom_precision p) {
    return (unsigned)p < LOOM_PRECISION_COUNT ? loom_precision_names[p] : "?";
}

/* ---- the mesh ------------------------------------------------------------ */

static loom_status check_degrees(const loom_layout *l) {
    const struct {
        const char *name;
        int v;
    } d[] = {{"dp", l->dp}, {"tp", l->tp}, {"pp", l->pp}, {"cp", l->cp}, {"ep", l->ep}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (d[i].v < 1) return loom_fail(LOOM_EUSAGE, "%s=%d: degrees must be >= 1", d[i].name, d[i].v);
    return LOOM_OK;
}

static loom_status check_order(const loom_layout *l) {
    int seen[LOOM_AXIS_COUNT] = {0};
    for (int i = 0; i < LOOM_AXIS_COUNT; i++) {
        unsigned a = (unsigned)l->order[i];
        if (a >= LOOM_AXIS_COUNT)
            return loom_fail(LOOM_EUSAGE, "axis order entry %d is %u, not an axis", i, a);
        if (seen[a]++)
            return loom_fail(LOOM_EUSAGE,
                             "axis order names %s twice; each of tp, cp, dp, pp must appear once",
                             loom_axis_names[a]);
    }
    return LOOM_OK;
}

loom_status loom_layout_check(const loom_layout *l, int world_size) {
    LOOM_TRY(check_degrees(l));
    LOOM_TRY(check_order(l));
    if (world_size < 1)
        return loom_fail(LOOM_EUSAGE, "the job has %d ranks; it needs at least 1", world_size);
    /* product clamped just above INT_MAX, so four ints cannot overflow */
    long long ranks = 1;
    const int deg[] = {l->dp, l->tp, l->pp, l->cp};
    for (int i = 0; i < 4; i++) {
        ranks *= deg[i];
        if (ranks > INT_MAX) ranks = (long long)INT_MAX + 1;
    }
    if (ranks != world_size)
        return loom_fail(LOOM_EUSAGE, "dp=%d x tp=%d x pp=%d x cp=%d = %s%lld %s, but the job has %d %s",
                         l->dp, l->tp, l->pp, l->cp, ranks > INT_MAX ? "more than " : "",
                         ranks > INT_MAX ? (long long)INT_MAX : ranks, ranks_word(ranks), world_size,
                         ranks_word(world_size));
    if ((l->dp * l->cp) % l->ep != 0)
        return loom_fail(LOOM_EUSAGE, "ep=%d must divide dp*cp=%d (dp=%d, cp=%d)", l->ep, l->dp * l->cp,
                         l->dp, l->cp);
    return LOOM_OK;
}

/* Enum fields in range (a layout built in code rather than parsed). */
static loom_status check_enums(const loom_layout *l) {
    const struct {
        const char *what;
        unsigned v, n;
    } e[] = {{"cp_impl", (unsigned)l->cp_impl, LOOM_CP_IMPL_COUNT},
             {"schedule", (unsigned)l->schedule, LOOM_SCHED_COUNT},
             {"recompute", (unsigned)l->recompute, LOOM_RECOMPUTE_COUNT},
             {"precision", (unsigned)l->precision, LOOM_PRECISION_COUNT},
             {"comm_precision", (unsigned)l->comm_precision, LOOM_PRECISION_COUNT}};
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (e[i].v >= e[i].n) return loom_fail(LOOM_EUSAGE, "layout %s %u: out of range", e[i].what, e[i].v);
    return LOOM_OK;
}

/* --comm-precision bf16: the dp (x cp) gradient reductions (dp.h) and the TP
 * activation collectives (tp.h) in bf16. */
static loom_status check_comm_precision(const loom_layout *l) {
    if (l->comm_precision == LOOM_PRECISION_FP32) return LOOM_OK;
    if (l->precision != LOOM_PRECISION_BF16)
        return loom_fail(LOOM_EUSAGE,
                         "--comm-precision bf16 needs --precision bf16: it is part of "
                         "mixed precision (this run computes in %s)",
                         precision_name(l->precision));
    if (l->dp * l->cp * l->tp == 1)
        return loom_fail(LOOM_EUSAGE,
                         "--comm-precision bf16 with dp=1 cp=1 tp=1: it sends the "
                         "gradient reductions over dp x cp and the TP collectives in bf16, and this "
                         "layout has neither");
    return LOOM_OK;
}

/* ---- tensor, context and expert parallelism ------------------------------ */

loom_status loom_layout_check_tp(const loom_layout_model *m, int tp, int sp, int T) {
    if (tp < 1) return loom_fail(LOOM_EUSAGE, "tp=%d: must be >= 1", tp);
    if (m->n_head % tp)
        return loom_fail(LOOM_EUSAGE, "tp=%d does not divide n_head=%d of model %s", tp, m->n_head, m->name);
    const int kv = m->n_kv_head > 0 ? m->n_kv_head : m->n_head;
    if (kv % tp && tp % kv) /* more tp ranks than key/value heads: each head replicated on tp / kv ranks */
        return loom_fail(LOOM_EUSAGE,
                         "tp=%d and num_key_value_heads=%d of model %s: one must divide the other "
                         "(key/value heads are split over tp, or replicated when tp exceeds them)",
                         tp, kv, m->name);
    if (m->ffn % tp)
        return loom_fail(LOOM_EUSAGE, "tp=%d does not divide ffn=%d (the %s hidden size) of model %s", tp,
                         m->ffn, m->n_expert > 0 ? "experts'" : "MLP's", m->name);
    if (sp && T % tp)
        return loom_fail(LOOM_EUSAGE, "--sp needs tp=%d to divide the sequence length --seq %d", tp, T);
    return LOOM_OK;
}

/* The causal load-balanced split into 2*cp chunks; Ulysses' heads; SP's rows. */
static loom_status check_cp(const loom_layout *l, const loom_layout_model *m, int T) {
    const int cp = l->cp, tp = l->tp;
    if (cp == 1) return LOOM_OK;
    if (T % (2 * cp))
        return loom_fail(LOOM_EUSAGE,
                         "--seq %d: cp=%d needs a multiple of 2*cp=%d (the causal load-balanced "
                         "split into 2*cp chunks)",
                         T, cp, 2 * cp);
    if (l->cp_impl == LOOM_CP_ULYSSES && (m->n_head / tp) % cp)
        return loom_fail(LOOM_EUSAGE,
                         "--cp-impl ulysses: cp=%d must divide the heads per tp rank, n_head=%d / "
                         "tp=%d = %d",
                         cp, m->n_head, tp, m->n_head / tp);
    const int kv = m->n_kv_head > 0 ? m->n_kv_head : m->n_head, kv_l = kv > tp ? kv / tp : 1;
    if (l->cp_impl == LOOM_CP_ULYSSES && kv_l % cp)
        return loom_fail(LOOM_EUSAGE,
                         "--cp-impl ulysses: cp=%d must divide the key/value heads per tp rank, "
                         "num_key_value_heads=%d / tp=%d = %d",
                         cp, kv, tp, kv_l);
    if (l->sp && (T / cp) % tp)
        return loom_fail(LOOM_EUSAGE,
                         "--sp with cp=%d: tp=%d must divide the %d local rows "
                         "(--seq %d / cp)",
                         cp, tp, T / cp, T);
    return LOOM_OK;
}

static loom_status check_ep(const loom_layout *l, const loom_layout_model *m, int loom_runs) {
    const int ep = l->ep;
    if (ep <= 1) return LOOM_OK;
    if (m->n_expert == 0)
        return loom_fail(LOOM_EUSAGE,
                         "--ep %d needs a Mixture-of-Experts model (num_local_experts > 0); "
                         "model %s is dense%s",
                         ep, m->name, loom_runs ? " (try tiny-moe)" : "");
    if (m->n_expert % ep)
        return loom_fail(LOOM_EUSAGE, "--ep %d does not divide num_local_experts=%d of model %s", ep,
                         m->n_expert, m->name);
    return LOOM_OK;
}

/* The rules of the axes that split the model, training and planning alike. */
static loom_status check_split(const loom_layout *l, const loom_layout_model *m, const loom_layout_job *j) {
    const int loom_runs = j->purpose == LOOM_LAYOUT_FOR_TRAIN;
    LOOM_TRY(loom_layout_check_tp(m, l->tp, l->sp, j->seq));
    LOOM_TRY(check_ep(l, m, loom_runs));
    LOOM_TRY(check_cp(l, m, j->seq));
    if (l->sp && l->tp == 1) return loom_fail(LOOM_EUSAGE, "--sp needs --tp > 1");
    return LOOM_OK;
}

/* ---- the batch ----------------------------------------------------------- */

static loom_status check_batch(const loom_layout *l, const loom_layout_job *j) {
    const int batch = j->batch, dp = l->dp;
    if (batch < 1) return loom_fail(LOOM_EUSAGE, "--batch %d: must be >= 1", batch);
    if (batch % dp)
        return loom_fail(LOOM_EUSAGE, "dp=%d does not divide --batch %d (global sequences per step)", dp,
                         batch);
    if (l->grad_accum < 1) return loom_fail(LOOM_EUSAGE, "--grad-accum %d: must be >= 1", l->grad_accum);
    if ((batch / dp) % l->grad_accum)
        return loom_fail(LOOM_EUSAGE,
                         "--grad-accum %d does not divide the %d sequences per DP rank (--batch %d / dp=%d)",
                         l->grad_accum, batch / dp, batch, dp);
    return LOOM_OK;
}

/* ---- the pipeline -------------------------------------------------------- */

loom_status loom_layout_check_schedule(loom_sched_kind k, int pp, int m, int v) {
    if ((unsigned)k >= LOOM_SCHED_COUNT) return loom_fail(LOOM_EUSAGE, "schedule %d: not a schedule", (int)k);
    if (pp < 1 || pp > LOOM_PP_MAX_PP)
        return loom_fail(LOOM_EUSAGE, "--pp %d: must be in 1..%d", pp, LOOM_PP_MAX_PP);
    if (m < 1 || m > LOOM_PP_MAX_MB)
        return loom_fail(LOOM_EUSAGE, "--micro-batches %d: must be in 1..%d", m, LOOM_PP_MAX_MB);
    if (v < 1 || v > LOOM_PP_MAX_V)
        return loom_fail(LOOM_EUSAGE, "--virtual-stages %d: must be in 1..%d", v, LOOM_PP_MAX_V);
    if (loom_schedule_vshape(k) && v != 2)
        return loom_fail(LOOM_EUSAGE, "--virtual-stages %d: %s places exactly 2 chunks per rank (a V)", v,
                         loom_schedule_names[k]);
    if (v > 1 && k != LOOM_SCHED_INTERLEAVED && !loom_schedule_vshape(k))
        return loom_fail(LOOM_EUSAGE,
                         "--virtual-stages %d: v > 1 only with interleaved, zbv or dualpipev (schedule %s)",
                         v, loom_schedule_names[k]);
    if (k == LOOM_SCHED_INTERLEAVED && m % pp != 0)
        return loom_fail(LOOM_EUSAGE, "interleaved needs --micro-batches divisible by pp=%d, got %d", pp, m);
    if ((long long)pp * m * v > LOOM_PP_MAX_WORK)
        return loom_fail(LOOM_EUSAGE,
                         "pp=%d x micro-batches=%d x v=%d = %lld (micro-batch, stage) pairs: more than %d",
                         pp, m, v, (long long)pp * m * v, LOOM_PP_MAX_WORK);
    return LOOM_OK;
}

/* Enough blocks for pp x v stages ("limits": also loom's own bounds on pp
 * and v, which the planner's other stacks do not have). */
static loom_status check_stages(int n_layer, int pp, int v, int limits) {
    if (limits && (pp < 1 || v < 1 || pp > LOOM_PP_MAX_PP || v > LOOM_PP_MAX_V))
        return loom_fail(LOOM_EUSAGE, "pp=%d x v=%d: both must be >= 1 (pp <= %d, v <= %d)", pp, v,
                         LOOM_PP_MAX_PP, LOOM_PP_MAX_V);
    if (n_layer < 1) return loom_fail(LOOM_EUSAGE, "the model has %d layers: need at least 1", n_layer);
    if ((long long)pp * v > n_layer)
        return loom_fail(LOOM_EUSAGE, "pp=%d x v=%d = %lld virtual stages but the model has %d layers", pp, v,
                         (long long)pp * v, n_layer);
    return LOOM_OK;
}

loom_status loom_layout_check_stages(int n_layer, int pp, int v) { return check_stages(n_layer, pp, v, 1); }

/* --stage-layers against the model and pp x v (entries >= 1 when parsed). */
static loom_status check_stage_layers(const loom_layout *l, int n_layer) {
    const int n = l->n_stage_layers, S = l->pp * l->virtual_stages;
    if (n == 0) return LOOM_OK;
    if (n != S)
        return loom_fail(LOOM_EUSAGE, "--stage-layers has %d entries, need pp=%d x v=%d = %d", n, l->pp,
                         l->virtual_stages, S);
    long long sum = 0;
    for (int i = 0; i < n; i++) sum += l->stage_layers[i];
    if (sum != n_layer)
        return loom_fail(LOOM_EUSAGE, "--stage-layers sums to %lld, model has %d layers", sum, n_layer);
    return LOOM_OK;
}

/* A training pipeline: the schedule, its stages, the micro-batches. */
static loom_status check_pipeline(const loom_layout *l, const loom_layout_model *m,
                                  const loom_layout_job *j) {
    const int pp = l->pp, v = l->virtual_stages, mb = loom_layout_micro_batches(l);
    LOOM_TRY(loom_layout_check_schedule(l->schedule, pp, mb, v));
    if (j->purpose != LOOM_LAYOUT_FOR_TRAIN)
        return LOOM_OK; /* the planner: stages checked, mbs x m = batch */
    LOOM_TRY(check_stages(m->n_layer, pp, v, 1));
    LOOM_TRY(check_stage_layers(l, m->n_layer));
    if (l->grad_accum != 1)
        return loom_fail(LOOM_EUSAGE,
                         "--grad-accum %d with a pipeline: use --micro-batches (pipelines "
                         "accumulate over their micro-batches)",
                         l->grad_accum);
    const int per_rank = j->batch / l->dp;
    if (per_rank % mb)
        return loom_fail(LOOM_EUSAGE,
                         "--micro-batches %d does not divide the %d sequences per DP rank "
                         "(--batch %d / dp=%d)",
                         mb, per_rank, j->batch, l->dp);
    return LOOM_OK;
}

/* ---- the uses ------------------------------------------------------------ */

static loom_status validate_train(const loom_layout *l, const loom_layout_model *m,
                                  const loom_layout_job *j) {
    LOOM_TRY(check_comm_precision(l));
    LOOM_TRY(loom_layout_check(l, j->world));
    LOOM_TRY(check_split(l, m, j));
    LOOM_TRY(loom_layout_check_device(l, j->device));
    LOOM_TRY(check_batch(l, j));
    if (l->zero < 0 || l->zero > 3) return loom_fail(LOOM_EUSAGE, "--zero %d: must be 0, 1, 2 or 3", l->zero);
    if (j->seq < 1) return loom_fail(LOOM_EUSAGE, "--seq %d: must be >= 1", j->seq);
    if (j->seq > m->n_positions)
        return loom_fail(LOOM_EUSAGE, "--seq %d exceeds n_positions=%d of model %s", j->seq, m->n_positions,
                         m->name);
    if (l->virtual_stages < 1)
        return loom_fail(LOOM_EUSAGE, "--virtual-stages %d: must be >= 1", l->virtual_stages);
    return loom_layout_pipelined(l) ? check_pipeline(l, m, j) : LOOM_OK;
}

/* generate and serve: tp x pp x ep ranks per replica (the ep ranks are dp
 * ranks that hold different experts and run the same requests), dp replicas. */
static loom_status validate_infer(const loom_layout *l, const loom_layout_model *m,
                                  const loom_layout_job *j) {
    LOOM_TRY(loom_layout_check(l, j->world));
    if (l->cp > 1)
        return loom_fail(LOOM_EUSAGE, "inference runs tp x pp x ep (x dp replicas); cp=%d must be 1", l->cp);
    LOOM_TRY(check_ep(l, m, 1));
    LOOM_TRY(loom_layout_check_tp(m, l->tp, 0, 1));
    if (l->pp > LOOM_INFER_MAX_STAGES)
        return loom_fail(LOOM_EUSAGE, "inference: pp=%d stages, at most %d", l->pp, LOOM_INFER_MAX_STAGES);
    return check_stages(m->n_layer, l->pp, 1, 1);
}

/* What the planner weighs: the model's splits as training has them, then
 * the planner's own representation (m micro-batches of mbs sequences, no
 * schedule at pp=1, ZeRO only with something to shard over, serving on dp,
 * tp, pp and ep only). Full recompute with zb is not refused here. */
static loom_status validate_plan(const loom_layout *l, const loom_layout_model *m, const loom_layout_job *j) {
    const int serve = j->purpose == LOOM_LAYOUT_FOR_PLAN_SERVE;
    LOOM_TRY(loom_layout_check(l, j->world));
    LOOM_TRY(check_split(l, m, j));
    LOOM_TRY(check_stages(m->n_layer, l->pp, l->virtual_stages, 0));
    if (l->zero && l->dp * l->cp < 2)
        return loom_fail(LOOM_EUSAGE, "zero=%d needs dp*cp > 1 (dp=%d x cp=%d = 1: nothing to shard over)",
                         l->zero, l->dp, l->cp);
    if (serve) {
        if (l->cp > 1 || l->zero || l->micro_batches != 1)
            return loom_fail(LOOM_EUSAGE,
                             "serving layouts use dp, tp, pp, ep only (cp=%d, zero=%d, m=%d: "
                             "need 1, 0, 1)",
                             l->cp, l->zero, l->micro_batches);
        return LOOM_OK;
    }
    LOOM_TRY(check_batch(l, j));
    const int local = j->batch / l->dp, mb = l->micro_batches;
    if (l->micro_batch_size > 0 && (long long)l->micro_batch_size * mb != local)
        return loom_fail(
            LOOM_EUSAGE, "mbs=%d x m=%d = %lld, but a dp rank has %d sequences (--batch %d / dp=%d)",
            l->micro_batch_size, mb, (long long)l->micro_batch_size * mb, local, j->batch, l->dp);
    if (l->pp == 1 && (l->virtual_stages != 1 || l->schedule != LOOM_SCHED_1F1B))
        return loom_fail(LOOM_EUSAGE,
                         "pp=1: no pipeline schedule (use schedule=1f1b, v=1; got schedule=%s, v=%d)",
                         loom_schedule_name(l->schedule), l->virtual_stages);
    return l->pp > 1 ? check_pipeline(l, m, j) : LOOM_OK;
}

/* loom sim: one pipeline, with or without a model's blocks. */
static loom_status validate_sim(const loom_layout *l, const loom_layout_model *m) {
    const int n_layer = m ? m->n_layer : 0;
    LOOM_TRY(loom_layout_check_schedule(l->schedule, l->pp, l->micro_batches, l->virtual_stages));
    if (l->n_stage_layers && n_layer == 0)
        return loom_fail(LOOM_EUSAGE, "--stage-layers needs --layers N (the model's layer count)");
    if (n_layer == 0) return LOOM_OK;
    LOOM_TRY(check_stages(n_layer, l->pp, l->virtual_stages, 1));
    return check_stage_layers(l, n_layer);
}

loom_status loom_layout_validate(const loom_layout *l, const loom_layout_model *m, const loom_layout_job *j) {
    LOOM_TRY(check_enums(l));
    switch (j->purpose) {
    case LOOM_LAYOUT_FOR_TRAIN: return validate_train(l, m, j);
    case LOOM_LAYOUT_FOR_INFER: return validate_infer(l, m, j);
    case LOOM_LAYOUT_FOR_PLAN_TRAIN:
    case LOOM_LAYOUT_FOR_PLAN_SERVE: return validate_plan(l, m, j);
    case LOOM_LAYOUT_FOR_SIM: return validate_sim(l, m);
    }
    return loom_fail(LOOM_EINTERNAL, "layout purpose %d", (int)j->purpose);
}

/* ---- the device ---------------------------------------------------------- */

/* Every group of a run is made by the device (device.h), host-staged when
 * its memory is not host memory, so multi-rank runs, bf16 communication and
 * sharded checkpoints (host copies through the device) work on any backend.
 * What is left: groups of a backend's own library (NCCL) have no tags and
 * run their ops one at a time, in order, on one stream; a send and a
 * receive that must progress together (the pipeline executor's, the CP
 * ring's) would need an NCCL group call around them, which those callers do
 * not make (comm.h: loom_comm_nccl_group_start). */
loom_status loom_layout_check_device(const loom_layout *l, const loom_layout_device *d) {
    if (!d || !d->native_comm) return LOOM_OK;
    if (l->pp > 1)
        return loom_fail(LOOM_EUSAGE,
                         "--device %s with %s groups (LOOM_DEVICE_COMM=%s) and pp=%d: the pipeline's sends "
                         "and receives must progress together, matched by tag, and NCCL groups run one op "
                         "at a time without tags; use LOOM_DEVICE_COMM=staged",
                         d->name, d->comm, d->comm, l->pp);
    if (l->cp > 1 && l->cp_impl == LOOM_CP_RING)
        return loom_fail(LOOM_EUSAGE,
                         "--device %s with %s groups (LOOM_DEVICE_COMM=%s) and cp=%d ring: the ring's send "
                         "and receive must progress together, and NCCL groups run one op at a time; use "
                         "--cp-impl ulysses, or LOOM_DEVICE_COMM=staged",
                         d->name, d->comm, d->comm, l->cp);
    return LOOM_OK;
}
