/* test_plan_terms.c - terms of the planner's cost model against hand counts
 * (include/loom/plan.h, docs/planning.md), pure:
 *  - DP traffic counts a head tied to the embedding once at pp = 1: the
 *    all-reduce of a dp-only layout moves 2 bytes x the model's parameters
 *    (2 Psi), the same matrix memory counts once;
 *  - sequence parallelism moves TP's bytes: on GPU stacks its backward
 *    re-gathers hide behind the input-gradient GEMMs, so its exposed time
 *    equals TP's all-reduces'; loom's own stack (fp32) gathers before it
 *    computes and pays them.
 * And physical facts (issue 34), not the planner's own formulas again:
 *  - memory: GPT-2 small's activations are Korthikanti et al.'s 34 s b h
 *    bytes a layer with dropout, 32 without (flash attention: no scores),
 *    plus the loss's fp32 logits and their gradient (8 bytes a logit, on
 *    the last stage only, 1/N of it over N chunks); ZeRO-3 holds its shard,
 *    two gathered units (the largest: a block, the embedding or the head)
 *    or DeepSpeed's live-parameter limit, and one unit's unsharded
 *    gradients; the presets'
 *    capacity is what the card addresses (nvidia-smi's MiB), and Llama 3 8B
 *    under FSDP at 8K tokens (torchtitan's run) fits an H100;
 *  - attention: with the measured FlashAttention-2 table, the step's time
 *    per token grows with the sequence length, the backward is slower than
 *    twice the forward (FA2's backward runs below its forward's FLOP/s), and
 *    the devices never run above peak; a kernel made faster than peak is
 *    flagged and the MFU capped;
 *  - element-wise work: eager PyTorch composites are slower than fused
 *    kernels; the loss over a 50K vocabulary is a larger share of a small
 *    model's step than of a large one's;
 *  - networks: a group spanning whole nodes crosses the node boundary over
 *    all of its ranks' NICs (8 on a DGX), one rank per node over one;
 *  - --fix: a search with pinned knobs returns only layouts with them;
 *  - FP8 parameters: no FP8 copy beside the bf16 weights, one byte a
 *    weight less; FP8 GEMMs' casts of their activation operands and output
 *    gradients, 6 bytes an element, by hand. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "loom/plan.h"

static loom_plan_cluster preset(const char *name) {
    loom_plan_cluster c;
    loom_status st = loom_plan_cluster_load(name, &c);
    CHECK(st == LOOM_OK, "%s preset: %s", name, loom_errmsg());
    return c;
}

static loom_plan_result eval_layout(const loom_plan_model *m, const loom_plan_cluster *c,
                                    const loom_plan_job *j, const char *layout) {
    loom_plan_layout l;
    loom_plan_result r;
    memset(&r, 0, sizeof r);
    CHECK(loom_plan_layout_parse(layout, j, &l) == LOOM_OK, "parse %s: %s", layout, loom_errmsg());
    CHECK(loom_plan_evaluate(m, c, j, &l, 1, &r) == LOOM_OK, "evaluate %s: %s", layout, loom_errmsg());
    CHECK(r.feasible, "%s feasible (%s)", layout, r.reason);
    return r;
}

/* Layout `lay` evaluated with *knob = a, then with *knob = b. */
static void eval_ab(const loom_plan_model *m, const loom_plan_cluster *c, loom_plan_job *j, const char *lay,
                    int *knob, int a, int b, loom_plan_result out[2]) {
    *knob = a;
    out[0] = eval_layout(m, c, j, lay);
    *knob = b;
    out[1] = eval_layout(m, c, j, lay);
}

/* The H100 80GB preset and Llama 3 8B, which several checks below use. */
static void h100_llama3_8b(loom_plan_cluster *c, loom_plan_model *m) {
    *c = preset("h100-80gb");
    CHECK(loom_plan_model_builtin("llama3-8b", m) == LOOM_OK, "llama3-8b");
}

/* Tied head at pp = 1 (the bug of issue 34: 2.41 Psi instead of 2 Psi). */
static void test_tied_head_dp_bytes(void) {
    const char *models[] = {"gpt2-small", "gpt2-xl"};
    loom_plan_cluster c = preset("dgx-h100");
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        loom_plan_model m;
        CHECK(loom_plan_model_builtin(models[i], &m) == LOOM_OK && m.tied, "%s is tied", models[i]);
        /* every parameter on every rank; the all-reduce after the backward */
        loom_plan_job j = {.batch = 8, .seq = 1024, .bf16 = 1, .gpus = 8, .no_dp_overlap = 1};
        const loom_plan_result r = eval_layout(&m, &c, &j, "dp=8,mbs=1,m=1");
        const double P = loom_plan_model_params(&m, NULL);
        /* 2 bytes per parameter; the planner also charges the (empty)
         * expert group's latency */
        const double want = loom_plan_coll_time(&c, LOOM_COLL_ALLREDUCE, 8, 0, 2 * P) +
                            loom_plan_coll_time(&c, LOOM_COLL_ALLREDUCE, 8, 0, 0);
        CHECK(fabs(r.t_dp / want - 1) < 1e-9, "%s: DP all-reduce %.6g s == 2 bytes x %.4g params: %.6g s",
              models[i], r.t_dp, P, want);
        const double state = r.mem_params + r.mem_grads + r.mem_opt;
        CHECK(fabs(state / (16 * P) - 1) < 1e-9, "%s: model state %.4g GB == 16 x params %.4g GB", models[i],
              state / 1e9, 16 * P / 1e9);
    }
}

/* SP's exposed time equals TP's on GPU stacks; loom's fp32 stack pays its
 * two blocking backward re-gathers per layer (5/4 of TP's). */
static void test_sp_equals_tp(void) {
    loom_plan_cluster c = preset("dgx-h100");
    loom_plan_model m;
    loom_plan_model_builtin("llama3-8b", &m);
    loom_plan_job j = {.batch = 8, .seq = 8192, .bf16 = 1, .gpus = 8, .flash = 1};
    const loom_plan_result tp = eval_layout(&m, &c, &j, "dp=2,tp=4,pp=1,mbs=1,m=4,recompute=full,sp=0");
    const loom_plan_result sp = eval_layout(&m, &c, &j, "dp=2,tp=4,pp=1,mbs=1,m=4,recompute=full,sp=1");
    CHECK(fabs(sp.t_tp / tp.t_tp - 1) < 1e-9, "bf16: SP exposed %.6g s == TP's %.6g s", sp.t_tp, tp.t_tp);
    loom_plan_model g;
    loom_plan_model_builtin("gpt2-small", &g);
    loom_plan_job jf = {.batch = 16, .seq = 1024, .bf16 = 0, .gpus = 2};
    const loom_plan_result tf = eval_layout(&g, &c, &jf, "dp=1,tp=2,mbs=4,m=4,recompute=none,sp=0");
    const loom_plan_result sf = eval_layout(&g, &c, &jf, "dp=1,tp=2,mbs=4,m=4,recompute=none,sp=1");
    CHECK(fabs(sf.t_tp / tf.t_tp - 1.25) < 1e-9, "fp32 (loom): SP %.6g s == 5/4 x TP's %.6g s", sf.t_tp,
          tf.t_tp);
}

/* GPT-2 small, one 1024-token sequence, bf16, flash, no recompute:
 * Korthikanti et al. 2022 (arXiv:2205.05198) section 4.1: 34 s b h bytes a
 * layer, of which the two dropout masks are 2 s b h (1 byte each, after the
 * projection and after the MLP); FlashAttention keeps no 5 a s^2 b. */
static void test_activation_memory(void) {
    loom_plan_cluster c = preset("a100-80gb");
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    const double s = 1024, b = 1, h = m.hidden, L = m.layers, V = m.vocab;
    loom_plan_job j = {.batch = 1, .seq = 1024, .bf16 = 1, .gpus = 1, .flash = 1};
    const char *lay = "dp=1,mbs=1,m=1,recompute=none";
    const loom_plan_result nodrop = eval_layout(&m, &c, &j, lay);
    const double logits = 8 * s * b * V; /* fp32 logits and their gradient */
    const double want = L * 32 * s * b * h + logits;
    CHECK(fabs(nodrop.mem_act / want - 1) < 1e-9,
          "no dropout: activations %.4f GB == 12 x 32 s b h + 8 s V = %.4f GB", nodrop.mem_act / 1e9,
          want / 1e9);
    j.dropout = 1;
    const loom_plan_result drop = eval_layout(&m, &c, &j, lay);
    CHECK(fabs((drop.mem_act - logits) / (L * 34 * s * b * h) - 1) < 1e-9,
          "dropout: layers %.4f GB == 12 x 34 s b h = %.4f GB", (drop.mem_act - logits) / 1e9,
          L * 34 * s * b * h / 1e9);
    j.dropout = 0, j.loss_chunks = 4;
    const loom_plan_result chunks = eval_layout(&m, &c, &j, lay);
    CHECK(fabs(nodrop.mem_act - chunks.mem_act - 0.75 * logits) < 1e-6 * logits,
          "4 loss chunks keep a quarter of the logits: %.4f GB less, want %.4f",
          (nodrop.mem_act - chunks.mem_act) / 1e9, 0.75 * logits / 1e9);
    /* the logits live on the last stage only: pp = 2's first stage holds
     * 6 layers and no logits (1F1B: 2 micro-batches in flight there) */
    loom_plan_job jp = {.batch = 2, .seq = 1024, .bf16 = 1, .gpus = 2, .flash = 1};
    const loom_plan_result pp = eval_layout(&m, &c, &jp, "dp=1,pp=2,mbs=1,m=2,recompute=none");
    CHECK(pp.mem_act < 2 * 6 * 34 * s * b * h + logits, "pp=2: the most loaded stage %.4f GB",
          pp.mem_act / 1e9);
    /* the capacity is the card's: 81920 MiB on an A100 80GB */
    CHECK(fabs(c.memory - 81920.0 * 1048576) < 1e6, "A100 80GB addresses 81920 MiB: %.4g B", c.memory);
}

/* ZeRO-3 (FSDP) of Llama 3 8B over 8 GPUs: the shard of 16 bytes a
 * parameter, two units gathered (bf16) and one unit's gradients (bf16)
 * before the reduce-scatter; torchtitan ran it at 8192 tokens with full
 * activation checkpointing on H100s, so it must fit one. */
static void test_zero3_memory(void) {
    loom_plan_cluster c;
    loom_plan_model m;
    h100_llama3_8b(&c, &m);
    loom_plan_job j = {.batch = 8, .seq = 8192, .bf16 = 1, .gpus = 8, .flash = 1};
    const loom_plan_result r = eval_layout(&m, &c, &j, "dp=8,zero=3,mbs=1,m=1,recompute=full");
    const double P = loom_plan_model_params(&m, NULL);
    const double h = m.hidden, kv = h / m.heads * m.kv_heads;
    /* the largest unit: the embedding or the head, 128256 x 4096 (a block
     * is 2 h^2 + 2 h kv + 3 h F + 2 h = 218 M) */
    const double unit = (double)m.vocab * h;
    CHECK(unit > 2 * h * h + 2 * h * kv + 3 * h * m.ffn + 2 * h, "the head outweighs a block");
    const double want = 16 * P / 8 + 2 * 2 * unit + 2 * unit;
    const double got = r.mem_params + r.mem_grads + r.mem_opt;
    CHECK(fabs(got / want - 1) < 0.01, "ZeRO-3 state %.3f GB == 16 P / 8 + 3 layers x 2 B = %.3f GB",
          got / 1e9, want / 1e9);
    CHECK(r.mem_total < c.memory, "Llama 3 8B FSDP over 8 at 8K fits an H100: %.1f GB", r.mem_total / 1e9);
    /* DeepSpeed's stage3_max_live_parameters: at most 1e8 gathered
     * parameters instead of two units; nothing else changes */
    j.zero3_live = 1e8;
    const loom_plan_result d = eval_layout(&m, &c, &j, "dp=8,zero=3,mbs=1,m=1,recompute=full");
    CHECK(fabs((r.mem_params - d.mem_params) / ((2 * unit - 1e8) * 2) - 1) < 1e-9,
          "live limit: %.3f GB fewer == (2 units - 1e8) x 2 B = %.3f GB", (r.mem_params - d.mem_params) / 1e9,
          (2 * unit - 1e8) * 2 / 1e9);
    CHECK(d.mem_grads == r.mem_grads && d.mem_opt == r.mem_opt && d.t_step == r.t_step,
          "gradients, optimizer and step time unchanged");
}

/* ZeRO-3 gathers per parameter tensor (DeepSpeed) instead of per unit
 * (FSDP): Llama 3 8B's tensors counted by hand, 9 a block (q, k, v, o, gate,
 * up, down, two RMSNorms) x 32 + embedding + final norm + head = 291 against
 * 32 blocks + embedding + head = 34 units; over 8 GPUs of one node each
 * extra gather is a ring of 7 NVLink steps. With nothing hidden
 * (overlap 0) the step grows by forward + backward x 257 x 7 latencies. */
static void test_zero3_gathers(void) {
    loom_plan_cluster c;
    loom_plan_model m;
    h100_llama3_8b(&c, &m);
    c.overlap = 0;
    loom_plan_job j = {.batch = 8, .seq = 4096, .bf16 = 1, .gpus = 8, .flash = 1};
    loom_plan_result r[2];
    eval_ab(&m, &c, &j, "dp=8,zero=3,mbs=1,m=1,recompute=full", &j.zero3_per_param, 0, 1, r);
    const double want = 2 * (291 - 34) * 7 * c.intra_lat;
    CHECK(want > 0 && fabs((r[1].t_step - r[0].t_step) / want - 1) < 1e-6,
          "per-parameter gathers add %.4g ms == 2 x 257 x 7 x %.3g us = %.4g ms",
          1e3 * (r[1].t_step - r[0].t_step), 1e6 * c.intra_lat, 1e3 * want);
    CHECK(r[1].mem_total == r[0].mem_total, "memory unchanged");
    /* ZeRO-2: nothing is gathered per pass, so nothing changes */
    eval_ab(&m, &c, &j, "dp=8,zero=2,mbs=1,m=1,recompute=full", &j.zero3_per_param, 0, 1, r);
    CHECK(r[1].t_step == r[0].t_step, "ZeRO-2 unchanged");
}

/* Measured FlashAttention-2 on H100 (the preset's attention_tflops). */
static void test_attention_terms(void) {
    loom_plan_cluster c = preset("h100-80gb");
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    double prev = 0;
    /* 64K tokens a micro-batch at every length: the same GEMMs */
    for (int s = 2048; s <= 65536; s *= 2) {
        const int mbs = 65536 / s;
        loom_plan_job j = {
            .batch = 8 * mbs, .seq = s, .bf16 = 1, .gpus = 8, .attn = LOOM_PLAN_ATTN_FLASH2, .flash = 1};
        m.max_seq = s;
        char lay[96];
        snprintf(lay, sizeof lay, "dp=8,mbs=%d,m=1,recompute=none", mbs);
        const loom_plan_result r = eval_layout(&m, &c, &j, lay);
        const double per_tok = 1 / r.tokens_per_s_dev;
        CHECK(per_tok > prev, "seq %d: time per token %.4g us grows with length (was %.4g)", s, 1e6 * per_tok,
              1e6 * prev);
        prev = per_tok;
        CHECK(!r.mfu_capped && r.mfu <= 1, "seq %d: MFU %.1f%% not above peak", s, 100 * r.mfu);
        /* FA2's backward runs below its forward's FLOP/s: more than twice
         * the forward's time */
        CHECK(r.sim_b > 2 * r.sim_f, "seq %d: backward %.4g s > 2 x forward %.4g s", s, r.sim_b, r.sim_f);
    }
    /* a kernel claimed 100 x faster than measured: the step would beat
     * peak; flagged, the MFU capped */
    loom_plan_attn_table *t = &c.attn[LOOM_PLAN_ATTN_FLASH2];
    for (int hd = 0; hd < 3; hd++)
        for (int i = 0; i < t->n_seq; i++) t->fwd[hd][i] *= 100, t->bwd[hd][i] *= 100;
    c.n_gemm = 0, c.gemm_eff = 1.5; /* and GEMMs above peak */
    loom_plan_job j = {
        .batch = 8, .seq = 65536, .bf16 = 1, .gpus = 8, .attn = LOOM_PLAN_ATTN_FLASH2, .flash = 1};
    const loom_plan_result r = eval_layout(&m, &c, &j, "dp=8,mbs=1,m=1,recompute=none");
    CHECK(r.mfu_capped && r.mfu <= 1 && strstr(r.failures, "impossible"), "above peak flagged: %s (MFU %.2f)",
          r.failures, r.mfu);
}

/* Eager composites cost more than fused kernels; the loss over the
 * vocabulary weighs more on a narrow model. */
static void test_elementwise_and_loss(void) {
    loom_plan_cluster c;
    loom_plan_model m;
    h100_llama3_8b(&c, &m);
    loom_plan_job j = {.batch = 8, .seq = 8192, .bf16 = 1, .gpus = 8, .flash = 1};
    loom_plan_result fe[2];
    eval_ab(&m, &c, &j, "dp=8,zero=3,mbs=1,m=1,recompute=full", &j.elementwise, 2, 1, fe);
    const loom_plan_result fused = fe[0], eager = fe[1];
    CHECK(eager.tokens_per_s_dev < fused.tokens_per_s_dev, "eager %.0f < fused %.0f tokens/s",
          eager.tokens_per_s_dev, fused.tokens_per_s_dev);
    /* the loss's share: 36 bytes a logit at HBM bandwidth per token, over
     * the step's time per token, for GPT-2 small and GPT-2 XL */
    const char *names[] = {"gpt2-small", "gpt2-xl"};
    double share[2];
    for (int i = 0; i < 2; i++) {
        loom_plan_model g;
        CHECK(loom_plan_model_builtin(names[i], &g) == LOOM_OK, "%s", names[i]);
        loom_plan_job jg = {.batch = 8, .seq = 1024, .bf16 = 1, .gpus = 8, .flash = 1};
        const loom_plan_result r = eval_layout(&g, &c, &jg, "dp=8,mbs=1,m=1,recompute=none");
        share[i] = 36.0 * g.vocab / c.hbm_bw * r.tokens_per_s_dev;
    }
    CHECK(share[0] > 2 * share[1] && share[0] > 0.05, "loss share: gpt2-small %.1f%% > 2 x gpt2-xl %.1f%%",
          100 * share[0], 100 * share[1]);
}

/* A collective over 16 ranks on 2 DGX nodes: 8 ranks of each node cross
 * the boundary over 8 NICs; one rank per node over one. */
static void test_network_hierarchy(void) {
    const loom_plan_cluster c = preset("h100-80gb");
    const double bytes = 4e9;
    const double one = loom_plan_coll_time_k(&c, LOOM_COLL_ALLGATHER, 16, 1, bytes);
    const double eight = loom_plan_coll_time_k(&c, LOOM_COLL_ALLGATHER, 16, 8, bytes);
    CHECK(one / eight > 7.7 && one / eight <= 8, "8 ranks a node: %.4g s, 1/8 of one rank a node's %.4g s",
          eight, one);
    /* one NIC (50 GB/s) at the collective efficiency carries 15/16 of the bytes */
    const double nic = c.nic_bw * c.coll_eff;
    CHECK(fabs(one / (bytes * 15 / 16 / nic) - 1) < 0.01,
          "one rank a node: %.4g s == 15/16 x 4 GB / %.3g GB/s", one, nic / 1e9);
    /* ZeRO-3 over 16 ranks (tp innermost = 1): the whole nodes' NICs */
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("llama3-8b", &m) == LOOM_OK, "llama3-8b");
    loom_plan_job j = {.batch = 16, .seq = 8192, .bf16 = 1, .gpus = 16, .flash = 1, .no_dp_overlap = 1};
    const loom_plan_result r = eval_layout(&m, &c, &j, "dp=16,zero=1,mbs=1,m=1,recompute=full");
    const double P = loom_plan_model_params(&m, NULL);
    const double ar8 = loom_plan_coll_time_k(&c, LOOM_COLL_ALLREDUCE, 16, 8, 2 * P);
    CHECK(r.t_dp < 1.01 * ar8 + 1e-3 && r.t_dp > 0.99 * ar8,
          "ZeRO-1 over 2 nodes: %.4g s == 8-NIC all-reduce %.4g s", r.t_dp, ar8);
}

/* --fix tp=2,zero=1: every layout the search returns has them. */
static void test_fix(void) {
    const loom_plan_cluster c = preset("h100-80gb");
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("llama3-8b", &m) == LOOM_OK, "llama3-8b");
    loom_plan_layout fixed;
    memset(&fixed, 0, sizeof fixed);
    loom_plan_job j = {.batch = 64, .seq = 2048, .bf16 = 1, .gpus = 16, .flash = 1};
    CHECK(loom_plan_fix_parse("tp=2,zero=1,recompute=op", &j.fix, &fixed) == LOOM_OK, "fix: %s",
          loom_errmsg());
    j.fixed = &fixed;
    loom_plan_result out[5];
    int n = 0;
    loom_plan_search_stats st;
    CHECK(loom_plan_search(&m, &c, &j, 5, out, &n, &st) == LOOM_OK && n > 0, "search: %s", loom_errmsg());
    for (int i = 0; i < n; i++)
        CHECK(out[i].l.tp == 2 && out[i].l.zero == 1 && out[i].l.recompute == LOOM_PLAN_RECOMPUTE_OP,
              "#%d: tp=%d zero=%d recompute=%d", i, out[i].l.tp, out[i].l.zero, (int)out[i].l.recompute);
    unsigned mask = 0;
    CHECK(loom_plan_fix_parse("tpp=2", &mask, &fixed) != LOOM_OK, "--fix tpp=2 refused");
}

/* FP8 weights (Transformer Engine's fp8 parameters, Megatron-Bridge's FP8
 * recipes): the FP8 copy beside the bf16 weights is gone, exactly one byte
 * a weight of the rank; nothing else changes. */
static void test_fp8_params(void) {
    loom_plan_cluster c;
    loom_plan_model m;
    h100_llama3_8b(&c, &m);
    loom_plan_job j = {.batch = 8, .seq = 4096, .bf16 = 1, .fp8 = 1, .gpus = 8, .flash = 1};
    loom_plan_result co[2];
    eval_ab(&m, &c, &j, "dp=4,tp=2,zero=1,sp=1,mbs=1,m=2,recompute=none", &j.fp8_params, 0, 1, co);
    const loom_plan_result copy = co[0], own = co[1];
    /* the rank's dense weights at tp 2, tied = no: (P - norms) / 2 + norms */
    const double P = loom_plan_model_params(&m, NULL), norms = m.layers * 2.0 * m.hidden + m.hidden;
    const double rank_w = (P - norms) / 2 + norms;
    CHECK(fabs((copy.mem_params - own.mem_params) / rank_w - 1) < 0.001,
          "fp8 params drop one byte a weight: %.3f GB == %.3f GB", (copy.mem_params - own.mem_params) / 1e9,
          rank_w / 1e9);
    CHECK(fabs(own.mem_params / rank_w - 2) < 0.001, "FP8 data and transpose: 2 bytes a weight (%.3f GB)",
          own.mem_params / 1e9);
    CHECK(own.mem_grads == copy.mem_grads && own.mem_opt == copy.mem_opt && own.mem_act == copy.mem_act,
          "gradients, optimizer and activations unchanged");
    CHECK(own.t_step == copy.t_step, "the step time unchanged");
}

/* FP8 casts (per-tensor scaling, fused cast-transpose): Llama 3 8B at tp 2
 * with SP, 4,096 tokens: forward, the QKV and MLP inputs (2,048 channels a
 * rank with SP), the projection input (2,048) and the down projection input
 * (14,336 / 2) at 2 + 2 + 1 + 1 = 6 bytes an element; backward, the output
 * gradients of QKV (2,048 + 2 x 512), of the projection and the down
 * projection (2,048 each) and of gate and up (2 x 7,168), likewise. */
static void test_fp8_casts(void) {
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("llama3-8b", &m) == LOOM_OK, "llama3-8b");
    loom_plan_job j = {.batch = 1, .seq = 4096, .bf16 = 1, .gpus = 2, .flash = 1};
    loom_plan_layout l;
    CHECK(loom_plan_layout_parse("dp=1,tp=2,sp=1,mbs=1,m=1,recompute=none", &j, &l) == LOOM_OK, "layout");
    double b16 = 0, b8 = 0;
    const double f16 = loom_plan_elementwise_bytes(&m, &j, &l, &b16, NULL);
    j.fp8 = 1;
    const double f8 = loom_plan_elementwise_bytes(&m, &j, &l, &b8, NULL);
    const double n = 4096, in = 2048 + 2048 + 2048 + 7168, go = (2048 + 2 * 512) + 2 * 2048 + 2 * 7168;
    CHECK(fabs((f8 - f16) / (6 * n * in) - 1) < 1e-9, "forward casts %.1f MB == %.1f MB", (f8 - f16) / 1e6,
          6 * n * in / 1e6);
    CHECK(fabs((b8 - b16) / (6 * n * go) - 1) < 1e-9, "backward casts %.1f MB == %.1f MB", (b8 - b16) / 1e6,
          6 * n * go / 1e6);
}

int main(void) {
    test_tied_head_dp_bytes();
    test_sp_equals_tp();
    test_activation_memory();
    test_zero3_memory();
    test_zero3_gathers();
    test_attention_terms();
    test_elementwise_and_loss();
    test_network_hierarchy();
    test_fix();
    test_fp8_params();
    test_fp8_casts();
    return check_done();
}
