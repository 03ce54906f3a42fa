/* pipeline.c - the trainer's pipeline-parallel path (axis pp; its flags are
 * checked by loom_layout_validate, layout.h): cut the model into one part
 * per virtual stage this rank holds, run a step through the executor, and
 * reduce the tied embedding's gradient between the first and the last
 * stage. Collective over pp (and the world at setup).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/data.h"
#include "loom/log.h"
#include "train/internal.h"

/* Every part of this rank in the model's arrays; a layout's virtual stages
 * are at most LOOM_PP_MAX_V (checked by loom_layout_validate). */
_Static_assert(LOOM_MAX_PARTS >= LOOM_PP_MAX_V, "a part per virtual stage");

/* Relative costs for balancing, per token, forward + backward (3 x the
 * forward): a block ~ 24 C^2 + 4 T C FLOPs forward, the LM head 2 V C, the
 * embedding a lookup. Full recompute runs each block's forward once more
 * inside its backward (4 x; 5 x when B and W are split: W recomputes too),
 * never the head's, so the head weighs less and
 * the stages holding it get more blocks. (Selective recompute adds nothing
 * here: the attention backward recomputes its probabilities in any mode.) */
static void stage_counts(const loom_train_config *c, const loom_model_config *mc, int *counts) {
    const loom_layout *l = &c->layout;
    if (l->n_stage_layers) { /* matches pp x v and the model: loom_layout_validate */
        memcpy(counts, l->stage_layers, (size_t)l->n_stage_layers * sizeof *counts);
        return;
    }
    double C = mc->n_embd, fwd = 24.0 * C * C + 4.0 * c->seq * C;
    const int full = l->recompute == LOOM_RECOMPUTE_FULL, split = loom_schedule_splits_backward(l->schedule);
    double block = (full ? (split ? 5.0 : 4.0) : 3.0) * fwd, head = 3.0 * 2.0 * mc->vocab_size * C;
    loom_partition_balance(mc->n_layer, l->pp, l->virtual_stages, 0.01, head / block, counts);
}

loom_status loom_train_pp_setup(loom_train_run_state *s, const loom_model_config *mc, int Bm) {
    const loom_train_config *c = s->cfg;
    const loom_layout *l = &c->layout;
    const int pp = l->pp, v = l->virtual_stages, r = s->mesh->pp_rank, S = pp * v;
    LOOM_TRY(loom_schedule_build(l->schedule, pp, loom_layout_micro_batches(l), v, &s->sched));
    LOOM_TRY(loom_schedule_validate(s->sched));
    int counts[LOOM_MAX_PARTS * 64], first[LOOM_MAX_PARTS * 64 + 1];
    stage_counts(c, mc, counts);
    first[0] = 0;
    for (int i = 0; i < S; i++) first[i + 1] = first[i] + counts[i];
    loom_gpt_opts opts = {.B = Bm,
                          .T = c->seq / l->cp,
                          .n_slots = loom_schedule_peak_live(s->sched, r),
                          .split_backward = s->sched->split_backward,
                          .recompute = l->recompute,
                          .external_params = l->zero >= 3,
                          .external_grads = l->zero >= 2,
                          .moe_route_cp = c->moe_route_cp};
    s->n_parts = v;
    for (int ch = 0; ch < v; ch++) {
        int vs = loom_pp_vstage(s->sched, r, ch);
        loom_model_part part = loom_model_part_whole(s->dev, mc);
        part.tp = loom_train_tp_group(s);
        part.ep = c->layout.ep > 1 ? s->mesh->ep : NULL; /* experts split over the EP group */
        part.cp = loom_train_cp_group(s);
        part.layer_begin = first[vs];
        part.layer_end = first[vs + 1];
        part.has_embed = vs == 0;
        part.has_head = vs == S - 1;
        LOOM_TRY(loom_gpt_create(mc, &part, &opts, &s->parts[ch]));
    }
    LOOM_TRY(loom_pp_exec_create(s->sched, r, s->parts, s->mesh->pp, &s->exec));
    s->pipelined = 1; /* from here teardown frees what follows */
    s->pp_times = calloc(2 * (size_t)pp, sizeof *s->pp_times);
    if (!s->pp_times) return loom_fail(LOOM_EOS, "out of memory for the pipeline's per-rank times");
    if (s->mesh->rank == 0) {
        char line[512];
        size_t n = 0;
        for (int i = 0; i < S && n < sizeof line; i++)
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%d", i ? "," : "", counts[i]);
        loom_info("pipeline: %s, pp=%d, %d micro-batches, %d virtual stage(s) per rank; blocks per "
                  "virtual stage %s",
                  loom_schedule_name(l->schedule), pp, loom_layout_micro_batches(l), v, line);
    }
    return LOOM_OK;
}

void loom_train_pp_teardown(loom_train_run_state *s) {
    loom_pp_exec_free(s->exec);
    loom_schedule_free(s->sched);
    free(s->pp_times);
}

static void pp_batch(void *ctx, int mb, int32_t *inputs, int32_t *targets) {
    loom_train_run_state *s = ctx;
    const loom_train_config *c = s->cfg;
    const int Bl = c->batch / c->layout.dp, Bm = Bl / loom_layout_micro_batches(&c->layout);
    int64_t first = (int64_t)s->mesh->dp_rank * Bl + (int64_t)mb * Bm;
    /* the sampler fills whole sequences into s->inputs / s->targets; each
     * stage gets this rank's context-parallel rows of the ones it needs */
    loom_train_sample(s, s->step, first, Bm, inputs, targets);
}

static void pp_before_backward(void *ctx, int mb, int last) {
    (void)mb;
    loom_dp_set_last_micro(((loom_train_run_state *)ctx)->dp, last);
}

/* The tied wte: stage 0 used it for the embedding, stage S-1 for the head;
 * each holds a copy with half the gradient. Sum them on both (or, when one
 * rank holds both ends, in place), through the parts' gradient views: the
 * model's own buffer at zero 0/1, the DP engine's staging buffer of the
 * outer unit at zero 2/3 (its reduction waits for loom_dp_finish_grads). */
static loom_status tie_embeddings(loom_train_run_state *s) {
    loom_gpt *first = NULL, *last = NULL;
    for (int i = 0; i < s->n_parts; i++) {
        if (s->parts[i]->part.has_embed) first = s->parts[i];
        if (s->parts[i]->part.has_head) last = s->parts[i];
    }
    if (first == last && first) return LOOM_OK; /* one part holds both: already summed */
    loom_gpt *mine = first ? first : last;
    if (!mine || mine->cfg.untied) return LOOM_OK; /* an untied head: nothing shared */
    const loom_param *p = loom_gpt_find_param(mine, loom_model_embed_name(&mine->cfg));
    if (first && last) {                           /* both ends on this rank (pp = 1, v > 1) */
        float *a = first->g.wte, *b = last->g.wte; /* same shape on both */
        loom_tensor_add2(s->dev, a, b, p->numel);
        return LOOM_OK;
    }
    return loom_comm_allreduce(s->mesh->pp_ends, mine->g.wte, p->numel, LOOM_F32, LOOM_SUM);
}

loom_status loom_train_pp_step(loom_train_run_state *s, int step, double *loss_sum) {
    const loom_train_config *c = s->cfg;
    loom_pp_exec_io io = {.ctx = s, .batch = pp_batch, .before_backward = pp_before_backward};
    s->step = step;
    LOOM_TRY(loom_pp_exec_run(s->exec, &io, 1.0f / ((float)c->batch * (float)c->seq), loss_sum));
    LOOM_TRY(tie_embeddings(s));
    /* the loss lives on the last stage: every stage reports the same number */
    return loom_comm_allreduce(loom_comm_host(s->mesh->pp), loss_sum, 1, LOOM_F64, LOOM_SUM);
}

static int is_compute(loom_pp_kind k) { return k == LOOM_PP_F || k == LOOM_PP_B || k == LOOM_PP_W; }

loom_status loom_train_pp_bubble(loom_train_run_state *s, double *bubble, double *idle_ms, double *wait_ms) {
    int n;
    const loom_pp_event *ev = loom_pp_exec_events(s->exec, &n);
    double mine[2] = {0, 0}, t0 = n ? ev[0].t0 : 0, t1 = n ? ev[n - 1].t1 : 0; /* compute, waits */
    for (int i = 0; i < n; i++) {
        const loom_pp_kind k = ev[i].a.kind;
        if (is_compute(k)) mine[0] += ev[i].t1 - ev[i].t0;
        if (k == LOOM_PP_RECV_ACT || k == LOOM_PP_RECV_GRAD || k == LOOM_PP_OPT_STEP)
            mine[1] += ev[i].t1 - ev[i].t0;
    }
    /* the step starts together on every rank (the previous step ended in
     * collectives); the span is the longest rank's */
    double span = t1 - t0;
    loom_comm *pp_host = loom_comm_host(s->mesh->pp); /* host doubles */
    const int pp = loom_comm_size(s->mesh->pp);
    double *all = malloc(2 * (size_t)pp * sizeof *all);
    if (!all) return loom_fail(LOOM_EOS, "out of memory for the pipeline's per-rank times");
    loom_status st = loom_comm_allgather(pp_host, mine, all, sizeof mine);
    if (st == LOOM_OK) st = loom_comm_allreduce(pp_host, &span, 1, LOOM_F64, LOOM_MAX);
    double busy = 0;
    for (int r = 0; r < pp && st == LOOM_OK; r++) {
        busy += all[2 * r];
        idle_ms[r] = 1e3 * (span - all[2 * r]);
        wait_ms[r] = 1e3 * all[2 * r + 1];
    }
    free(all);
    *bubble = span > 0 ? 1.0 - busy / (pp * span) : 0.0;
    return st;
}

void loom_train_pp_trace(loom_train_run_state *s, loom_trace *t) {
    int n;
    const loom_pp_event *ev = loom_pp_exec_events(s->exec, &n);
    for (int i = 0; i < n; i++) {
        char name[96];
        loom_pp_action_format(&ev[i].a, s->cfg->layout.virtual_stages, name, sizeof name);
        loom_trace_event(t, name, is_compute(ev[i].a.kind) ? "compute" : "pipeline", ev[i].t0, ev[i].t1,
                         s->mesh->rank, 0);
    }
}
