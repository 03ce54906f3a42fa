/* test_plan.c - the planner (include/loom/plan.h), pure:
 *  - the bubble a layout reports is the simulator's: loom_sim_run on the
 *    schedule lists with the costs the planner says it used gives the same
 *    bubble and step (every schedule, v > 1, uneven stages);
 *  - layouts that break divisibility or memory are rejected with the reason;
 *  - HF config.json for Llama and Mixtral keys; parameter counts of known
 *    models (Llama 3 70B 70.6 B, Mixtral 8x7B 46.7 B total / 12.9 B active);
 *  - memory falls by the ZeRO stage as the formulas say;
 *  - a 16,384-GPU search answers in under a second;
 *  - cp: the bytes a rank sends per step equal docs/context-parallel.md's
 *    formulas (ring, Ulysses, all-gather; MHA fp32 and GQA bf16), and "CP
 *    communication exposed" is named when the attention is too short to hide
 *    the ring, not when it is long;
 *  - GEMM efficiency by size interpolates the cluster's curve;
 *  - the element-wise bytes of a layer equal a hand count of its kernels
 *    (GPT as Megatron-LM 2021 runs it, with and without flash attention;
 *    Llama-style), and the step time grows by them at HBM bandwidth;
 *  - gradient accumulation costs 3 x 2 bytes per parameter per extra
 *    micro-batch; ZeRO-3's reduce-scatter hides only where the backward's
 *    gathers leave room;
 *  - devices that share cores (cores_per_node): pipelines faster than on
 *    independent devices, with the simulator's bubble; all-busy layouts,
 *    enough cores or no key: unchanged;
 *  - fp32 (loom): the attention backward's recomputed QK^T is charged, a
 *    hand count of 2 b s^2 h per layer at the GEMM curve; bf16 unchanged. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "loom/plan.h"
#include "loom/sim.h"

static loom_plan_cluster h100(void) {
    loom_plan_cluster c;
    loom_status st = loom_plan_cluster_load("dgx-h100", &c);
    CHECK(st == LOOM_OK, "dgx-h100 preset: %s", loom_errmsg());
    return c;
}

static void test_bubble_is_simulators(void) {
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("llama3-70b", &m) == LOOM_OK, "llama3-70b");
    loom_plan_cluster c = h100();
    loom_plan_job j = {.batch = 512, .seq = 4096, .bf16 = 1, .gpus = 256};
    const char *layouts[] = {
        "dp=8,tp=8,pp=4,zero=1,sp=1,schedule=1f1b,m=16,recompute=selective",
        "dp=8,tp=8,pp=4,zero=1,sp=1,schedule=gpipe,m=8,recompute=full",
        "dp=4,tp=8,pp=8,zero=1,sp=1,schedule=interleaved,m=128,v=2,recompute=selective",
        "dp=4,tp=8,pp=8,zero=1,sp=1,schedule=zb,m=32,recompute=full",
        "dp=2,tp=8,pp=16,zero=1,sp=1,schedule=1f1b,m=32,recompute=full", /* 80 layers over 16: 5 each, head extra */
        "dp=8,tp=4,pp=8,cp=1,zero=2,sp=1,schedule=interleaved,m=8,v=5,recompute=full",
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        loom_plan_layout l;
        CHECK(loom_plan_layout_parse(layouts[i], &j, &l) == LOOM_OK, "parse %s: %s", layouts[i],
              loom_errmsg());
        loom_plan_result r;
        CHECK(loom_plan_evaluate(&m, &c, &j, &l, 1, &r) == LOOM_OK, "evaluate %s: %s", layouts[i],
              loom_errmsg());
        CHECK(r.feasible, "%s feasible (%s)", layouts[i], r.reason);
        CHECK(r.simulated, "%s: bubble from the simulator", layouts[i]);
        /* replay: the same schedule, the costs the planner reports, the partitioner's scale */
        loom_schedule *s = NULL;
        CHECK(loom_schedule_build(l.sched, l.pp, l.m, l.v, &s) == LOOM_OK, "build");
        const int S = l.pp * l.v;
        int counts[128];
        double scale[128];
        /* the head's cost in layers: its FLOPs over a layer's, each at its GEMM efficiency */
        const double b = l.mbs, sq = j.seq, h = m.hidden, hd = h / m.heads;
        const double layer =
            2 * b * sq * (2 * h * h + 2 * h * hd * m.kv_heads + 3 * h * m.ffn) + 4 * b * sq * sq * h;
        const double head = r.head_cost;
        CHECK(head > 0.5 * 2 * b * sq * h * m.vocab / layer && head < 2 * 2 * b * sq * h * m.vocab / layer,
              "%s: head cost %.3f layers, near its FLOP share %.3f", layouts[i], head,
              2 * b * sq * h * m.vocab / layer);
        CHECK(loom_partition_balance(m.layers, l.pp, l.v, 0, head, counts) == LOOM_OK, "partition");
        double max_rank = 0;
        for (int rk = 0; rk < l.pp; rk++) {
            double cost = 0;
            for (int ch = 0; ch < l.v; ch++)
                cost += loom_partition_stage_cost(counts, S, ch * l.pp + rk, 0, head);
            if (cost > max_rank) max_rank = cost;
        }
        for (int v = 0; v < S; v++)
            scale[v] = loom_partition_stage_cost(counts, S, v, 0, head) / (max_rank / l.v);
        loom_sim_costs sc;
        loom_sim_costs_default(&sc);
        sc.f = r.sim_f, sc.b = r.sim_b, sc.w = r.sim_w, sc.comm = r.sim_comm;
        sc.stage_scale = scale;
        loom_sim_result *res = NULL;
        CHECK(loom_sim_run(s, &sc, &res) == LOOM_OK, "sim");
        if (res) {
            CHECK(fabs(res->bubble - r.bubble) < 1e-12, "%s: planner bubble %.9f == simulator %.9f",
                  layouts[i], r.bubble, res->bubble);
            CHECK(fabs(res->makespan - (r.t_step - r.t_dp)) < 0.05 * r.t_step,
                  "%s: step %.4f = makespan %.4f + dp %.4f + optimizer", layouts[i], r.t_step, res->makespan,
                  r.t_dp);
            CHECK(loom_schedule_peak_live(s, 0) == r.in_flight, "%s: in flight %d == schedule's peak live %d",
                  layouts[i], r.in_flight, loom_schedule_peak_live(s, 0));
        }
        loom_sim_free(res);
        loom_schedule_free(s);
    }
}

static void expect_reject(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                          const char *layout, const char *needle) {
    loom_plan_layout l;
    CHECK(loom_plan_layout_parse(layout, j, &l) == LOOM_OK, "parse %s: %s", layout, loom_errmsg());
    loom_plan_result r;
    CHECK(loom_plan_evaluate(m, c, j, &l, 1, &r) == LOOM_OK, "evaluate %s", layout);
    CHECK(!r.feasible, "%s rejected", layout);
    CHECK(strstr(r.reason, needle) != NULL, "%s: reason '%s' names '%s'", layout, r.reason, needle);
}

static void test_rejections(void) {
    loom_plan_model m;
    loom_plan_model_builtin("llama3-70b", &m);
    loom_plan_cluster c = h100();
    loom_plan_job j = {.batch = 512, .seq = 4096, .bf16 = 1, .gpus = 64};
    expect_reject(&m, &c, &j, "dp=64", "memory"); /* 70B x 16 bytes on one device */
    expect_reject(&m, &c, &j, "dp=64", "over by");
    expect_reject(&m, &c, &j, "dp=1,tp=1,pp=64,schedule=gpipe,m=64,mbs=8",
                  "activations"); /* 64 sets in flight */
    loom_plan_job j3 = {.batch = 512, .seq = 4096, .bf16 = 1, .gpus = 48};
    expect_reject(&m, &c, &j3, "dp=16,tp=3", "tp=3 does not divide n_head=64");
    loom_plan_job j2 = {.batch = 100, .seq = 4096, .bf16 = 1, .gpus = 64};
    expect_reject(&m, &c, &j2, "dp=8,tp=8", "dp=8 does not divide --batch 100");
    loom_plan_job j4 = {.batch = 512, .seq = 4096, .bf16 = 1, .gpus = 1024};
    expect_reject(&m, &c, &j4, "dp=1,tp=8,pp=128", "128 virtual stages but the model has 80 layers");
    expect_reject(&m, &c, &j4, "dp=64,tp=8,pp=2,schedule=interleaved,v=2,m=3,mbs=2",
                  "mbs=2 x m=3 = 6, but a dp rank has 8 sequences");
    loom_plan_job j6 = {.batch = 384, .seq = 4096, .bf16 = 1, .gpus = 1024};
    expect_reject(&m, &c, &j6, "dp=64,tp=8,pp=2,schedule=interleaved,v=2,m=3", "divisible by pp=2");
    loom_plan_model mx;
    loom_plan_model_builtin("mixtral-8x7b", &mx);
    expect_reject(&mx, &c, &j4, "dp=128,tp=8,ep=3", "ep=3 must divide dp*cp=128");
    loom_plan_job j5 = {.batch = 512, .seq = 4000, .bf16 = 1, .gpus = 1024};
    expect_reject(&mx, &c, &j5, "dp=32,tp=8,cp=3", "= 768 ranks, but the job has 1024 ranks");
    loom_plan_layout l;
    CHECK(loom_plan_layout_parse("dp=2,bogus=3", &j, &l) == LOOM_EUSAGE, "unknown key rejected");
    CHECK(strstr(loom_errmsg(), "bogus") != NULL, "message names the key: %s", loom_errmsg());
    CHECK(loom_plan_layout_parse("dp=2,order=tp,dp,cp", &j, &l) == LOOM_EUSAGE, "bad order rejected");
}

static void test_models(void) {
    loom_plan_model m;
    double active, total;
    loom_plan_model_builtin("llama3-70b", &m);
    total = loom_plan_model_params(&m, &active);
    CHECK(fabs(total / 70.55e9 - 1) < 0.01, "llama3-70b %.4g params (70.55 B)", total);
    loom_plan_model_builtin("mixtral-8x7b", &m);
    total = loom_plan_model_params(&m, &active);
    CHECK(fabs(total / 46.70e9 - 1) < 0.01, "mixtral-8x7b %.4g params (46.7 B)", total);
    CHECK(fabs(active / 12.88e9 - 1) < 0.01, "mixtral-8x7b %.4g active (12.9 B)", active);
    loom_plan_model_builtin("gpt2-small", &m);
    total = loom_plan_model_params(&m, &active);
    CHECK(fabs(total - 124439808) < 1, "gpt2-small %.0f params (124,439,808)", total);
    const char *dir = check_scratch_dir("plan");
    if (!dir) return;
    const char *mix =
        "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 32, \"hidden_size\": 4096,"
        " \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"intermediate_size\": 14336,"
        " \"vocab_size\": 32000, \"max_position_embeddings\": 32768, \"num_local_experts\": 8,"
        " \"num_experts_per_tok\": 2, \"tie_word_embeddings\": false}";
    const char *p = check_scratch_path("mixtral.json");
    check_write_bytes(p, mix, strlen(mix));
    loom_plan_model f;
    CHECK(loom_plan_model_resolve(p, &f) == LOOM_OK, "load mixtral config: %s", loom_errmsg());
    loom_plan_model_builtin("mixtral-8x7b", &m);
    CHECK(f.layers == m.layers && f.hidden == m.hidden && f.kv_heads == 8 && f.experts == 8 && f.topk == 2 &&
              f.gated && !f.tied,
          "mixtral config.json = the built-in shape");
    const char *bad = "{\"model_type\": \"llama\", \"num_hidden_layers\": 32, \"hidden_size\": 4096.5,"
                      " \"num_attention_heads\": 32, \"intermediate_size\": 64, \"vocab_size\": 10}";
    p = check_scratch_path("bad.json");
    check_write_bytes(p, bad, strlen(bad));
    CHECK(loom_plan_model_resolve(p, &f) == LOOM_ECONFIG, "non-integer hidden_size rejected");
    CHECK(strstr(loom_errmsg(), "hidden_size") != NULL, "message names the key: %s", loom_errmsg());
    /* training's reader: DeepSeek-V3's MoE keys read as loom train reads them,
     * its multi-head latent attention refused by name as there */
    const char *ds = "{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 256,"
                     " \"num_attention_heads\": 4, \"intermediate_size\": 512, \"vocab_size\": 1000,"
                     " \"n_routed_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 96,"
                     " \"n_group\": 1, \"topk_group\": 1}";
    p = check_scratch_path("deepseek.json");
    check_write_bytes(p, ds, strlen(ds));
    CHECK(loom_plan_model_resolve(p, &f) == LOOM_OK, "load deepseek config: %s", loom_errmsg());
    CHECK(f.experts == 16 && f.topk == 4 && f.ffn == 96 && f.gated && !f.tied && !f.learned_pos &&
              f.loom_trains,
          "deepseek config.json: 16 experts of 96, top 4 (got %d of %d, top %d)", f.experts, f.ffn, f.topk);
    const char *mla = "{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 256,"
                      " \"num_attention_heads\": 4, \"intermediate_size\": 512, \"vocab_size\": 1000,"
                      " \"kv_lora_rank\": 64, \"n_group\": 1, \"topk_group\": 1}";
    p = check_scratch_path("mla.json");
    check_write_bytes(p, mla, strlen(mla));
    CHECK(loom_plan_model_resolve(p, &f) == LOOM_ECONFIG && strstr(loom_errmsg(), "kv_lora_rank"),
          "an MLA config is refused naming kv_lora_rank, as loom train refuses it: %s", loom_errmsg());
    CHECK(loom_plan_model_resolve("/nonexistent/config.json", &f) == LOOM_ENOINPUT, "missing file");
}

static void test_zero_memory(void) {
    loom_plan_model m;
    loom_plan_model_builtin("llama3-8b", &m);
    loom_plan_cluster c = h100();
    loom_plan_job j = {.batch = 64, .seq = 4096, .bf16 = 1, .gpus = 8};
    const double P = loom_plan_model_params(&m, NULL);
    double prev = INFINITY;
    for (int z = 0; z <= 3; z++) {
        char text[128];
        snprintf(text, sizeof text, "dp=8,zero=%d,recompute=full", z);
        loom_plan_layout l;
        loom_plan_layout_parse(text, &j, &l);
        loom_plan_result r;
        loom_plan_evaluate(&m, &c, &j, &l, 1, &r);
        const double state = r.mem_params + r.mem_grads + r.mem_opt;
        const double want = z == 0   ? 16 * P
                            : z == 1 ? 4 * P + 12 * P / 8
                            : z == 2 ? 2 * P + 14 * P / 8
                                     : 16 * P / 8 + 3 * 2 * (double)m.vocab * m.hidden;
        /* zero 3 adds two gathered units and one unit's gradients, the
         * largest unit being the head (or the embedding), V x h */
        CHECK(fabs(state - want) < 1e-6 * want, "zero=%d model state %.4g GB, formula %.4g GB", z,
              state / 1e9, want / 1e9);
        CHECK(state < prev, "zero=%d saves memory", z);
        prev = state;
    }
}

static void test_16k_speed(void) {
    loom_plan_model m;
    loom_plan_model_builtin("llama3-405b", &m);
    loom_plan_cluster c = h100();
    c.nodes = 2048;
    loom_plan_job j = {.batch = 2048, .seq = 8192, .bf16 = 1, .gpus = 16384};
    loom_plan_result out[5];
    int n = 0;
    loom_plan_search_stats st;
    /* the planner's own CPU time (the machine is shared: wall time also
     * counts other jobs' turns on the cores); wall time is printed */
    struct timespec t0, t1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    CHECK(loom_plan_search(&m, &c, &j, 5, out, &n, &st) == LOOM_OK, "search: %s", loom_errmsg());
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    const double cpu = (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec);
    printf("16,384 GPUs, llama3-405b: %ld layouts, %ld feasible, %.3f s CPU, %.3f s wall\n", st.considered,
           st.feasible, cpu, secs);
#ifdef LOOM_SANITIZED
    const double limit = 4.0; /* ASan + UBSan + -O0 run this search ~3x slower */
#else
    const double limit = 1.0; /* the target, in a Release build */
#endif
    CHECK(cpu < limit, "16,384-GPU search in %.3f s of CPU (< %g s)", cpu, limit);
    CHECK(n == 5 && out[0].feasible && out[0].simulated, "5 ranked layouts, the best simulated");
    for (int i = 1; i < n; i++)
        CHECK(out[i].tokens_per_s_dev <= out[i - 1].tokens_per_s_dev, "ranked by tokens/s/device");
    CHECK(st.rejected_memory > 0 && st.rejected_divide > 0,
          "rejections counted (%ld memory, %ld divisibility)", st.rejected_memory, st.rejected_divide);
}

static loom_plan_result eval_layout(const loom_plan_model *m, const loom_plan_cluster *c,
                                    const loom_plan_job *j, const char *layout) {
    loom_plan_layout l;
    loom_plan_result r;
    CHECK(loom_plan_layout_parse(layout, j, &l) == LOOM_OK, "parse %s: %s", layout, loom_errmsg());
    CHECK(loom_plan_evaluate(m, c, j, &l, 1, &r) == LOOM_OK, "evaluate %s: %s", layout, loom_errmsg());
    CHECK(r.feasible, "%s feasible (%s)", layout, r.reason);
    return r;
}

static void test_cp_volume(void) {
    loom_plan_cluster c = h100();
    /* GPT-2 small in fp32 (MHA): docs' ring 8*B*(T/cp)*C*(3cp-2) and Ulysses
     * 48*B*(T/cp)*C bytes per layer and micro-batch, C = n_embd/tp */
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    loom_plan_job j = {.batch = 8, .seq = 4096, .bf16 = 0, .gpus = 8};
    const double B = 2, T = 4096, layers = m.layers, mb = 2; /* batch 8 / dp 2 = 2 x mbs 2 */
    const int cps[] = {2, 4};
    for (int i = 0; i < 2; i++) {
        const int cp = cps[i], tp = 8 / (2 * cp);
        const double C = (double)m.hidden / tp;
        char lay[128];
        snprintf(lay, sizeof lay, "dp=2,tp=%d,cp=%d,mbs=2,m=2,cp_impl=ring", tp, cp);
        loom_plan_result r = eval_layout(&m, &c, &j, lay);
        const double ring = 8 * B * (T / cp) * C * (3 * cp - 2) * layers * mb;
        CHECK(fabs(r.cp_bytes - ring) < 1e-9 * ring, "%s: cp bytes %.6g == docs' ring formula %.6g", lay,
              r.cp_bytes, ring);
        snprintf(lay, sizeof lay, "dp=2,tp=%d,cp=%d,mbs=2,m=2,cp_impl=ulysses", tp, cp);
        r = eval_layout(&m, &c, &j, lay);
        const double uly = 48 * B * (T / cp) * C * layers * mb;
        CHECK(fabs(r.cp_bytes - uly) < 1e-9 * uly, "%s: cp bytes %.6g == docs' Ulysses formula %.6g", lay,
              r.cp_bytes, uly);
    }
    /* Llama 3 8B in bf16 (GQA, 8 of 32 heads carry K/V): K/V blocks shrink by kv/heads */
    CHECK(loom_plan_model_builtin("llama3-8b", &m) == LOOM_OK, "llama3-8b");
    j = (loom_plan_job){.batch = 2, .seq = 32768, .bf16 = 1, .gpus = 16, .flash = 1};
    const double Ckv = 4096.0 / 2 * 8 / 32, n = 32768.0 / 8;
    loom_plan_result r = eval_layout(&m, &c, &j, "dp=1,tp=2,cp=8,zero=3,mbs=1,m=2,cp_impl=ring");
    double want = 2 * n * Ckv * 2 * (3 * 8 - 2) * m.layers * 2;
    CHECK(fabs(r.cp_bytes - want) < 1e-9 * want, "llama3-8b ring cp=8: %.6g == %.6g", r.cp_bytes, want);
    r = eval_layout(&m, &c, &j, "dp=1,tp=2,cp=8,zero=3,mbs=1,m=2,cp_impl=allgather");
    want = 3 * (2 * 32768.0 * Ckv * 2) * 7 / 8 * m.layers * 2;
    CHECK(fabs(r.cp_bytes - want) < 1e-9 * want, "llama3-8b all-gather cp=8: %.6g == %.6g", r.cp_bytes, want);
    /* exposed: a short sequence split 8 ways leaves ~128 tokens of attention per
     * ring step, far less than a K/V transfer's latency; hidden: at 128k tokens
     * the attention of a step dwarfs the transfer */
    j = (loom_plan_job){.batch = 8, .seq = 2048, .bf16 = 1, .gpus = 8, .flash = 1};
    r = eval_layout(&m, &c, &j, "dp=1,cp=8,zero=3,mbs=1,m=8,cp_impl=ring");
    CHECK(strstr(r.failures, "CP communication exposed") != NULL,
          "seq 2048 cp=8 ring: failure named (%s), cp %.3g of "
          "step %.3g s",
          r.failures, r.t_cp, r.t_step);
    j = (loom_plan_job){.batch = 1, .seq = 131072, .bf16 = 1, .gpus = 8, .flash = 1};
    r = eval_layout(&m, &c, &j, "dp=1,cp=8,zero=3,mbs=1,m=1,cp_impl=ring,recompute=full");
    CHECK(strstr(r.failures, "CP communication exposed") == NULL && r.t_cp < 0.05 * r.t_step,
          "seq 131072 cp=8 ring: hidden (cp %.3g of step %.3g s; %s)", r.t_cp, r.t_step, r.failures);
    /* Ulysses needs the heads per tp rank divisible by cp */
    j = (loom_plan_job){.batch = 8, .seq = 4096, .bf16 = 1, .gpus = 64};
    expect_reject(&m, &c, &j, "dp=1,tp=8,cp=8,mbs=1,m=8,cp_impl=ulysses",
                  "--cp-impl ulysses: cp=8 must divide the heads per tp rank, n_head=32 / tp=8 = 4");
}

static void test_gemm_curve(void) {
    loom_plan_cluster c = h100();
    CHECK(c.n_gemm >= 2, "dgx-h100 has a GEMM curve (%d points)", c.n_gemm);
    for (int i = 0; i < c.n_gemm; i++)
        CHECK(fabs(loom_plan_gemm_eff(&c, c.gemm_flops[i]) - c.gemm_eff * c.gemm_curve[i]) < 1e-12,
              "point %d exact", i);
    const double mid = sqrt(c.gemm_flops[0] * c.gemm_flops[1]); /* halfway in log(FLOPs) */
    CHECK(fabs(loom_plan_gemm_eff(&c, mid) - 0.5 * (c.gemm_curve[0] + c.gemm_curve[1]) * c.gemm_eff) < 1e-12,
          "log-linear between points");
    CHECK(loom_plan_gemm_eff(&c, 1) == c.gemm_eff * c.gemm_curve[0] &&
              loom_plan_gemm_eff(&c, 1e30) == c.gemm_eff * c.gemm_curve[c.n_gemm - 1],
          "clamped at the ends");
    loom_plan_cluster old; /* a cluster file without a curve: one number for every shape */
    CHECK(loom_plan_cluster_load("dgx2-v100", &old) == LOOM_OK, "dgx2-v100 (no gemm_curve) loads: %s",
          loom_errmsg());
    CHECK(old.n_gemm == 0 && loom_plan_gemm_eff(&old, 1e6) == old.gemm_eff &&
              loom_plan_gemm_eff(&old, 1e12) == 0.7,
          "no curve: efficiency.gemm (0.7) for every size");
}

/* efficiency.hbm: the achievable fraction of hbm_gbps (a measured
 * memory-bound kernel; docs/planning.md). The presets carry their sourced
 * fractions; a file without the key (loom calibrate's, whose hbm_gbps is a
 * measured copy) keeps hbm_gbps as it is; out of (0, 1] is rejected. */
static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "create %s", path);
    if (f) fputs(text, f), fclose(f);
}

static void test_hbm_eff(void) {
    const struct {
        const char *name;
        double gbps, eff;
    } presets[] = {{"dgx-h100", 3350, 0.887}, {"dgx-a100-80gb", 2039, 0.834}, {"dgx2-v100", 900, 0.9}};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        loom_plan_cluster c;
        CHECK(loom_plan_cluster_load(presets[i].name, &c) == LOOM_OK, "%s: %s", presets[i].name,
              loom_errmsg());
        CHECK(c.hbm_eff == presets[i].eff &&
                  fabs(c.hbm_bw / (presets[i].gbps * 1e9 * presets[i].eff) - 1) < 1e-12,
              "%s: achievable HBM %.4g GB/s = %.0f x %.3f", presets[i].name, c.hbm_bw / 1e9, presets[i].gbps,
              presets[i].eff);
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/loom-plan-hbm-%d.json", (int)getpid());
    const char *head =
        "{\"gpus_per_node\": 1, \"memory_gb\": 1, \"peak_tflops\": {\"fp32\": 1}, \"hbm_gbps\": 100,\n"
        " \"intra_node\": {\"bandwidth_gbps\": 1}, ";
    char text[512];
    loom_plan_cluster c;
    snprintf(text, sizeof text, "%s\"efficiency\": {\"gemm\": 1, \"collective\": 1}}\n", head);
    write_file(path, text);
    CHECK(loom_plan_cluster_load(path, &c) == LOOM_OK && c.hbm_eff == 1 && c.hbm_bw == 100e9,
          "no efficiency.hbm: hbm_gbps as given (%.4g GB/s)", c.hbm_bw / 1e9);
    snprintf(text, sizeof text, "%s\"efficiency\": {\"gemm\": 1, \"collective\": 1, \"hbm\": 0.5}}\n", head);
    write_file(path, text);
    CHECK(loom_plan_cluster_load(path, &c) == LOOM_OK && c.hbm_eff == 0.5 && c.hbm_bw == 50e9,
          "efficiency.hbm 0.5: 50 GB/s achievable (%.4g)", c.hbm_bw / 1e9);
    snprintf(text, sizeof text, "%s\"efficiency\": {\"gemm\": 1, \"collective\": 1, \"hbm\": 1.5}}\n", head);
    write_file(path, text);
    CHECK(loom_plan_cluster_load(path, &c) == LOOM_ECONFIG && strstr(loom_errmsg(), "efficiency.hbm"),
          "efficiency.hbm 1.5 rejected: %s", loom_errmsg());
    remove(path);
}

/* Element-wise bytes of one layer: gpt2-small (h 768, 12 heads, ffn 3072),
 * tp=2, micro-batch 2 x 128 tokens, bf16. Hand inventory, per kernel, in
 * bytes read + written (2-byte elements, 1-byte masks): n = 256 tokens,
 * ht = 384 channels per tp rank, 6 heads per rank, sc = 256 x 128 x 6
 * scores, qkv = 3 x 384 channels, ffn per rank 1536. */
static void test_elementwise_bytes(void) {
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    loom_plan_job j = {.batch = 2, .seq = 128, .bf16 = 1};
    loom_plan_layout l;
    CHECK(loom_plan_layout_parse("dp=1,tp=2,mbs=2,m=1", &j, &l) == LOOM_OK, "parse: %s", loom_errmsg());
    const double n = 256, h = 768, ht = 384, qkv = 1152, sc = 256.0 * 128 * 6, F = 1536;
    const double fwd_hand = 2 * 2 * n * h      /* LayerNorm 1: read x, write y */
                            + 2 * 2 * n * qkv  /* QKV bias add: read, write */
                            + 2 * 2 * sc       /* scale+mask+softmax: read scores, write probabilities */
                            + (2 * 2 + 1) * sc /* dropout: read, write, 1-byte mask */
                            + 2 * 2 * n * ht   /* context permute to contiguous */
                            + 2 * 7 * n * h    /* 2 x bias+dropout+add: read out, residual, write, mask */
                            + 2 * 2 * n * h    /* LayerNorm 2 */
                            + 2 * 2 * n * F;   /* bias+GeLU */
    const double bwd_hand =
        2 * 10 * n * h   /* 2 x LayerNorm: read dy, x, write dx; dgamma/dbeta re-read dy, x */
        + 2 * 6 * n * h  /* 2 residual gradient sums */
        + 6 * n * qkv    /* QKV bias gradient + the split's concatenation */
        + 2 * 2 * n * ht /* permute back */
        + 5 * sc         /* dropout back: read grad, mask, write */
        + 6 * sc         /* softmax back: read grad, probabilities, write */
        + 2 * 7 * n * h  /* 2 x bias+dropout+add back (+ bias gradient) */
        + 8 * n * F;     /* GeLU back: read grad, input, write; bias gradient */
    double bwd, sel;
    double fwd = loom_plan_elementwise_bytes(&m, &j, &l, &bwd, &sel);
    CHECK(fabs(fwd - fwd_hand) < 0.5, "GPT forward element-wise %.0f == hand count %.0f", fwd, fwd_hand);
    CHECK(fabs(bwd - bwd_hand) < 0.5, "GPT backward element-wise %.0f == hand count %.0f", bwd, bwd_hand);
    CHECK(fabs(sel - 9 * sc) < 0.5, "selective recompute repeats softmax + dropout: %.0f == %.0f", sel,
          9 * sc);
    /* flash attention: no scores, no permute */
    j.flash = 1;
    double bwd_f, sel_f;
    double fwd_f = loom_plan_elementwise_bytes(&m, &j, &l, &bwd_f, &sel_f);
    CHECK(fabs(fwd_f - (fwd_hand - 9 * sc - 4 * n * ht)) < 0.5, "flash forward %.0f", fwd_f);
    CHECK(fabs(bwd_f - (bwd_hand - 11 * sc - 4 * n * ht)) < 0.5 && sel_f == 0, "flash backward %.0f", bwd_f);
    /* Llama-style (llama3-8b: h 4096, 32 heads, 8 KV heads, ffn 14336), tp=1,
     * one 64-token sequence, flash: RMSNorm x 2, RoPE on q and k, two
     * residual adds, SwiGLU (read gate and up, write) */
    CHECK(loom_plan_model_builtin("llama3-8b", &m) == LOOM_OK, "llama3-8b");
    loom_plan_job jl = {.batch = 1, .seq = 64, .bf16 = 1, .flash = 1};
    CHECK(loom_plan_layout_parse("dp=1,mbs=1,m=1", &jl, &l) == LOOM_OK, "parse: %s", loom_errmsg());
    const double N = 64, H = 4096, KV = 1024, FF = 14336;
    const double lf = 2 * 4 * N * H + 4 * N * (H + KV) + 2 * 6 * N * H + 6 * N * FF;
    const double lb = 2 * 10 * N * H + 2 * 6 * N * H + 4 * N * (H + KV) + 10 * N * FF;
    fwd = loom_plan_elementwise_bytes(&m, &jl, &l, &bwd, NULL);
    CHECK(fabs(fwd - lf) < 0.5 && fabs(bwd - lb) < 0.5, "Llama forward %.0f == %.0f, backward %.0f == %.0f",
          fwd, lf, bwd, lb);
    /* the step of a one-layer-deep view: more element-wise bytes, more time;
     * with scores materialised the batched attention GEMMs are no faster
     * than the score bytes at HBM bandwidth */
    loom_plan_cluster c = h100();
    loom_plan_job jb = {.batch = 8, .seq = 2048, .bf16 = 1, .gpus = 8};
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    CHECK(loom_plan_layout_parse("dp=8,mbs=1,m=1", &jb, &l) == LOOM_OK, "parse: %s", loom_errmsg());
    loom_plan_result r1, r2;
    CHECK(loom_plan_evaluate(&m, &c, &jb, &l, 1, &r1) == LOOM_OK && r1.feasible, "evaluate");
    c.hbm_bw *= 0.5;
    CHECK(loom_plan_evaluate(&m, &c, &jb, &l, 1, &r2) == LOOM_OK && r2.feasible, "evaluate");
    double eb = 0, ef = loom_plan_elementwise_bytes(&m, &jb, &l, &eb, NULL);
    const double extra =
        m.layers * (ef + eb) / (2 * c.hbm_bw); /* half the bandwidth: the element-wise time again */
    CHECK(r2.t_compute - r1.t_compute > 0.99 * extra,
          "halving HBM bandwidth adds at least the element-wise time: "
          "%.4g s > %.4g s",
          r2.t_compute - r1.t_compute, extra);
}

/* Selective recompute follows the stack. GPU stacks (bf16, Megatron-LM's):
 * the whole core attention again, both batched GEMMs at the time the
 * forward charges them - with scores materialised the larger of their FLOPs
 * at the curve and the score bytes at HBM bandwidth, with a flash kernel
 * half the FLOPs at efficiency.attention - plus the softmax and dropout
 * traffic (Korthikanti et al. 2022, section 5). loom's fp32 stack: its
 * attention backward recomputes the probabilities in every mode, so
 * selective costs exactly what none does. gpt2-small on one H100, one
 * 1024-token sequence (no DP, no pipeline: the difference is the recompute). */
static void test_selective_recompute(void) {
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    const loom_plan_cluster c = h100();
    const double s = 1024, h = m.hidden, a = m.heads, L = m.layers;
    for (int flash = 0; flash <= 1; flash++) {
        loom_plan_job j = {.batch = 1, .seq = (int)s, .bf16 = 1, .gpus = 1, .flash = flash};
        loom_plan_layout ln, ls;
        CHECK(loom_plan_layout_parse("dp=1,mbs=1,m=1,recompute=none", &j, &ln) == LOOM_OK, "parse: %s",
              loom_errmsg());
        CHECK(loom_plan_layout_parse("dp=1,mbs=1,m=1,recompute=selective", &j, &ls) == LOOM_OK, "parse: %s",
              loom_errmsg());
        loom_plan_result rn, rs;
        CHECK(loom_plan_evaluate(&m, &c, &j, &ln, 1, &rn) == LOOM_OK && rn.feasible, "evaluate none");
        CHECK(loom_plan_evaluate(&m, &c, &j, &ls, 1, &rs) == LOOM_OK && rs.feasible, "evaluate selective");
        double sel = 0;
        loom_plan_elementwise_bytes(&m, &j, &ls, NULL, &sel);
        const double fl = 4 * s * s * h; /* QK^T and attention over V, forward */
        const double gemms = flash ? 0.5 * fl / (c.peak_bf16 * c.attn_eff)
                                   : fmax(fl / (c.peak_bf16 * loom_plan_gemm_eff(&c, fl / 2)),
                                          2 * 2 * s * s * a / c.hbm_bw); /* scores written, read: 2 bytes */
        const double want = L * (gemms + sel / c.hbm_bw);
        CHECK(
            fabs((rs.t_compute - rn.t_compute) / want - 1) < 1e-9,
            "bf16%s: selective recompute %.6g s == %g layers x (both attention GEMMs %.4g s + softmax/dropout "
            "%.4g s) = %.6g s",
            flash ? " flash" : "", rs.t_compute - rn.t_compute, L, gemms, sel / c.hbm_bw, want);
        CHECK(fabs(rs.t_step - rn.t_step - want) < 1e-9 * want, "bf16%s: the step grows by the same",
              flash ? " flash" : "");
    }
    loom_plan_job j = {.batch = 1, .seq = (int)s, .bf16 = 0, .gpus = 1};
    loom_plan_layout ln, ls;
    CHECK(loom_plan_layout_parse("dp=1,mbs=1,m=1,recompute=none", &j, &ln) == LOOM_OK, "parse: %s",
          loom_errmsg());
    CHECK(loom_plan_layout_parse("dp=1,mbs=1,m=1,recompute=selective", &j, &ls) == LOOM_OK, "parse: %s",
          loom_errmsg());
    loom_plan_result rn, rs;
    CHECK(loom_plan_evaluate(&m, &c, &j, &ln, 1, &rn) == LOOM_OK && rn.feasible, "evaluate fp32 none");
    CHECK(loom_plan_evaluate(&m, &c, &j, &ls, 1, &rs) == LOOM_OK && rs.feasible, "evaluate fp32 selective");
    CHECK(rs.t_compute == rn.t_compute && rs.t_step == rn.t_step,
          "fp32 (loom): selective recomputes nothing the backward does not already: %.9g == %.9g s",
          rs.t_step, rn.t_step);
}

/* Gradient accumulation (bf16, unsharded gradients): each micro-batch after
 * the first reads the rank's gradient buffer and its new gradients and writes
 * the sum, 3 x 2 bytes per parameter at HBM bandwidth. ZeRO-3: the gradient
 * reduce-scatter shares the link with the backward's parameter gathers, so
 * when the gathers fill the backward it is exposed whole. */
static void test_grad_acc_and_zero3(void) {
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    loom_plan_cluster c = h100();
    loom_plan_job j4 = {.batch = 32, .seq = 1024, .bf16 = 1, .gpus = 8}, j1 = j4;
    j1.batch = 8;
    loom_plan_layout l4, l1;
    CHECK(loom_plan_layout_parse("dp=8,mbs=1,m=4", &j4, &l4) == LOOM_OK, "parse: %s", loom_errmsg());
    CHECK(loom_plan_layout_parse("dp=8,mbs=1,m=1", &j1, &l1) == LOOM_OK, "parse: %s", loom_errmsg());
    loom_plan_result r4, r1;
    CHECK(loom_plan_evaluate(&m, &c, &j4, &l4, 1, &r4) == LOOM_OK && r4.feasible, "evaluate m=4");
    CHECK(loom_plan_evaluate(&m, &c, &j1, &l1, 1, &r1) == LOOM_OK && r1.feasible, "evaluate m=1");
    /* layers (weights; LayerNorms and the qkv, proj, fc, fc_proj biases),
     * the token and position embeddings, the final LayerNorm; the head is
     * tied to the embedding (one matrix at pp = 1: until 2026-11-26 the
     * planner counted it twice here, the bug of issue 34) */
    const double h = m.hidden, F = m.ffn,
                 P = m.layers * (4 * h * h + 2 * h * F + 4 * h + 3 * h + h + F + h) + (double)m.vocab * h +
                     (double)m.max_seq * h + 2 * h;
    const double want = 3 * 3 * 2 * P / c.hbm_bw; /* 3 accumulations of 6 bytes per parameter */
    const double got = r4.t_compute - 4 * r1.t_compute;
    CHECK(fabs(got / want - 1) < 1e-6,
          "gradient accumulation %.6g s == 3 x 6 bytes x %.4g params / HBM = %.6g s", got, P, want);
    /* ZeRO-3 over 2 nodes */
    loom_plan_job jz = {.batch = 16, .seq = 1024, .bf16 = 1, .gpus = 16};
    loom_plan_layout lz;
    CHECK(loom_plan_layout_parse("dp=16,zero=3,mbs=1,m=1", &jz, &lz) == LOOM_OK, "parse: %s", loom_errmsg());
    loom_plan_result rz;
    c.inter_bw = 1e9; /* gathers longer than the backward: nothing left to hide the reduce-scatter */
    CHECK(loom_plan_evaluate(&m, &c, &jz, &lz, 1, &rz) == LOOM_OK && rz.feasible, "evaluate zero=3 slow");
    /* the dense parameters' reduce-scatter, plus the (empty) expert group's
     * latency the planner charges: 8 ranks of the group on each node, the
     * node-boundary bytes spread over their 8 NIC shares */
    const double rs = loom_plan_coll_time_k(&c, LOOM_COLL_REDUCESCATTER, 16, 8, 2 * P) +
                      loom_plan_coll_time_k(&c, LOOM_COLL_REDUCESCATTER, 16, 8, 0);
    CHECK(fabs(rz.t_dp / rs - 1) < 1e-9, "zero=3, slow link: reduce-scatter exposed whole, %.6g s == %.6g s",
          rz.t_dp, rs);
    /* gathers short (a fast link without latency: each of the 14 units' gathers
     * pays the ring's latency): the reduce-scatter hides behind the backward */
    c.inter_bw = 1e15, c.inter_lat = c.intra_lat = 0;
    CHECK(loom_plan_evaluate(&m, &c, &jz, &lz, 1, &rz) == LOOM_OK && rz.feasible, "evaluate zero=3 fast");
    CHECK(rz.t_dp == 0, "zero=3, fast link: reduce-scatter hidden (%.4g s exposed)", rz.t_dp);
}

/* A 4-device CPU node as `loom calibrate` writes it (rates with all four
 * ranks busy), with cores_per_node `cores` (<= 0: the key absent) and
 * sched_slice_us `slice_us` (<= 0: absent). */
static loom_plan_cluster cpu_node_slice(double cores, double slice_us, const char *path) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "create %s", path);
    if (f) {
        fprintf(
            f,
            "{\"name\": \"cpu\", \"gpus_per_node\": 4, \"nodes\": 1, \"memory_gb\": 2, \"reserved_gb\": 0.05,\n"
            " \"peak_tflops\": {\"fp32\": 0.039}, \"hbm_gbps\": 5,\n"
            " \"intra_node\": {\"bandwidth_gbps\": 3, \"latency_us\": 10},\n"
            " \"efficiency\": {\"gemm\": 0.9, \"collective\": 1, \"overlap\": 0},\n"
            " \"gemm_curve\": [{\"m\": 32, \"n\": 512, \"k\": 512, \"eff\": 0.6}, {\"m\": 1024, \"n\": 1024, \"k\": 1024, \"eff\": 1}]");
        if (cores > 0) fprintf(f, ",\n \"cores_per_node\": %g", cores);
        if (slice_us > 0) fprintf(f, ",\n \"sched_slice_us\": %g", slice_us);
        fprintf(f, "}\n");
        fclose(f);
    }
    loom_plan_cluster c;
    CHECK(loom_plan_cluster_load(path, &c) == LOOM_OK, "load %s: %s", path, loom_errmsg());
    return c;
}

static loom_plan_cluster cpu_node(double cores, const char *path) { return cpu_node_slice(cores, 0, path); }

static loom_plan_result eval_on(const loom_plan_cluster *c, const char *layout, int gpus) {
    loom_plan_model m;
    loom_plan_model_builtin("mini", &m);
    loom_plan_job j = {.batch = 16, .seq = 128, .bf16 = 0, .gpus = gpus};
    loom_plan_layout l;
    loom_plan_result r;
    memset(&r, 0, sizeof r);
    CHECK(loom_plan_layout_parse(layout, &j, &l) == LOOM_OK, "parse %s: %s", layout, loom_errmsg());
    CHECK(loom_plan_evaluate(&m, c, &j, &l, 1, &r) == LOOM_OK && r.feasible, "evaluate %s: %s %s", layout,
          loom_errmsg(), r.reason);
    return r;
}

static loom_plan_result eval(const loom_plan_cluster *c, const char *layout) { return eval_on(c, layout, 4); }

/* Devices that time-share cores (cores_per_node): a pipeline's idle stages
 * hand their cores to the busy ones, so a pipeline on 4 ranks and 2 cores
 * is faster than on 4 devices of the same (all-busy) rate; layouts that keep
 * every rank busy predict exactly what they did; a node with as many cores
 * as devices, or no key, is the independent-device model. */
static void test_shared_cores(void) {
    char p_own[64], p_two[64], p_four[64], p_bad[64];
    snprintf(p_own, sizeof p_own, "/tmp/loom-plan-own-%d.json", (int)getpid());
    snprintf(p_two, sizeof p_two, "/tmp/loom-plan-two-%d.json", (int)getpid());
    snprintf(p_four, sizeof p_four, "/tmp/loom-plan-four-%d.json", (int)getpid());
    snprintf(p_bad, sizeof p_bad, "/tmp/loom-plan-bad-%d.json", (int)getpid());
    const loom_plan_cluster own = cpu_node(0, p_own), two = cpu_node(2, p_two), four = cpu_node(4, p_four);
    CHECK(own.cores == 0 && two.cores == 2, "cores_per_node read: %g %g", own.cores, two.cores);
    /* Every rank busy all the time: the same compute as on own devices, plus
     * the waits for a core after each synchronisation. 4 ranks on 2 cores,
     * no sched_slice_us: EEVDF's default slice for 2 CPUs, 0.75 ms x (1 +
     * log2 2) = 1.5 ms, longer than mini's work between two collectives
     * here, so X = 1.5 ms and each wait is X/3 (the first of the 2 holders'
     * runs to end) + 1/2 x X/2 (half of the one other queued rank's run,
     * on one of the 2 cores) = 0.875 ms. Synchronisations per step, by
     * hand (mini: 4 layers, 12.7 MB of fp32 gradients, one 25 MB bucket):
     * dp=4 one all-reduce; ZeRO-2 a reduce-scatter and an all-gather; tp
     * two all-reduces per layer forward and two backward (16), with sp two
     * all-gathers + two reduce-scatters forward and the same plus two
     * re-gathers backward (40); m = 2 micro-batches twice. */
    CHECK(two.slice == 1.5e-3 && own.slice == 0, "default slice: %g s on 2 cores, %g without the key",
          two.slice, own.slice);
    const char *busy[] = {"dp=4", "dp=4,zero=2", "dp=2,tp=2", "tp=4,sp=1", "dp=1,tp=4,m=2"};
    const double syncs[] = {1, 2, 16 + 1, 40, 2 * 16};
    for (size_t i = 0; i < sizeof busy / sizeof busy[0]; i++) {
        const loom_plan_result a = eval(&own, busy[i]), b = eval(&two, busy[i]), c4 = eval(&four, busy[i]);
        CHECK(a.t_compute == b.t_compute && b.sim_cores == 0 && a.t_wake == 0,
              "%s: every rank busy all the time, the same compute on shared cores %.9g == %.9g", busy[i],
              b.t_compute, a.t_compute);
        CHECK(fabs(b.t_wake - syncs[i] * 0.875e-3) < 1e-15 && fabs(b.t_step - (a.t_step + b.t_wake)) < 1e-12,
              "%s: %g synchronisations x 0.875 ms = %.6g s of waits (got %.6g), step %.9g = %.9g + the waits",
              busy[i], syncs[i], syncs[i] * 0.875e-3, b.t_wake, b.t_step, a.t_step);
        CHECK(c4.t_step == a.t_step && c4.t_wake == 0, "%s: 4 cores for 4 devices, no waits: %.9g == %.9g",
              busy[i], c4.t_step, a.t_step);
    }
    /* the file's slice: twice EEVDF's default, twice the waits */
    char p_slow[64];
    snprintf(p_slow, sizeof p_slow, "/tmp/loom-plan-slow-%d.json", (int)getpid());
    const loom_plan_cluster slow = cpu_node_slice(2, 3000, p_slow);
    const loom_plan_result tp4 = eval(&two, "tp=4,sp=1"), tp4slow = eval(&slow, "tp=4,sp=1");
    CHECK(slow.slice == 3e-3 && fabs(tp4slow.t_wake - 40 * 1.75e-3) < 1e-15 &&
              fabs(tp4slow.t_step - tp4.t_step - 40 * 0.875e-3) < 1e-12,
          "sched_slice_us 3000: waits %.6g s, want 40 x 1.75 ms", tp4slow.t_wake);
    remove(p_slow);
    const char *pipes[] = {"pp=4,schedule=1f1b,m=4",
                           "pp=4,schedule=zb,m=8",
                           "dp=2,pp=2,m=4",
                           "tp=2,pp=2,m=4",
                           "dp=2,pp=2,schedule=interleaved,m=4,v=2",
                           "pp=2,dp=2,schedule=gpipe,m=4,order=tp.cp.pp.dp"};
    for (size_t i = 0; i < sizeof pipes / sizeof pipes[0]; i++) {
        const loom_plan_result a = eval(&own, pipes[i]), b = eval(&two, pipes[i]), c4 = eval(&four, pipes[i]);
        CHECK(b.t_step < a.t_step, "%s: shared cores %.4f s < independent devices %.4f s", pipes[i], b.t_step,
              a.t_step);
        CHECK(c4.t_step == a.t_step && c4.bubble == a.bubble && c4.sim_cores == 0,
              "%s: 4 cores for 4 devices = independent devices (%.9g vs %.9g)", pipes[i], c4.t_step,
              a.t_step);
        /* the bubble is the simulator's, with the sharing the planner reports */
        CHECK(b.sim_cores > 0 && b.sim_share >= 1, "%s: sim shares cores (%g, %d)", pipes[i], b.sim_cores,
              b.sim_share);
        loom_schedule *s = NULL;
        CHECK(loom_schedule_build(b.l.sched, b.l.pp, b.l.m, b.l.v, &s) == LOOM_OK, "build");
        loom_plan_model m;
        loom_plan_model_builtin("mini", &m);
        const int S = b.l.pp * b.l.v;
        int counts[64];
        double scale[64], max_rank = 0;
        CHECK(loom_partition_balance(m.layers, b.l.pp, b.l.v, 0, b.head_cost, counts) == LOOM_OK,
              "partition");
        for (int rk = 0; rk < b.l.pp; rk++) {
            double cost = 0;
            for (int ch = 0; ch < b.l.v; ch++)
                cost += loom_partition_stage_cost(counts, S, ch * b.l.pp + rk, 0, b.head_cost);
            max_rank = fmax(max_rank, cost);
        }
        for (int v = 0; v < S; v++)
            scale[v] = loom_partition_stage_cost(counts, S, v, 0, b.head_cost) / (max_rank / b.l.v);
        /* no faster than the node's work on its cores (every stage here is on the one node) */
        double work = 0;
        for (int v = 0; v < S; v++) work += b.l.m * (b.sim_f + b.sim_b + b.sim_w) * scale[v];
        CHECK(b.sim_share == b.l.pp && b.t_step >= work / b.sim_cores,
              "%s: step %.4f >= the node's work / cores %.4f", pipes[i], b.t_step, work / b.sim_cores);
        loom_sim_costs sc;
        loom_sim_costs_default(&sc);
        sc.f = b.sim_f, sc.b = b.sim_b, sc.w = b.sim_w, sc.comm = b.sim_comm, sc.stage_scale = scale;
        sc.cores = b.sim_cores, sc.share = b.sim_share;
        sc.slice = b.sim_slice, sc.span = b.sim_span, sc.replicas = b.sim_replicas;
        sc.syncs_f = b.sim_syncs_f, sc.syncs_b = b.sim_syncs_b;
        loom_sim_result *res = NULL, *res0 = NULL;
        CHECK(loom_sim_run(s, &sc, &res) == LOOM_OK, "sim");
        /* 4 ranks on 2 cores: waits for a core in the replay, with the
         * node's ranks per stage as replicas and the slice of the file */
        CHECK(b.sim_slice == 1.5e-3 && b.sim_replicas * b.sim_share == 4 && b.sim_span > 0,
              "%s: replay with slice %g, %d replicas x %d stages, span %g", pipes[i], b.sim_slice,
              b.sim_replicas, b.sim_share, b.sim_span);
        sc.slice = 0;
        CHECK(loom_sim_run(s, &sc, &res0) == LOOM_OK, "sim without waits");
        if (res && res0) {
            CHECK(fabs(res->bubble - b.bubble) < 1e-12, "%s: planner bubble %.9f == simulator %.9f", pipes[i],
                  b.bubble, res->bubble);
            int slow_k = 0;
            for (int k = 1; k < b.l.pp; k++)
                if (res->busy[k] > res->busy[slow_k]) slow_k = k;
            CHECK(fabs(b.t_compute + b.t_tp + b.t_bubble + res->wake[slow_k] - res->makespan) <
                          1e-9 * res->makespan &&
                      b.t_wake >= res->wake[slow_k],
                  "%s: compute %.4f + tp %.4f + bubble %.4f + waits %.4f = makespan %.4f", pipes[i],
                  b.t_compute, b.t_tp, b.t_bubble, res->wake[slow_k], res->makespan);
            /* TP collectives inside F and B: each waits holding its group's
             * share, so the replay is longer than without the waits */
            if (b.l.tp > 1)
                CHECK(b.sim_syncs_f == 4 && b.sim_syncs_b == 4 && res->makespan > res0->makespan + 1e-3,
                      "%s: 2 layers x 2 all-reduces per F and B; makespan %.6g > %.6g without waits",
                      pipes[i], res->makespan, res0->makespan);
        }
        loom_sim_free(res);
        loom_sim_free(res0);
        loom_schedule_free(s);
    }
    const loom_plan_result pp4 = eval(&two, "pp=4,schedule=1f1b,m=4"), dp2pp2 = eval(&two, "dp=2,pp=2,m=4");
    CHECK(pp4.sim_share == 4 && pp4.sim_cores == 2, "pp=4 on one node: 4 stages share 2 cores (%d, %g)",
          pp4.sim_share, pp4.sim_cores);
    CHECK(dp2pp2.sim_share == 2 && dp2pp2.sim_cores == 1,
          "dp=2 x pp=2: 2 stages per node, each stage set's share 1 core (%d, %g)", dp2pp2.sim_share,
          dp2pp2.sim_cores);
    /* 2 of the node's 4 devices on 2 cores: no sharing in this job, so
     * twice the rate the file measured with 4 busy, every part of the step */
    const loom_plan_result d2own = eval_on(&own, "dp=2", 2), d2two = eval_on(&two, "dp=2", 2);
    CHECK(fabs(d2two.t_step - 0.5 * d2own.t_step) < 1e-12 * d2own.t_step && d2two.t_dp == 0.5 * d2own.t_dp,
          "dp=2 on a 4-device, 2-core node: step %.6g = half of %.6g", d2two.t_step, d2own.t_step);
    /* a bad key is named */
    FILE *f = fopen(p_bad, "w");
    if (f) {
        fprintf(f, "{\"gpus_per_node\": 4, \"memory_gb\": 2, \"peak_tflops\": {\"fp32\": 0.04}, "
                   "\"intra_node\": {\"bandwidth_gbps\": 3}, \"cores_per_node\": 0}\n");
        fclose(f);
    }
    loom_plan_cluster bad;
    CHECK(loom_plan_cluster_load(p_bad, &bad) == LOOM_ECONFIG &&
              strstr(loom_errmsg(), "'cores_per_node' must be a positive number"),
          "cores_per_node 0 refused: %s", loom_errmsg());
    f = fopen(p_bad, "w");
    if (f) {
        fprintf(f,
                "{\"gpus_per_node\": 4, \"memory_gb\": 2, \"peak_tflops\": {\"fp32\": 0.04}, "
                "\"intra_node\": {\"bandwidth_gbps\": 3}, \"cores_per_node\": 2, \"sched_slice_us\": 0}\n");
        fclose(f);
    }
    CHECK(loom_plan_cluster_load(p_bad, &bad) == LOOM_ECONFIG &&
              strstr(loom_errmsg(), "'sched_slice_us' must be a positive number"),
          "sched_slice_us 0 refused: %s", loom_errmsg());
    remove(p_own), remove(p_two), remove(p_four), remove(p_bad);
}

/* loom's fp32 attention backward (src/kernels/cpu/attention.c) recomputes
 * each tile's scores q k^T (and their exp) before its four products, dV, dP,
 * dQ and dK: five GEMMs of the forward's two sizes, where "backward = 2 x
 * forward" counts four. The planner charges the fifth, QK^T, 2 b s^2 h FLOPs
 * per layer, as the forward charges its attention GEMMs: the GEMM curve at
 * the batched GEMM's size. One rank, one micro-batch, no pipeline: the
 * backward the simulator runs is 2 x the forward + that, in every recompute
 * mode but full (which adds its own forward); the fp32 element-wise backward
 * is 2 x its forward. GPU stacks (bf16, scores materialised or flash) are
 * unchanged: backward - 2 x forward is only the element-wise difference
 * and the loss's (its fp32 log-softmax over the vocabulary). */
static void test_fp32_attention_backward(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/loom-plan-attn-%d.json", (int)getpid());
    const loom_plan_cluster own = cpu_node(0, path);
    loom_plan_model m;
    CHECK(loom_plan_model_builtin("mini", &m) == LOOM_OK, "mini");
    const double L = m.layers, b = 4, s = 128, h = m.hidden; /* 16 sequences over dp=4: 4 a rank */
    const double qk = 2 * b * s * s * h;                     /* QK^T of one layer, forward */
    const double want = L * qk / (own.peak_fp32 * loom_plan_gemm_eff(&own, qk));
    const char *modes[] = {"dp=4,m=1,recompute=none", "dp=4,m=1,recompute=selective"};
    for (int i = 0; i < 2; i++) {
        const loom_plan_result r = eval(&own, modes[i]);
        const double extra = r.sim_b - 2 * r.sim_f;
        CHECK(fabs(extra / want - 1) < 1e-9,
              "fp32 %s: backward - 2 x forward %.6g s == %g layers x QK^T again (%.4g MFLOP at the curve's "
              "%.4f) = %.6g s",
              modes[i], extra, L, qk / 1e6, loom_plan_gemm_eff(&own, qk), want);
        CHECK(fabs(r.t_compute - 3 * r.sim_f - want) < 1e-9 * r.t_compute,
              "fp32 %s: compute %.6g s == 3 x forward %.6g s + %.6g s", modes[i], r.t_compute, 3 * r.sim_f,
              want);
    }
    remove(path);
    /* bf16: nothing added (gpt2-small, one 1024-token sequence on one H100) */
    const loom_plan_cluster c = h100();
    CHECK(loom_plan_model_builtin("gpt2-small", &m) == LOOM_OK, "gpt2-small");
    for (int flash = 0; flash <= 1; flash++) {
        loom_plan_job j = {.batch = 1, .seq = 1024, .bf16 = 1, .gpus = 1, .flash = flash};
        loom_plan_layout l;
        CHECK(loom_plan_layout_parse("dp=1,mbs=1,m=1,recompute=none", &j, &l) == LOOM_OK, "parse: %s",
              loom_errmsg());
        loom_plan_result r;
        CHECK(loom_plan_evaluate(&m, &c, &j, &l, 1, &r) == LOOM_OK && r.feasible, "evaluate bf16");
        double eb = 0, ef = loom_plan_elementwise_bytes(&m, &j, &l, &eb, NULL);
        /* and the loss's: 22 bytes a logit backward, 14 forward */
        const double elem = m.layers * (eb - 2 * ef) / c.hbm_bw + (22.0 - 2 * 14) * 1024 * m.vocab / c.hbm_bw;
        CHECK(fabs(r.sim_b - 2 * r.sim_f - elem) < 1e-9 * r.sim_b,
              "bf16%s: backward - 2 x forward %.6g s == the element-wise and loss difference %.6g s only",
              flash ? " flash" : "", r.sim_b - 2 * r.sim_f, elem);
    }
}

int main(void) {
    test_bubble_is_simulators();
    test_rejections();
    test_models();
    test_zero_memory();
    test_16k_speed();
    test_cp_volume();
    test_gemm_curve();
    test_hbm_eff();
    test_elementwise_bytes();
    test_selective_recompute();
    test_grad_acc_and_zero3();
    test_shared_cores();
    test_fp32_attention_backward();
    return check_done();
}
