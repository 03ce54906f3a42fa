/* dp.c - the data-parallel engine of dp.h: per-unit hooks that reduce each
 * gradient bucket as soon as the backward completes it (all-reduce at
 * zero 0, reduce-scatter at zero 1-3), the exact global norm over shards,
 * AdamW on this rank's shard (a run per segment for the driver of adamw.h),
 * and the parameter all-gathers of zero 1/2.
 * Axis: dp. ZeRO-3's parameter side is zero3.c; the plan is dp_layout.c.
 *
 * Collective over dp: the hooks (so the model's forward and backward),
 * loom_dp_finish_grads and loom_dp_step; over tp too
 * where the engine sums partial SP gradients; over tp, pp and dp:
 * loom_dp_grad_norm. At dp = 1 nothing is communicated over dp.
 *
 * Gradient storage: zero 0/1 use the model's own grad_mem (the caller may
 * still touch it after the backward: loom_gpt_finish_grads, the pipeline's
 * tied embedding - the buckets holding those gradients are deferred to
 * loom_dp_finish_grads); zero 2/3 bind each bucket's units to a staging
 * buffer for one backward and keep only the reduced slice (gshard).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/moe.h"
#include "distributed/dp_internal.h"

#define F sizeof(float)

/* The compute thread's seconds inside calls on the dp group so far. */
static double dp_call_seconds(const loom_dp_engine *e) {
    if (!e->dp) return 0;
    const loom_comm_stats *s = loom_comm_get_stats(e->dp);
    double t = 0;
    for (int op = 0; op < LOOM_OP_COUNT; op++) t += s->call_seconds[op];
    return t;
}

/* ---- in-flight gradient reductions -------------------------------------- */

/* A finished reduction. zero 2/3: add the reduced slice (at the start of the
 * staging buffer) into the shard and give the buffer back. */
static void reduce_done(dp_part *p, dp_bucket *b) {
    loom_dp_engine *e = p->e;
    e->timing.reduce_s += loom_comm_wtime() - b->rs_t0;
    b->rs = NULL;
    if (e->cfg.zero < 2) {
        b->gstate = DP_DONE;
        return;
    }
    const float *src = p->stage[b->slot];
    float *dst = p->gshard + b->so;
    loom_tensor_add(p->m->dev, dst, src, b->S);
    p->stage_owner[b->slot] = -1;
    b->gstate = DP_IDLE;
}

static loom_status wait_reduce(dp_part *p, dp_bucket *b) {
    if (b->gstate != DP_REDUCING) return LOOM_OK;
    loom_req *r = b->rs;
    b->rs = NULL;
    LOOM_TRY(loom_comm_wait(r));
    reduce_done(p, b);
    return LOOM_OK;
}

/* One pass of loom_comm_test over everything in flight. */
static loom_status poll_once(loom_dp_engine *e) {
    for (int i = 0; i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        for (int k = 0; k < p->n_buckets; k++) {
            dp_bucket *b = &p->buckets[k];
            if (b->rs) {
                int done = 0;
                loom_status st = loom_comm_test(b->rs, &done);
                if (done) {
                    b->rs = NULL; /* released by test */
                    LOOM_TRY(st);
                    reduce_done(p, b);
                }
            }
            if (e->cfg.zero == 3) LOOM_TRY(loom_dp_z3_test(p, b));
        }
    }
    return LOOM_OK;
}

/* Drive what is in flight. With the communicator's progress thread MPI moves
 * on its own and the hooks do nothing (completion is collected by the waits
 * in acquire_stage / loom_dp_finish_grads; no start depends on a test).
 * Without it, Open MPI progresses non-blocking collectives
 * only inside MPI calls, so every hook tests each request once (a
 * rendezvous handshake then proceeds, and where the transport moves data on
 * its own - RDMA, a progress thread - the transfer runs behind the compute).
 * Hooks do not spin: where data moves only inside calls (shared memory on
 * busy cores), spinning would just move the copy work into the backward of
 * the slowest rank, and wait there for peers still computing. */
loom_status loom_dp_progress(loom_dp_engine *e) {
    if (loom_comm_progress_thread()) return LOOM_OK;
    double t0 = loom_comm_wtime();
    LOOM_TRY(poll_once(e));
    e->timing.poll_s += loom_comm_wtime() - t0;
    return LOOM_OK;
}

/* ---- starting reductions ------------------------------------------------- */

/* Sum over tp the gradients SP left partial, in the bucket's buffer `g`
 * (laid out like the model's flat range from b->lo). Collective over tp. */
static loom_status sum_partials(dp_part *p, const dp_bucket *b, float *g) {
    return b->has_partial ? loom_gpt_sum_sp_partials(p->m, g, b->lo, b->n) : LOOM_OK;
}

/* Bounded reductions in flight: before a start, wait for the oldest still
 * in flight while DP_MAX_INFLIGHT are (the start order, and so which one is
 * waited for, is the same on every rank; waiting is local). An entry is
 * stale once its bucket completed or restarted (rs_seq moved on). */
#define FIFO_CAP ((int)(sizeof((loom_dp_engine *)0)->fifo_bucket / sizeof(int)))
static int fifo_live(const loom_dp_engine *e, int j) {
    const dp_bucket *b = &e->fifo_part[j]->buckets[e->fifo_bucket[j]];
    return b->gstate == DP_REDUCING && b->rs && b->rs_seq == e->fifo_seq[j];
}
static loom_status make_room(loom_dp_engine *e) {
    int busy = 0;
    for (int i = 0; i < e->fifo_n; i++) busy += fifo_live(e, (e->fifo_head + i) % FIFO_CAP);
    double t0 = loom_comm_wtime();
    while (e->fifo_n && (busy >= DP_MAX_INFLIGHT || e->fifo_n == FIFO_CAP)) {
        int j = e->fifo_head;
        if (fifo_live(e, j)) {
            LOOM_TRY(wait_reduce(e->fifo_part[j], &e->fifo_part[j]->buckets[e->fifo_bucket[j]]));
            busy--;
        }
        e->fifo_head = (e->fifo_head + 1) % FIFO_CAP;
        e->fifo_n--;
    }
    e->timing.exposed_s += loom_comm_wtime() - t0;
    return LOOM_OK;
}

/* b's reduction has just started (b->rs set). The early wte's (one per
 * part, zero 0) flies beside the DP_MAX_INFLIGHT others: it starts first
 * and runs longest, and waiting for it would stall the very backward it is
 * meant to hide behind; loom_dp_finish_grads waits for it. */
static void record_started(dp_part *p, dp_bucket *b) {
    loom_dp_engine *e = p->e;
    if (b->head_wte) return;
    int j = (e->fifo_head + e->fifo_n) % FIFO_CAP;
    b->rs_seq++;
    e->fifo_part[j] = p;
    e->fifo_bucket[j] = (int)(b - p->buckets);
    e->fifo_seq[j] = b->rs_seq;
    e->fifo_n++;
}

static void count_reduction(loom_dp_engine *e, dp_bucket *b, int overlapped) {
    b->rs_t0 = loom_comm_wtime();
    if (e->N == 1) return;
    e->timing.reductions++;
    e->timing.overlapped += overlapped;
}

/* What the gradient reductions carry (comm_bf16: the communicator's bf16
 * wire format converts each bucket and converts the result back when its
 * reduction completes). */
static loom_dtype wire(const loom_dp_engine *e) { return e->cfg.comm_bf16 ? LOOM_BF16 : LOOM_F32; }

/* zero 0/1: all-reduce, or reduce-scatter in place (the slice lands at the
 * bucket's start); a padded bucket goes through the scratch, blocking. */
static loom_status start_reduce01(dp_part *p, dp_bucket *b, int overlapped) {
    loom_dp_engine *e = p->e;
    float *g = p->m->grad_mem + b->lo;
    if (e->cfg.sum_tp_partials) LOOM_TRY(sum_partials(p, b, g));
    count_reduction(e, b, overlapped);
    b->gstate = DP_DONE;
    if (e->N == 1) return LOOM_OK;
    if (e->cfg.zero == 0 || b->P == b->n) {
        LOOM_TRY(make_room(e));
        loom_status st = e->cfg.zero == 0
                             ? loom_comm_iallreduce_as(e->dp, g, b->n, wire(e), LOOM_SUM, &b->rs)
                             : loom_comm_ireduce_scatter_as(e->dp, g, g, b->S, wire(e), LOOM_SUM, &b->rs);
        if (st == LOOM_OK) {
            b->gstate = DP_REDUCING;
            record_started(p, b);
        }
        return st;
    }
    loom_tensor_copy(p->m->dev, p->scratch, g, b->n);
    loom_tensor_zero(p->m->dev, p->scratch + b->n, b->P - b->n);
    LOOM_TRY(loom_comm_reduce_scatter_as(e->dp, p->scratch, p->scratch, b->S, wire(e), LOOM_SUM));
    loom_tensor_copy(p->m->dev, g, p->scratch, b->S);
    e->timing.reduce_s += loom_comm_wtime() - b->rs_t0;
    return LOOM_OK;
}

/* zero 2/3: reduce-scatter the staging buffer in place. */
static loom_status start_reduce23(dp_part *p, dp_bucket *b) {
    loom_dp_engine *e = p->e;
    float *g = p->stage[b->slot];
    LOOM_TRY(sum_partials(p, b, g));
    if (e->N > 1) LOOM_TRY(make_room(e)); /* before b counts as reducing */
    count_reduction(e, b, 1);
    b->gstate = DP_REDUCING;
    if (e->N == 1) {
        reduce_done(p, b);
        return LOOM_OK;
    }
    loom_status st = loom_comm_ireduce_scatter_as(e->dp, g, g, b->S, wire(e), LOOM_SUM, &b->rs);
    if (st != LOOM_OK) b->gstate = DP_IDLE;
    else record_started(p, b);
    return st;
}

/* zero 2/3: bind the bucket's units to its staging buffer, zeroed, once its
 * previous user's reduction is complete. */
static loom_status acquire_stage(dp_part *p, int bi) {
    dp_bucket *b = &p->buckets[bi];
    if (b->gstate == DP_ACQUIRED) return LOOM_OK;
    double t0 = loom_comm_wtime();
    LOOM_TRY(wait_reduce(p, b)); /* its own reduction from the previous micro-batch */
    int owner = p->stage_owner[b->slot];
    if (owner >= 0) {
        dp_bucket *o = &p->buckets[owner];
        if (o->gstate != DP_REDUCING)
            return loom_fail(LOOM_EINTERNAL,
                             "ZeRO-%d: gradient buffer %d is still accumulating bucket %d when "
                             "bucket %d needs it (unexpected hook order)",
                             p->e->cfg.zero, b->slot, owner, bi);
        LOOM_TRY(wait_reduce(p, o));
    }
    p->e->timing.exposed_s += loom_comm_wtime() - t0;
    float *buf = p->stage[b->slot];
    loom_tensor_zero(p->m->dev, buf, b->P);
    for (int i = b->u_begin; i < b->u_end; i++) {
        const dp_unit *u = &p->units[i];
        loom_gpt_bind_unit(p->m, u->unit, NULL, buf + (u->lo - b->lo));
    }
    p->stage_owner[b->slot] = bi;
    b->gstate = DP_ACQUIRED;
    return LOOM_OK;
}

/* ---- hooks --------------------------------------------------------------- */

static loom_status hook_pre_forward(void *ctx, loom_gpt *m, int unit) {
    (void)m;
    dp_part *p = ctx;
    LOOM_TRY(loom_dp_progress(p->e));
    return p->e->cfg.zero == 3 ? loom_dp_z3_use(p, unit, 0) : LOOM_OK;
}

static loom_status hook_post_forward(void *ctx, loom_gpt *m, int unit) {
    (void)m;
    dp_part *p = ctx;
    if (p->e->cfg.zero == 3) loom_dp_z3_release(p, unit);
    return loom_dp_progress(p->e);
}

/* Before a unit's backward: zero 2/3 bind its gradients to a staging
 * buffer (in a split backward, before its W instead: hook_pre_weight), and
 * zero 3 gathers its parameters. */
static loom_status hook_pre_backward(void *ctx, loom_gpt *m, int unit) {
    dp_part *p = ctx;
    LOOM_TRY(loom_dp_progress(p->e));
    if (p->e->cfg.zero < 2) return LOOM_OK;
    int ui = loom_dp_unit_index(p, unit);
    if (ui < 0) return LOOM_OK;
    if (!m->opts.split_backward) LOOM_TRY(acquire_stage(p, p->units[ui].bucket));
    return p->e->cfg.zero == 3 ? loom_dp_z3_use(p, unit, 1) : LOOM_OK;
}

/* Split backward: the unit's B is done, its gathered parameters can go. */
static loom_status hook_post_input(void *ctx, loom_gpt *m, int unit) {
    (void)m;
    dp_part *p = ctx;
    if (p->e->cfg.zero == 3) loom_dp_z3_release(p, unit);
    return LOOM_OK;
}

/* Split backward: the unit's W is about to write its gradients. */
static loom_status hook_pre_weight(void *ctx, loom_gpt *m, int unit) {
    (void)m;
    dp_part *p = ctx;
    LOOM_TRY(loom_dp_progress(p->e));
    if (p->e->cfg.zero < 2) return LOOM_OK;
    int ui = loom_dp_unit_index(p, unit);
    return ui < 0 ? LOOM_OK : acquire_stage(p, p->units[ui].bucket);
}

/* The unit's gradients are complete: when that completes its bucket, reduce
 * it now (zero 2/3 every micro-batch; zero 0/1 on the last one, unless the
 * bucket is deferred or padded). */
static loom_status hook_post_backward(void *ctx, loom_gpt *m, int unit) {
    (void)m;
    dp_part *p = ctx;
    loom_dp_engine *e = p->e;
    if (e->cfg.zero == 3) loom_dp_z3_release(p, unit);
    LOOM_TRY(loom_dp_progress(e));
    int ui = loom_dp_unit_index(p, unit);
    if (ui < 0) return LOOM_OK;
    dp_bucket *b = &p->buckets[p->units[ui].bucket];
    if (++b->done_units < b->u_end - b->u_begin) return LOOM_OK;
    b->done_units = 0;
    if (e->cfg.zero >= 2) /* a deferred bucket accumulates in its slot until finish_grads */
        return b->defer ? LOOM_OK : start_reduce23(p, b);
    if (e->last_micro && !b->defer && !e->no_overlap && (e->cfg.zero == 0 || b->P == b->n))
        return start_reduce01(p, b, 1);
    return LOOM_OK;
}

/* Early wte (dp_internal.h): the head has produced its share of wte's
 * gradient; on the last micro-batch reduce it now, behind the backward. */
static loom_status hook_post_head_wte(void *ctx, loom_gpt *m) {
    (void)m;
    dp_part *p = ctx;
    LOOM_TRY(loom_dp_progress(p->e));
    return p->early && p->e->last_micro ? start_reduce01(p, &p->buckets[0], 1) : LOOM_OK;
}

/* Early wte, last micro-batch: keep the token embedding's rows out of wte
 * (its reduction is in flight) and gather them, with their ids, over dp. */
static loom_status hook_embed_rows(void *ctx, loom_gpt *m, const int32_t *ids, const float *rows,
                                   int *taken) {
    dp_part *p = ctx;
    loom_dp_engine *e = p->e;
    *taken = 0;
    if (!p->early || !e->last_micro || p->buckets[0].gstate == DP_IDLE) return LOOM_OK;
    const size_t n = (size_t)m->N, C = (size_t)m->C, r = (size_t)e->r;
    if (n > p->rows_max)
        return loom_fail(LOOM_EINTERNAL, "micro-batch of %zu rows exceeds the %zu planned", n, p->rows_max);
    loom_tensor_copy(p->m->dev, p->rows_all + r * n * C, rows, n * C);
    loom_tensor_copy_i32(p->m->dev, p->ids_all + r * n, ids, n);
    LOOM_TRY(loom_comm_iallgather(e->dp, p->rows_all + r * n * C, p->rows_all, n * C * F, &p->rows_req));
    LOOM_TRY(loom_comm_iallgather(e->dp, p->ids_all + r * n, p->ids_all, n * sizeof *ids, &p->ids_req));
    p->rows_n = (int)n;
    *taken = 1;
    return LOOM_OK;
}

/* Early wte: every rank's embedding rows into the reduced wte gradient. */
static loom_status add_gathered_rows(dp_part *p) {
    if (!p->rows_n) return LOOM_OK;
    loom_req *rq = p->rows_req, *iq = p->ids_req;
    p->rows_req = p->ids_req = NULL;
    LOOM_TRY(loom_comm_wait(rq));
    LOOM_TRY(loom_comm_wait(iq));
    loom_gpt *m = p->m;
    loom_embed_bwd(m->dev, m->g.wte, p->rows_all, p->ids_all, m->vocab_start, m->V_l, p->e->N * p->rows_n,
                   m->C);
    p->rows_n = 0;
    return LOOM_OK;
}

/* ---- creation ------------------------------------------------------------ */

static loom_status check_stage(const loom_dp_engine *e) {
    const int z = e->cfg.zero;
    if (z < 0 || z > 3) return loom_fail(LOOM_EUSAGE, "--zero %d: must be 0, 1, 2 or 3", z);
    return LOOM_OK;
}

static float *take(loom_arena *a, size_t floats) {
    if (!a->base) {
        loom_arena_reserve(a, floats * F);
        return NULL;
    }
    return floats ? loom_arena_alloc(a, floats * F) : NULL;
}

/* Plan (arenas uncommitted) or hand out (committed) the part's buffers. */
static void layout_buffers(const loom_dp_engine *e, dp_part *p) {
    const int z = e->cfg.zero;
    p->opt_m = take(&p->a_opt, p->S);
    p->opt_v = take(&p->a_opt, p->S);
    if (z == 1) p->scratch = take(&p->a_grads, p->scratch_floats);
    if (p->early) {
        p->rows_all = take(&p->a_grads, (size_t)e->N * p->rows_max * (size_t)p->m->C);
        p->ids_all = (int32_t *)take(&p->a_grads, (size_t)e->N * p->rows_max);
    }
    if (z >= 2) {
        p->gshard = take(&p->a_grads, p->S);
        for (int k = 0; k < DP_SLOTS; k++) p->stage[k] = take(&p->a_grads, p->slot_floats[k]);
    }
    if (z == 3) {
        p->pshard = take(&p->a_params, p->S);
        for (int k = 0; k < DP_SLOTS; k++) p->gather[k] = take(&p->a_params, p->slot_floats[k]);
    }
}

/* The parameter runs of loom_dp_param_runs, and a check that every part
 * has the storage its stage reads: grad_mem below ZeRO-2, param_mem below
 * ZeRO-3. */
static loom_status build_runs(const loom_dp_engine *e, dp_part *p) {
    const loom_gpt *m = p->m;
    if (e->cfg.zero < 2 && !m->grad_mem)
        return loom_fail(LOOM_EINTERNAL, "--zero %d needs the model's gradient buffer", e->cfg.zero);
    if (e->cfg.zero < 3 && !m->param_mem)
        return loom_fail(LOOM_EINTERNAL, "--zero %d needs the model's parameter buffer", e->cfg.zero);
    float *ex_params, *ex_grads; /* an expert-parallel part's experts: in no bucket (moe.h) */
    size_t ex_lo, ex_n;
    loom_moe_expert_storage(m, &ex_params, &ex_grads, &ex_lo, &ex_n);
    p->n_runs = e->cfg.zero == 3 ? p->n_buckets + (ex_n > 0) : 1;
    p->runs = calloc((size_t)p->n_runs, sizeof *p->runs);
    if (!p->runs) return loom_fail(LOOM_EOS, "out of memory");
    if (e->cfg.zero < 3) {
        p->runs[0] = (loom_param_run){.data = m->param_mem, .lo = 0, .n = m->num_params};
        return LOOM_OK;
    }
    for (int k = 0; k < p->n_buckets; k++) {
        const dp_bucket *b = &p->buckets[k];
        p->runs[k] = (loom_param_run){.data = p->pshard + b->so, .lo = b->mine_lo, .n = b->mine_n};
    }
    if (ex_n) p->runs[p->n_buckets] = (loom_param_run){.data = ex_params, .lo = ex_lo, .n = ex_n};
    return LOOM_OK;
}

static loom_status part_create(loom_dp_engine *e, dp_part *p, loom_gpt *m) {
    p->e = e;
    p->m = m;
    for (int k = 0; k < DP_SLOTS; k++) p->stage_owner[k] = p->gather_owner[k] = -1;
    loom_device_arena_init(p->m->dev, &p->a_grads, "grad shards");
    loom_device_arena_init(p->m->dev, &p->a_params, "parameter shards");
    loom_device_arena_init(p->m->dev, &p->a_opt, "optimizer");
    LOOM_TRY(loom_dp_layout_build(e, p));
    layout_buffers(e, p);
    LOOM_TRY(loom_arena_commit(&p->a_grads));
    LOOM_TRY(loom_arena_commit(&p->a_params));
    LOOM_TRY(loom_arena_commit(&p->a_opt));
    layout_buffers(e, p);
    LOOM_TRY(build_runs(e, p));
    p->adamw = calloc((size_t)(p->n_segs ? p->n_segs : 1), sizeof *p->adamw);
    if (!p->adamw) return loom_fail(LOOM_EOS, "out of memory");
    m->hooks = (loom_gpt_hooks){.ctx = p,
                                .pre_forward = hook_pre_forward,
                                .post_forward = hook_post_forward,
                                .pre_backward = hook_pre_backward,
                                .post_backward = hook_post_backward,
                                .post_input = hook_post_input,
                                .pre_weight = hook_pre_weight,
                                .post_head_wte = hook_post_head_wte,
                                .embed_rows = hook_embed_rows};
    return LOOM_OK;
}

static int by_size_desc(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* comm_bf16: set aside the dp group's wire buffers for the reductions that
 * can be in flight at once (make_room bounds them): the DP_MAX_INFLIGHT
 * largest buckets - one more at zero 1, the padded bucket's blocking
 * reduce-scatter - and every part's early wte beside them. */
static loom_status reserve_wire(loom_dp_engine *e) {
    if (!e->cfg.comm_bf16 || e->N == 1) return LOOM_OK;
    int cap = 1, n_wte = 0, n = 0;
    for (int i = 0; i < e->n_parts; i++) cap += e->p[i].n_buckets;
    size_t *v = malloc((size_t)cap * sizeof *v); /* values per reduction: the early wte's first */
    if (!v) return loom_fail(LOOM_EOS, "out of memory");
    for (int wte = 1; wte >= 0; wte--)
        for (int i = 0; i < e->n_parts; i++)
            for (int k = 0; k < e->p[i].n_buckets; k++) {
                const dp_bucket *b = &e->p[i].buckets[k];
                if (b->head_wte == wte) v[n++] = e->cfg.zero == 0 ? b->n : b->P;
                n_wte += b->head_wte && wte;
            }
    qsort(v + n_wte, (size_t)(n - n_wte), sizeof *v, by_size_desc);
    const int keep = DP_MAX_INFLIGHT + (e->cfg.zero == 1);
    if (n - n_wte > keep) n = n_wte + keep;
    qsort(v, (size_t)n, sizeof *v, by_size_desc);
    loom_status st = LOOM_OK;
    for (int i = 0; i < n && st == LOOM_OK; i++) { /* i + 1 buffers of at least v[i] */
        st = loom_comm_reserve_wire(e->dp, v[i], i + 1);
        e->mem_wire += v[i] * loom_dtype_size(LOOM_BF16);
    }
    free(v);
    return st;
}

loom_status loom_dp_engine_create(loom_gpt **parts, int n_parts, const loom_mesh *mesh,
                                  const loom_dp_config *cfg, const loom_adamw_hparams *hp,
                                  loom_dp_engine **out) {
    *out = NULL;
    loom_dp_engine *e = calloc(1, sizeof *e);
    if (!e) return loom_fail(LOOM_EOS, "out of memory");
    e->cfg = *cfg;
    e->hp = *hp;
    e->mesh = mesh;
    e->dp = mesh->layout.cp > 1 ? mesh->dpcp : mesh->dp; /* gradients sum over dp x cp */
    e->N = loom_comm_size(e->dp);
    e->r = loom_comm_rank(e->dp);
    e->parts = parts;
    e->n_parts = n_parts;
    const char *ov = getenv("LOOM_DP_OVERLAP");
    e->no_overlap = ov && strcmp(ov, "0") == 0;
    loom_status st = check_stage(e);
    const char *ar = getenv("LOOM_DP_ALLREDUCE");
    if (st == LOOM_OK && ar && ar[0] && strcmp(ar, "flat") != 0) {
        if (strcmp(ar, "hier") != 0)
            st = loom_fail(LOOM_EUSAGE, "LOOM_DP_ALLREDUCE=%s: expected flat (default) or hier", ar);
        else st = loom_comm_wrap_hier(e->dp, &e->hier); /* NULL unless the group spans hosts evenly */
        if (e->hier) e->dp = e->hier;
    }
    const char *log = getenv("LOOM_DP_TIMINGS");
    if (st == LOOM_OK && log && log[0]) {
        char path[1100];
        snprintf(path, sizeof path, "%s.rank%d.jsonl", log, mesh->rank);
        e->timing_log = fopen(path, "a");
        if (!e->timing_log)
            st = loom_fail(LOOM_ECANTCREAT, "LOOM_DP_TIMINGS: cannot open %s: %s", path, strerror(errno));
    }
    if (st == LOOM_OK && n_parts < 1)
        st = loom_fail(LOOM_EINTERNAL, "data-parallel engine: %d model parts", n_parts);
    if (st == LOOM_OK) {
        e->p = calloc((size_t)n_parts, sizeof *e->p);
        if (!e->p) st = loom_fail(LOOM_EOS, "out of memory");
    }
    for (int i = 0; i < n_parts && st == LOOM_OK; i++) st = part_create(e, &e->p[i], parts[i]);
    if (st == LOOM_OK) st = reserve_wire(e);
    if (st != LOOM_OK) {
        loom_dp_engine_free(e);
        return st;
    }
    *out = e;
    return LOOM_OK;
}

static int in_flight(const dp_part *p) {
    if (p->rows_req || p->ids_req) return 1;
    for (int k = 0; k < p->n_buckets; k++)
        if (p->buckets[k].rs || p->buckets[k].ag) return 1;
    return 0;
}

void loom_dp_engine_free(loom_dp_engine *e) {
    if (!e) return;
    for (int i = 0; e->p && i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        if (!p->m) continue;
        memset(&p->m->hooks, 0, sizeof p->m->hooks);
        for (int u = 0; p->units && u < p->n_units; u++) { /* the model's own storage again */
            const dp_unit *du = &p->units[u];
            loom_gpt_bind_unit(p->m, du->unit, p->m->param_mem ? p->m->param_mem + du->lo : NULL,
                               p->m->grad_mem ? p->m->grad_mem + du->lo : NULL);
        }
        free(p->runs);
        free(p->adamw);
        /* a failed step can leave requests in flight: leak their buffers
         * rather than free memory MPI may still write */
        if (!in_flight(p)) {
            loom_arena_free(&p->a_grads);
            loom_arena_free(&p->a_params);
            loom_arena_free(&p->a_opt);
        }
        loom_dp_layout_free(p);
    }
    if (e->timing_log) fclose(e->timing_log);
    loom_comm_free(e->hier);
    free(e->p);
    free(e);
}

/* ---- the step ------------------------------------------------------------ */

loom_status loom_dp_begin_step(loom_dp_engine *e) {
    for (int i = 0; i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        if (e->cfg.zero >= 2) loom_tensor_zero(p->m->dev, p->gshard, p->S);
        else if (!p->grads_zeroed) loom_gpt_zero_grad(p->m);
        p->grads_zeroed = 0;
        for (int k = 0; k < p->n_buckets; k++) {
            dp_bucket *b = &p->buckets[k];
            if (b->rs || b->gstate == DP_REDUCING || b->gstate == DP_ACQUIRED)
                return loom_fail(LOOM_EINTERNAL, "data-parallel step begun with bucket %d busy", k);
            b->gstate = DP_IDLE;
            b->done_units = 0;
        }
        if (p->rows_n)
            return loom_fail(LOOM_EINTERNAL, "data-parallel step begun with embedding rows in flight");
    }
    e->last_micro = 0;
    e->fifo_head = e->fifo_n = 0; /* finish_grads completed every reduction */
    memset(&e->timing, 0, sizeof e->timing);
    e->comm_call0 = dp_call_seconds(e);
    return LOOM_OK;
}

void loom_dp_set_last_micro(loom_dp_engine *e, int last) { e->last_micro = last; }

loom_status loom_dp_finish_grads(loom_dp_engine *e) {
    double t0 = loom_comm_wtime();
    /* what the backward did not start, in bucket order on every rank */
    for (int i = 0; i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        for (int k = 0; k < p->n_buckets; k++) {
            dp_bucket *b = &p->buckets[k];
            if (e->cfg.zero >= 2 && b->gstate == DP_ACQUIRED) {
                if (!b->defer || b->done_units)
                    return loom_fail(LOOM_EINTERNAL, "ZeRO-%d: bucket %d's backward did not complete",
                                     e->cfg.zero, k);
                LOOM_TRY(start_reduce23(p, b)); /* accumulated over the micro-batches, completed */
            }
            if (e->cfg.zero < 2 && b->gstate == DP_IDLE) LOOM_TRY(start_reduce01(p, b, 0));
        }
    }
    for (int i = 0; i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        for (int k = 0; k < p->n_buckets; k++) LOOM_TRY(wait_reduce(p, &p->buckets[k]));
        LOOM_TRY(add_gathered_rows(p));
        if (e->cfg.zero == 3) LOOM_TRY(loom_dp_z3_wait_all(p));
    }
    e->timing.t_backward_end = t0;
    e->timing.t_synced = loom_comm_wtime();
    e->timing.exposed_s += e->timing.t_synced - t0;
    e->timing.comm_s = dp_call_seconds(e) - e->comm_call0;
    return LOOM_OK;
}

static const float *grad_base(const loom_dp_engine *e, const dp_part *p) {
    return e->cfg.zero >= 2 ? p->gshard : p->m->grad_mem;
}

void loom_dp_sumsq_parts(loom_gpt **parts, int n_parts, const float *const *grads, double sq[2]) {
    sq[0] = sq[1] = 0;
    for (int k = 0; k < n_parts; k++) {
        const loom_gpt *m = parts[k];
        const float *g = grads ? grads[k] : m->grad_mem;
        for (int i = 0; i < m->n_params; i++) {
            const loom_param *p = &m->params[i];
            if (loom_param_norm_skip(m, p)) continue; /* a tied copy or a replica */
            sq[p->split_dim < 0] += loom_sumsq(m->dev, g + p->offset, p->numel);
        }
    }
}

loom_status loom_dp_grad_norm(loom_dp_engine *e, double *norm) {
    double sq[2] = {0, 0};
    for (int i = 0; i < e->n_parts; i++) {
        const dp_part *p = &e->p[i];
        const float *g = grad_base(e, p);
        for (int k = 0; k < p->n_segs; k++) {
            const dp_seg *s = &p->segs[k];
            if (!s->skip_norm) sq[s->replicated] += loom_sumsq(p->m->dev, g + s->g_off, s->n);
        }
    }
    if (e->cfg.zero >= 1 && e->N > 1) /* shards: every rank holds a different part */
        LOOM_TRY(loom_comm_allreduce(loom_comm_host(e->dp), sq, 2, LOOM_F64, LOOM_SUM)); /* host doubles */
    if (loom_comm_size(e->mesh->tp) > 1) /* cut tensors: sum; replicated ones: once */
        LOOM_TRY(loom_comm_allreduce(loom_comm_host(e->mesh->tp), sq, 1, LOOM_F64, LOOM_SUM));
    double total = sq[0] + sq[1];
    if (loom_comm_size(e->mesh->pp) > 1)
        LOOM_TRY(loom_comm_allreduce(loom_comm_host(e->mesh->pp), &total, 1, LOOM_F64, LOOM_SUM));
    *norm = sqrt(total);
    return LOOM_OK;
}

/* zero 1/2: every rank's updated slice to every rank, bucket by bucket, in
 * place in param_mem; padded buckets through a scratch, blocking. */
static loom_status gather_params12(loom_dp_engine *e) {
    const size_t r = (size_t)e->r;
    for (int i = 0; i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        float *x = p->m->param_mem;
        for (int k = 0; k < p->n_buckets; k++) {
            dp_bucket *b = &p->buckets[k];
            if (k >= DP_MAX_INFLIGHT) { /* bounded in flight, as the reductions */
                loom_req *old = p->buckets[k - DP_MAX_INFLIGHT].ag;
                p->buckets[k - DP_MAX_INFLIGHT].ag = NULL;
                LOOM_TRY(loom_comm_wait(old));
            }
            if (b->P == b->n) {
                b->ag_t0 = loom_comm_wtime();
                LOOM_TRY(loom_comm_iallgather(e->dp, x + b->mine_lo, x + b->lo, b->S * F, &b->ag));
                continue;
            }
            float *s = e->cfg.zero == 1 ? p->scratch : p->stage[b->slot];
            loom_tensor_zero(p->m->dev, s + r * b->S, b->S);
            loom_tensor_copy(p->m->dev, s + r * b->S, x + b->mine_lo, b->mine_n);
            LOOM_TRY(loom_comm_allgather(e->dp, s + r * b->S, s, b->S * F));
            loom_tensor_copy(p->m->dev, x + b->lo, s, b->n);
        }
    }
    for (int i = 0; i < e->n_parts; i++) {
        dp_part *p = &e->p[i];
        for (int k = 0; k < p->n_buckets; k++) {
            loom_req *r_ = p->buckets[k].ag;
            p->buckets[k].ag = NULL;
            LOOM_TRY(loom_comm_wait(r_));
        }
    }
    return LOOM_OK;
}

/* AdamW on what part p's rank owns: a run per segment, through the driver. */
static void step_part(loom_dp_engine *e, dp_part *p, float lr, float grad_scale) {
    float *x = e->cfg.zero == 3 ? p->pshard : p->m->param_mem;
    float *g = (float *)grad_base(e, p);
    int zeroed = p->zero_in_update;
    /* every parameter updated here: their bf16 copy for the next step's
     * GEMMs, written by the update (loom_gpt_hold_weights keeps it) */
    uint16_t *w16 = zeroed ? loom_gemm_keep_fill(p->m->dev, x, p->m->num_params) : NULL;
    for (int k = 0; k < p->n_segs; k++) {
        const dp_seg *s = &p->segs[k];
        p->adamw[k] = (loom_adamw_run){.p = x + s->p_off,
                                       .g = g + s->g_off,
                                       .m = p->opt_m + s->s_off,
                                       .v = p->opt_v + s->s_off,
                                       .n = s->n,
                                       .decay = s->decay,
                                       .p16 = w16 ? w16 + s->p_off : NULL};
    }
    zeroed = loom_adamw_update_runs(p->m->dev, &e->hp, p->adamw, p->n_segs, e->t, lr, grad_scale, zeroed);
    if (w16) loom_gemm_keep_filled(p->m->dev, x, zeroed);
    p->grads_zeroed = zeroed;
}

loom_status loom_dp_step(loom_dp_engine *e, float lr, float grad_scale) {
    e->t++;
    for (int i = 0; i < e->n_parts; i++) step_part(e, &e->p[i], lr, grad_scale);
    if ((e->cfg.zero == 1 || e->cfg.zero == 2) && e->N > 1) {
        double t0 = loom_comm_wtime();
        LOOM_TRY(gather_params12(e));
        e->timing.gather_s += loom_comm_wtime() - t0;
    }
    if (e->timing_log) {
        const loom_dp_timing *t = &e->timing;
        fprintf(e->timing_log,
                "{\"step\": %d, \"t_backward_end\": %.6f, \"t_synced\": %.6f, \"exposed_ms\": %.4f, "
                "\"reduce_ms\": %.4f, \"gather_ms\": %.4f, \"poll_ms\": %.4f, \"comm_ms\": %.4f, "
                "\"reductions\": %d, \"overlapped\": %d, \"progress_thread\": %d}\n",
                e->t, t->t_backward_end, t->t_synced, 1e3 * t->exposed_s, 1e3 * t->reduce_s,
                1e3 * t->gather_s, 1e3 * t->poll_s, 1e3 * t->comm_s, t->reductions, t->overlapped,
                loom_comm_progress_thread());
        fflush(e->timing_log);
    }
    return LOOM_OK;
}

void loom_dp_memory_bytes(const loom_dp_engine *e, loom_dp_memory *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < e->n_parts; i++) {
        out->params += e->p[i].mem_params;
        out->grads += e->p[i].mem_grads;
        out->optimizer += e->p[i].mem_opt;
        out->activations += loom_gpt_activation_bytes(e->parts[i]);
    }
    out->grads += e->mem_wire;
}

void loom_dp_get_timing(const loom_dp_engine *e, loom_dp_timing *out) { *out = e->timing; }

const loom_param_run *loom_dp_param_runs(const loom_dp_engine *e, int part, int *n_runs) {
    *n_runs = e->p[part].n_runs;
    return e->p[part].runs;
}

int loom_dp_params_sharded(const loom_dp_engine *e) { return e->cfg.zero == 3; }

int loom_dp_opt_sharded(const loom_dp_engine *e) { return e->cfg.zero >= 1 && e->N > 1; }

int loom_dp_opt_runs(const loom_dp_engine *e, int part, loom_opt_run *out, int cap) {
    const dp_part *p = &e->p[part];
    for (int k = 0; k < p->n_segs && k < cap; k++) {
        const dp_seg *s = &p->segs[k];
        out[k] = (loom_opt_run){
            .param = s->param, .lo = s->flat, .n = s->n, .m = p->opt_m + s->s_off, .v = p->opt_v + s->s_off};
    }
    return p->n_segs;
}

int loom_dp_steps_taken(const loom_dp_engine *e) { return e->t; }
void loom_dp_set_steps_taken(loom_dp_engine *e, int t) { e->t = t; }

int loom_dp_grad_finite(const loom_dp_engine *e, int part, int param) {
    const dp_part *p = &e->p[part];
    const float *g = grad_base(e, p);
    for (int k = 0; k < p->n_segs; k++) {
        if (p->segs[k].param != param) continue;
        for (size_t j = 0; j < p->segs[k].n; j++)
            if (!isfinite(g[p->segs[k].g_off + j])) return 0;
    }
    return 1;
}
