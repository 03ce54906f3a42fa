/* cmd_plan.c - `loom plan`: rank every layout of a model on a cluster by the
 * planner's cost model (src/plan/planner.c and plan_*.c), or evaluate one
 * (--layout). One process, no MPI. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "loom/plan.h"

typedef struct plan_args {
    char model[1024], cluster[1024], precision[16], mode[16], layout[512];
    char attention[16], grad_reduce[16], elementwise[16], logits[16];
    int batch, seq, gpus, nodes, top, json, explain, gen, flash, no_dp_overlap, dropout, fused, loss_chunks;
    int fp8_params, zero3_per_param;
    double zero3_live;
    cli_strlist fix;
} plan_args;

/* A word of `words` (NULL-terminated) as its index; LOOM_EUSAGE listing them. */
static loom_status pick(const char *flag, const char *v, const char *const *words, int first, int *out) {
    char list[256] = "";
    for (int i = first; words[i]; i++) {
        if (strcmp(v, words[i]) == 0) {
            *out = i;
            return LOOM_OK;
        }
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i > first ? ", " : "", words[i]);
    }
    return loom_fail(LOOM_EUSAGE, "--%s %s: one of %s", flag, v, list);
}

/* The training stack's properties (docs/planning.md, "The training stack"). */
static loom_status stack_of(const plan_args *a, loom_plan_job *j, loom_plan_layout *fixed) {
    static const char *const ATTN[LOOM_PLAN_ATTN_COUNT + 1] = {
        "default", "materialized", "flash", "flash2", "flash3", "triton", "cudnn", "xformers", NULL};
    static const char *const RED[] = {"bf16", "fp32", NULL}, *const EW[] = {"fused", "eager", "compiled",
                                                                            NULL};
    int x = 0;
    if (a->attention[0]) {
        LOOM_TRY(pick("attention", a->attention, ATTN, 1, &x));
        j->attn = (loom_plan_attn)x;
        j->flash = x != LOOM_PLAN_ATTN_MATERIALIZED;
    }
    if (a->grad_reduce[0]) LOOM_TRY(pick("grad-reduce", a->grad_reduce, RED, 0, &j->grad_fp32));
    if (a->elementwise[0]) LOOM_TRY(pick("elementwise", a->elementwise, EW, 0, &j->elementwise));
    if (a->fused) j->elementwise = 2;
    if (a->logits[0]) {
        LOOM_TRY(pick("logits", a->logits, RED, 0, &x));
        j->logits_bf16 = x == 0;
    }
    if (a->loss_chunks < 0) return loom_fail(LOOM_EUSAGE, "--loss-chunks %d: must be >= 1", a->loss_chunks);
    j->loss_chunks = a->loss_chunks;
    j->dropout = a->dropout;
    if (a->fp8_params && !j->fp8) return loom_fail(LOOM_EUSAGE, "--fp8-params needs --precision fp8");
    j->fp8_params = a->fp8_params;
    if (a->zero3_live < 0) return loom_fail(LOOM_EUSAGE, "--zero3-live %g: must be >= 0", a->zero3_live);
    j->zero3_live = a->zero3_live;
    j->zero3_per_param = a->zero3_per_param;
    for (int i = 0; i < a->fix.n; i++) LOOM_TRY(loom_plan_fix_parse(a->fix.items[i], &j->fix, fixed));
    j->fixed = fixed;
    return LOOM_OK;
}

typedef struct named {
    const char *name;
    double v;
} named;

static void add_numbers(cJSON *o, const named *n) {
    for (; n->name; n++) cJSON_AddNumberToObject(o, n->name, n->v);
}

static cJSON *result_json(const loom_plan_model *m, const loom_plan_job *j, const loom_plan_result *r) {
    cJSON *o = cJSON_CreateObject();
    char buf[1024];
    loom_plan_layout_format(&r->l, buf, sizeof buf);
    cJSON_AddStringToObject(o, "layout", buf);
    cJSON_AddBoolToObject(o, "feasible", r->feasible);
    if (!r->feasible) {
        cJSON_AddStringToObject(o, "reason", r->reason);
        return o;
    }
    cJSON_AddNumberToObject(o, "tokens_per_s_per_device", r->tokens_per_s_dev);
    cJSON_AddNumberToObject(o, "mfu", r->mfu);
    cJSON_AddBoolToObject(o, "mfu_capped", r->mfu_capped);
    add_numbers(cJSON_AddObjectToObject(o, "memory_bytes"), (const named[]){{"params", r->mem_params},
                                                                            {"grads", r->mem_grads},
                                                                            {"optimizer", r->mem_opt},
                                                                            {"activations", r->mem_act},
                                                                            {"kv_cache", r->mem_kv},
                                                                            {"reserved", r->mem_other},
                                                                            {"runtime", r->mem_runtime},
                                                                            {"total", r->mem_total},
                                                                            {NULL, 0}});
    cJSON_AddNumberToObject(o, "in_flight", r->in_flight);
    add_numbers(cJSON_AddObjectToObject(o, "time_s"), (const named[]){{"step", r->t_step},
                                                                      {"compute", r->t_compute},
                                                                      {"tp", r->t_tp},
                                                                      {"cp", r->t_cp},
                                                                      {"ep", r->t_ep},
                                                                      {"dp_exposed", r->t_dp},
                                                                      {"pp_message", r->t_pp},
                                                                      {"bubble", r->t_bubble},
                                                                      {"wake", r->t_wake},
                                                                      {NULL, 0}});
    cJSON_AddNumberToObject(o, "cp_bytes_per_step", r->cp_bytes);
    cJSON_AddNumberToObject(o, "bubble", r->bubble);
    cJSON_AddBoolToObject(o, "bubble_simulated", r->simulated);
    add_numbers(
        cJSON_AddObjectToObject(o, "sim_costs_s"),
        (const named[]){{"f", r->sim_f}, {"b", r->sim_b}, {"w", r->sim_w}, {"comm", r->sim_comm}, {NULL, 0}});
    /* devices that share cores: the simulator's processors per node and stages per node (0: own devices) */
    add_numbers(cJSON_AddObjectToObject(o, "sim_shared_cores"),
                (const named[]){{"cores", r->sim_cores},
                                {"stages_per_node", r->sim_share},
                                {"slice", r->sim_slice},
                                {"span", r->sim_span},
                                {"replicas", r->sim_replicas},
                                {"syncs_f", r->sim_syncs_f},
                                {"syncs_b", r->sim_syncs_b},
                                {NULL, 0}});
    cJSON_AddNumberToObject(o, "stage_imbalance", r->stage_imbalance);
    cJSON_AddNumberToObject(o, "head_cost_layers", r->head_cost);
    if (j->serve) {
        cJSON_AddNumberToObject(o, "ttft_s", r->ttft);
        cJSON_AddNumberToObject(o, "tpot_s", r->tpot);
        cJSON_AddNumberToObject(o, "max_concurrent_sequences", r->max_seqs);
    }
    cJSON_AddStringToObject(o, "failure_modes", r->failures);
    loom_plan_train_flags(m, j, &r->l, buf, sizeof buf);
    cJSON_AddStringToObject(o, j->serve ? "command" : "train_flags", buf);
    return o;
}

static void print_table(const loom_plan_model *m, const loom_plan_job *j, const loom_plan_result *r, int n) {
    if (j->serve)
        printf("%3s %11s %7s %8s %9s %9s %6s  %s\n", "#", "tok/s/dev", "MFU", "mem GB", "TTFT ms", "TPOT ms",
               "seqs", "layout");
    else
        printf("%3s %11s %6s %7s %9s %8s %7s %7s %7s %7s %7s %6s  %s\n", "#", "tok/s/dev", "MFU", "mem GB",
               "step s", "compute", "tp", "cp", "ep", "dp", "bubble", "bub%", "layout");
    for (int i = 0; i < n; i++) {
        char lay[512];
        loom_plan_layout_format(&r[i].l, lay, sizeof lay);
        if (j->serve)
            printf("%3d %11.1f %6.1f%% %8.1f %9.2f %9.2f %6d  %s\n", i + 1, r[i].tokens_per_s_dev,
                   100 * r[i].mfu, r[i].mem_total / 1e9, 1e3 * r[i].ttft, 1e3 * r[i].tpot, r[i].max_seqs,
                   lay);
        else
            printf("%3d %11.1f %5.1f%% %7.1f %9.4g %8.3g %7.3g %7.3g %7.3g %7.3g %7.3g %5.1f%%  %s\n", i + 1,
                   r[i].tokens_per_s_dev, 100 * r[i].mfu, r[i].mem_total / 1e9, r[i].t_step, r[i].t_compute,
                   r[i].t_tp, r[i].t_cp, r[i].t_ep, r[i].t_dp, r[i].t_bubble, 100 * r[i].bubble, lay);
    }
    for (int i = 0; i < n; i++) {
        char flags[1024];
        loom_plan_train_flags(m, j, &r[i].l, flags, sizeof flags);
        printf("\n#%d %s\n   failure modes: %s\n", i + 1, flags, r[i].failures[0] ? r[i].failures : "none");
    }
}

static void explain(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                    const loom_plan_result *best) {
    char text[4096] = "";
    loom_plan_layout h;
    loom_plan_heuristic(m, c, j, &h, text, sizeof text);
    printf("\nexplain: the rule of thumb (TP by intra-node links and memory, PP by depth and inter-node\n"
           "bandwidth, DP for the rest, then SP/CP for activations, EP for MoE), step by step:\n%s",
           text);
    loom_plan_result hr;
    if (loom_plan_evaluate(m, c, j, &h, 1, &hr) != LOOM_OK) {
        printf("  (the rule's layout cannot be evaluated: %s)\n", loom_errmsg());
        return;
    }
    char a[512], b[512];
    loom_plan_layout_format(&h, a, sizeof a);
    loom_plan_layout_format(&best->l, b, sizeof b);
    printf("rule of thumb:  %s\n", a);
    if (!hr.feasible) {
        printf("  infeasible: %s\n", hr.reason);
    } else {
        printf(
            "  %.1f tok/s/dev, MFU %.1f%%, %.1f GB/rank, step %.4g s (compute %.3g, tp %.3g, dp %.3g, bubble %.3g)\n",
            hr.tokens_per_s_dev, 100 * hr.mfu, hr.mem_total / 1e9, hr.t_step, hr.t_compute, hr.t_tp, hr.t_dp,
            hr.t_bubble);
        if (hr.failures[0]) printf("  failure modes: %s\n", hr.failures);
    }
    printf(
        "search's best: %s\n  %.1f tok/s/dev, MFU %.1f%%, %.1f GB/rank, step %.4g s (compute %.3g, tp %.3g, dp %.3g, "
        "bubble %.3g)\n",
        b, best->tokens_per_s_dev, 100 * best->mfu, best->mem_total / 1e9, best->t_step, best->t_compute,
        best->t_tp, best->t_dp, best->t_bubble);
    if (hr.feasible && strcmp(a, b) == 0) {
        printf("the search agrees with the rule of thumb\n");
        return;
    }
    printf("where the search disagrees:\n");
    static const char *RC[] = {"none", "selective", "full"};
    const struct {
        const char *name;
        int rule, best;
        const char *rs, *bs; /* names instead of numbers */
    } d[] = {
        {"tp", h.tp, best->l.tp, NULL, NULL},
        {"pp", h.pp, best->l.pp, NULL, NULL},
        {"dp", h.dp, best->l.dp, NULL, NULL},
        {"cp", h.cp, best->l.cp, NULL, NULL},
        {"ep", h.ep, best->l.ep, NULL, NULL},
        {"sp", h.sp, best->l.sp, NULL, NULL},
        {"zero", h.zero, best->l.zero, NULL, NULL},
        {"m", h.m, best->l.m, NULL, NULL},
        {"mbs", h.mbs, best->l.mbs, NULL, NULL},
        {"v", h.v, best->l.v, NULL, NULL},
        {"recompute", h.recompute, best->l.recompute, RC[h.recompute], RC[best->l.recompute]},
        {"schedule", h.sched, best->l.sched, loom_schedule_name(h.sched), loom_schedule_name(best->l.sched)}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        if (d[i].rule == d[i].best) continue;
        if (d[i].rs) printf("  %s: rule %s, search %s\n", d[i].name, d[i].rs, d[i].bs);
        else printf("  %s: rule %d, search %d\n", d[i].name, d[i].rule, d[i].best);
    }
    if (!hr.feasible) {
        printf("  why: the rule's layout does not run (%s)\n", hr.reason);
        return;
    }
    const double gain = best->tokens_per_s_dev / hr.tokens_per_s_dev - 1;
    printf(
        "  why: %+.1f%% tokens/s/device; step time change by part: compute %+.3g s, tp %+.3g s, dp %+.3g s, "
        "bubble %+.3g s, ep %+.3g s, cp %+.3g s; memory %+.1f GB/rank\n",
        100 * gain, best->t_compute - hr.t_compute, best->t_tp - hr.t_tp, best->t_dp - hr.t_dp,
        best->t_bubble - hr.t_bubble, best->t_ep - hr.t_ep, best->t_cp - hr.t_cp,
        (best->mem_total - hr.mem_total) / 1e9);
}

static loom_status run(plan_args *a) {
    loom_plan_model m;
    loom_plan_cluster c;
    LOOM_TRY(loom_plan_model_resolve(a->model, &m));
    LOOM_TRY(loom_plan_cluster_load(a->cluster, &c));
    if (a->nodes > 0) c.nodes = a->nodes;
    loom_plan_job j = {.batch = a->batch,
                       .seq = a->seq,
                       .gen = a->gen,
                       .gpus = a->gpus,
                       .flash = a->flash,
                       .no_dp_overlap = a->no_dp_overlap};
    if (strcmp(a->precision, "bf16") == 0) j.bf16 = 1;
    else if (strcmp(a->precision, "fp8") == 0) j.bf16 = j.fp8 = 1;
    else if (strcmp(a->precision, "fp32") != 0)
        return loom_fail(LOOM_EUSAGE, "--precision %s: fp32, bf16 or fp8", a->precision);
    if (j.fp8 && !(c.peak_fp8 > 0))
        return loom_fail(LOOM_EUSAGE, "--precision fp8: cluster %s gives no peak_tflops.fp8 (no FP8 GEMMs)",
                         c.name);
    static loom_plan_layout fixed;
    LOOM_TRY(stack_of(a, &j, &fixed));
    if (strcmp(a->mode, "serve") == 0) j.serve = 1;
    else if (strcmp(a->mode, "train") != 0)
        return loom_fail(LOOM_EUSAGE, "--mode %s: train or serve", a->mode);
    if (j.batch < 1 || j.seq < 1) return loom_fail(LOOM_EUSAGE, "--batch and --seq must be >= 1");
    if (a->gpus < 0) return loom_fail(LOOM_EUSAGE, "--gpus %d: must be >= 1", a->gpus);
    if (a->top < 1 || a->top > 1000) return loom_fail(LOOM_EUSAGE, "--top %d: 1..1000", a->top);
    if (j.gpus > c.gpus_per_node * c.nodes)
        return loom_fail(LOOM_EUSAGE, "--gpus %d: the cluster has %d x %d devices (give --nodes)", j.gpus,
                         c.nodes, c.gpus_per_node);
    const int N = j.gpus > 0 ? j.gpus : c.gpus_per_node * c.nodes;
    double total, active;
    total = loom_plan_model_params(&m, &active);
    if (a->layout[0]) {
        loom_plan_layout l;
        LOOM_TRY(loom_plan_layout_parse(a->layout, &j, &l));
        if (j.serve) l.m = 1;
        loom_plan_result r;
        LOOM_TRY(loom_plan_evaluate(&m, &c, &j, &l, 1, &r));
        if (a->json) {
            cJSON *o = result_json(&m, &j, &r);
            char *s = cJSON_Print(o);
            puts(s);
            free(s);
            cJSON_Delete(o);
        } else if (!r.feasible) {
            char lay[512];
            loom_plan_layout_format(&l, lay, sizeof lay);
            printf("%s\n  rejected: %s\n", lay, r.reason);
        } else {
            print_table(&m, &j, &r, 1);
        }
        return r.feasible ? LOOM_OK : loom_fail(LOOM_EUSAGE, "layout rejected: %s", r.reason);
    }
    loom_plan_result *res = malloc(sizeof *res * a->top);
    if (!res) return loom_fail(LOOM_EOS, "out of memory");
    loom_plan_search_stats st;
    int n = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    loom_status s = loom_plan_search(&m, &c, &j, a->top, res, &n, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    if (s != LOOM_OK) {
        free(res);
        return s;
    }
    if (a->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", m.name);
        cJSON_AddNumberToObject(o, "params", total);
        cJSON_AddNumberToObject(o, "active_params", active);
        cJSON_AddStringToObject(o, "cluster", c.name);
        cJSON_AddNumberToObject(o, "devices", N);
        cJSON_AddNumberToObject(o, "considered", (double)st.considered);
        cJSON_AddNumberToObject(o, "feasible", (double)st.feasible);
        cJSON_AddNumberToObject(o, "rejected_memory", (double)st.rejected_memory);
        cJSON_AddNumberToObject(o, "rejected_divisibility", (double)(st.rejected_divide + st.rejected_batch));
        cJSON_AddNumberToObject(o, "search_seconds", secs);
        cJSON *arr = cJSON_AddArrayToObject(o, "layouts");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, result_json(&m, &j, &res[i]));
        char *txt = cJSON_Print(o);
        puts(txt);
        free(txt);
        cJSON_Delete(o);
    } else {
        printf("loom plan: %s (%.3g B params, %.3g B active) on %d x %s, %s, batch %d x seq %d, %s\n", m.name,
               total / 1e9, active / 1e9, N, c.name, j.serve ? "serve" : "train", j.batch, j.seq,
               j.bf16 ? "bf16" : "fp32");
        printf(
            "searched %ld layouts in %.3f s: %ld feasible, %ld over memory, %ld that do not divide; the best %ld "
            "re-timed with the pipeline simulator\n",
            st.considered, secs, st.feasible, st.rejected_memory, st.rejected_divide + st.rejected_batch,
            st.simulated);
        if (st.example_memory[0]) printf("  e.g. rejected: %s\n", st.example_memory);
        if (st.example_divide[0]) printf("  e.g. rejected: %s\n", st.example_divide);
        if (n == 0) printf("no layout fits\n");
        else print_table(&m, &j, res, n);
        if (a->explain && n > 0) explain(&m, &c, &j, &res[0]);
    }
    free(res);
    return n > 0 ? LOOM_OK
                 : loom_fail(LOOM_EUSAGE, "no layout of %s fits %d devices of %s", m.name, N, c.name);
}

int cmd_plan(int argc, char **argv) {
    static plan_args a;
    a = (plan_args){.model = "mini",
                    .cluster = "dgx-h100",
                    .precision = "bf16",
                    .mode = "train",
                    .batch = 0,
                    .seq = 0,
                    .top = 5,
                    .gen = 128};
    static cli_opt opts[] = {
        {"model", OPT_STR, a.model, sizeof a.model, "NAME|FILE",
         "loom model (tiny.. gpt2-xl), a shape (llama3-8b, llama2-70b, llama3-70b, llama3-405b, gpt3-175b, "
         "mixtral-8x7b, mixtral-8x22b) or a config.json or Hugging Face directory, read as loom train reads it (default mini)"},
        {"cluster", OPT_STR, a.cluster, sizeof a.cluster, "NAME|FILE",
         "preset (dgx-a100-80gb, dgx-h100, dgx2-v100) or a cluster JSON, e.g. the one `loom calibrate` writes "
         "(default dgx-h100)"},
        {"gpus", OPT_INT, &a.gpus, 0, "N", "devices to plan for (default: every device of the cluster)"},
        {"nodes", OPT_INT, &a.nodes, 0, "N", "override the cluster's node count"},
        {"batch", OPT_INT, &a.batch, 0, "B",
         "global batch in sequences (train; serve: concurrent requests) (default 8 x devices)"},
        {"seq", OPT_INT, &a.seq, 0, "T",
         "sequence length (serve: prompt length) (default: the model's context)"},
        {"gen", OPT_INT, &a.gen, 0, "N", "serve: tokens generated per request (default 128)"},
        {"precision", OPT_STR, a.precision, sizeof a.precision, "P",
         "fp32, bf16 (mixed) or fp8 (the layers' GEMMs in FP8, the rest bf16 mixed) (default bf16)"},
        {"mode", OPT_STR, a.mode, sizeof a.mode, "M", "train or serve (default train)"},
        {"top", OPT_INT, &a.top, 0, "N", "layouts to print (default 5)"},
        {"layout", OPT_STR, a.layout, sizeof a.layout, "L",
         "evaluate exactly this layout, e.g. dp=8,tp=4,pp=2,zero=1,sp=1,schedule=1f1b,m=16,mbs=1,v=1,"
         "recompute=selective,order=tp.cp.dp.pp, cp=4,cp_impl=ring|ulysses|allgather; also recompute=op "
         "(torchtitan's op-level) or recompute=layer2 (every other block), async_tp=1, stages=5.6.6.5 (layers per "
         "virtual stage) (exit 64 if rejected, with the reason)"},
        {"flash-attention", OPT_FLAG, &a.flash, 0, NULL,
         "the stack's attention keeps no seq x seq scores (FlashAttention-style): no score activations, no "
         "score element-wise traffic; timed as --attention flash2"},
        {"no-dp-overlap", OPT_FLAG, &a.no_dp_overlap, 0, NULL,
         "the stack starts the DP gradient reduction after the backward (as Megatron-LM 2021 did)"},
        {"attention", OPT_STR, a.attention, sizeof a.attention, "K",
         "the stack's attention kernel: materialized (s x s scores in HBM), flash, flash2, flash3, triton, cudnn, "
         "xformers; timed from the cluster's measured attention_tflops (default materialized; flash2 with "
         "--flash-attention)"},
        {"grad-reduce", OPT_STR, a.grad_reduce, sizeof a.grad_reduce, "T",
         "the dtype gradients are accumulated and reduced in: bf16 or fp32 (default bf16)"},
        {"dropout", OPT_FLAG, &a.dropout, 0, NULL,
         "the model applies dropout (masks kept and their traffic)"},
        {"elementwise", OPT_STR, a.elementwise, sizeof a.elementwise, "E",
         "how element-wise ops run: fused (one kernel per op: Megatron, TE, apex), eager (PyTorch composites: "
         "an RMSNorm as several kernels) or compiled (torch.compile) (default fused)"},
        {"fused", OPT_FLAG, &a.fused, 0, NULL, "the same as --elementwise compiled"},
        {"logits", OPT_STR, a.logits, sizeof a.logits, "T",
         "the loss's input: fp32 (default: F.cross_entropy(logits.float()), 8 bytes a logit kept, 36 moved) or bf16 "
         "(a fused kernel on the bf16 logits, as flash-attn's cross-entropy in llm-foundry: 4 kept, 6 moved)"},
        {"loss-chunks", OPT_INT, &a.loss_chunks, 0, "N",
         "the head and loss computed over N chunks of the tokens (logits memory / N) (default 1)"},
        {"fp8-params", OPT_FLAG, &a.fp8_params, 0, NULL,
         "with --precision fp8: the weights are held in FP8 (Transformer Engine's fp8 parameters, Megatron's "
         "fp8_param_gather), fp32 masters in the optimizer: no separate FP8 copy beside bf16 weights"},
        {"zero3-live", OPT_DOUBLE, &a.zero3_live, 0, "N",
         "ZeRO-3 holds at most N gathered parameters at once (DeepSpeed's stage3_max_live_parameters, default "
         "1e9 there) (default: two whole FSDP units, a block or the embedding or the head)"},
        {"zero3-per-param", OPT_FLAG, &a.zero3_per_param, 0, NULL,
         "ZeRO-3 gathers every parameter tensor with a collective of its own, each paying the ring's latency "
         "(DeepSpeed ZeRO-3) (default: one collective per FSDP unit)"},
        {"fix", OPT_STRLIST, &a.fix, 0, "KEY=VALUE",
         "pin search knobs (repeatable or comma-separated: --fix tp=8 --fix zero=1,sp=1); the others are searched"},
        {"json", OPT_FLAG, &a.json, 0, NULL, "machine-readable output"},
        {"explain", OPT_FLAG, &a.explain, 0, NULL,
         "walk the rule of thumb's decisions and say where the search disagrees and why"},
    };
    static const cli_cmd cmd = {
        "plan",
        "loom plan --model NAME|config.json --cluster NAME|FILE [--gpus N] --batch B --seq T [--precision bf16|fp32]\n"
        "                 [--mode train|serve] [--top N] [--json] [--explain] [--layout dp=..,tp=..,...]",
        "Choose the parallel layout: every (dp, tp, pp, cp, ep, zero, sp, schedule, micro-batch\n"
        "size and count, virtual stages, recompute, mesh order) that divides the model and the\n"
        "cluster, ranked by predicted tokens/s/device. Memory per rank by ZeRO stage,\n"
        "activations (Korthikanti et al.) and the schedule's in-flight micro-batches; step time\n"
        "from compute, exposed communication per axis over the link its group crosses, and the\n"
        "bubble of the pipeline simulator (`loom sim`) on the executor's schedule lists.",
        "Layouts over memory or that do not divide heads, layers, experts, the batch or the\n"
        "sequence are rejected with the reason. Each layout lists its failure modes (too much\n"
        "TP, pipeline imbalance, too few or too many micro-batches, exposed expert all-to-all\n"
        "or CP communication, recompute). docs/planning.md describes the model.\n"
        "examples: loom plan --model llama3-70b --cluster dgx-h100 --gpus 1024 --batch 1024 --seq 8192 --explain\n"
        "          loom plan --model mini --cluster this-machine.json --gpus 4 --batch 8 --seq 128 --precision fp32\n"
        "          loom plan --model gpt2-small --gpus 8 --batch 64 --seq 1024 --layout dp=4,tp=2,zero=1 --json\n",
        opts,
        sizeof opts / sizeof opts[0]};
    int help;
    loom_status st = cli_parse(&cmd, argc, argv, 0, &help);
    if (st != LOOM_OK) return cli_fail(st);
    if (help) {
        cli_print_help(&cmd, stdout);
        return 0;
    }
    if (a.seq == 0 || a.batch == 0) {
        loom_plan_model m;
        if (loom_plan_model_resolve(a.model, &m) == LOOM_OK) {
            if (a.seq == 0) a.seq = m.max_seq < 8192 ? m.max_seq : 8192;
        }
        if (a.batch == 0) {
            loom_plan_cluster c;
            int n = a.gpus;
            if (n == 0 && loom_plan_cluster_load(a.cluster, &c) == LOOM_OK)
                n = c.gpus_per_node * (a.nodes ? a.nodes : c.nodes);
            a.batch = 8 * (n > 0 ? n : 1);
        }
    }
    return cli_fail(run(&a));
}
