/* plan_time.c - the time side of the planner's cost model: FLOPs and GEMM
 * efficiency of a layer, its element-wise HBM traffic, the links a mesh
 * axis's group crosses, devices that share processors, and the costs of one
 * micro-batch on the slowest rank: compute and recompute, the exposed
 * communication of each axis (tp/sp all-reduces or gathers, cp ring,
 * Ulysses or all-gather exchanges, ep all-to-alls, pp messages, dp/ZeRO
 * reductions and gathers) and the synchronisations a rank meets. The
 * formulas are docs/planning.md's. Pure: nothing here is collective. */
#include <math.h>
#include <string.h>

#include "plan/internal.h"

/* ---- shape helpers --------------------------------------------------- */

shape_costs plan_shape_of(const loom_plan_model *m) {
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

/* Forward FLOPs of one layer for `tok` tokens of a sequence of length s
 * (whole layer, before any split). */
double plan_layer_flops(const loom_plan_model *m, const shape_costs *sc, double tok, double s) {
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
double plan_layer_gemm_eff(const loom_plan_model *m, const shape_costs *sc, const loom_plan_cluster *c,
                           double tok, double s, double t, int ep, int flash, double score_bytes,
                           double peak_per_bw, double *attn_share) {
    const double h = m->hidden, kvd = sc->hd * m->kv_heads, F = m->ffn, k = n_topk(m);
    const double per_expert =
        m->experts > 1 ? (double)ep / m->experts : 1; /* share of tok*k one expert gets */
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
            tm += tm_attn =
                0.5 * g[i].flops / (c->attn_eff > 0 ? c->attn_eff : loom_plan_gemm_eff(c, g[i].size));
        else if (i == attn) /* in units of peak FLOPs: bytes * peak / bandwidth */
            tm += tm_attn = fmax(g[i].flops / loom_plan_gemm_eff(c, g[i].size), score_bytes * peak_per_bw);
        else tm += g[i].flops / loom_plan_gemm_eff(c, g[i].size);
    }
    if (attn_share) *attn_share = tm > 0 ? tm_attn / tm : 0;
    return tm > 0 ? fl / tm : c->gemm_eff;
}

double plan_model_flops(const loom_plan_model *m, double tokens, double s) {
    const shape_costs sc = plan_shape_of(m);
    return 3 * (m->layers * plan_layer_flops(m, &sc, tokens, s) + 2 * tokens * sc.head_w);
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
long plan_axis_stride(const loom_plan_layout *l, int axis) {
    long s = 1;
    for (int i = 0; i < LOOM_PLAN_NAXES && l->order[i] != axis; i++) s *= degree(l, l->order[i]);
    return s;
}

/* 1 if the group of `axis` spans more than one node. */
int plan_axis_inter(const loom_plan_layout *l, const loom_plan_cluster *c, int axis) {
    return plan_axis_stride(l, axis) * degree(l, axis) > c->gpus_per_node && degree(l, axis) > 1;
}

/* Ranks of a group of g ranks `stride` apart that share one node (g: the
 * group is inside a node; 1: one rank per node). */
static int group_k(const loom_plan_cluster *c, long stride, int g) {
    if (stride * g <= c->gpus_per_node) return g;
    const long k = stride < c->gpus_per_node ? c->gpus_per_node / stride : 1;
    return k < g ? (int)k : g;
}

int plan_axis_k(const loom_plan_layout *l, const loom_plan_cluster *c, int axis) {
    return group_k(c, plan_axis_stride(l, axis), degree(l, axis));
}

/* The dp x cp (ZeRO) group, and an EP group inside it: consecutive ranks
 * of that sub-mesh, its inner stride apart. */
static long dpcp_stride(const loom_plan_layout *l) {
    const long a = plan_axis_stride(l, LOOM_PLAN_DP), b = plan_axis_stride(l, LOOM_PLAN_CP);
    return a < b ? a : b;
}

/* EP groups are consecutive ranks of the dp x cp sub-mesh. */
int plan_ep_inter(const loom_plan_layout *l, const loom_plan_cluster *c) {
    const long inner = plan_axis_stride(l, LOOM_PLAN_DP) < plan_axis_stride(l, LOOM_PLAN_CP)
                           ? plan_axis_stride(l, LOOM_PLAN_DP)
                           : plan_axis_stride(l, LOOM_PLAN_CP);
    return l->ep > 1 && inner * l->ep > c->gpus_per_node;
}

/* ---- element-wise traffic ------------------------------------------- */

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
elem_bytes plan_layer_elem(const loom_plan_model *m, const eval_ctx *e, const loom_plan_layout *l, double b,
                           double s_loc, double s) {
    elem_bytes r = {0, 0, 0};
    if (e->ab == 4) {
        loom_plan_layout kept = *l;
        kept.recompute = LOOM_RECOMPUTE_NONE;
        r.fwd = plan_layer_act(m, e, &kept, b, s_loc, s);
        r.bwd = 2 * r.fwd;
        return r;
    }
    const double w = e->ab, t = l->tp, n = b * s_loc, h = m->hidden, k = n_topk(m);
    const double hr = h / (l->sp ? t : 1); /* LayerNorm / residual channels on this rank */
    const double ht = h / t, kvt = ht * m->kv_heads / m->heads, Ft = (double)m->ffn / t;
    const double sc = e->flash ? 0 : n * s * m->heads / t;          /* score elements on this rank */
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
    } else if (e->elementwise == 1) {
        /* eager PyTorch composites, per element: RMSNorm as x.float()
         * (read 2, write 4), pow (4, 4), mean (read 4), x * rsqrt (4, 4),
         * .type_as (4, 2), * weight (2, 2) = 36 bytes, its autograd backward
         * twice that; RoPE through complex fp32 (x.float() 2 + 4, the complex
         * product 8 + 8, .type_as 4 + 2 = 28 bytes, as much backward); SwiGLU
         * as silu (2, 2) and the product (4, 2) = 10 bytes, backward twice */
        const double norm_f = 36 * n * hr, norm_b = 72 * n * hr, add = 3 * w * n * hr;
        const double rope = 28 * n * (ht + kvt);
        r.sel = 2 * w * sc;
        r.fwd = 2 * norm_f + rope + r.sel + 2 * add + 10 * n * k * Ft + moe;
        r.bwd = 2 * norm_b + 2 * add + rope + 3 * w * sc + 20 * n * k * Ft + moe;
    } else {
        const double norm_f = 2 * w * n * hr, norm_b = 5 * w * n * hr, add = 3 * w * n * hr;
        const double rope = 2 * w * n * (ht + kvt);
        r.sel = 2 * w * sc;
        r.fwd = 2 * norm_f + rope + r.sel + 2 * add + 3 * w * n * k * Ft + moe;
        r.bwd = 2 * norm_b + 2 * add + rope + 3 * w * sc + 5 * w * n * k * Ft + moe;
    }
    if (e->fp8) {
        /* FP8 GEMMs with per-tensor scaling (Transformer Engine's recipes,
         * torchao's tensorwise float8): each GEMM's activation operand is
         * reduced to its amax (read) and cast (read), written as FP8 twice,
         * row-wise and transposed, since Hopper's FP8 GEMMs take K-major
         * operands only and the weight gradient needs the transpose (TE's
         * fused cast-transpose); each output gradient likewise in the
         * backward: 2 w + 2 bytes an element. Per rank, before any gather
         * (the FP8 recipes cast the local shard and gather FP8): QKV and MLP
         * inputs (h_r), projection input (h/t), down projection input
         * (k F/t); output gradients of QKV (h/t + 2 kv channels), of the
         * projection and the down projection (h_r), of the up (and gate)
         * projection (k F/t, twice gated). A lower bound: the weights' casts
         * (TE caches them over the micro-batches) and unfused amax passes
         * are left out. */
        const double in = n * (2 * hr + ht + k * Ft);
        const double go = n * (ht + 2 * kvt + 2 * hr + k * (m->gated ? 2.0 : 1.0) * Ft);
        r.fwd += (2 * w + 2) * in;
        r.bwd += (2 * w + 2) * go;
    }
    return r;
}

double loom_plan_elementwise_bytes(const loom_plan_model *m, const loom_plan_job *j,
                                   const loom_plan_layout *l, double *bwd, double *sel) {
    eval_ctx e = plan_ctx_of(m, NULL, j);
    e.fp8 = j->fp8 && j->bf16; /* the stack's casts, whatever the cluster */
    const elem_bytes r = plan_layer_elem(m, &e, l, l->mbs, (double)j->seq / l->cp, j->seq);
    if (bwd) *bwd = r.bwd;
    if (sel) *sel = r.sel;
    return r.fwd;
}

/* ---- devices that share processors ----------------------------------- */

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
sharing plan_sharing_of(const loom_plan_cluster *c, const loom_plan_job *j, const loom_plan_layout *l) {
    sharing sh = {1, 1, 0, 0, 0, 0};
    const int N = job_gpus(c, j);
    const double C = c->cores, D_cal = c->gpus_per_node, D = N < c->gpus_per_node ? N : c->gpus_per_node;
    if (!(C > 0) || (D_cal <= C && D <= C)) return sh;
    sh.solo = fmin(1, C / D_cal);
    sh.all_busy = sh.solo / fmin(1, C / D);
    const long stride = plan_axis_stride(l, LOOM_PLAN_PP);
    long g = stride < D ? (long)D / stride : 1;
    if (g > l->pp) g = l->pp;
    if (g < 1) g = 1;
    sh.share = (int)g;
    sh.cores = C * g / D;
    if (D > C) sh.node_ranks = D, sh.node_cores = C;
    return sh;
}

/* ---- per micro-batch on the slowest rank ----------------------------- */

/* Compute of one micro-batch on the slowest rank, in layer units, plus the
 * memory-bound element-wise work at HBM bandwidth (plan_layer_elem: per
 * kernel on GPU stacks; fp32: three passes over the bytes a layer keeps),
 * and what recompute repeats. */
static void compute_costs(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                          const loom_plan_layout *l, const eval_ctx *e, const stage_split *sp, mb_costs *k) {
    const double t = l->tp, cp = l->cp, b = l->mbs, s = j->seq, s_loc = s / cp;
    const int layers_max = sp->layers_max;
    const double eff = sp->eff, f_layer = sp->f_layer;
    const elem_bytes eb = plan_layer_elem(m, e, l, b, s_loc, s);
    const double elem_f = layers_max * eb.fwd / c->hbm_bw, elem_b = layers_max * eb.bwd / c->hbm_bw;
    const double f_rank = sp->max_rank_cost * f_layer / eff;
    /* this rank's two attention GEMMs (QK^T, PV) forward, at the time the
     * forward charges them (roofline, flash kernel or curve) */
    const double attn_fwd = layers_max * f_layer / eff * sp->attn_share;
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
    /* a kernel the cluster measured (planner.c's split_costs): its
     * backward at its own speed, not twice the forward's time */
    const double attn_bwd_extra = e->ab == 4 ? 0.5 * attn_fwd : layers_max * sp->attn_bwd_extra;
    /* the loss over the vocabulary on the last stage (GPU stacks), each op
     * one pass over the logits at HBM bandwidth (vocab-parallel under tp):
     * PyTorch's F.cross_entropy(logits.float()) casts them to fp32 (read 2,
     * write 4 bytes a logit) and log-softmaxes them (read 4, write 4)
     * forward; backward writes the loss's dense gradient (4), the
     * log-softmax gradient (read 4 + 4, write 4) and casts it back (read 4,
     * write 2). A fused kernel on bf16 logits (--logits bf16: flash-attn's
     * cross-entropy) reads them once forward (2) and reads them and writes
     * their gradient backward (2 + 2) */
    const double logits = sp->last && e->ab == 2 ? b * s_loc * m->vocab / t : 0;
    const double ce_f = (e->logits_bf16 ? 2 : 14) * logits / c->hbm_bw;
    const double ce_b = (e->logits_bf16 ? 4 : 22) * logits / c->hbm_bw;
    k->fwd = f_rank + elem_f + ce_f, k->bwd_in = f_rank + elem_b + attn_bwd_extra + ce_b, k->bwd_w = f_rank;
    k->attn_part = 4 * b * s * s * m->hidden / (t * cp) / eff * layers_max;
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
    /* torchtitan's op-level policy (LOOM_PLAN_RECOMPUTE_OP) keeps every
     * other matmul's output and the attention's: half the layer's other
     * GEMMs and its element-wise work again; every other block whole
     * (LOOM_PLAN_RECOMPUTE_LAYER2): half of full */
    const double full = layers_max * f_layer / eff + elem_f;
    k->recompute =
        l->recompute == LOOM_RECOMPUTE_FULL          ? full
        : l->recompute == LOOM_PLAN_RECOMPUTE_LAYER2 ? 0.5 * full
        : l->recompute == LOOM_PLAN_RECOMPUTE_OP     ? 0.5 * (layers_max * f_layer / eff - attn_fwd) + elem_f
        : l->recompute == LOOM_RECOMPUTE_SELECTIVE && e->ab == 2 ? attn_fwd + layers_max * eb.sel / c->hbm_bw
                                                                 : 0;
}

/* Tensor parallel: collectives per layer per micro-batch (act: one
 * micro-batch's activations of one layer, bytes). With SP the forward's two
 * all-gathers + two reduce-scatters move the bytes of its two all-reduces,
 * and so do the backward's (Korthikanti et al. 2022, section 4.2.2: "the
 * communication bandwidth used for tensor parallelism and tensor together
 * with sequence parallelism are the same"). The backward also gathers again
 * the two column-parallel GEMMs' inputs for their weight gradients (only
 * the shards were kept): GPU stacks issue that all-gather asynchronously
 * while the input-gradient GEMM runs (Megatron-LM's
 * LinearWithGradAccumulationAndAsyncCommunication; the paper's section
 * 4.2.2), so only what outlasts those GEMMs (`dgrad`: their time per layer)
 * is exposed; loom's own stack (fp32) gathers before it computes
 * (src/model/gpt.c, sp_regather), all exposed: dgrad = 0. */
static void tp_costs(const loom_plan_cluster *c, const loom_plan_layout *l, double act, int layers_max,
                     double dgrad, double hide, mb_costs *k) {
    const int tin = plan_axis_k(l, c, LOOM_PLAN_TP);
    double tp_f = 0, tp_b = 0;
    if (l->tp > 1) {
        if (l->sp) {
            const double ag = loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, l->tp, tin, act);
            const double rs = loom_plan_coll_time_k(c, LOOM_COLL_REDUCESCATTER, l->tp, tin, act);
            tp_f = layers_max * fmax(0, 2 * (ag + rs) - hide);
            tp_b = layers_max * fmax(0, 2 * (ag + rs) + fmax(0, 2 * ag - dgrad) - 2 * hide);
        } else {
            const double ar = loom_plan_coll_time_k(c, LOOM_COLL_ALLREDUCE, l->tp, tin, act);
            tp_f = layers_max * fmax(0, 2 * ar - hide);
            tp_b = layers_max * fmax(0, 2 * ar - 2 * hide);
        }
        if (l->recompute == LOOM_RECOMPUTE_FULL) tp_b += tp_f;
    }
    k->tp_f = tp_f, k->tp_b = tp_b;
}

/* Context parallel (docs/context-parallel.md), per layer and micro-batch.
 * C = channels per tp rank, Ckv = K (or V) channels per tp rank (GQA). */
static void cp_costs(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                     const loom_plan_layout *l, const eval_ctx *e, int layers_max, mb_costs *k) {
    const double t = l->tp, b = l->mbs, s = j->seq, s_loc = s / l->cp;
    double cp_f = 0, cp_b = 0, cp_layer_bytes = 0;
    if (l->cp > 1) {
        const int cin = plan_axis_inter(l, c, LOOM_PLAN_CP), ck = plan_axis_k(l, c, LOOM_PLAN_CP);
        const double C = m->hidden / t, Ckv = C * m->kv_heads / m->heads, n = b * s_loc, g = l->cp;
        const double attn_f = k->attn_part / layers_max; /* this rank's attention forward */
        if (l->cp_impl == LOOM_PLAN_CP_RING) {
            /* cp-1 K/V blocks forward, each overlapped with 1/cp of the
             * attention; backward the blocks again plus cp dK/dV accumulators,
             * overlapped with 1/cp of the backward attention each, the last
             * accumulator after the compute (exposed) */
            const double kv = 2 * n * Ckv * e->ab, p2p = loom_plan_coll_time(c, LOOM_COLL_P2P, 2, cin, kv);
            cp_f = (g - 1) * fmax(0, p2p - attn_f / g);
            cp_b = (g - 1) * fmax(0, 2 * p2p - 2 * attn_f / g) + p2p;
            cp_layer_bytes = kv * (3 * g - 2);
        } else if (l->cp_impl == LOOM_PLAN_CP_ULYSSES) {
            /* all-to-alls (blocking): q, k, v then out forward; q, k, v, out,
             * dout then dq, dk, dv backward (sizes of a rank's own input) */
            const double qkv = n * (C + 2 * Ckv) * e->ab, o = n * C * e->ab;
            cp_f = loom_plan_coll_time_k(c, LOOM_COLL_ALLTOALL, l->cp, ck, qkv) +
                   loom_plan_coll_time_k(c, LOOM_COLL_ALLTOALL, l->cp, ck, o);
            cp_b = loom_plan_coll_time_k(c, LOOM_COLL_ALLTOALL, l->cp, ck, qkv + 2 * o) +
                   loom_plan_coll_time_k(c, LOOM_COLL_ALLTOALL, l->cp, ck, qkv);
            cp_layer_bytes = 3 * qkv + 3 * o;
        } else {
            /* all-gather of K and V before the attention (exposed), again in
             * the backward, and a reduce-scatter of dK, dV */
            const double kv_full = 2 * b * s * Ckv * e->ab;
            const double ag = loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, l->cp, ck, kv_full);
            cp_f = ag;
            cp_b = ag + loom_plan_coll_time_k(c, LOOM_COLL_REDUCESCATTER, l->cp, ck, kv_full);
            cp_layer_bytes = 3 * kv_full * (g - 1) / g;
        }
        cp_f *= layers_max, cp_b *= layers_max;
    }
    k->cp_f = cp_f, k->cp_b = cp_b, k->cp_layer_bytes = cp_layer_bytes;
}

/* Data parallel + ZeRO after (or during) the pipeline: the rank's dense and
 * expert parameters and their reductions. */
static void dp_costs(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_layout *l,
                     const eval_ctx *e, const stage_split *sp, mb_costs *k) {
    const double t = l->tp;
    const int layers_max = sp->layers_max, first = sp->first, last = sp->last;
    const int din = plan_axis_inter(l, c, LOOM_PLAN_DP) || plan_axis_inter(l, c, LOOM_PLAN_CP);
    const int zg = l->dp * l->cp;
    const double E = n_experts(m);
    /* the parameters memory counts: a head tied to the embedding on the
     * same rank (pp = 1) is one matrix, reduced once */
    const double dense_p = plan_rank_dense_params(m, e, l, layers_max, first, last);
    const double exp_p = E > 1 ? layers_max * E * e->sc.mlp_w / (t * l->ep) : 0;
    const int eg = zg / l->ep;
    /* ranks of the ZeRO group, and of an expert-data group (ep apart), on a node */
    const int zk = din ? group_k(c, dpcp_stride(l), zg) : zg;
    const int ek = din ? group_k(c, dpcp_stride(l) * l->ep, eg) : eg;
    double dp_t = 0, z3 = 0;
    if (zg > 1) {
        if (l->zero <= 1) {
            dp_t = loom_plan_coll_time_k(c, LOOM_COLL_ALLREDUCE, zg, zk, dense_p * e->gb) +
                   loom_plan_coll_time_k(c, LOOM_COLL_ALLREDUCE, eg, ek, exp_p * e->gb);
            /* ZeRO-1 is a reduce-scatter of the gradients and an all-gather of
             * the updated shards: the bytes and time of the all-reduce */
        } else {
            dp_t = loom_plan_coll_time_k(c, LOOM_COLL_REDUCESCATTER, zg, zk, dense_p * e->gb) +
                   loom_plan_coll_time_k(c, LOOM_COLL_REDUCESCATTER, eg, ek, exp_p * e->gb);
            if (l->zero == 2)
                dp_t += loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, zg, zk, dense_p * e->wb) +
                        loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, eg, ek, exp_p * e->wb);
            else { /* zero 3: parameters gathered for every forward and backward of every
                    * micro-batch, in n collectives a pass: the bytes once, the ring's
                    * latency (a collective of no bytes) n times */
                const double n = plan_zero3_gathers(m, e, l, layers_max, first, last);
                z3 = 2 * (loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, zg, zk, dense_p * e->wb) +
                          (n - 1) * loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, zg, zk, 0) +
                          loom_plan_coll_time_k(c, LOOM_COLL_ALLGATHER, eg, ek, exp_p * e->wb));
                k->z3_n = n;
            }
        }
    }
    k->dense_p = dense_p, k->exp_p = exp_p, k->zg = zg, k->eg = eg, k->dp_t = dp_t, k->z3 = z3;
}

/* What the simulator runs per micro-batch (F, Bi, W) and the optimizer. */
static void step_costs(const loom_plan_cluster *c, const loom_plan_layout *l, const eval_ctx *e,
                       mb_costs *k) {
    /* ZeRO-3: a micro-batch's forward gathers hide behind its forward, its
     * backward gathers behind its backward (recompute included); the
     * gradient reduce-scatter shares the link with the backward's gathers,
     * so it hides only in what of the backward they leave (t_dp below) */
    k->z3_ag = 0.5 * k->z3, k->z3_bwd = k->bwd_in + k->recompute + k->bwd_w;
    k->F = k->fwd + k->tp_f + k->cp_f + k->ep_f + fmax(0, k->z3_ag - c->overlap * k->fwd);
    k->Bi =
        k->bwd_in + k->recompute + k->tp_b + k->cp_b + k->ep_b + fmax(0, k->z3_ag - c->overlap * k->z3_bwd);
    /* gradient accumulation over micro-batches (GPU stacks, unsharded
     * gradients): every micro-batch after the first adds its weight gradients
     * to the rank's gradient buffer, reading both and writing the sum
     * (Megatron-LM 2021: autograd's in-place add into param.grad, or
     * main_grad.add_ with contiguous buffers); averaged over the m */
    const double grad_acc = e->ab == 2 && l->zero <= 1 && l->m > 1
                                ? (l->m - 1.0) / l->m * 3 * e->gb * (k->dense_p + k->exp_p) / c->hbm_bw
                                : 0;
    k->W = k->bwd_w + grad_acc;
    /* the optimizer: read/write params, grads and two moments of this rank's shard */
    const double shard =
        (l->zero >= 1 && k->zg > 1) ? (k->dense_p / k->zg + k->exp_p / k->eg) : (k->dense_p + k->exp_p);
    k->opt = shard * (e->wb + e->gb + e->ob) * 2 / c->hbm_bw;
}

/* Synchronisations a rank meets per micro-batch, forward and backward (the
 * collectives above, each one a wait for its group), and the DP reductions
 * it waits for per step. With more ranks than cores on a node, every one of
 * them hands the rank's core to another rank and it waits for one back
 * (loom_sim_wake_wait; docs/planning.md, "Devices that share cores"). */
static void sync_counts(const loom_plan_model *m, const loom_plan_layout *l, const eval_ctx *e,
                        int layers_max, mb_costs *k) {
    double sync_f = 0, sync_b = 0, sync_dp = 0;
    if (l->tp > 1) {
        sync_f += layers_max * (l->sp ? 4 : 2);
        sync_b += layers_max * (l->sp ? 6 : 2);
        if (l->recompute == LOOM_RECOMPUTE_FULL) sync_b += layers_max * (l->sp ? 4 : 2);
    }
    if (l->cp > 1) {
        const double g = l->cp;
        sync_f += layers_max * (l->cp_impl == LOOM_PLAN_CP_RING      ? g - 1
                                : l->cp_impl == LOOM_PLAN_CP_ULYSSES ? 2
                                                                     : 1);
        sync_b += layers_max * (l->cp_impl == LOOM_PLAN_CP_RING ? g : 2);
    }
    if (m->experts > 1 && l->ep > 1) sync_f += 2.0 * layers_max, sync_b += 2.0 * layers_max;
    if (k->zg >
        1) { /* buckets of 25 MB (docs/data-parallel.md); ZeRO-3 one unit (a block, the embeddings) at a time */
        const double nb = fmax(1, ceil((k->dense_p + k->exp_p) * e->gb / 25e6)), units = layers_max + 1.0;
        sync_dp = l->zero == 0 ? nb : l->zero <= 2 ? 2 * nb : l->m * 2 * k->z3_n + units;
    }
    k->sync_f = sync_f, k->sync_b = sync_b, k->sync_dp = sync_dp;
}

void plan_mb_costs(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                   const loom_plan_layout *l, const eval_ctx *e, const stage_split *sp, mb_costs *k) {
    memset(k, 0, sizeof *k);
    const double t = l->tp, b = l->mbs, s_loc = (double)j->seq / l->cp;
    const int layers_max = sp->layers_max;
    compute_costs(m, c, j, l, e, sp, k);
    const double act = b * s_loc * m->hidden * e->ab;
    /* the input-gradient GEMMs of QKV and the MLP's up (and gate)
     * projection, per layer: what hides SP's backward re-gathers on GPU stacks */
    const double h = m->hidden, up = m->gated ? 2.0 : 1.0, tok = b * s_loc;
    const double dgrad =
        e->ab == 2 ? 2 * tok * h * (h + 2 * e->sc.hd * m->kv_heads + up * n_topk(m) * m->ffn) / (t * sp->eff)
                   : 0;
    /* async TP: the collectives decomposed and run beside the layer's GEMMs
     * (torchtitan's async TP, Megatron's --tp-comm-overlap), hidden up to
     * the overlap efficiency times those GEMMs' time (forward; the
     * backward's GEMMs twice that) */
    const double hide = l->async_tp ? c->overlap * sp->f_layer / sp->eff * (1 - sp->attn_share) : 0;
    tp_costs(c, l, act, layers_max, dgrad, hide, k);
    cp_costs(m, c, j, l, e, layers_max, k);
    /* expert parallel: dispatch + combine all-to-all, forward and backward */
    if (m->experts > 1 && l->ep > 1) {
        const double tok = b * s_loc * n_topk(m) * m->hidden * e->ab / (l->sp ? t : 1);
        const int ek = plan_ep_inter(l, c) ? group_k(c, dpcp_stride(l), l->ep) : l->ep;
        const double a2a = loom_plan_coll_time_k(c, LOOM_COLL_ALLTOALL, l->ep, ek, tok);
        k->ep_f = layers_max * 2 * a2a;
        k->ep_b = layers_max * 2 * a2a;
    }
    /* pipeline messages */
    const int pin = plan_axis_inter(l, c, LOOM_PLAN_PP);
    k->msg = l->pp > 1 ? loom_plan_coll_time(c, LOOM_COLL_P2P, 2, pin, act / (l->sp ? t : 1)) : 0;
    dp_costs(m, c, l, e, sp, k);
    step_costs(c, l, e, k);
    sync_counts(m, l, e, layers_max, k);
}
