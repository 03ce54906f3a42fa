/* plan_memory.c - the memory side of the planner's cost model: bytes per
 * parameter, gradient, optimizer state and activation element of a job's
 * precision, the activations one layer keeps for one micro-batch (per
 * recompute mode, tp/sp and cp shards), and the bytes per rank of the most
 * loaded pipeline stage: parameters, gradients and optimizer state by ZeRO
 * stage over the dp x cp group (experts over ep), DP buffers, activations
 * of the schedule's in-flight micro-batches, and the KV cache when serving.
 * docs/planning.md states the formulas. Pure: nothing here is collective. */
#include <math.h>
#include <stdio.h>

#include "plan/internal.h"

eval_ctx plan_ctx_of(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j) {
    eval_ctx e;
    e.sc = plan_shape_of(m);
    if (j->bf16) e.wb = 2, e.gb = j->grad_fp32 ? 4 : 2, e.ob = 12, e.ab = 2, e.peak = c ? c->peak_bf16 : 0;
    else e.wb = 4, e.gb = 4, e.ob = 8, e.ab = 4, e.peak = c ? c->peak_fp32 : 0;
    e.attn = j->attn != LOOM_PLAN_ATTN_DEFAULT ? j->attn
             : j->flash                        ? LOOM_PLAN_ATTN_FLASH2
                                               : LOOM_PLAN_ATTN_MATERIALIZED;
    e.flash = e.attn != LOOM_PLAN_ATTN_MATERIALIZED;
    e.fp8 = j->fp8 && j->bf16 && c && c->peak_fp8 > 0;
    e.fp8_params = e.fp8 && j->fp8_params;
    e.zero3_per_param = j->zero3_per_param;
    e.dropout = j->dropout, e.elementwise = j->elementwise;
    e.loss_chunks = j->loss_chunks > 1 ? j->loss_chunks : 1;
    /* the loss's peak per logit: fp32 log-probabilities kept and the fp32
     * gradient its backward writes (8); a fused loss on bf16 logits
     * (flash-attn's cross-entropy, llm-foundry's default) keeps the bf16
     * logits and writes a bf16 gradient (4); fp32 (loom): 8 */
    e.logit_bytes = j->bf16 && j->logits_bf16 ? 4 : 8;
    e.logits_bf16 = j->bf16 && j->logits_bf16;
    return e;
}

/* Activation bytes one layer keeps for one micro-batch (Korthikanti et al.
 * 2022, generalised to GQA, gated MLPs and top-k experts). */
double plan_layer_act(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l, double b,
                      double s_loc, double s) {
    const double t = l->tp, A = s_loc * b * m->hidden, k = n_topk(m);
    if (e->ab == 4) { /* fp32: loom's own plan (src/model/gpt.c): no dropout, log-sum-exps only */
        const double N = b * s_loc, hd = (double)m->hidden / m->heads, h = m->hidden;
        const double res = 4 * N * h / (l->sp ? t : 1) + 4 * N;
        if (l->recompute == LOOM_RECOMPUTE_FULL) return 4 * N * h / (l->sp ? t : 1);
        double x = res + N * (h + 2 * hd * m->kv_heads) / t + N * h / t +
                   k * (m->gated ? 3.0 : 2.0) * N * m->ffn / t;
        /* the online-softmax kernel keeps one log-sum-exp per row and head,
         * no T x T probabilities (docs/context-parallel.md) */
        if (l->recompute == LOOM_RECOMPUTE_NONE) x += b * (double)m->heads / t * s_loc;
        return 4 * x;
    }
    const double u = e->ab / 2;                               /* the paper counts 2-byte elements */
    const double masks = e->dropout && !m->gated ? 2 * A : 0; /* hidden dropout masks (GPT), if any */
    const double rep = 4 * A + 2 * A + 2 * A;                 /* LN inputs, QKV input, MLP input */
    const double kv = 4 * A * m->kv_heads / m->heads;         /* K, V */
    const double attn = 2 * A + kv + 2 * A;                   /* Q, K+V, proj input */
    const double mlp = k * (m->gated ? 6.0 : 4.0) * s_loc * b * m->ffn;
    /* softmax output, and with dropout its mask and output (Korthikanti's 5) */
    const double scores = (e->dropout ? 5.0 : 2.0) * m->heads * s_loc * s * b;
    const double sp = l->sp ? t : 1, full = 2 * A / sp;
    double none = (rep + masks) / sp + (attn + mlp) / t;
    if (!e->flash) none += scores / t;
    switch (l->recompute) {
    case LOOM_RECOMPUTE_FULL: return u * full;
    case LOOM_RECOMPUTE_SELECTIVE: return u * ((rep + masks) / sp + (attn + mlp) / t);
    case LOOM_PLAN_RECOMPUTE_OP: {
        /* torchtitan's op-level policy: every other matmul's output kept
         * (q, v, the MLP's first, its last), the attention's output, the
         * block input; the rest recomputed */
        const double mm = 2 * A + kv / 2 + k * 2.0 * s_loc * b * m->ffn + 2 * A;
        return u * (full + (mm + 2 * A) / t);
    }
    case LOOM_PLAN_RECOMPUTE_LAYER2: return u * (none + full) / 2; /* every other block whole */
    default: return u * none;
    }
}

/* Dense (non-expert) parameters a rank of layout l holds: its layers'
 * attention, router, dense MLP (all / t) and norms (whole), the embedding on
 * the first stage and the LM head on the last, the head only where it is not
 * the embedding itself (tied at pp = 1: one matrix, held and reduced once),
 * and the final norm with the head.
 * Memory and the DP/ZeRO traffic both count these. */
double plan_rank_dense_params(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l,
                              int layers_max, int first, int last) {
    const double t = l->tp;
    return layers_max * (e->sc.attn_w + e->sc.router_w + (n_experts(m) > 1 ? 0 : e->sc.mlp_w)) / t +
           layers_max * e->sc.norm_w + (first ? e->sc.embed_w / t : 0) +
           (last && (!m->tied || !first) ? e->sc.head_w / t : 0) +
           (last ? (m->gated ? 1.0 : 2.0) * m->hidden : 0);
}

/* ZeRO-3 all-gathers of one pass (forward or backward) over the rank's dense
 * parameters, each one collective that pays its ring's latency. FSDP gathers
 * a unit at a time: each block, the embedding on the first stage, the head
 * (with the final norm) on the last. DeepSpeed ZeRO-3 gathers parameter
 * tensor by parameter tensor (its partitioned-parameter all-gather is issued
 * per parameter): per block the attention's (GPT: fused QKV and output
 * projection, each weight and bias; Llama: q, k, v, o) and the MLP's
 * matrices (GPT: two with biases; gated: three), the router, two norms
 * (GPT's LayerNorm: weight and bias); the embedding (and GPT-2's position
 * embedding), the final norm and an untied head. */
double plan_zero3_gathers(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l,
                          int layers_max, int first, int last) {
    const int head = last && (!m->tied || !first);
    if (!e->zero3_per_param) return layers_max + (first ? 1 : 0) + (last ? 1 : 0);
    const double E = n_experts(m), local = E > 1 ? E / l->ep : 1;
    const double layer = m->gated ? 4 + 3 * local + 2 : 4 + 4 * local + 4;
    return layers_max * (layer + (E > 1 ? 1 : 0)) + (first ? 1 + (m->learned_pos ? 1 : 0) : 0) +
           (last ? (m->gated ? 1 : 2) + head : 0);
}

/* Memory of the most loaded stage; fills r->mem_*; returns the number of
 * layers on that stage in *Ls. */
void plan_memory(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                 const loom_plan_layout *l, const eval_ctx *e, int layers_max, int first, int last,
                 loom_plan_result *r) {
    const double t = l->tp, E = n_experts(m);
    const double zgroup = (double)l->dp * l->cp, egroup = zgroup / l->ep;
    const double dense = plan_rank_dense_params(m, e, l, layers_max, first, last);
    const double expert = E > 1 ? layers_max * E * e->sc.mlp_w / (t * l->ep) : 0;
    double pw = (dense + expert) * e->wb, pg = (dense + expert) * e->gb, po = (dense + expert) * e->ob;
    if (!j->serve) {
        const double dz = dense / zgroup + expert / egroup; /* one shard */
        if (l->zero >= 1) po = dz * e->ob;
        if (l->zero >= 2) pg = dz * e->gb;
        if (l->zero >= 3) { /* shards, two units gathered (one in use, one prefetched: FSDP's
                             * limit_all_gathers / FSDP2's prefetch) and the unsharded gradients of the
                             * unit in its backward, before the reduce-scatter */
            /* the unit FSDP gathers: a block, or the embedding and the head
             * (their own units, torchtitan and llm-foundry alike): the largest */
            const double block = (e->sc.attn_w + e->sc.router_w + (E > 1 ? 0 : e->sc.mlp_w)) / t +
                                 e->sc.norm_w + (E > 1 ? E * e->sc.mlp_w / (t * l->ep) : 0);
            const double unit = fmax(block, fmax(first ? e->sc.embed_w / t : 0, last ? e->sc.head_w / t : 0));
            /* DeepSpeed gathers parameter by parameter and releases them
             * beyond stage3_max_live_parameters (--zero3-live) */
            const double live = j->zero3_live > 0 ? fmin(2 * unit, j->zero3_live) : 2 * unit;
            pw = dz * e->wb + live * (e->fp8 ? 1 : e->wb);
            pg += unit * e->gb;
        }
    } else {
        pg = po = 0;
    }
    /* the FP8 copy of the weights the GEMMs read, beside the bf16 weights;
     * with FP8 parameters (Transformer Engine's Float8Tensor weights, fp32
     * masters in the optimizer) none: the FP8 data and the transpose Hopper's
     * FP8 GEMMs read in the backward take the 2 bytes a bf16 weight did */
    if (!j->serve && e->fp8 && !e->fp8_params && l->zero < 3) pw += dense;
    r->mem_params = pw, r->mem_grads = pg, r->mem_opt = po;
    r->mem_other = r->mem_runtime = c->reserved;
    if (!j->serve && zgroup > 1) {
        /* DP buffers: the in-flight reductions' message-sized temporaries (at
         * most two buckets), and at ZeRO-2/3 the gradient staging (two
         * buckets) that replaces the full gradient buffer */
        const double bucket = 25e6, full = (dense + expert) * e->gb;
        r->mem_other += fmin(full, 2 * bucket) * (l->zero >= 2 ? 2 : 1);
    }
    if (j->serve) {
        /* loom serve's paged KV cache holds whole blocks of 16 positions (--kv-block-size) */
        const double ctx = ceil(((double)j->seq + j->gen) / 16.0) * 16.0;
        const int kvl = m->kv_heads >= l->tp ? m->kv_heads / l->tp : 1;
        const double kv_seq = 2.0 * layers_max * ctx * e->sc.hd * kvl * e->ab;
        const double work = 4.0 * j->seq * m->hidden * e->ab + 2.0 * j->seq * m->ffn / t * e->ab;
        const double free_b = c->memory - c->reserved - pw - work;
        r->max_seqs = free_b > 0 ? (int)fmin(free_b / kv_seq, 1e9) : 0;
        const int want = (j->batch + l->dp - 1) / l->dp;
        const int live = r->max_seqs < want ? r->max_seqs : want;
        r->mem_kv = live * kv_seq;
        r->mem_act = work;
        r->in_flight = live;
    } else {
        const double s = j->seq, s_loc = s / l->cp, b = l->mbs;
        const int live = l->pp > 1 ? r->in_flight : 1;
        const double per_set = plan_layer_act(m, e, l, b, s_loc, s) * layers_max / l->v;
        /* a full recompute re-materialises one layer at a time */
        double a = live * per_set;
        if (l->recompute == LOOM_RECOMPUTE_FULL) {
            loom_plan_layout l2 = *l;
            l2.recompute = LOOM_RECOMPUTE_SELECTIVE;
            a += plan_layer_act(m, e, &l2, b, s_loc, s);
        }
        if (last) a += b * s_loc * m->vocab / t * e->logit_bytes / e->loss_chunks; /* the loss's peak */
        if (l->cp > 1) { /* the exchange's buffers, once (docs/context-parallel.md) */
            const double C = m->hidden / t, Ckv = C * m->kv_heads / m->heads, n = b * s_loc;
            a += (l->cp_impl == LOOM_PLAN_CP_RING      ? 5 * 2 * n * Ckv
                  : l->cp_impl == LOOM_PLAN_CP_ULYSSES ? 3 * n * (C + 2 * Ckv) + 5 * n * C
                                                       : 2 * b * s * Ckv) *
                 e->ab;
        }
        if (e->ab == 4) { /* loom: per-slot input/output, one shared backward scratch set */
            const double N = b * s_loc, h = m->hidden, ht = h / t, F = (double)m->ffn / t;
            a += live * 4 * (2 * N / t + 2 * N * h / (l->sp ? t : 1));
            a += 4 * (5 * N * h + 2 * N * F + 2 * N * ht + 3 * N * ht + N * h / (l->sp ? t : 1));
        }
        r->mem_act = a;
        r->mem_kv = 0;
    }
    r->mem_total = r->mem_params + r->mem_grads + r->mem_opt + r->mem_act + r->mem_kv + r->mem_other;
}

void plan_format_gb(char *buf, size_t cap, const loom_plan_result *r) {
    snprintf(buf, cap,
             "params %.2f + grads %.2f + optimizer %.2f + activations %.2f + kv %.2f + reserved %.2f GB",
             r->mem_params / GB, r->mem_grads / GB, r->mem_opt / GB, r->mem_act / GB, r->mem_kv / GB,
             r->mem_other / GB);
}
