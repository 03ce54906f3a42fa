/* cmd_train.c - `loom train` and `loom eval`: flags -> config -> the trainer.
 * Both start MPI (a plain `build/loom train` is a one-rank job). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/device.h"
#include "loom/log.h"
#include "loom/train.h"

static loom_status start(int *argc, char ***argv, loom_comm **world) {
    return cli_mpi_start(argc, argv, world);
}

/* Flags are checked on every rank and the outcome agreed on (one collective,
 * loom_comm_agree): the lowest failing rank keeps its message and the others
 * stay quiet, so an error every rank shares is printed once, and an error
 * only one rank sees (a config file missing on one node) is still printed and
 * still stops every rank. */
static loom_status agree(loom_comm *world, loom_status st) { return loom_comm_agree(world, st); }

/* Frees the device (NULL: none), then cli_mpi_finish. */
static int finish(loom_comm *world, loom_device *dev, loom_status st) {
    loom_device_free(dev);
    return cli_mpi_finish(world, st);
}
static void help_once(loom_comm *world, const cli_cmd *cmd) { cli_help_once(world, cmd); }

/* Two settings that must not name the same file (an output over an input or
 * over another output would destroy it). */
static loom_status distinct(const char *flag_a, const char *a, const char *flag_b, const char *b) {
    if (cli_same_file(a, b))
        return loom_fail(LOOM_EUSAGE, "%s %s and %s %s are the same file; one would overwrite the other",
                         flag_a, a, flag_b, b);
    return LOOM_OK;
}

/* Checks of flag values the trainer does not make. */
static loom_status check_train_flags(const loom_train_config *c) {
    if (c->log_every < 1) return loom_fail(LOOM_EUSAGE, "--log-every %d: must be >= 1", c->log_every);
    if (c->threads < 0) return loom_fail(LOOM_EUSAGE, "--threads %d: must be >= 0 (0 = auto)", c->threads);
    if (c->peak_flops < 0)
        return loom_fail(LOOM_EUSAGE, "--peak-flops %g: must be > 0 (or 0 to measure)", c->peak_flops);
    if (c->grad_clip < 0)
        return loom_fail(LOOM_EUSAGE, "--grad-clip %g: must be >= 0 (0 = off)", c->grad_clip);
    LOOM_TRY(distinct("--save-params", c->save_params, "--metrics", c->metrics));
    LOOM_TRY(distinct("--save-params", c->save_params, "--data", c->data));
    LOOM_TRY(distinct("--metrics", c->metrics, "--data", c->data));
    LOOM_TRY(distinct("--metrics", c->metrics, "--load-params", c->load_params));
    if (c->save_every < 0) return loom_fail(LOOM_EUSAGE, "--save-every %d: must be >= 0", c->save_every);
    if (c->keep < 0) return loom_fail(LOOM_EUSAGE, "--keep %d: must be >= 0 (0 = all)", c->keep);
    if ((c->save_every || c->keep || c->overwrite) && !c->save_dir[0])
        return loom_fail(LOOM_EUSAGE, "--save-every, --keep and --overwrite need --save-dir DIR");
    if (c->resume[0] && c->load_params[0])
        return loom_fail(LOOM_EUSAGE, "--resume and --load-params both set the parameters; give one");
    return LOOM_OK;
}

/* --trace-steps A:B, A or A: into c->trace_first/_last (1-based; 0: the
 * last step); within --steps, and only with --trace. */
static loom_status parse_trace_steps(const char *s, loom_train_config *c) {
    if (!s[0]) return LOOM_OK;
    if (!c->trace[0]) return loom_fail(LOOM_EUSAGE, "--trace-steps %s needs --trace DIR", s);
    char *end;
    long a = strtol(s, &end, 10), b = a;
    int ok = end != s;
    if (ok && *end == ':') { /* A: runs to the last step */
        const char *rest = end + 1;
        b = c->steps;
        end = (char *)rest;
        if (*rest) {
            b = strtol(rest, &end, 10);
            ok = end != rest;
        }
    }
    if (!ok || *end || a < 1 || b < a || b > c->steps)
        return loom_fail(LOOM_EUSAGE,
                         "--trace-steps %s: expected A:B, A or A: with 1 <= A <= B <= --steps %d", s,
                         c->steps);
    c->trace_first = (int)a;
    c->trace_last = (int)b;
    return LOOM_OK;
}

/* The default shard is built on first use, by rank 0, if any rank lacks it. */
static loom_status ensure_default_data(loom_comm *world, const char *data) {
    if (strcmp(data, LOOM_DEFAULT_TRAIN) != 0) return LOOM_OK;
    int32_t missing = access(data, F_OK) != 0;
    LOOM_TRY(loom_comm_allreduce(world, &missing, 1, LOOM_I32, LOOM_MAX));
    if (!missing) return LOOM_OK;
    loom_status st = LOOM_OK;
    if (loom_comm_rank(world) == 0 && access(data, F_OK) != 0) {
        loom_info("building the default data set %s from %s", data, LOOM_DEFAULT_CORPUS_DIR);
        st = cli_build_default_data(LOOM_DEFAULT_TRAIN, LOOM_DEFAULT_VAL, 1);
    }
    return agree(world, st);
}

int cmd_train(int argc, char **argv) {
    static loom_train_config c;
    static char order[64] = "tp,cp,dp,pp", stage_layers[256], trace_steps[64];
    static cli_enum e_schedule = {&c.layout.schedule, loom_schedule_names},
                    e_precision = {&c.layout.precision, loom_precision_names},
                    e_comm_precision = {&c.layout.comm_precision, loom_precision_names},
                    e_recompute = {&c.layout.recompute, loom_recompute_names},
                    e_cp_impl = {&c.layout.cp_impl, loom_cp_impl_names},
                    e_nan_policy = {&c.nan_policy, loom_nan_policy_names};
    static char device[16] = "cpu";
    static int no_progress, progress;
    loom_train_config_default(&c);
    snprintf(c.data, sizeof c.data, "%s", LOOM_DEFAULT_TRAIN);
    cli_opt opts[] = {
        {"model", OPT_STR, c.model, sizeof c.model, "NAME|FILE",
         "built-in model (tiny, mini, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, tiny-moe, mini-moe, tiny-llama, tiny-mistral, tiny-qwen2, ...), a Hugging Face config.json (model_type gpt2, llama, mistral, qwen2, mixtral, qwen2_moe; GPT-2 MoE keys as Mixtral's) or a Hugging Face directory: its config.json, and its model.safetensors or sharded model-*-of-*.safetensors as the initial parameters (default mini)"},
        {"data", OPT_STR, c.data, sizeof c.data, "PATH",
         "token shard, llm.c .bin (default " LOOM_DEFAULT_TRAIN
         ", built from the fortunes corpus if missing)"},
        {"steps", OPT_INT, &c.steps, 0, "N", "optimizer steps (default 100)"},
        {"batch", OPT_INT, &c.batch, 0, "B", "global batch in sequences, split over dp (default 8)"},
        {"seq", OPT_INT, &c.seq, 0, "T", "sequence length (default 128)"},
        {"seed", OPT_U64, &c.seed, 0, "S", "seed for parameters and data order (default 1337)"},
        {"lr", OPT_FLOAT, &c.lr, 0, "X", "peak learning rate (default 3e-4)"},
        {"warmup", OPT_INT, &c.warmup, 0, "N", "linear warmup steps, then cosine decay (default 0)"},
        {"min-lr-frac", OPT_FLOAT, &c.min_lr_frac, 0, "F", "final lr as a fraction of --lr (default 0.1)"},
        {"weight-decay", OPT_FLOAT, &c.weight_decay, 0, "X",
         "AdamW decoupled weight decay on matrices (default 0.1)"},
        {"beta1", OPT_FLOAT, &c.beta1, 0, "X", "AdamW beta1 (default 0.9)"},
        {"beta2", OPT_FLOAT, &c.beta2, 0, "X", "AdamW beta2 (default 0.95)"},
        {"eps", OPT_FLOAT, &c.eps, 0, "X", "AdamW epsilon (default 1e-8)"},
        {"grad-clip", OPT_FLOAT, &c.grad_clip, 0, "X",
         "clip the global gradient norm to X; 0 = off (default 1.0)"},
        {"dp", OPT_INT, &c.layout.dp, 0, "N", "data-parallel degree (default 1)"},
        {"tp", OPT_INT, &c.layout.tp, 0, "N", "tensor-parallel degree (default 1)"},
        {"grad-accum", OPT_INT, &c.layout.grad_accum, 0, "K",
         "micro-batches per step on each DP rank; gradients communicated on the last (default 1)"},
        {"zero", OPT_INT, &c.layout.zero, 0, "S",
         "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 + gradients, 3 + parameters (default 0)"},
        {"moe-warn-imbalance", OPT_FLOAT, &c.moe_warn_imbalance, 0, "X",
         "MoE: warn naming the block when max/mean tokens per expert exceeds X (default 2)"},
        {"moe-warn-a2a", OPT_FLOAT, &c.moe_warn_a2a, 0, "F",
         "MoE: warn when expert all-to-all takes more than F of the step (default 0.5)"},
        {"moe-route-cp", OPT_INT, &c.moe_route_cp, 0, "N",
         "MoE without --cp: route each micro-batch as N groups, the tokens each of N CP ranks would hold, so dropping and the aux loss match a --cp N run (default: one group)"},
        {"bucket-mb", OPT_DOUBLE, &c.bucket_mb, 0, "MB", "DDP gradient bucket size in MB (default 25)"},
        {"sp", OPT_FLAG, &c.layout.sp, 0, NULL,
         "Megatron sequence parallelism inside the TP group (needs --tp > 1)"},
        {"pp", OPT_INT, &c.layout.pp, 0, "N", "pipeline-parallel degree (default 1)"},
        {"schedule", OPT_ENUM, &e_schedule, 0, "NAME",
         "pipeline schedule: gpipe, 1f1b, interleaved, zb (ZB-H1), zbh2 (ZB-H2), zbv (ZB-V), dualpipev (DeepSeek DualPipeV) (default 1f1b)"},
        {"precision", OPT_ENUM, &e_precision, 0, "P",
         "GEMM precision: fp32, or bf16 mixed (bf16 operands, fp32 accumulation, fp32 master weights, optimizer and reductions) (default fp32)"},
        {"comm-precision", OPT_ENUM, &e_comm_precision, 0, "P",
         "communication of gradients and activations: fp32, or bf16 - the dp x cp gradient reductions (zero 0 all-reduce, zero 1-3 reduce-scatters) and the TP/SP activation collectives sent as bf16, half their bytes; every partial sum is rounded to bf16, so the error grows with the group size; needs --precision bf16 and dp, cp or tp > 1; parameter gathers, the gradient norm, softmax statistics, PP, CP and EP traffic stay fp32 (default fp32)"},
        {"recompute", OPT_ENUM, &e_recompute, 0, "MODE",
         "activation recompute: none, selective (attention probabilities), full (each block from its input; with zb, zbh2, zbv, dualpipev W recomputes it once more) (default none)"},
        {"micro-batches", OPT_INT, &c.layout.micro_batches, 0, "M",
         "pipeline micro-batches per step per DP rank (default: pp)"},
        {"virtual-stages", OPT_INT, &c.layout.virtual_stages, 0, "V",
         "model chunks per pipeline rank, for interleaved (default 1; zbv and dualpipev: 2, their V)"},
        {"stage-layers", OPT_STR, stage_layers, sizeof stage_layers, "LIST",
         "blocks per virtual stage, e.g. 3,3,2,2 (default: balanced by cost)"},
        {"trace", OPT_STR, c.trace, sizeof c.trace, "DIR",
         "write DIR/trace.json: one Chrome/Perfetto trace of the whole job over --trace-steps (each rank a "
         "process, its compute and each group's communication a thread, clocks aligned at start-up by "
         "ping-pong, the offsets printed), and DIR/trace_rank<R>.json per rank of the last traced step "
         "(loom sim --from-trace)"},
        {"trace-steps", OPT_STR, trace_steps, sizeof trace_steps, "A:B",
         "the steps --trace records, 1-based, inclusive: A:B, A (one step) or A: (to the end) (default: the "
         "last step)"},
        {"cp", OPT_INT, &c.layout.cp, 0, "N",
         "context-parallel degree: the sequence split over N ranks, 2N causal-balanced chunks (default 1)"},
        {"cp-impl", OPT_ENUM, &e_cp_impl, 0, "NAME",
         "context-parallel attention: ring (K/V passed around) or ulysses (all-to-all to heads) (default ring)"},
        {"ep", OPT_INT, &c.layout.ep, 0, "N",
         "expert-parallel degree for MoE models: experts split over N ranks inside dp x cp (default 1)"},
        {"mesh-order", OPT_STR, order, sizeof order, "AXES",
         "mesh axes innermost first (default tp,cp,dp,pp); ranks are numbered host by host "
         "(LOOM_PLACEMENT=launcher: as launched), so the innermost axes stay inside a host"},
        {"threads", OPT_INT, &c.threads, 0, "N", "compute threads per rank; 0 = auto (default)"},
        CLI_DEVICE_OPT(device),
        {"peak-flops", OPT_DOUBLE, &c.peak_flops, 0, "X",
         "per-rank peak FLOP/s for MFU; default: measured sgemm, cached"},
        {"metrics", OPT_STR, c.metrics, sizeof c.metrics, "FILE",
         "write the run's settings and environment, then one JSON object per step (JSONL; loom report FILE plots "
         "it)"},
        {"tensorboard", OPT_STR, c.tensorboard, sizeof c.tensorboard, "DIR",
         "write TensorBoard event files into DIR (created): every number of each step's metrics row as a scalar"},
        {"save-params", OPT_STR, c.save_params, sizeof c.save_params, "FILE",
         "write final parameters (safetensors, Hugging Face names); a path ending in / or an existing directory gets a Hugging Face directory (model.safetensors + config.json) that transformers' from_pretrained loads"},
        {"load-params", OPT_STR, c.load_params, sizeof c.load_params, "FILE",
         "start from these parameters instead of the seed"},
        {"save-dir", OPT_STR, c.save_dir, sizeof c.save_dir, "DIR",
         "sharded checkpoints DIR/step_N (each rank its own shards + a manifest), at the end and every --save-every steps; SIGTERM/SIGINT save and exit 75 (docs/checkpoints.md)"},
        {"save-every", OPT_INT, &c.save_every, 0, "N",
         "checkpoint every N steps (default 0: only at the end)"},
        {"keep", OPT_INT, &c.keep, 0, "K",
         "keep the newest K checkpoints in --save-dir, removing older ones after each publish (default 0: all)"},
        {"resume", OPT_STR, c.resume, sizeof c.resume, "DIR",
         "continue from the newest step_N of DIR whose manifest and files verify, or from DIR/step_N, under any layout; the run's model, data, seed and hyper-parameters must be the checkpoint's"},
        {"overwrite", OPT_FLAG, &c.overwrite, 0, NULL,
         "--save-dir may hold checkpoints (of this or another run): delete them before the first step and start over"},
        {"nan-policy", OPT_ENUM, &e_nan_policy, 0, "abort|skip",
         "a non-finite loss or gradient (checked every step, the first such parameter named): abort (exit 65, default) or skip that step's update"},
        {"log-every", OPT_INT, &c.log_every, 0, "N", "plain log line every N steps (default 1)"},
        {"progress", OPT_FLAG, &progress, 0, NULL, "force the progress bar"},
        {"no-progress", OPT_FLAG, &no_progress, 0, NULL, "plain log lines even on a terminal"},
        {"quiet", OPT_FLAG, &c.quiet, 0, NULL, "print errors only"},
    };
    const cli_cmd cmd = {
        "train",
        "loom train [options]   (many ranks: scripts/loomrun -np N build/loom train --dp N ...)",
        "Train a GPT-2 or Llama-family model. Every layout computes the same run as one device: the\n"
        "loss at each step and the final parameters agree with a one-rank run.",
        "A JSON file given with --config FILE holds flag names as keys, e.g.\n"
        "  {\"model\": \"tiny\", \"steps\": 20, \"lr\": 1e-3, \"dp\": 2}\n"
        "and flags on the command line override it. Unknown keys or wrong types: exit 78.\n"
        "The world size must equal dp x tp x pp x cp. Metrics and parameter files are\n"
        "written to FILE.tmp and renamed when complete; a failed run leaves existing\n"
        "files as they were.\n",
        opts,
        sizeof opts / sizeof opts[0]};

    loom_comm *world = NULL;
    loom_device *dev = NULL;
    loom_status st = start(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    int help;
    st = cli_parse(&cmd, argc, argv, 1, &help);
    if (st == LOOM_OK && help) {
        help_once(world, &cmd);
        return finish(world, dev, LOOM_OK);
    }
    /* the strings a layout holds as enums are parsed by the flag table; these two are lists */
    if (st == LOOM_OK) st = loom_layout_parse_order(order, &c.layout);
    if (st == LOOM_OK) st = loom_layout_parse_stage_layers(stage_layers, &c.layout);
    if (st == LOOM_OK) st = parse_trace_steps(trace_steps, &c);
    loom_layout_vshape_default(&c.layout);
    if (st == LOOM_OK) st = check_train_flags(&c);
    /* the stop signals tools/loom.c held since the start: --save-dir catches them */
    if (st == LOOM_OK && c.save_dir[0]) loom_train_catch_stop_signals(cli_held_stop_signal());
    else cli_release_stop_signals();
    if (st == LOOM_OK)
        st = cli_device_create(device, c.threads, loom_comm_size(world),
                               c.layout.precision == LOOM_PRECISION_BF16, &dev);
    st = agree(world, st);
    if (st != LOOM_OK) return finish(world, dev, st);
    c.progress = no_progress ? 0 : progress ? 1 : -1;
    if (c.quiet) loom_log_set_level(LOOM_LOG_ERROR); /* errors only, as --help says: no MoE warnings */

    st = ensure_default_data(world, c.data);
    if (st != LOOM_OK) return finish(world, dev, st);
    loom_train_result res;
    st = loom_train_run(&c, dev, world, &res);
    if (st == LOOM_OK && !c.save_params[0] && !c.save_dir[0] && loom_comm_rank(world) == 0)
        loom_warn("the trained parameters were not saved: give --save-params FILE (one safetensors file) or "
                  "--save-dir DIR (sharded checkpoints) to keep them");
    return finish(world, dev, st);
}

int cmd_eval(int argc, char **argv) {
    static loom_eval_config c = {
        .model = "mini", .data = LOOM_DEFAULT_VAL, .batch = 8, .seq = 128, .batches = 1, .threads = 0};
    static char device[16] = "cpu";
    cli_opt opts[] = {
        {"model", OPT_STR, c.model, sizeof c.model, "NAME|FILE",
         "built-in model or config.json (default mini)"},
        {"load-params", OPT_STR, c.load_params, sizeof c.load_params, "FILE",
         "parameters (safetensors, or a Hugging Face directory) to evaluate (default: the --model directory's weights)"},
        {"data", OPT_STR, c.data, sizeof c.data, "PATH", "token shard (default " LOOM_DEFAULT_VAL ")"},
        {"batch", OPT_INT, &c.batch, 0, "B", "sequences per batch (default 8)"},
        {"seq", OPT_INT, &c.seq, 0, "T", "sequence length (default 128)"},
        {"batches", OPT_INT, &c.batches, 0, "N", "number of batches (default 1)"},
        {"threads", OPT_INT, &c.threads, 0, "N", "compute threads per rank; 0 = auto"},
        CLI_DEVICE_OPT(device),
    };
    const cli_cmd cmd = {
        "eval",
        "loom eval --load-params FILE [--model NAME|FILE] [--data PATH] [--batch B] [--seq T] [--batches N]",
        "Mean cross-entropy of the parameters on the shard read sequentially: sequence j\n"
        "(j = 0 .. B*N-1) has inputs tokens[j*T .. j*T+T-1] and targets one token later.\n"
        "The last line printed is `loss <value>`.",
        NULL,
        opts,
        sizeof opts / sizeof opts[0]};
    loom_comm *world = NULL;
    loom_device *dev = NULL;
    loom_status st = start(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    int help;
    st = cli_parse(&cmd, argc, argv, 0, &help);
    if (st == LOOM_OK && help) {
        help_once(world, &cmd);
        return finish(world, dev, LOOM_OK);
    }
    if (st == LOOM_OK && c.threads < 0)
        st = loom_fail(LOOM_EUSAGE, "--threads %d: must be >= 0 (0 = auto)", c.threads);
    if (st == LOOM_OK) st = cli_device_create(device, c.threads, loom_comm_size(world), 0, &dev);
    st = agree(world, st);
    if (st != LOOM_OK) return finish(world, dev, st);
    double loss = 0;
    st = loom_eval_run(&c, dev, world, &loss);
    /* a blow-up is bad data, never a printed "loss nan" with exit 0; the
     * loss is all-reduced, so every rank sees it and rank 0 reports it */
    if (st == LOOM_OK && !isfinite(loss)) {
        st = loom_fail(LOOM_EDATA, "non-finite loss (%g) on %s with parameters %s", loss, c.data,
                       c.load_params);
        if (loom_comm_rank(world) != 0) loom_clear_error();
    }
    if (st == LOOM_OK && loom_comm_rank(world) == 0) printf("loss %.6f\n", loss);
    return finish(world, dev, st);
}
