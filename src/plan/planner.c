/* planner.c - the cost model of one layout and the search over all of them.
 * docs/planning.md is the reference for every formula here. */
#include "loom/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"

#define GB 1e9

/* ---- shape helpers --------------------------------------------------- */

typedef struct shape_costs {
    double attn_w, mlp_w, router_w, norm_w; /* parameters per layer (mlp_w: one expert) */
    double embed_w, head_w;                 /* input embedding (+ positions), LM head */
    double hd;
} shape_costs;

static shape_costs shape_of(const loom_plan_model *m) {
    shape_costs s;
    const double h = m->hidden;
    s.hd = h / m->heads;
    s.attn_w = 2 * h * h + 2 * h * s.hd * m->kv_heads;
    s.mlp_w = (m->gated ? 3.0 : 2.0) * h * m->ffn;
    s.router_w = m->experts > 1 ? h * m->experts : 0;
    s.norm_w = 4 * h + (m->gated ? 0 : h + 2 * s.hd * m->kv_heads + h + m->ffn + h); /* + GPT-2 biases */
    s.embed_w = (double)m->vocab * h + (m->learned_pos ? (double)m->max_seq * h : 0);
    s.head_w = (double)m->vocab * h;
    return s;
}

static int n_experts(const loom_plan_model *m) { return m->experts > 1 ? m->experts : 1; }
static int n_topk(const loom_plan_model *m) { return m->experts > 1 ? m->topk : 1; }

/* Forward FLOPs of one layer for `tok` tokens of a sequence of length s
 * (whole layer, before any split). */
static double layer_flops(const loom_plan_model *m, const shape_costs *sc, double tok, double s) {
    return 2 * tok * (sc->attn_w + n_topk(m) * sc->mlp_w + sc->router_w) + 4 * tok * s * m->hidden;
}

/* Effective GEMM efficiency of one layer's forward on a rank holding `tok`
 * tokens of sequences of length s, split by t: the FLOP-weighted harmonic
 * mean of each GEMM's efficiency at its size (loom_plan_gemm_eff). The
 * backward's GEMMs have the same sizes. Expert GEMMs see tok*k*ep/E tokens.
 * Attention counts 4*tok*s*h/t model FLOPs; materialised (flash = 0) it runs
 * them all as two batched GEMMs, a causal flash kernel computes half of them
 * at the cluster's efficiency.attention (the GEMM curve when absent).
 * score_bytes > 0 (materialised scores in 2-byte elements): the two batched
 * GEMMs write and read the tok*s*heads/t scores, score_bytes in all per
 * forward, and run at the roofline: no faster than those bytes at HBM
 * bandwidth (their inner dimension is one head, hd FLOPs per byte moved,
 * below A100's 312/2.04 = 153 for hd < 153). peak_per_bw = peak / HBM.
 * *attn_share (if not NULL): the two attention GEMMs' share of the layer's
 * GEMM time, as charged here (roofline, flash kernel or curve). */
static double layer_gemm_eff(const loom_plan_model *m, const shape_costs *sc, const loom_plan_cluster *c,
                             double tok, double s, double t, int ep, int flash, double score_bytes,
                             double peak_per_bw, double *attn_share) {
    const double h = m->hidden, kvd = sc->hd * m->kv_heads, F = m->ffn, k = n_topk(m);
    const double per_expert = m->experts > 1 ? (double)ep / m->experts : 1; /* share of tok*k one expert gets */
    const double up = m->gated ? 2.0 : 1.0;
    const struct {
        double flops, size; /* on the rank; of one GEMM */
    } g[] = {
        {2 * tok * h * (h + 2 * kvd) / t, 2 * tok * h * (h + 2 * kvd) / t},          /* QKV */
        {2 * tok * h * h / t, 2 * tok * h * h / t},                                  /* projection */
        {2 * tok * k * h * F * up / t, 2 * tok * k * per_expert * h * F * up / t},   /* MLP up (+gate) */
        {2 * tok * k * F * h / t, 2 * tok * k * per_expert * F * h / t},             /* MLP down */
        {2 * tok * h * (m->experts > 1 ? m->experts : 0), 2 * tok * h * m->experts}, /* router */
        {4 * tok * s * h / t, 2 * tok * s * h / t},                                  /* QK^T, PV (batched) */
    };
    double fl = 0, tm = 0, tm_attn = 0;
    const size_t attn = sizeof g / sizeof g[0] - 1;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        if (g[i].flops <= 0) continue;
        fl += g[i].flops;
        if (i == attn && flash)
            tm += tm_attn = 0.5 * g[i].flops / (c->attn_eff > 0 ? c->attn_eff : loom_plan_gemm_eff(c, g[i].size));
        else if (i == attn) /* in units of peak FLOPs: bytes * peak / bandwidth */
            tm += tm_attn = fmax(g[i].flops / loom_plan_gemm_eff(c, g[i].size), score_bytes * peak_per_bw);
        else
            tm += g[i].flops / loom_plan_gemm_eff(c, g[i].size);
    }
    if (attn_share) *attn_share = tm > 0 ? tm_attn / tm : 0;
    return tm > 0 ? fl / tm : c->gemm_eff;
}

static double plan_model_flops(const loom_plan_model *m, double tokens, double s) {
    const shape_costs sc = shape_of(m);
    return 3 * (m->layers * layer_flops(m, &sc, tokens, s) + 2 * tokens * sc.head_w);
}

/* ---- links ----------------------------------------------------------- */

static int degree(const loom_plan_layout *l, int axis) {
    switch (axis) {
    case LOOM_PLAN_TP: return l->tp;
    case LOOM_PLAN_CP: return l->cp;
    case LOOM_PLAN_DP: return l->dp;
    default: return l->pp;
    }
}

/* Stride (in ranks) between neighbours of an axis's group. */
static long axis_stride(const loom_plan_layout *l, int axis) {
    long s = 1;
    for (int i = 0; i < LOOM_PLAN_NAXES && l->order[i] != axis; i++) s *= degree(l, l->order[i]);
    return s;
}

/* 1 if the group of `axis` spans more than one node. */
static int axis_inter(const loom_plan_layout *l, const loom_plan_cluster *c, int axis) {
    return axis_stride(l, axis) * degree(l, axis) > c->gpus_per_node && degree(l, axis) > 1;
}

/* EP groups are consecutive ranks of the dp x cp sub-mesh. */
static int ep_inter(const loom_plan_layout *l, const loom_plan_cluster *c) {
    const long inner = axis_stride(l, LOOM_PLAN_DP) < axis_stride(l, LOOM_PLAN_CP) ? axis_stride(l, LOOM_PLAN_DP)
                                                                                  : axis_stride(l, LOOM_PLAN_CP);
    return l->ep > 1 && inner * l->ep > c->gpus_per_node;
}

/* ---- schedule helpers (cached: the search asks for the same lists often) */

static int peak_live_formula(const loom_plan_layout *l) {
    const int p = l->pp, m = l->m, v = l->v;
    switch (l->sched) {
    case LOOM_SCHED_GPIPE: return m;
    case LOOM_SCHED_INTERLEAVED: {
        const int w = 2 * (p - 1) + (v - 1) * p + 1;
        return m * v < w ? m * v : w;
    }
    default: return p < m ? p : m;
    }
}

/* ---- evaluation -------------------------------------------------------- */

static void add_failure(loom_plan_result *r, const char *fmt, double x) {
    char t[160];
    snprintf(t, sizeof t, fmt, x);
    size_t n = strlen(r->failures);
    snprintf(r->failures + n, sizeof r->failures - n, "%s%s", n ? "; " : "", t);
}

static loom_status reject(loom_plan_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static loom_status reject(loom_plan_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
    r->feasible = 0;
    return LOOM_OK;
}

static int job_gpus(const loom_plan_cluster *c, const loom_plan_job *j) {
    return j->gpus > 0 ? j->gpus : c->gpus_per_node * c->nodes;
}

/* Devices that time-share processors (cluster key cores_per_node; docs/
 * planning.md, "Devices that share cores"). The cluster's rates are per
 * device with all gpus_per_node devices of a node busy: with C cores and D
 * devices each got min(1, C/D) of the speed it has alone. A time t at those
 * rates takes t * solo when the device computes alone, and t * all_busy
 * when the job's own devices on the node (min(N, gpus_per_node)) all
 * compute. For the pipeline, the g = (devices per node) / (pp stride)
 * consecutive stages of a node (at least 1, at most pp) share the node's
 * cores among their D/g replicas: cores C*g/D per stage set. No key, or no
 * node with more devices than cores: solo = all_busy = 1, cores 0. */
typedef struct sharing {
    double solo, all_busy, cores;
    int share;
    double node_ranks, node_cores; /* D and C when they share (node_ranks > node_cores), else 0 */
} sharing;

static sharing sharing_of(const loom_plan_cluster *c, const loom_plan_job *j, const loom_plan_layout *l) {
    sharing sh = {1, 1, 0, 0, 0, 0};
    const int N = job_gpus(c, j);
    const double C = c->cores, D_cal = c->gpus_per_node, D = N < c->gpus_per_node ? N : c->gpus_per_node;
    if (!(C > 0) || (D_cal <= C && D <= C)) return sh;
    sh.solo = fmin(1, C / D_cal);
    sh.all_busy = sh.solo / fmin(1, C / D);
    const long stride = axis_stride(l, LOOM_PLAN_PP);
    long g = stride < D ? (long)D / stride : 1;
    if (g > l->pp) g = l->pp;
    if (g < 1) g = 1;
    sh.share = (int)g;
    sh.cores = C * g / D;
    if (D > C) sh.node_ranks = D, sh.node_cores = C;
    return sh;
}

typedef struct eval_ctx {
    shape_costs sc;
    double wb, gb, ob, ab; /* bytes: weight, grad, optimizer state per param, activation element */
    double peak;
    int flash; /* the job's attention keeps no s x s scores */
} eval_ctx;

static eval_ctx ctx_of(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j) {
    eval_ctx e;
    e.sc = shape_of(m);
    if (j->bf16) e.wb = 2, e.gb = 2, e.ob = 12, e.ab = 2, e.peak = c ? c->peak_bf16 : 0;
    else e.wb = 4, e.gb = 4, e.ob = 8, e.ab = 4, e.peak = c ? c->peak_fp32 : 0;
    e.flash = j->flash;
    return e;
}

/* Activation bytes one layer keeps for one micro-batch (Korthikanti et al.
 * 2022, generalised to GQA, gated MLPs and top-k experts). */
static double layer_act(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l, double b,
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
    const double u = e->ab / 2; /* the paper counts 2-byte elements */
    const double masks = m->gated ? 0 : 2 * A;   /* dropout masks (GPT) */
    const double rep = 4 * A + 2 * A + 2 * A;    /* LN inputs, QKV input, MLP input */
    const double attn = 2 * A + 4 * A * m->kv_heads / m->heads + 2 * A; /* Q, K+V, proj input */
    const double mlp = k * (m->gated ? 6.0 : 4.0) * s_loc * b * m->ffn;
    const double scores = 5.0 * m->heads * s_loc * s * b;
    if (l->recompute == LOOM_RECOMPUTE_FULL) return u * 2 * A / (l->sp ? t : 1);
    double x = (l->sp ? (rep + masks) / t : rep + masks) + (attn + mlp) / t;
    if (l->recompute == LOOM_RECOMPUTE_NONE && !e->flash) x += scores / t;
    return u * x;
}

/* Element-wise HBM traffic of one layer for one micro-batch, in bytes read
 * plus written (docs/planning.md, "Element-wise traffic"): fwd, bwd, and
 * sel = the forward part selective recompute repeats (softmax, dropout).
 *
 * fp32 (loom on CPU): one pass over the bytes the layer keeps forward, two
 * backward (written; read and their gradients written), as before.
 *
 * bf16: one entry per kernel of the stack, each reading its inputs and
 * writing its outputs once at 2 bytes an element (masks 1 byte). GPT
 * (Megatron-LM 2021, arXiv:2104.04473 section 4.2, and its code at
 * 6985e589): LayerNorm; the QKV bias added after the GEMM (F.linear on a 3-D
 * input); fused scale+mask+softmax; dropout on the probabilities (1-byte
 * mask); the context permuted to contiguous; fused bias+dropout+add after the
 * projection and the MLP; fused bias+GeLU. Backward: each op's gradient reads
 * its saved input(s) and the incoming gradient and writes the outgoing one;
 * LayerNorm's weight gradients read gradient and input again; bias gradients
 * read the gradient once; the residual stream's two gradients are summed
 * (read 2, write 1); the QKV split's gradient is a concatenation. Llama-style
 * (gated): RMSNorm, RoPE on q and k, residual adds, SwiGLU, no bias, no
 * dropout; MoE adds the token permutation in and out (k copies of a token).
 * --flash-attention: no score traffic and no permute (inside the kernel). */
typedef struct elem_bytes {
    double fwd, bwd, sel;
} elem_bytes;

static elem_bytes layer_elem(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l, double b,
                             double s_loc, double s) {
    elem_bytes r = {0, 0, 0};
    if (e->ab == 4) {
        loom_plan_layout kept = *l;
        kept.recompute = LOOM_RECOMPUTE_NONE;
        r.fwd = layer_act(m, e, &kept, b, s_loc, s);
        r.bwd = 2 * r.fwd;
        return r;
    }
    const double w = e->ab, t = l->tp, n = b * s_loc, h = m->hidden, k = n_topk(m);
    const double hr = h / (l->sp ? t : 1);          /* LayerNorm / residual channels on this rank */
    const double ht = h / t, kvt = ht * m->kv_heads / m->heads, Ft = (double)m->ffn / t;
    const double sc = e->flash ? 0 : n * s * m->heads / t; /* score elements on this rank */
    const double moe = m->experts > 1 ? 2 * 2 * w * n * k * hr : 0; /* permute in and out */
    if (!m->gated) {
        const double norm_f = 2 * w * n * hr, norm_b = 5 * w * n * hr;
        const double bda_f = (3 * w + 1) * n * hr, bda_b = (3 * w + 1) * n * hr;
        const double qkv = n * (ht + 2 * kvt), perm = e->flash ? 0 : 2 * w * n * ht;
        const double soft_f = 2 * w * sc, drop_f = (2 * w + 1) * sc;
        r.sel = soft_f + drop_f;
        r.fwd = 2 * norm_f + 2 * w * qkv + r.sel + perm + 2 * bda_f + 2 * w * n * k * Ft + moe;
        r.bwd = 2 * norm_b + 2 * 3 * w * n * hr /* residual sums */ + 3 * w * qkv + perm + (2 * w + 1) * sc +
                3 * w * sc + 2 * bda_b + 4 * w * n * k * Ft + moe;
    } else {
        const double norm_f = 2 * w * n * hr, norm_b = 5 * w * n * hr, add = 3 * w * n * hr;
        const double rope = 2 * w * n * (ht + kvt);
        r.sel = 2 * w * sc;
        r.fwd = 2 * norm_f + rope + r.sel + 2 * add + 3 * w * n * k * Ft + moe;
        r.bwd = 2 * norm_b + 2 * add + rope + 3 * w * sc + 5 * w * n * k * Ft + moe;
    }
    return r;
}

double loom_plan_elementwise_bytes(const loom_plan_model *m, const loom_plan_job *j, const loom_plan_layout *l,
                                   double *bwd, double *sel) {
    const eval_ctx e = ctx_of(m, NULL, j);
    const elem_bytes r = layer_elem(m, &e, l, l->mbs, (double)j->seq / l->cp, j->seq);
    if (bwd) *bwd = r.bwd;
    if (sel) *sel = r.sel;
    return r.fwd;
}

/* Memory of the most loaded stage; fills r->mem_*; returns the number of
 * layers on that stage in *Ls. */
static void memory(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                   const loom_plan_layout *l, const eval_ctx *e, int layers_max, int first, int last,
                   loom_plan_result *r) {
    const double t = l->tp, E = n_experts(m);
    const double zgroup = (double)l->dp * l->cp, egroup = zgroup / l->ep;
    const double dense = layers_max * (e->sc.attn_w + e->sc.router_w + (E > 1 ? 0 : e->sc.mlp_w)) / t +
                         layers_max * e->sc.norm_w + (first ? e->sc.embed_w / t : 0) +
                         (last && (!m->tied || !first) ? e->sc.head_w / t : 0);
    const double expert = E > 1 ? layers_max * E * e->sc.mlp_w / (t * l->ep) : 0;
    double pw = (dense + expert) * e->wb, pg = (dense + expert) * e->gb, po = (dense + expert) * e->ob;
    if (!j->serve) {
        const double dz = dense / zgroup + expert / egroup; /* one shard */
        if (l->zero >= 1) po = dz * e->ob;
        if (l->zero >= 2) pg = dz * e->gb;
        if (l->zero >= 3) /* shards plus two layers gathered (one in use, one prefetched) */
            pw = dz * e->wb + 2 * (dense + expert) / (layers_max ? layers_max : 1) * e->wb;
    } else {
        pg = po = 0;
    }
    r->mem_params = pw, r->mem_grads = pg, r->mem_opt = po;
    r->mem_other = c->reserved;
    if (!j->serve && zgroup > 1) {
        /* DP buffers: the in-flight reductions' message-sized temporaries (at
         * most two buckets), and at ZeRO-2/3 the gradient staging (two
         * buckets) that replaces the full gradient buffer */
        const double bucket = 25e6, full = (dense + expert) * e->gb;
        r->mem_other += fmin(full, 2 * bucket) * (l->zero >= 2 ? 2 : 1);
    }
    if (j->serve) {
        const double ctx = (double)j->seq + j->gen;
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
        const double per_set = layer_act(m, e, l, b, s_loc, s) * layers_max / l->v;
        /* a full recompute re-materialises one layer at a time */
        double a = live * per_set;
        if (l->recompute == LOOM_RECOMPUTE_FULL) {
            loom_plan_layout l2 = *l;
            l2.recompute = LOOM_RECOMPUTE_SELECTIVE;
            a += layer_act(m, e, &l2, b, s_loc, s);
        }
        if (last) a += b * s_loc * m->vocab / t * 4.0 * 2; /* fp32 logits and their gradient */
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

static void format_gb(char *buf, size_t cap, const loom_plan_result *r) {
    snprintf(buf, cap, "params %.2f + grads %.2f + optimizer %.2f + activations %.2f + kv %.2f + reserved %.2f GB",
             r->mem_params / GB, r->mem_grads / GB, r->mem_opt / GB, r->mem_act / GB, r->mem_kv / GB,
             r->mem_other / GB);
}

static loom_status eval_serve(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                              const loom_plan_layout *l, const eval_ctx *e, loom_plan_result *r) {
    const int Ls = (m->layers + l->pp - 1) / l->pp;
    memory(m, c, j, l, e, Ls, 1, l->pp == 1, r);
    if (r->max_seqs < 1) {
        char b[256];
        format_gb(b, sizeof b, r);
        return reject(r, "memory: weights leave no room for one sequence's KV cache (%s; device %.1f GB)", b,
                      c->memory / GB);
    }
    const double t = l->tp, eff = e->peak * c->gemm_eff;
    const int tin = axis_inter(l, c, LOOM_PLAN_TP), pin = axis_inter(l, c, LOOM_PLAN_PP);
    /* prefill of one prompt: every stage in turn */
    const double s = j->seq;
    const double pre = m->layers * layer_flops(m, &e->sc, s, s) / t / eff + 2 * s * e->sc.head_w / t / eff;
    const double pre_tp = 2.0 * m->layers * loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, l->tp, tin, s * m->hidden * e->ab);
    const double pre_pp = (l->pp - 1) * loom_plan_coll_time(c, LOOM_COLL_P2P, 2, pin, s * m->hidden * e->ab);
    r->ttft = pre + pre_tp + pre_pp;
    /* decode: B sequences, one token each, bound by weights + KV reads or FLOPs */
    const double live = r->in_flight, B = ceil(live / l->pp), ctx = s + j->gen / 2.0;
    double active;
    loom_plan_model_params(m, &active);
    const double total_w = loom_plan_model_params(m, NULL);
    /* expert weights read: the experts the batch touches on this rank */
    const double frac_read = m->experts > 1 ? fmin(1.0, B * m->topk / (double)m->experts) : 1.0;
    const double w_read = (total_w - (m->experts > 1 ? (1 - frac_read) * (total_w - active) : 0)) * e->wb / (t * l->pp);
    const int kvl = m->kv_heads >= l->tp ? m->kv_heads / l->tp : 1;
    const double kv_read = B * 2.0 * m->layers / l->pp * ctx * e->sc.hd * kvl * e->ab;
    const double mem_t = (w_read / (m->experts > 1 && l->ep > 1 ? l->ep : 1) + kv_read) / c->hbm_bw;
    const double fl_t = (2 * active * B + 4.0 * B * ctx * m->hidden * m->layers) / (t * l->pp) / eff;
    const double tp_t = 2.0 * m->layers / l->pp * loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, l->tp, tin, B * m->hidden * e->ab);
    const double ep_t = l->ep > 1 ? 2.0 * m->layers / l->pp *
                                        loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->ep, ep_inter(l, c),
                                                            B * m->topk * m->hidden * e->ab / t)
                                  : 0;
    const double stage = fmax(mem_t, fl_t) + tp_t + ep_t;
    r->tpot = l->pp * stage + (l->pp - 1) * loom_plan_coll_time(c, LOOM_COLL_P2P, 2, pin, B * m->hidden * e->ab);
    r->t_compute = fmax(mem_t, fl_t) * l->pp, r->t_tp = tp_t * l->pp, r->t_ep = ep_t * l->pp;
    r->t_step = r->tpot;
    /* pp stages each work on their own batch in flight: throughput of one stage */
    const double per_replica = live / r->tpot;
    r->tokens_per_s_dev = per_replica * l->dp / job_gpus(c, j);
    r->mfu = 2 * active * r->tokens_per_s_dev / e->peak;
    if (tp_t > 0.3 * stage) add_failure(r, "too much TP: all-reduces are %.0f%% of a decode step", 100 * tp_t / stage);
    if (ep_t > 0.3 * stage) add_failure(r, "expert all-to-all dominates: %.0f%% of a decode step", 100 * ep_t / stage);
    if (mem_t > fl_t) add_failure(r, "decode bound by memory bandwidth (%.0f%% of the FLOP bound is used)", 100 * fl_t / mem_t);
    if (r->max_seqs < (j->batch + l->dp - 1) / l->dp)
        add_failure(r, "KV cache holds only %.0f concurrent sequences per replica", r->max_seqs);
    r->feasible = 1;
    return LOOM_OK;
}

/* Per-micro-batch costs of the slowest stage, and the whole step. */
loom_status loom_plan_evaluate(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                               const loom_plan_layout *l, int simulate, loom_plan_result *r) {
    memset(r, 0, sizeof *r);
    r->l = *l;
    if (loom_plan_layout_validate(m, j, job_gpus(c, j), l) != LOOM_OK) return reject(r, "%s", loom_errmsg());
    const eval_ctx e = ctx_of(m, c, j);
    if (j->serve) return eval_serve(m, c, j, l, &e, r);

    const int S = l->pp * l->v;
    const double t = l->tp, cp = l->cp, b = l->mbs, s = j->seq, s_loc = s / cp;
    /* GEMM efficiency at this layout's GEMM sizes (one number per layer) */
    const double score_bytes = e.ab == 2 && !e.flash ? 2 * e.ab * b * s_loc * s * m->heads / t : 0;
    double attn_share = 0; /* the attention GEMMs' share of a layer's GEMM time */
    const double eff =
        e.peak * layer_gemm_eff(m, &e.sc, c, b * s_loc, s, t, l->ep, e.flash, score_bytes, e.peak / c->hbm_bw,
                                &attn_share);
    /* layers per rank: the partitioner's split with the head's cost in blocks */
    const double f_layer = layer_flops(m, &e.sc, b * s, s) / (t * cp);
    const double f_head = 2 * b * s * e.sc.head_w / (t * cp);
    const double head_cost =
        (f_head / (e.peak * loom_plan_gemm_eff(c, f_head))) / (f_layer / eff); /* in time, layer units */
    int counts_small[64], *counts = S <= 64 ? counts_small : malloc(sizeof(int) * S);
    if (!counts) return loom_fail(LOOM_EOS, "out of memory");
    double max_rank_cost = 0, mean_cost = (m->layers + head_cost) / l->pp;
    int layers_max = 0, first = 1, last = l->pp == 1;
    if (simulate && l->pp > 1) {
        loom_status st = loom_partition_balance(m->layers, l->pp, l->v, 0, head_cost, counts);
        if (st != LOOM_OK) {
            if (counts != counts_small) free(counts);
            return reject(r, "%s", loom_errmsg());
        }
        for (int rk = 0; rk < l->pp; rk++) {
            double cost = 0;
            int ly = 0;
            for (int ch = 0; ch < l->v; ch++) {
                cost += loom_partition_stage_cost(counts, S, ch * l->pp + rk, 0, head_cost);
                ly += counts[ch * l->pp + rk];
            }
            if (cost > max_rank_cost) {
                max_rank_cost = cost, layers_max = ly;
                first = rk == 0, last = rk == l->pp - 1;
            }
        }
    } else {
        /* coarse: even split rounded up, the head on the last rank */
        layers_max = (m->layers + S - 1) / S * l->v;
        max_rank_cost = layers_max + (l->pp == 1 ? head_cost : 0);
        if (l->pp > 1 && (m->layers / S) * l->v + head_cost > max_rank_cost) {
            max_rank_cost = (m->layers / S) * l->v + head_cost;
        }
        if (l->pp == 1) mean_cost = max_rank_cost;
    }
    r->stage_imbalance = max_rank_cost / mean_cost - 1;
    r->head_cost = head_cost;
    r->in_flight = l->pp > 1 ? peak_live_formula(l) : 1;
    memory(m, c, j, l, &e, layers_max, first, last, r);
    if (r->mem_total > c->memory) {
        char bd[256];
        format_gb(bd, sizeof bd, r);
        if (counts != counts_small) free(counts);
        return reject(r, "memory %.1f GB/rank > %.1f GB (over by %.1f GB: %s)", r->mem_total / GB, c->memory / GB,
                      (r->mem_total - c->memory) / GB, bd);
    }
    /* compute of one micro-batch on the slowest rank, in layer units, plus
     * the memory-bound element-wise work at HBM bandwidth (layer_elem: per
     * kernel on GPU stacks; fp32: three passes over the bytes a layer keeps) */
    const elem_bytes eb = layer_elem(m, &e, l, b, s_loc, s);
    const double elem_f = layers_max * eb.fwd / c->hbm_bw, elem_b = layers_max * eb.bwd / c->hbm_bw;
    const double f_rank = max_rank_cost * f_layer / eff;
    /* this rank's two attention GEMMs (QK^T, PV) forward, at the time the
     * forward charges them (roofline, flash kernel or curve) */
    const double attn_fwd = layers_max * f_layer / eff * attn_share;
    /* loom's fp32 stack: its attention backward (loom_attention_bwd,
     * src/kernels/cpu/attention.c) recomputes every visible tile's scores
     * q k^T, and exp(score - lse), before its four products (dV, dP, dQ, dK):
     * five GEMMs of the forward's two sizes where "backward = 2 x forward"
     * counts four. The fifth is QK^T again, half the forward's attention
     * GEMMs (2 b s^2 h / (t cp) FLOPs per layer), charged as the forward
     * charges them, in every recompute mode; its exp is not charged, as the
     * forward's softmax is not. GPU stacks (bf16) are left as they were:
     * backward twice the forward. The trainer's partitioner
     * (src/train/pipeline.c) weighs a block 3 x its forward in any mode but
     * full ("the attention backward recomputes its probabilities in any
     * mode"), without this fifth GEMM; the split here (head_cost, in forward
     * layer units) is left alike, so the extra is backward time, not a
     * different split. */
    const double attn_bwd_extra = e.ab == 4 ? 0.5 * attn_fwd : 0;
    double fwd = f_rank + elem_f, bwd_in = f_rank + elem_b + attn_bwd_extra, bwd_w = f_rank;
    const double attn_part = 4 * b * s * s * m->hidden / (t * cp) / eff * layers_max;
    /* full recompute repeats the layers' forward, element-wise work included.
     * Selective repeats what the stack drops:
     * - GPU stacks (bf16, Megatron-LM's selective recompute): the whole core
     *   attention, "QK^T matrix multiply, softmax, softmax dropout, and
     *   attention over V" (Korthikanti et al. 2022, arXiv:2205.05198, section
     *   5; Appendix A counts both GEMMs): both batched GEMMs at the time the
     *   forward charges them (roofline, flash kernel or curve) plus the
     *   softmax and dropout traffic (eb.sel);
     * - loom's fp32 stack: nothing. Its attention never keeps the
     *   probabilities: the backward recomputes them tile by tile from q, k, v
     *   and the saved log-sum-exp in every mode (loom_attention_bwd,
     *   include/loom/kernels.h; include/loom/model.h: "SELECTIVE keeps no
     *   extra"), so --recompute selective runs the same kernels as none, as
     *   the trainer's partitioner assumes (src/train/pipeline.c); that
     *   recomputation is in bwd_in above, whatever the mode. */
    double recompute = l->recompute == LOOM_RECOMPUTE_FULL ? layers_max * f_layer / eff + elem_f
                       : l->recompute == LOOM_RECOMPUTE_SELECTIVE && e.ab == 2
                           ? attn_fwd + layers_max * eb.sel / c->hbm_bw
                           : 0;
    /* tensor parallel: collectives per layer per micro-batch */
    const int tin = axis_inter(l, c, LOOM_PLAN_TP);
    const double act = b * s_loc * m->hidden * e.ab;
    double tp_f = 0, tp_b = 0;
    if (l->tp > 1) {
        if (l->sp) {
            const double ag = loom_plan_coll_time(c, LOOM_COLL_ALLGATHER, l->tp, tin, act);
            const double rs = loom_plan_coll_time(c, LOOM_COLL_REDUCESCATTER, l->tp, tin, act);
            tp_f = layers_max * 2 * (ag + rs);
            tp_b = layers_max * (2 * (ag + rs) + 2 * ag);
        } else {
            const double ar = loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, l->tp, tin, act);
            tp_f = layers_max * 2 * ar;
            tp_b = layers_max * 2 * ar;
        }
        if (l->recompute == LOOM_RECOMPUTE_FULL) tp_b += tp_f;
    }
    /* context parallel (docs/context-parallel.md), per layer and micro-batch.
     * C = channels per tp rank, Ckv = K (or V) channels per tp rank (GQA). */
    double cp_f = 0, cp_b = 0, cp_layer_bytes = 0;
    if (l->cp > 1) {
        const int cin = axis_inter(l, c, LOOM_PLAN_CP);
        const double C = m->hidden / t, Ckv = C * m->kv_heads / m->heads, n = b * s_loc, g = l->cp;
        const double attn_f = attn_part / layers_max; /* this rank's attention forward */
        if (l->cp_impl == LOOM_PLAN_CP_RING) {
            /* cp-1 K/V blocks forward, each overlapped with 1/cp of the
             * attention; backward the blocks again plus cp dK/dV accumulators,
             * overlapped with 1/cp of the backward attention each, the last
             * accumulator after the compute (exposed) */
            const double kv = 2 * n * Ckv * e.ab, p2p = loom_plan_coll_time(c, LOOM_COLL_P2P, 2, cin, kv);
            cp_f = (g - 1) * fmax(0, p2p - attn_f / g);
            cp_b = (g - 1) * fmax(0, 2 * p2p - 2 * attn_f / g) + p2p;
            cp_layer_bytes = kv * (3 * g - 2);
        } else if (l->cp_impl == LOOM_PLAN_CP_ULYSSES) {
            /* all-to-alls (blocking): q, k, v then out forward; q, k, v, out,
             * dout then dq, dk, dv backward (sizes of a rank's own input) */
            const double qkv = n * (C + 2 * Ckv) * e.ab, o = n * C * e.ab;
            cp_f = loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->cp, cin, qkv) +
                   loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->cp, cin, o);
            cp_b = loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->cp, cin, qkv + 2 * o) +
                   loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->cp, cin, qkv);
            cp_layer_bytes = 3 * qkv + 3 * o;
        } else {
            /* all-gather of K and V before the attention (exposed), again in
             * the backward, and a reduce-scatter of dK, dV */
            const double kv_full = 2 * b * s * Ckv * e.ab;
            const double ag = loom_plan_coll_time(c, LOOM_COLL_ALLGATHER, l->cp, cin, kv_full);
            cp_f = ag;
            cp_b = ag + loom_plan_coll_time(c, LOOM_COLL_REDUCESCATTER, l->cp, cin, kv_full);
            cp_layer_bytes = 3 * kv_full * (g - 1) / g;
        }
        cp_f *= layers_max, cp_b *= layers_max;
    }
    /* expert parallel: dispatch + combine all-to-all, forward and backward */
    double ep_f = 0, ep_b = 0;
    if (m->experts > 1 && l->ep > 1) {
        const double tok = b * s_loc * n_topk(m) * m->hidden * e.ab / (l->sp ? t : 1);
        const double a2a = loom_plan_coll_time(c, LOOM_COLL_ALLTOALL, l->ep, ep_inter(l, c), tok);
        ep_f = layers_max * 2 * a2a;
        ep_b = layers_max * 2 * a2a;
    }
    /* pipeline messages */
    const int pin = axis_inter(l, c, LOOM_PLAN_PP);
    const double msg = l->pp > 1 ? loom_plan_coll_time(c, LOOM_COLL_P2P, 2, pin, act / (l->sp ? t : 1)) : 0;
    /* data parallel + ZeRO after (or during) the pipeline */
    const int din = axis_inter(l, c, LOOM_PLAN_DP) || axis_inter(l, c, LOOM_PLAN_CP);
    const int zg = l->dp * l->cp;
    const double E = n_experts(m);
    const double dense_p = layers_max * (e.sc.attn_w + e.sc.router_w + (E > 1 ? 0 : e.sc.mlp_w)) / t +
                           (first ? e.sc.embed_w / t : 0) + (last ? e.sc.head_w / t : 0);
    const double exp_p = E > 1 ? layers_max * E * e.sc.mlp_w / (t * l->ep) : 0;
    const int eg = zg / l->ep;
    const int ein = din && !(l->ep > 1 && eg * axis_stride(l, LOOM_PLAN_DP) <= c->gpus_per_node);
    double dp_t = 0, z3 = 0;
    if (zg > 1) {
        if (l->zero <= 1) {
            dp_t = loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, zg, din, dense_p * e.gb) +
                   loom_plan_coll_time(c, LOOM_COLL_ALLREDUCE, eg, ein, exp_p * e.gb);
            /* ZeRO-1 is a reduce-scatter of the gradients and an all-gather of
             * the updated shards: the bytes and time of the all-reduce */
        } else {
            dp_t = loom_plan_coll_time(c, LOOM_COLL_REDUCESCATTER, zg, din, dense_p * e.gb) +
                   loom_plan_coll_time(c, LOOM_COLL_REDUCESCATTER, eg, ein, exp_p * e.gb);
            if (l->zero == 2)
                dp_t += loom_plan_coll_time(c, LOOM_COLL_ALLGATHER, zg, din, dense_p * e.wb) +
                        loom_plan_coll_time(c, LOOM_COLL_ALLGATHER, eg, ein, exp_p * e.wb);
            else /* zero 3: parameters gathered for every forward and backward of every micro-batch */
                z3 = 2 * (loom_plan_coll_time(c, LOOM_COLL_ALLGATHER, zg, din, dense_p * e.wb) +
                          loom_plan_coll_time(c, LOOM_COLL_ALLGATHER, eg, ein, exp_p * e.wb));
        }
    }
    /* per micro-batch costs the simulator runs with */
    const int split = loom_schedule_splits_backward(l->sched) && l->pp > 1;
    /* ZeRO-3: a micro-batch's forward gathers hide behind its forward, its
     * backward gathers behind its backward (recompute included); the
     * gradient reduce-scatter shares the link with the backward's gathers,
     * so it hides only in what of the backward they leave (t_dp below) */
    const double z3_ag = 0.5 * z3, z3_bwd = bwd_in + recompute + bwd_w;
    const double F = fwd + tp_f + cp_f + ep_f + fmax(0, z3_ag - c->overlap * fwd);
    const double Bi = bwd_in + recompute + tp_b + cp_b + ep_b + fmax(0, z3_ag - c->overlap * z3_bwd);
    /* gradient accumulation over micro-batches (GPU stacks, unsharded
     * gradients): every micro-batch after the first adds its weight gradients
     * to the rank's gradient buffer, reading both and writing the sum
     * (Megatron-LM 2021: autograd's in-place add into param.grad, or
     * main_grad.add_ with contiguous buffers); averaged over the m */
    const double grad_acc = e.ab == 2 && l->zero <= 1 && l->m > 1
                                ? (l->m - 1.0) / l->m * 3 * e.gb * (dense_p + exp_p) / c->hbm_bw
                                : 0;
    const double W = bwd_w + grad_acc;
    /* the optimizer: read/write params, grads and two moments of this rank's shard */
    const double shard = (l->zero >= 1 && zg > 1) ? (dense_p / zg + exp_p / eg) : (dense_p + exp_p);
    const double opt = shard * (e.wb + e.gb + e.ob) * 2 / c->hbm_bw;
    /* devices sharing cores: the pipeline replays each stage's work at its
     * speed alone and lets the simulator share the node's cores; all else
     * runs with every device busy (all_busy = 1 on the calibrated node) */
    const sharing sh = sharing_of(c, j, l);
    const int shared_pipe = l->pp > 1 && sh.cores > 0;
    const double solo = shared_pipe ? sh.solo : 1;
    r->sim_f = solo * F / l->v, r->sim_b = solo * (split ? Bi : Bi + W) / l->v, r->sim_w = split ? solo * W / l->v : 0;
    r->sim_comm = msg;
    r->sim_cores = shared_pipe ? sh.cores : 0, r->sim_share = shared_pipe ? sh.share : 0;
    /* Synchronisations a rank meets per micro-batch, forward and backward
     * (the collectives above, each one a wait for its group), and the DP
     * reductions it waits for per step. With more ranks than cores on a
     * node, every one of them hands the rank's core to another rank and it
     * waits for one back (loom_sim_wake_wait; docs/planning.md, "Devices
     * that share cores"). */
    double sync_f = 0, sync_b = 0, sync_dp = 0;
    if (l->tp > 1) {
        sync_f += layers_max * (l->sp ? 4 : 2);
        sync_b += layers_max * (l->sp ? 6 : 2);
        if (l->recompute == LOOM_RECOMPUTE_FULL) sync_b += layers_max * (l->sp ? 4 : 2);
    }
    if (l->cp > 1) {
        const double g = l->cp;
        sync_f += layers_max * (l->cp_impl == LOOM_PLAN_CP_RING ? g - 1 : l->cp_impl == LOOM_PLAN_CP_ULYSSES ? 2 : 1);
        sync_b += layers_max * (l->cp_impl == LOOM_PLAN_CP_RING ? g : 2);
    }
    if (m->experts > 1 && l->ep > 1) sync_f += 2.0 * layers_max, sync_b += 2.0 * layers_max;
    if (zg > 1) { /* buckets of 25 MB (docs/data-parallel.md); ZeRO-3 one unit (a block, the embeddings) at a time */
        const double nb = fmax(1, ceil((dense_p + exp_p) * e.gb / 25e6)), units = layers_max + 1.0;
        sync_dp = l->zero == 0 ? nb : l->zero <= 2 ? 2 * nb : l->m * 2 * units + units;
    }
    /* the wait per synchronisation with all D ranks of the node wanting a
     * core (every layout but a pipeline's, whose replay counts them), X =
     * the slice, or the work between two synchronisations if shorter */
    const double syncs_mb = sync_f + sync_b + (l->pp > 1 ? 2.0 * l->v : 0);
    const double span = syncs_mb > 0 ? sh.solo * (F + Bi + W) / syncs_mb : 0;
    const double wake = sh.node_ranks > 0 ? loom_sim_wake_wait(c->slice, span, sh.node_cores, sh.node_ranks) : 0;
    const int sim_waits = shared_pipe && wake > 0; /* the replay does the pipeline's waits */
    r->sim_slice = sim_waits ? c->slice : 0, r->sim_span = sim_waits ? span : 0;
    r->sim_replicas = shared_pipe ? (int)lround(sh.node_ranks / sh.share) : 0;
    r->sim_syncs_f = sim_waits ? (int)lround(sync_f / l->v) : 0;
    r->sim_syncs_b = sim_waits ? (int)lround(sync_b / l->v) : 0;
    r->t_wake = 0;
    double makespan, busy;
    if (l->pp == 1) {
        busy = l->m * (F + Bi + W) * sh.all_busy;
        r->t_wake = l->m * (sync_f + sync_b) * wake;
        makespan = busy + r->t_wake;
        r->bubble = 0;
    } else if (simulate) {
        loom_schedule *sch = NULL;
        loom_sim_result *res = NULL;
        double *scale = malloc(sizeof(double) * S);
        loom_status st = scale ? loom_schedule_build(l->sched, l->pp, l->m, l->v, &sch) : loom_fail(LOOM_EOS, "oom");
        if (st == LOOM_OK) {
            /* chunk-level costs: per virtual stage, relative to the slowest rank's mean chunk */
            const double per_chunk = max_rank_cost / l->v;
            for (int v = 0; v < S; v++) scale[v] = loom_partition_stage_cost(counts, S, v, 0, head_cost) / per_chunk;
            loom_sim_costs sc;
            loom_sim_costs_default(&sc);
            sc.f = r->sim_f, sc.b = r->sim_b, sc.w = r->sim_w, sc.comm = msg, sc.opt = 0;
            sc.stage_scale = scale;
            sc.cores = r->sim_cores, sc.share = r->sim_share;
            sc.slice = r->sim_slice, sc.span = r->sim_span, sc.replicas = r->sim_replicas;
            sc.syncs_f = r->sim_syncs_f, sc.syncs_b = r->sim_syncs_b;
            st = loom_sim_run(sch, &sc, &res);
        }
        if (st == LOOM_OK) {
            makespan = res->makespan;
            busy = 0;
            for (int k = 0; k < l->pp; k++)
                if (res->busy[k] > busy) busy = res->busy[k], r->t_wake = res->wake[k];
            r->bubble = res->bubble;
            r->in_flight = loom_schedule_peak_live(sch, 0);
            r->simulated = 1;
        }
        loom_sim_free(res);
        loom_schedule_free(sch);
        free(scale);
        if (st != LOOM_OK) {
            if (counts != counts_small) free(counts);
            return st;
        }
        /* the schedule's real in-flight count may differ from the formula */
        memory(m, c, j, l, &e, layers_max, first, last, r);
        if (r->mem_total > c->memory) {
            char bd[256];
            format_gb(bd, sizeof bd, r);
            if (counts != counts_small) free(counts);
            return reject(r, "memory %.1f GB/rank > %.1f GB (over by %.1f GB: %s)", r->mem_total / GB,
                          c->memory / GB, (r->mem_total - c->memory) / GB, bd);
        }
    } else {
        loom_sim_costs sc;
        loom_sim_costs_default(&sc);
        sc.f = r->sim_f, sc.b = r->sim_b, sc.w = r->sim_w;
        double bub = loom_sim_closed_form_bubble(l->sched, l->pp, l->m, l->v, &sc);
        if (isnan(bub)) bub = (l->pp - 1.0) / (l->m + l->pp - 1.0);
        busy = l->m * (F + Bi + W) * solo;
        makespan = busy / (1 - bub) + 2 * (l->pp - 1) * msg;
        /* shared cores: the node's work cannot finish faster than with every
         * stage busy; each synchronisation of the slowest rank (receives
         * included) waits for a core as if every rank wanted one */
        if (shared_pipe) makespan = fmax(makespan, l->m * (F + Bi + W) * sh.all_busy);
        r->t_wake = l->m * syncs_mb * wake;
        makespan += r->t_wake;
        r->bubble = 1 - busy / makespan;
    }
    if (counts != counts_small) free(counts);
    /* DP reductions hide behind the last micro-batch's backward */
    const double window = j->no_dp_overlap ? 0
                          : z3 > 0         ? fmax(0, c->overlap * z3_bwd - z3_ag)
                                           : c->overlap * (Bi + W);
    r->t_dp = fmax(0, dp_t - window) * sh.all_busy;
    const double wake_dp = sync_dp * wake; /* after the pipeline: every rank waits for its reductions */
    r->t_wake += wake_dp;
    r->t_step = makespan + r->t_dp + opt * sh.all_busy + wake_dp;
    /* the parts of the slowest rank's busy time (with shared cores: its wall
     * time computing in the replay, in the proportions of its work) */
    const double part = shared_pipe ? busy / (l->m * (F + Bi + W)) : sh.all_busy;
    r->t_compute = l->m * (fwd + bwd_in + W + recompute) * part;
    r->t_tp = l->m * (tp_f + tp_b) * part, r->t_cp = l->m * (cp_f + cp_b) * part, r->t_ep = l->m * (ep_f + ep_b) * part;
    r->t_pp = msg;
    r->cp_bytes = cp_layer_bytes * layers_max * l->m;
    r->t_bubble = makespan - busy - (r->t_wake - wake_dp);
    const double tokens = (double)j->batch * j->seq;
    const int N = job_gpus(c, j);
    r->model_flops = plan_model_flops(m, tokens, s);
    r->tokens_per_s_dev = tokens / r->t_step / N;
    r->mfu = r->model_flops / (r->t_step * N * e.peak);
    r->feasible = 1;
    /* failure modes */
    const double st_ = r->t_step;
    if (r->t_tp > 0.2 * st_) add_failure(r, "too much TP: collectives are %.0f%% of the step", 100 * r->t_tp / st_);
    if (r->stage_imbalance > 0.1)
        add_failure(r, "pipeline imbalance: slowest stage %.0f%% above the mean", 100 * r->stage_imbalance);
    if (r->bubble > 0.15) add_failure(r, "too few micro-batches: bubble %.0f%% of the step", 100 * r->bubble);
    if (r->mem_act > 0.5 * c->memory)
        add_failure(r, "too many micro-batches in flight: activations use %.0f%% of memory", 100 * r->mem_act / c->memory);
    if (r->t_ep > 0.2 * st_) add_failure(r, "expert all-to-all dominates: %.0f%% of the step", 100 * r->t_ep / st_);
    if (r->t_cp > 0.05 * st_) add_failure(r, "CP communication exposed: %.0f%% of the step", 100 * r->t_cp / st_);
    if (r->t_dp > 0.15 * st_) add_failure(r, "DP reduction exposed: %.0f%% of the step", 100 * r->t_dp / st_);
    if (recompute > 0 && l->pp > 1)
        add_failure(r, "recompute changes stage times: backward +%.0f%%", 100 * recompute / (bwd_in + bwd_w));
    else if (recompute > 0) add_failure(r, "recompute costs %.0f%% more compute", 100 * recompute / (3 * fwd));
    return LOOM_OK;
}

/* ---- search ------------------------------------------------------------ */

static int divisors(long n, int *out, int cap, long maxv) {
    int k = 0;
    for (long d = 1; d <= n && d <= maxv && k < cap; d++)
        if (n % d == 0) out[k++] = (int)d;
    return k;
}

typedef struct topk {
    loom_plan_result *r;
    int n, cap;
} topk;

static int better(const loom_plan_result *a, const loom_plan_result *b) {
    if (a->tokens_per_s_dev != b->tokens_per_s_dev) return a->tokens_per_s_dev > b->tokens_per_s_dev;
    return a->mem_total < b->mem_total;
}

static void topk_add(topk *t, const loom_plan_result *r) {
    if (t->n < t->cap) {
        t->r[t->n++] = *r;
    } else {
        int worst = 0;
        for (int i = 1; i < t->n; i++)
            if (better(&t->r[worst], &t->r[i])) worst = i;
        if (!better(r, &t->r[worst])) return;
        t->r[worst] = *r;
    }
}

static int cmp_result(const void *a, const void *b) {
    const loom_plan_result *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

static void count_reject(loom_plan_search_stats *st, const loom_plan_result *r) {
    if (strncmp(r->reason, "memory", 6) == 0) {
        st->rejected_memory++;
        if (!st->example_memory[0]) snprintf(st->example_memory, sizeof st->example_memory, "%s", r->reason);
    } else {
        st->rejected_divide++;
        if (!st->example_divide[0]) snprintf(st->example_divide, sizeof st->example_divide, "%s", r->reason);
    }
}

#define COARSE 48

loom_status loom_plan_search(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                             int top, loom_plan_result *out, int *n_out, loom_plan_search_stats *stats) {
    loom_plan_search_stats dummy;
    loom_plan_search_stats *st = stats ? stats : &dummy;
    memset(st, 0, sizeof *st);
    const int N = job_gpus(c, j);
    if (N < 1) return loom_fail(LOOM_EUSAGE, "--gpus %d: must be >= 1", N);
    topk tk = {malloc(sizeof(loom_plan_result) * (COARSE > top ? COARSE : top)), 0, COARSE > top ? COARSE : top};
    loom_plan_result *r = malloc(sizeof *r);
    if (!tk.r || !r) {
        free(tk.r);
        free(r);
        return loom_fail(LOOM_EOS, "out of memory");
    }
    int tps[64], pps[64], cps[64], eps[64], mbss[64];
    const int ntp = divisors(N, tps, 64, m->heads);
    static const int orders[2][LOOM_PLAN_NAXES] = {{LOOM_PLAN_TP, LOOM_PLAN_CP, LOOM_PLAN_DP, LOOM_PLAN_PP},
                                                  {LOOM_PLAN_TP, LOOM_PLAN_CP, LOOM_PLAN_PP, LOOM_PLAN_DP}};
    for (int a = 0; a < ntp; a++) {
        const int tp = tps[a];
        const int npp = divisors(N / tp, pps, 64, m->layers);
        for (int bq = 0; bq < npp; bq++) {
            const int pp = pps[bq];
            const int ncp = j->serve ? 1 : divisors(N / tp / pp, cps, 64, 64);
            if (j->serve) cps[0] = 1;
            for (int cq = 0; cq < ncp; cq++) {
                const int cp = cps[cq], dp = N / tp / pp / cp;
                if (j->seq % cp) continue;
                if (!j->serve && j->batch % dp) {
                    st->considered++, st->rejected_batch++;
                    continue;
                }
                const int nep = m->experts > 1 ? divisors((long)dp * cp, eps, 64, m->experts) : 1;
                if (m->experts <= 1) eps[0] = 1;
                const int local = j->serve ? 1 : j->batch / dp;
                const int nmbs = j->serve ? 1 : divisors(local, mbss, 64, 16);
                if (j->serve) mbss[0] = 1;
                for (int eq = 0; eq < nep; eq++) {
                    if (m->experts > 1 && m->experts % eps[eq]) continue;
                    /* cp > 1: ring and (where the heads divide) Ulysses, the two loom runs */
                    for (int ci = 0; ci < (cp > 1 ? 2 : 1); ci++)
                    for (int sp = 0; sp <= (tp > 1 && !j->serve); sp++)
                        for (int zero = 0; zero <= (j->serve || dp * cp < 2 ? 0 : 3); zero++)
                            for (int mq = 0; mq < nmbs; mq++)
                                for (int sk = 0; sk < (pp > 1 && !j->serve ? LOOM_SCHED_COUNT : 1); sk++)
                                    for (int v = 1; v <= (sk == LOOM_SCHED_INTERLEAVED ? 8 : 1); v *= 2)
                                        for (int rc = 0, rc_done = 0; rc < (j->serve ? 1 : 3) && !rc_done; rc++)
                                            for (int o = 0; o < (pp > 1 && dp > 1 ? 2 : 1); o++) {
                                                loom_plan_layout l = {.dp = dp, .tp = tp, .pp = pp, .cp = cp,
                                                                      .ep = eps[eq], .cp_impl = (loom_plan_cp_impl)ci,
                                                                      .zero = zero, .sp = sp,
                                                                      .mbs = mbss[mq], .m = local / mbss[mq],
                                                                      .v = v, .recompute = (loom_recompute)rc};
                                                l.sched = pp > 1 && !j->serve ? (loom_sched_kind)sk : LOOM_SCHED_1F1B;
                                                memcpy(l.order, orders[o], sizeof l.order);
                                                if (l.sched == LOOM_SCHED_INTERLEAVED && v == 1) continue;
                                                if (ci == LOOM_PLAN_CP_ULYSSES && (m->heads / tp) % cp) continue;
                                                if (o == 1) { /* the other order only when it moves a group across nodes */
                                                    loom_plan_layout l0 = l;
                                                    memcpy(l0.order, orders[0], sizeof l0.order);
                                                    if (axis_inter(&l0, c, LOOM_PLAN_DP) == axis_inter(&l, c, LOOM_PLAN_DP) &&
                                                        axis_inter(&l0, c, LOOM_PLAN_PP) == axis_inter(&l, c, LOOM_PLAN_PP))
                                                        continue;
                                                }
                                                st->considered++;
                                                loom_status s = loom_plan_evaluate(m, c, j, &l, 0, r);
                                                if (s != LOOM_OK) {
                                                    free(tk.r);
                                                    free(r);
                                                    return s;
                                                }
                                                if (!r->feasible) {
                                                    count_reject(st, r);
                                                    continue;
                                                }
                                                st->feasible++;
                                                topk_add(&tk, r);
                                                /* more recompute only adds time: the cheapest that fits wins */
                                                rc_done = 1;
                                            }
                }
            }
        }
    }
    /* the best by the closed form, re-evaluated with the simulator */
    int n = 0;
    for (int i = 0; i < tk.n; i++) {
        loom_status s = loom_plan_evaluate(m, c, j, &tk.r[i].l, 1, r);
        if (s != LOOM_OK) {
            free(tk.r);
            free(r);
            return s;
        }
        st->simulated++;
        if (r->feasible) tk.r[n++] = *r;
    }
    qsort(tk.r, n, sizeof *tk.r, cmp_result);
    *n_out = n < top ? n : top;
    memcpy(out, tk.r, sizeof *out * *n_out);
    free(tk.r);
    free(r);
    return LOOM_OK;
}

/* ---- the rule of thumb --------------------------------------------------- */

void loom_plan_heuristic(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                         loom_plan_layout *l, char *buf, size_t cap) {
    const int N = job_gpus(c, j), G = c->gpus_per_node < N ? c->gpus_per_node : N;
    const eval_ctx e = ctx_of(m, c, j);
    const double P = loom_plan_model_params(m, NULL);
    const double per_param = j->serve ? e.wb : e.wb + e.gb + e.ob;
    size_t n = strlen(buf);
#define SAY(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__), n = n < cap ? n : cap)
    memset(l, 0, sizeof *l);
    l->ep = l->v = l->cp = 1;
    l->sched = LOOM_SCHED_1F1B;
    for (int i = 0; i < LOOM_PLAN_NAXES; i++) l->order[i] = i;
    /* 1. TP inside a node until the model state fits in half the memory */
    int tp = 1;
    while (tp < G && P * per_param / tp > 0.5 * c->memory && m->heads % (tp * 2) == 0 && N % (tp * 2) == 0) tp *= 2;
    SAY("1. TP by intra-node links and memory: tp=%d (model state %.1f GB; %.1f GB per rank at tp=%d, "
        "a node has %d devices)\n",
        tp, P * per_param / GB, P * per_param / tp / GB, tp, c->gpus_per_node);
    /* 2. PP across nodes until it fits */
    int pp = 1;
    while (P * per_param / (tp * pp) > 0.5 * c->memory && pp * 2 <= m->layers && N % (tp * pp * 2) == 0) pp *= 2;
    SAY("2. PP by depth and inter-node bandwidth: pp=%d (%d layers, %.1f GB per rank of model state)\n", pp,
        m->layers, P * per_param / (tp * pp) / GB);
    /* 3. DP for the rest */
    int dp = N / (tp * pp);
    SAY("3. DP for the rest: dp=%d%s\n", dp, dp > 1 && !j->serve ? ", ZeRO-1 to shard the optimizer" : "");
    l->tp = tp, l->pp = pp, l->dp = dp;
    l->zero = dp > 1 && !j->serve ? 1 : 0;
    /* 4. SP with TP, CP for long sequences */
    l->sp = tp > 1 && !j->serve && j->seq % tp == 0;
    if (!j->serve && j->seq >= 32768) {
        int cp = 1;
        while (cp * 2 <= dp && dp % (cp * 2) == 0 && j->seq / cp > 16384) cp *= 2;
        l->cp = cp, l->dp = dp / cp;
    }
    SAY("4. SP/CP for activations: sp=%d cp=%d (sequence %d)\n", l->sp, l->cp, j->seq);
    /* 5. EP for MoE */
    if (m->experts > 1) {
        int ep = 1;
        while (ep * 2 <= m->experts && m->experts % (ep * 2) == 0 && (l->dp * l->cp) % (ep * 2) == 0) ep *= 2;
        l->ep = ep;
        SAY("5. EP for MoE: ep=%d (%d experts)\n", ep, m->experts);
    } else {
        SAY("5. EP for MoE: dense model, ep=1\n");
    }
    if (j->serve) {
        l->mbs = 1, l->m = 1;
    } else {
        const int local = j->batch / (l->dp > 0 ? l->dp : 1);
        l->m = pp > 1 ? 4 * pp : 1;
        while (l->m > 1 && local % l->m) l->m /= 2;
        if (l->m < 1) l->m = 1;
        l->mbs = local / l->m > 0 ? local / l->m : 1;
        l->recompute = LOOM_RECOMPUTE_SELECTIVE;
        SAY("   then 1f1b with m=%d micro-batches of %d, selective recompute\n", l->m, l->mbs);
    }
#undef SAY
}

void loom_plan_train_flags(const loom_plan_model *m, const loom_plan_job *j, const loom_plan_layout *l, char *buf,
                           size_t cap) {
    if (j->serve) {
        int k = snprintf(buf, cap, "loom serve --model %s --dp %d --tp %d --pp %d", m->name, l->dp, l->tp, l->pp);
        if (l->ep > 1 && k >= 0 && (size_t)k < cap)
            snprintf(buf + k, cap - (size_t)k, "  # ep=%d: loom serve has no expert parallelism", l->ep);
        return;
    }
    size_t n = (size_t)snprintf(buf, cap, "loom train --model %s --batch %d --seq %d --dp %d --tp %d --pp %d", m->name,
                                j->batch, j->seq, l->dp, l->tp, l->pp);
#define ADD(...) (n += (size_t)snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__))
    if (l->cp > 1) ADD(" --cp %d", l->cp);
    if (l->cp > 1 && l->cp_impl == LOOM_PLAN_CP_ULYSSES) ADD(" --cp-impl ulysses");
    if (l->ep > 1) ADD(" --ep %d", l->ep);
    if (l->sp) ADD(" --sp");
    if (l->zero) ADD(" --zero %d", l->zero);
    if (l->pp > 1) {
        ADD(" --schedule %s --micro-batches %d", loom_schedule_name(l->sched), l->m);
        if (l->v > 1) ADD(" --virtual-stages %d", l->v);
    } else if (l->m > 1) {
        ADD(" --grad-accum %d", l->m);
    }
    static const char *ax[] = {"tp", "cp", "dp", "pp"};
    if (l->order[2] != LOOM_PLAN_DP)
        ADD(" --mesh-order %s,%s,%s,%s", ax[l->order[0]], ax[l->order[1]], ax[l->order[2]], ax[l->order[3]]);
    if (l->recompute != LOOM_RECOMPUTE_NONE)
        ADD(" --recompute %s", l->recompute == LOOM_RECOMPUTE_FULL ? "full" : "selective");
    if (j->bf16) ADD(" --precision bf16");
    if (l->cp > 1 && l->cp_impl == LOOM_PLAN_CP_ALLGATHER) ADD("  # cp_impl=allgather: not in loom train (ring, ulysses)");
    if (!m->loom_trains) ADD("  # loom trains GPT-2 shapes only");
#undef ADD
}
