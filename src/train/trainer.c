/* trainer.c - the training loop: data -> forward -> backward -> DP gradient
 * sync -> clip -> AdamW, with logging, metrics and parameter files.
 *
 * Collective over the world. Failures (see train.h): set-up agrees on them
 * with loom_comm_agree; from the first step on, train_phase's status goes
 * through fail_fast, which returns a failure every rank saw together and
 * aborts the job on any other.
 * Axis: dp for the gradient sync and the loss all-reduce. Every rank holds the
 * full model (plain DP); rank 0 alone prints and writes files.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/device.h"
#include "loom/cpu.h"
#include "loom/data.h"
#include "loom/dp.h"
#include "loom/edp.h"
#include "loom/hf_dir.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "loom/sysmem.h"
#include "loom/train.h"
#include "train/ckpt.h"
#include "train/internal.h"

void loom_train_config_default(loom_train_config *c) {
    memset(c, 0, sizeof *c);
    loom_layout_default(&c->layout);
    snprintf(c->model, sizeof c->model, "mini");
    c->steps = 100;
    c->seed = 1337;
    c->batch = 8;
    c->seq = 128;
    c->lr = 3e-4f;
    c->min_lr_frac = 0.1f;
    c->warmup = 0;
    c->weight_decay = 0.1f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->grad_clip = 1.0f;
    c->log_every = 1;
    c->bucket_mb = 25.0;
    c->moe_warn_imbalance = 2.0f;
    c->moe_warn_a2a = 0.5f;
    c->progress = -1;
    c->nan_policy = LOOM_NAN_POLICY_ABORT;
}

loom_layout_device loom_train_device(const loom_device *dev) {
    return (loom_layout_device){.name = dev->be->name,
                                .comm = loom_device_comm_name(dev->comm),
                                .native_comm = dev->comm == LOOM_DEVICE_COMM_NATIVE};
}

/* Checks that depend only on the config: identical on every rank. The
 * layout's are loom_layout_validate's; the rest are the trainer's options. */
static loom_status check_config(const loom_train_config *c, const loom_device *d, const loom_model_config *mc,
                                int world) {
    const loom_layout_model shape = loom_model_shape(mc);
    const loom_layout_device dev = loom_train_device(d);
    const loom_layout_job job = {
        .purpose = LOOM_LAYOUT_FOR_TRAIN, .world = world, .batch = c->batch, .seq = c->seq, .device = &dev};
    LOOM_TRY(loom_layout_validate(&c->layout, &shape, &job));
    if (d->bf16 != (c->layout.precision == LOOM_PRECISION_BF16))
        return loom_fail(LOOM_EINTERNAL, "--precision %s on a device made for %s GEMMs",
                         c->layout.precision == LOOM_PRECISION_BF16 ? "bf16" : "fp32",
                         d->bf16 ? "bf16" : "fp32");
    LOOM_TRY(loom_train_moe_check(c, mc));
    if (c->steps < 1) return loom_fail(LOOM_EUSAGE, "--steps %d: must be >= 1", c->steps);
    if (!(c->bucket_mb >= 0)) return loom_fail(LOOM_EUSAGE, "--bucket-mb %g: must be >= 0", c->bucket_mb);
    if (!(c->lr > 0 && isfinite(c->lr))) return loom_fail(LOOM_EUSAGE, "--lr %g: must be > 0", c->lr);
    if (c->warmup < 0 || c->warmup > c->steps)
        return loom_fail(LOOM_EUSAGE, "--warmup %d: must be between 0 and --steps %d", c->warmup, c->steps);
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
        return loom_fail(LOOM_EUSAGE, "--beta1 %g / --beta2 %g: must be in [0, 1)", c->beta1, c->beta2);
    if (!(c->min_lr_frac >= 0 && c->min_lr_frac <= 1))
        return loom_fail(LOOM_EUSAGE, "--min-lr-frac %g: must be in [0, 1]", c->min_lr_frac);
    if (c->weight_decay < 0 || c->eps <= 0)
        return loom_fail(LOOM_EUSAGE, "--weight-decay must be >= 0 and --eps > 0");
    if (!c->data[0]) return loom_fail(LOOM_EUSAGE, "--data PATH is required (make one with `loom data`)");
    if ((unsigned)c->nan_policy >= LOOM_NAN_POLICY_COUNT)
        return loom_fail(LOOM_EUSAGE, "--nan-policy %d: not a policy", (int)c->nan_policy);
    return LOOM_OK;
}

/* The directory of an output must exist and be writable before we train for
 * an hour and then fail to save. */
loom_status loom_check_output_path(const char *path, const char *flag) {
    if (!path[0]) return LOOM_OK;
    char dir[LOOM_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    size_t n = strlen(dir); /* a directory to create ("DIR/"): its parent must be writable */
    while (n > 1 && dir[n - 1] == '/') dir[--n] = '\0';
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    if (access(dir, W_OK) != 0)
        return loom_fail(LOOM_ECANTCREAT, "%s %s: directory %s is not writable: %s", flag, path, dir,
                         strerror(errno));
    return LOOM_OK;
}

/* Open the shard and check it can feed this run. */
static loom_status open_data(const loom_train_config *c, const loom_model_config *mc, loom_tokens *tok) {
    LOOM_TRY(loom_tokens_open(c->data, tok));
    char why[64];
    snprintf(why, sizeof why, "--seq %d", c->seq);
    loom_status st = loom_data_check_len(tok, (size_t)c->seq + 1, why);
    if (st == LOOM_OK) st = loom_tokens_check_vocab(tok, mc->vocab_size);
    if (st != LOOM_OK) loom_tokens_close(tok);
    return st;
}

/* Params from the seed, or from the file (rank 0 reads, all keep their
 * shard), written where the DP engine keeps them (ZeRO-3: only this rank's
 * slices ever exist). Collective. */
static loom_status init_params(const loom_train_config *c, loom_train_run_state *s) {
    if (c->resume[0]) return loom_ckpt_load(s, &s->start_step);
    if (c->load_params[0]) return loom_params_load(s->parts, s->n_parts, s->mesh, s->dp, c->load_params);
    const char *dir = s->model_cfg.dir;
    if (dir[0] && loom_hf_has_weights(dir)) /* --model DIR: its weights, as from_pretrained */
        return loom_params_load(s->parts, s->n_parts, s->mesh, s->dp, dir);
    for (int i = 0; i < s->n_parts; i++) {
        int n;
        const loom_param_run *runs = loom_dp_param_runs(s->dp, i, &n);
        for (int k = 0; k < n; k++)
            loom_gpt_init_range(s->parts[i], c->seed, runs[k].lo, runs[k].n, runs[k].data);
    }
    return LOOM_OK;
}

/* What tensor parallelism costs each block, in words (the table after the
 * first step has the measured totals). */
static void report_tp_regions(const loom_train_run_state *s) {
    const loom_train_config *c = s->cfg;
    if (c->layout.tp == 1) return;
    const loom_gpt *m = s->parts[0];
    double kb = (double)m->N * m->C * sizeof(float) / 1024.0;
    if (c->layout.sp)
        loom_info("tp=%d with sp: each block issues, per micro-batch, forward 2 all-gathers + 2 "
                  "reduce-scatters and backward 2 all-gathers + 2 reduce-scatters of the (B*T, C) "
                  "activations, plus 2 all-gathers re-gathering the LayerNorm outputs it keeps "
                  "sharded (4 with a split backward) (%.1f KB each, counted whole)",
                  c->layout.tp, kb);
    else
        loom_info("tp=%d: each block issues, per micro-batch, 2 all-reduces forward (after attention "
                  "and MLP) and 2 backward (into their inputs) of the (B*T, C) activations (%.1f KB each)",
                  c->layout.tp, kb);
}

/* This rank's and every rank's largest peak RSS so far (VmHWM). Collective
 * over the world; called outside the per-step statistics. */
static loom_status peak_rss(const loom_train_run_state *s, size_t *mine, size_t *max) {
    *mine = loom_sysmem_peak_rss();
    double v = (double)*mine;
    if (s->mesh->world_size > 1) LOOM_TRY(loom_comm_allreduce(s->mesh->world, &v, 1, LOOM_F64, LOOM_MAX));
    *max = (size_t)v;
    return LOOM_OK;
}

/* loom's plan per lifetime class beside what the OS measured (rank 0's peak
 * and the largest over the ranks, after initialisation). */
/* The hosts the ranks run on (loom_comm_init placed them host by host), one
 * line a host: its ranks, and the launcher's numbers for them where they
 * differ. Nothing on one host in the launcher's order. */
static void report_hosts(int world_size) {
    int moved = 0, consecutive = 1;
    for (int r = 0; r < world_size; r++) {
        moved |= loom_comm_launcher_rank(r) != r;
        if (r > 0 && loom_comm_host_of(r) < loom_comm_host_of(r - 1)) consecutive = 0;
    }
    if (loom_comm_hosts() < 2 && !moved) return;
    loom_info(
        "hosts: %d (ranks that share memory, from MPI); %s", loom_comm_hosts(),
        consecutive
            ? "each holds consecutive ranks, so the innermost axes of the order above stay inside a host"
            : "their ranks are not consecutive (LOOM_PLACEMENT=launcher): the innermost axes cross hosts");
    if (world_size > 64) return;
    for (int h = 0; h < loom_comm_hosts(); h++) {
        char ranks[512] = "", launch[512] = "";
        size_t a = 0, b = 0;
        for (int r = 0; r < world_size; r++) {
            if (loom_comm_host_of(r) != h) continue;
            if (a < sizeof ranks) a += (size_t)snprintf(ranks + a, sizeof ranks - a, " %d", r);
            if (b < sizeof launch)
                b += (size_t)snprintf(launch + b, sizeof launch - b, " %d", loom_comm_launcher_rank(r));
        }
        for (int r = 0; r < world_size; r++)
            if (loom_comm_host_of(r) == h) {
                loom_info("  host %d %s: ranks%s%s%s%s", h, loom_comm_host_name(r), ranks,
                          moved ? " (launcher ranks" : "", moved ? launch : "", moved ? ")" : "");
                break;
            }
    }
}

static void report_memory(const loom_train_run_state *s, size_t rss0, size_t rss_max) {
    double mb = 1024.0 * 1024.0;
    loom_dp_memory mem;
    loom_dp_memory_bytes(s->dp, &mem);
    loom_edp_memory_bytes(s->edp, &mem); /* MoE: experts' optimizer state, own storage, buffers */
    loom_info("memory per rank (planned): params %.1f MB, grads %.1f MB, optimizer %.1f MB, "
              "activations %.1f MB, total %.1f MB; peak RSS from the OS so far: %.1f MB on rank 0, "
              "%.1f MB the largest of all ranks (with libraries and buffers loom does not plan)",
              mem.params / mb, mem.grads / mb, mem.optimizer / mb, mem.activations / mb,
              (mem.params + mem.grads + mem.optimizer + mem.activations) / mb, rss0 / mb, rss_max / mb);
}

/* Keep one phase of the traced step (a no-op when not tracing). */
static void phase(loom_train_run_state *s, const char *what, int k, double t0, double t1) {
    if (!s->tracing || s->n_phase == LOOM_MAX_PHASES) return;
    snprintf(s->phase[s->n_phase].name, sizeof s->phase[0].name, k >= 0 ? "%s%d" : "%s", what, k);
    s->phase[s->n_phase].t0 = t0;
    s->phase[s->n_phase].t1 = t1;
    s->n_phase++;
}

loom_tp loom_train_tp_group(const loom_train_run_state *s) {
    const loom_train_config *c = s->cfg;
    return (loom_tp){.dev = s->dev,
                     .comm = s->mesh->tp,
                     .size = c->layout.tp,
                     .rank = s->mesh->tp_rank,
                     .sp = c->layout.sp,
                     .comm_bf16 = c->layout.comm_precision == LOOM_PRECISION_BF16};
}

loom_cp loom_train_cp_group(const loom_train_run_state *s) {
    return (loom_cp){.dev = s->dev,
                     .comm = s->mesh->cp,
                     .size = s->cfg->layout.cp,
                     .rank = s->mesh->cp_rank,
                     .impl = s->cfg->layout.cp_impl};
}

void loom_train_sample(loom_train_run_state *s, int step, int64_t first, int Bm, int32_t *inputs,
                       int32_t *targets) {
    const loom_train_config *c = s->cfg;
    loom_data_sample(&s->tokens, c->seed, step, c->batch, first, Bm, c->seq, s->inputs, s->targets);
    const loom_cp cp = loom_train_cp_group(s);
    const size_t n = (size_t)Bm * (c->seq / c->layout.cp);
    loom_cp_split_tokens(&cp, s->inputs, Bm, c->seq);
    loom_cp_split_tokens(&cp, s->targets, Bm, c->seq);
    if (inputs && inputs != s->inputs) memcpy(inputs, s->inputs, n * sizeof *inputs);
    if (targets && targets != s->targets) memcpy(targets, s->targets, n * sizeof *targets);
}

/* Forward and backward of this rank's micro-batches (pp = 1): K
 * micro-batches of B_l / K sequences each; gradients accumulate and the DP
 * engine communicates during the last one's backward. */
static loom_status run_micro_batches(loom_train_run_state *s, int step, double *loss_sum) {
    const loom_train_config *c = s->cfg;
    const int Bl = c->batch / c->layout.dp, K = c->layout.grad_accum, Bm = Bl / K, T = c->seq;
    const float dloss = 1.0f / ((float)c->batch * (float)T);
    for (int k = 0; k < K; k++) {
        int64_t first = (int64_t)s->mesh->dp_rank * Bl + (int64_t)k * Bm;
        loom_train_sample(s, step, first, Bm, s->inputs, s->targets);
        loom_dp_set_last_micro(s->dp, k == K - 1);
        double t0 = loom_comm_wtime();
        loom_gpt_expect_backward(s->parts[0], dloss); /* the backward right below */
        LOOM_TRY(loom_gpt_forward(s->parts[0], 0, s->inputs, s->targets, loss_sum));
        double t1 = loom_comm_wtime();
        LOOM_TRY(loom_gpt_backward(s->parts[0], 0, NULL, dloss));
        phase(s, "F", k, t0, t1);
        phase(s, "B", k, t1, loom_comm_wtime());
    }
    return LOOM_OK;
}

/* One optimizer step on this rank's slice of the global batch. */
static loom_status train_step(loom_train_run_state *s, int step, loom_step_stats *out) {
    const loom_train_config *c = s->cfg;
    const int T = c->seq;
    double t0 = loom_comm_wtime(), loss_sum = 0;
    LOOM_TRY(loom_dp_begin_step(s->dp));
    for (int i = 0; i < s->n_parts; i++) loom_gpt_hold_weights(s->parts[i], 1); /* until the update */
    loom_status st =
        s->pipelined ? loom_train_pp_step(s, step, &loss_sum) : run_micro_batches(s, step, &loss_sum);
    for (int i = 0; i < s->n_parts; i++) loom_gpt_hold_weights(s->parts[i], 0);
    LOOM_TRY(st);
    double t1 = loom_comm_wtime();
    LOOM_TRY(loom_dp_finish_grads(s->dp));
    LOOM_TRY(loom_edp_finish_grads(s->edp)); /* expert gradients over edp */
    phase(s, "gradient sync", -1, t1, loom_comm_wtime());
    if (c->layout.dp * c->layout.cp > 1) /* the tokens of dp x cp */
        LOOM_TRY(loom_comm_allreduce(loom_comm_host(c->layout.cp > 1 ? s->mesh->dpcp : s->mesh->dp),
                                     &loss_sum, 1, LOOM_F64, LOOM_SUM));
    out->loss = loss_sum / ((double)c->batch * T);
    LOOM_TRY(loom_dp_grad_norm(s->dp, &out->grad_norm));
    out->skipped = 0;
    LOOM_TRY(loom_edp_grad_norm(s->edp, &out->grad_norm));
    if (!isfinite(out->loss) || !isfinite(out->grad_norm)) {
        loom_status st = loom_train_nonfinite(s, step, out->loss, out->grad_norm);
        s->failed_together = st != LOOM_OK;
        if (st != LOOM_OK) return st;
        out->skipped = 1; /* --nan-policy skip: no update this step */
        out->lr = loom_lr_at(c, step);
        out->seconds = loom_comm_wtime() - t0;
        out->tokens_per_s = (double)c->batch * T / out->seconds;
        out->mfu = 0;
        return LOOM_OK;
    }
    float scale = 1.0f;
    if (c->grad_clip > 0 && out->grad_norm > c->grad_clip)
        scale = c->grad_clip / (float)(out->grad_norm + 1e-6);
    out->lr = loom_lr_at(c, step);
    double t2 = loom_comm_wtime();
    LOOM_TRY(loom_dp_step(s->dp, out->lr, scale));
    LOOM_TRY(loom_edp_step(s->edp, out->lr, scale));
    phase(s, "optimizer", -1, t2, loom_comm_wtime());
    out->seconds = loom_comm_wtime() - t0;
    out->tokens_per_s = (double)c->batch * T / out->seconds;
    out->mfu = loom_mfu(&s->peak_flops, s->flops_per_token * out->tokens_per_s / s->mesh->world_size,
                        &s->peak_raised);
    return LOOM_OK;
}

static loom_status setup(loom_train_run_state *s, const loom_train_config *c, loom_comm *world) {
    int world_size = loom_comm_size(world), rank = loom_comm_rank(world);
    loom_model_config mc;
    loom_status st = loom_model_config_resolve(c->model, &mc);
    if (st == LOOM_OK) st = check_config(c, s->dev, &mc, world_size);
    LOOM_TRY(loom_comm_agree(world, st));

    st = open_data(c, &mc, &s->tokens);
    s->have_tokens = st == LOOM_OK;
    if (st == LOOM_OK && rank == 0) st = loom_check_output_path(c->save_params, "--save-params");
    if (st == LOOM_OK && rank == 0) st = loom_check_output_path(c->metrics, "--metrics");
    if (st == LOOM_OK) st = loom_ckpt_run_create(c, &mc, &s->ckpt);
    if (st == LOOM_OK && rank == 0) st = loom_ckpt_prepare(c, s->ckpt);
    LOOM_TRY(loom_comm_agree(world, st));

    if (c->trace[0]) {
        if (rank == 0) mkdir(c->trace, 0755); /* one level, as mkdir(1); errors surface below */
        LOOM_TRY(loom_comm_barrier(world));
        st = access(c->trace, W_OK) == 0
                 ? LOOM_OK
                 : loom_fail(LOOM_ECANTCREAT, "--trace %s: not a writable directory: %s", c->trace,
                             strerror(errno));
        LOOM_TRY(loom_comm_agree(world, st));
        loom_comm_trace(1 << 16);
    }
    LOOM_TRY(loom_mesh_create(world, &c->layout, s->dev, &s->mesh));
    const loom_layout *l = &c->layout;
    const int micro = loom_layout_pipelined(l) ? loom_layout_micro_batches(l) : l->grad_accum;
    const int Bm = c->batch / l->dp / micro;
    if (loom_layout_pipelined(l)) {
        st = loom_train_pp_setup(s, &mc, Bm);
    } else {
        loom_model_part part = loom_model_part_whole(s->dev, &mc);
        part.tp = loom_train_tp_group(s);
        part.ep = c->layout.ep > 1 ? s->mesh->ep : NULL; /* experts split over the EP group */
        part.cp = loom_train_cp_group(s);
        loom_gpt_opts opts = {.B = Bm,
                              .T = c->seq / l->cp,
                              .n_slots = 1,
                              .recompute = l->recompute,
                              .external_params = l->zero >= 3,
                              .external_grads = l->zero >= 2,
                              .moe_route_cp = c->moe_route_cp};
        s->n_parts = 1;
        st = loom_gpt_create(&mc, &part, &opts, &s->parts[0]);
    }
    loom_dp_config dpc = {.zero = l->zero,
                          .bucket_mb = c->bucket_mb,
                          .sum_tp_partials = 1,
                          .comm_bf16 = l->comm_precision == LOOM_PRECISION_BF16};
    loom_adamw_hparams hp = {c->beta1, c->beta2, c->eps, c->weight_decay};
    if (st == LOOM_OK) st = loom_dp_engine_create(s->parts, s->n_parts, s->mesh, &dpc, &hp, &s->dp);
    if (st == LOOM_OK) st = loom_edp_engine_create(s->parts, s->n_parts, s->mesh, &hp, &s->edp);
    if (st == LOOM_OK) {
        s->inputs = malloc((size_t)Bm * c->seq * sizeof(int32_t));
        s->targets = malloc((size_t)Bm * c->seq * sizeof(int32_t));
        if (!s->inputs || !s->targets) st = loom_fail(LOOM_EOS, "out of memory for the batch");
    }
    LOOM_TRY(loom_comm_agree(world, st));
    s->model_cfg = mc;
    LOOM_TRY(init_params(c, s));
    if (c->trace[0]) LOOM_TRY(loom_train_trace_setup(s)); /* ranks' clocks aligned, offsets reported */
    s->flops_per_token = loom_gpt_flops_per_token(&mc, c->seq);
    return loom_peak_flops(world, s->dev, c->peak_flops, &s->peak_flops, &s->fma_flops);
}

static void teardown(loom_train_run_state *s) {
    free(s->inputs);
    free(s->targets);
    loom_dp_engine_free(s->dp);
    loom_edp_engine_free(s->edp);
    loom_train_moe_free(s);
    if (s->pipelined) loom_train_pp_teardown(s);
    for (int i = 0; i < s->n_parts; i++) loom_gpt_free(s->parts[i]);
    loom_train_trace_free(s);
    loom_mesh_free(s->mesh);
    if (s->have_tokens) loom_tokens_close(&s->tokens);
    loom_ckpt_run_free(s->ckpt);
}

static loom_status run_steps(loom_train_run_state *s, loom_train_result *res) {
    const loom_train_config *c = s->cfg;
    loom_step_stats st_step = {0};
    double tok_time = 0, tokens = 0;
    loom_comm *groups[LOOM_REPORT_GROUPS] = {s->mesh->tp,   s->mesh->cp, s->mesh->dp,   s->mesh->pp,
                                             s->mesh->dpcp, s->mesh->ep, s->mesh->world};
    loom_dp_memory_bytes(s->dp, &st_step.mem);
    loom_edp_memory_bytes(s->edp, &st_step.mem);
    for (int step = s->start_step; step < c->steps; step++) {
        for (int g = 0; g < LOOM_REPORT_GROUPS; g++) loom_comm_reset_stats(groups[g]);
        s->tracing = loom_train_trace_on(s, step);
        if (s->tracing) loom_comm_trace_clear(), s->n_phase = 0;
        double t_step = loom_comm_wtime();
        LOOM_TRY(train_step(s, step, &st_step));
        loom_dp_get_timing(s->dp, &st_step.dp);
        st_step.pp_bubble = -1;
        if (s->pipelined) {
            st_step.pp_ranks = c->layout.pp;
            st_step.pp_idle_ms = s->pp_times;
            st_step.pp_wait_ms = s->pp_times + c->layout.pp;
            LOOM_TRY(loom_train_pp_bubble(s, &st_step.pp_bubble, st_step.pp_idle_ms, st_step.pp_wait_ms));
            st_step.pp_peak_live = loom_pp_exec_peak_live(s->exec);
        }
        st_step.comm_bytes = 0;
        for (int g = 0; g < LOOM_REPORT_GROUPS; g++) {
            st_step.comm[g] = *loom_comm_get_stats(groups[g]);
            for (int op = 0; op < LOOM_OP_COUNT; op++) st_step.comm_bytes += st_step.comm[g].bytes[op];
        }
        /* after the step's statistics: the merge's messages are not counted in them */
        if (s->tracing) LOOM_TRY(loom_train_trace_step(s, step, t_step)); /* a local failure aborts */
        if (step > 0 || c->steps == 1) {
            tok_time += st_step.seconds;
            tokens += (double)c->batch * c->seq;
        }
        /* after the step's statistics were taken: not counted in them */
        LOOM_TRY(peak_rss(s, &st_step.peak_rss, &st_step.peak_rss_max));
        LOOM_TRY(loom_train_moe_step(s, step, &st_step));
        LOOM_TRY(loom_report_step(&s->report, step, &st_step));
        res->steps_done = step + 1;
        res->final_loss = st_step.loss;
        LOOM_TRY(loom_ckpt_after_step(s, step)); /* periodic save; a signal saves and stops */
    }
    res->tokens_per_s = tok_time > 0 ? tokens / tok_time : 0;
    double per_rank = s->flops_per_token * res->tokens_per_s / s->mesh->world_size;
    res->mfu = loom_mfu(&s->peak_flops, per_rank, &s->peak_raised);
    if (s->cfg->peak_flops > 0)
        loom_info("MFU %.1f%% of the given peak (%.1f GFLOP/s per rank%s)", 100 * res->mfu,
                  s->peak_flops / 1e9, s->peak_raised ? ", raised to a step's own rate" : "");
    else
        loom_info(
            "MFU %.1f%% of the %s peak (%.1f GFLOP/s per rank%s), %.1f%% of the FMA peak (%.1f GFLOP/s)",
            100 * res->mfu, s->dev->bf16 ? "bf16 GEMM" : "sgemm", s->peak_flops / 1e9,
            s->peak_raised ? ", raised to a step's own rate" : "",
            100 * per_rank / (s->fma_flops > per_rank ? s->fma_flops : per_rank), s->fma_flops / 1e9);
    return LOOM_OK;
}

/* Everything from the first step on: steps, the parameter file, closing the
 * metrics. A failure here returns at once on the rank that hit it, with no
 * further collective; fail_fast decides what happens next. */
static loom_status train_phase(loom_train_run_state *s, loom_train_result *res) {
    const loom_train_config *c = s->cfg;
    loom_status st = run_steps(s, res);
    if (st == LOOM_OK && c->save_dir[0] && s->start_step < c->steps) {
        st = loom_ckpt_save(s, c->steps);
        s->failed_together = st != LOOM_OK; /* agreed by every rank */
    }
    if (st == LOOM_OK && c->save_params[0])
        st = loom_params_save(s->parts, s->n_parts, s->mesh, s->dp, c->save_params);
    loom_status cst = loom_report_close(&s->report, st, res);
    return st != LOOM_OK ? st : cst;
}

/* The rule of train.h: a failure every rank saw together (failed_together)
 * returns; any other is local to this rank, whose peers are (or will be)
 * waiting in a collective, so it aborts the whole job with its message and
 * its status as the exit code. */
static loom_status fail_fast(const loom_train_run_state *s, loom_comm *world, loom_status st) {
    if (st != LOOM_OK && !s->failed_together) loom_comm_abort(world, (int)st);
    return st;
}

loom_status loom_train_run(const loom_train_config *c, loom_device *dev, loom_comm *world,
                           loom_train_result *res) {
    loom_train_run_state s;
    memset(&s, 0, sizeof s);
    memset(res, 0, sizeof *res);
    s.cfg = c;
    s.dev = dev;
    if (c->save_dir[0]) loom_ckpt_signals();
    loom_status st = setup(&s, c, world);
    int rank = loom_comm_rank(world);
    size_t rss0 = 0, rss_max = 0;
    if (st == LOOM_OK) st = peak_rss(&s, &rss0, &rss_max);
    if (st == LOOM_OK && rank == 0) {
        char table[8192];
        loom_mesh_format(&c->layout, s.mesh->world_size, table, sizeof table);
        loom_info("%s", table);
        report_hosts(s.mesh->world_size);
        const loom_model_config *mc = &s.model_cfg;
        loom_info("model %s: %d layers, d_model %d, %d heads, vocab %d", mc->name, mc->n_layer, mc->n_embd,
                  mc->n_head, mc->vocab_size);
        char gemm[512], bf16[512] = "";
        loom_blas_describe(gemm, sizeof gemm);
        if (dev->bf16) loom_bf16_gemm_describe(bf16, sizeof bf16);
        loom_info("gemm: %s%s%s", gemm,
                  bf16[0] ? "; precision bf16 mixed (fp32 accumulation), bf16 gemm: " : "", bf16);
        loom_omp_describe(gemm, sizeof gemm);
        loom_info("threads: %d per rank; %s", dev->threads, gemm);
        loom_info("start-up: %.2f s from process start (parameters initialised on %d thread(s); "
                  "%.2f s of CPU)",
                  loom_sysmem_process_age(), dev->threads, loom_sysmem_process_cpu());
        report_memory(&s, rss0, rss_max);
        report_tp_regions(&s);
    }
    if (st == LOOM_OK && c->save_dir[0]) st = loom_ckpt_begin(&s);
    if (st == LOOM_OK) {
        loom_status rst = loom_report_open(&s.report, c, rank);
        if (rst == LOOM_OK) rst = loom_report_header(&s.report, &s); /* the run's settings: row 1 */
        st = loom_comm_agree(world, rst);
    }
    if (st != LOOM_OK) loom_report_close(&s.report, st, res); /* agreed before the first step */
    else st = fail_fast(&s, world, train_phase(&s, res));
    /* no rank leaves (and exits 0) while a peer may still fail locally and abort */
    if (st == LOOM_OK) st = loom_comm_agree(world, st);
    teardown(&s);
    return st;
}
