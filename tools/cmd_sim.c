/* cmd_sim.c - `loom sim`: build a pipeline schedule (the lists the executor
 * runs), validate it, replay it with a cost model and print the timeline,
 * bubble, peak live activations per stage and the closed-form bubble; write a
 * Chrome trace with --trace. With --from-trace DIR the costs are measured:
 * each virtual stage's mean F, B, W and the message latency from the traces
 * `loom train --trace DIR` wrote, and the measured bubble of that step is
 * printed beside the simulated one. One process, no MPI. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/layout.h"
#include "loom/pipeline.h"
#include "loom/sim.h"

typedef struct sim_args {
    loom_layout l; /* pp, micro_batches, virtual_stages, schedule, recompute, stage_layers */
    int layers, max_cols;
    char stage_layers[1024], trace[1024], from_trace[1024];
    loom_sim_costs costs; /* NAN: flag not given */
    double cost_embed, cost_head;
} sim_args;

#define UNSET_COLS INT_MIN

static const char *closed_form_text(loom_sched_kind k) {
    switch (k) {
    case LOOM_SCHED_GPIPE:
    case LOOM_SCHED_1F1B: return "(p-1)/(m+p-1)";
    case LOOM_SCHED_INTERLEAVED: return "(p-1)/(v*m+p-1)";
    case LOOM_SCHED_ZB: return "(p-1)x/(m(f+b+w)+(p-1)x), x=max(f,b,f+b-w)";
    case LOOM_SCHED_ZBH2:
    case LOOM_SCHED_ZBV:
    case LOOM_SCHED_DUALPIPEV: return "list-scheduled (docs/pipeline.md)";
    default: return "?";
    }
}

/* Why a schedule has no closed-form bubble here. */
static const char *no_closed_form(loom_sched_kind k) {
    return k == LOOM_SCHED_ZBH2 || k == LOOM_SCHED_ZBV || k == LOOM_SCHED_DUALPIPEV ? "no closed form"
                                                                                    : "none for m < pp";
}

/* Per-stage cost factors from a layer partition (--stage-layers, checked by
 * the validator, or balanced): stage cost relative to the mean, so an even
 * split gives all 1. */
static loom_status stage_scales(const sim_args *a, int *counts, double *scale) {
    const int S = a->l.pp * a->l.virtual_stages;
    if (a->l.n_stage_layers) memcpy(counts, a->l.stage_layers, (size_t)S * sizeof *counts);
    else
        LOOM_TRY(loom_partition_balance(a->layers, a->l.pp, a->l.virtual_stages, a->cost_embed, a->cost_head,
                                        counts));
    const double total = a->layers + a->cost_embed + a->cost_head;
    for (int s = 0; s < S; s++)
        scale[s] = loom_partition_stage_cost(counts, S, s, a->cost_embed, a->cost_head) * S / total;
    return LOOM_OK;
}

static void print_trace_costs(const sim_args *a, const loom_schedule *s, const loom_sim_trace *t,
                              int comm_given) {
    printf("costs: measured in %s (%d trace file%s, %d per pipeline rank), in ms; %s\n", a->from_trace,
           t->n_files, t->n_files == 1 ? "" : "s", t->per_rank,
           s->split_backward ? "B and W separate" : "B is the full backward (w = 0)");
    printf("  %-13s %4s %5s %10s %10s %10s\n", "virtual stage", "rank", "chunk", "F", "B", "W");
    for (int v = 0; v < t->n_stages; v++) {
        char w[32];
        if (s->split_backward) snprintf(w, sizeof w, "%.3f", t->mean[v].w);
        else snprintf(w, sizeof w, "-");
        printf("  %-13d %4d %5d %10.3f %10.3f %10s\n", v, loom_pp_owner(s, v), loom_pp_chunk(s, v),
               t->mean[v].f, t->mean[v].b, w);
    }
    if (comm_given)
        printf("  comm %g ms (--cost-comm; the trace's estimate is %.4f ms)\n", a->costs.comm, t->comm);
    else if (t->comm_samples)
        printf(
            "  comm %.4f ms: median of RECV end - SEND end over the %d message%s a receiver waited for%s\n",
            t->comm, t->comm_samples, t->comm_samples == 1 ? "" : "s",
            t->aligned ? " (clocks aligned on the pp all-reduce after the step)" : " (clocks not aligned)");
    else printf("  comm 0 ms: no receiver waited for a message, so the trace shows no latency\n");
    printf(
        "  opt %g ms (the executor's OPT_STEP only waits for sends; the optimizer runs after the pipeline)\n",
        a->costs.opt);
    if (t->n_msgs)
        printf("  messages: %d, time from both sides ready to the end of the RECV: median %.4f ms, max %.4f "
               "ms\n",
               t->n_msgs, t->delay_median, t->delay_max);
    if (t->n_late)
        printf(
            "warning: %d of %d messages took more than %.3f ms once both sides were ready (up to %.3f ms):\n"
            "  the transport did not move them while the sender computed (no asynchronous progress: with\n"
            "  Open MPI's shared-memory transport, OMPI_MCA_btl_vader_single_copy_mechanism=cma lets the\n"
            "  receiver copy on its own), or a rank lost its core. The simulator's constant latency does\n"
            "  not model that: expect the measured bubble to be larger than the simulated one.\n",
            t->n_late, t->n_msgs, t->late_threshold, t->delay_max);
}

static void print_report(const sim_args *a, const loom_schedule *s, const loom_sim_result *r,
                         const int *counts, const loom_sim_trace *t, const loom_sim_result *exact,
                         int comm_given, int max_cols) {
    const loom_sim_costs *c = &a->costs;
    printf("loom sim: %s, pp=%d, micro-batches=%d, virtual-stages=%d\n", loom_schedule_name(s->kind), s->pp,
           s->micro_batches, s->virtual_stages);
    if (t) print_trace_costs(a, s, t, comm_given);
    else
        printf("costs: f=%g b=%g w=%g (%s) comm=%g opt=%g\n", c->f, c->b, c->w,
               s->split_backward ? "B and W separate" : "full backward b+w", c->comm, c->opt);
    if (a->l.recompute == LOOM_RECOMPUTE_FULL)
        printf("recompute: full - each backward re-runs its chunk's forward first (b includes f%s)\n",
               loom_schedule_splits_backward(a->l.schedule) ? "; W re-runs it too, w includes f" : "");
    if (counts) {
        printf("layers per virtual stage (%d layers, embedding %g, head %g):", a->layers, a->cost_embed,
               a->cost_head);
        for (int i = 0; i < s->pp * s->virtual_stages; i++) printf(" %d", counts[i]);
        printf("\n");
    }
    size_t n = loom_sim_format_timeline(s, r, max_cols, NULL, 0);
    char *text = malloc(n + 1);
    if (text) {
        loom_sim_format_timeline(s, r, max_cols, text, n + 1);
        fputs(text, stdout);
        free(text);
    }
    printf("\n%-6s %10s %10s %10s %10s\n", "stage", "busy", "idle", "end", "peak live");
    for (int k = 0; k < s->pp; k++)
        printf("%-6d %10g %10g %10g %10d\n", k, r->busy[k], r->makespan - r->busy[k], r->rank_end[k],
               r->peak_live[k]);
    printf("\nmakespan  %g%s\n", r->makespan, t ? " ms" : "");
    if (t) {
        /* the closed form at the stages' mean costs */
        loom_sim_costs mc;
        loom_sim_costs_default(&mc);
        mc.f = mc.b = mc.w = 0;
        for (int v = 0; v < t->n_stages; v++) {
            mc.f += t->mean[v].f / t->n_stages;
            mc.b += t->mean[v].b / t->n_stages;
            mc.w += t->mean[v].w / t->n_stages;
        }
        const double cf =
            loom_sim_closed_form_bubble(s->kind, s->pp, s->micro_batches, s->virtual_stages, &mc);
        printf("bubble    %.6f (simulated: the schedule at each virtual stage's mean F, B, W and comm)\n",
               r->bubble);
        printf("replayed  %.6f (each action at its own measured duration, same comm)\n", exact->bubble);
        printf("measured  %.6f (the traced step: 1 - F/B/W time / (pp x longest rank span), as pp_bubble)\n",
               t->bubble);
        const double diff = fabs(t->bubble - r->bubble) < 5e-7 ? 0.0 : t->bubble - r->bubble; /* no "-0" */
        printf("diff      %+.6f (measured - simulated)\n", diff);
        if (isnan(cf)) printf("closed    %s: %s\n", closed_form_text(s->kind), no_closed_form(s->kind));
        else
            printf("closed    %.6f %s (uniform stages at the mean costs, no latency)\n", cf,
                   closed_form_text(s->kind));
    } else {
        printf("bubble    %.6f (simulated)\n", r->bubble);
        const double cf = loom_sim_closed_form_bubble(s->kind, s->pp, s->micro_batches, s->virtual_stages, c);
        if (isnan(cf) || c->comm != 0 || counts || c->cores > 0)
            printf("closed    %s: %s\n", closed_form_text(s->kind),
                   isnan(cf) ? no_closed_form(s->kind)
                             : "applies only with --cost-comm 0, uniform stages and no --cores");
        else printf("closed    %.6f %s\n", cf, closed_form_text(s->kind));
    }
    printf("peak live = activation sets alive at once (F done, %s not yet)%s\n",
           s->split_backward ? "W" : "B", s->virtual_stages > 1 ? ", one per (micro-batch, chunk)" : "");
}

/* Flags that --from-trace replaces: an error to give both. */
static loom_status check_trace_flags(const sim_args *a) {
    const struct {
        const char *flag;
        int given;
    } f[] = {{"--cost-f", !isnan(a->costs.f)},
             {"--cost-b", !isnan(a->costs.b)},
             {"--cost-w", !isnan(a->costs.w)},
             {"--layers", a->layers != 0},
             {"--stage-layers", a->stage_layers[0] != 0},
             {"--cost-embed", !isnan(a->cost_embed)},
             {"--cost-head", !isnan(a->cost_head)},
             /* what the measured durations already hold */
             {"--recompute full", a->l.recompute == LOOM_RECOMPUTE_FULL},
             {"--cores", a->costs.cores > 0}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given)
            return loom_fail(LOOM_EUSAGE,
                             "%s: not with --from-trace (the trace gives every virtual stage's F, B and W)",
                             f[i].flag);
    return LOOM_OK;
}

/* --recompute full: as loom train runs it, every backward of a chunk first
 * re-runs the chunk's forward from its input (B costs b + f); in the
 * schedules that split the backward, W re-runs it once more (w + f: B's
 * recomputed set went to the blocks before it). The embedding and the LM
 * head are never recomputed, so next to a block they weigh less by
 * (f+b+w)/(2f+b+w) (split: /(3f+b+w)) when the partitioner splits the
 * layers. selective adds nothing (loom's attention backward recomputes its
 * probabilities in any mode). */
static void apply_recompute(sim_args *a) {
    if (a->l.recompute != LOOM_RECOMPUTE_FULL) return; /* with --from-trace: refused by check_trace_flags */
    loom_sim_costs *c = &a->costs;
    const int split = loom_schedule_splits_backward(a->l.schedule);
    const double plain = c->f + c->b + c->w, longer = (split ? 3 : 2) * c->f + c->b + c->w;
    if (longer > 0) {
        a->cost_embed *= plain / longer;
        a->cost_head *= plain / longer;
    }
    c->b += c->f;
    if (split) c->w += c->f;
}

static loom_status run(sim_args *a) {
    if (a->layers < 0) return loom_fail(LOOM_EUSAGE, "--layers %d: must be >= 1", a->layers);
    LOOM_TRY(loom_layout_parse_stage_layers(a->stage_layers, &a->l));
    const loom_layout_model model = {.name = "--layers", .n_layer = a->layers};
    const loom_layout_job job = {.purpose = LOOM_LAYOUT_FOR_SIM};
    loom_layout_vshape_default(&a->l);
    LOOM_TRY(loom_layout_validate(&a->l, &model, &job));
    const loom_layout *l = &a->l;
    const int max_cols = a->max_cols != UNSET_COLS ? a->max_cols : a->from_trace[0] ? 120 : 400;
    if (max_cols < 1 || max_cols > 100000)
        return loom_fail(LOOM_EUSAGE, "--max-cols %d: must be in 1..100000", max_cols);
    if (a->from_trace[0]) LOOM_TRY(check_trace_flags(a));
    const int comm_given = !isnan(a->costs.comm);
    /* flags not given take their defaults */
    loom_sim_costs def;
    loom_sim_costs_default(&def);
    if (isnan(a->costs.f)) a->costs.f = def.f;
    if (isnan(a->costs.b)) a->costs.b = def.b;
    if (isnan(a->costs.w)) a->costs.w = def.w;
    if (isnan(a->costs.comm)) a->costs.comm = def.comm;
    if (isnan(a->costs.opt)) a->costs.opt = def.opt;
    if (isnan(a->cost_embed)) a->cost_embed = 0;
    if (isnan(a->cost_head)) a->cost_head = 0;
    LOOM_TRY(loom_sim_costs_check(&a->costs, 0));
    if (a->costs.share && !(a->costs.cores > 0))
        return loom_fail(LOOM_EUSAGE, "--share %d: only with --cores C (ranks that share processors)",
                         a->costs.share);
    if (!(isfinite(a->cost_embed) && a->cost_embed >= 0))
        return loom_fail(LOOM_EUSAGE, "--cost-embed %g: must be a finite number >= 0", a->cost_embed);
    if (!(isfinite(a->cost_head) && a->cost_head >= 0))
        return loom_fail(LOOM_EUSAGE, "--cost-head %g: must be a finite number >= 0", a->cost_head);
    apply_recompute(a);
    const int S = l->pp * l->virtual_stages;
    int *counts = NULL;
    double *scale = NULL;
    loom_schedule *s = NULL;
    loom_sim_result *r = NULL, *exact = NULL;
    loom_sim_trace *t = NULL;
    loom_status st = LOOM_OK;
    if (a->layers > 0) {
        counts = malloc((size_t)S * sizeof *counts);
        scale = malloc((size_t)S * sizeof *scale);
        st = !counts || !scale ? loom_fail(LOOM_EOS, "out of memory") : stage_scales(a, counts, scale);
        a->costs.stage_scale = scale;
    }
    if (st == LOOM_OK) st = loom_schedule_build(l->schedule, l->pp, l->micro_batches, l->virtual_stages, &s);
    if (st == LOOM_OK && a->from_trace[0]) {
        st = loom_sim_trace_read(s, a->from_trace, &t);
        if (st == LOOM_OK) {
            a->costs.stage = t->mean;
            if (!comm_given) a->costs.comm = t->comm;
            st = loom_sim_run_durations(s, t->dur, a->costs.comm, &exact);
        }
    }
    if (st == LOOM_OK) st = loom_sim_run(s, &a->costs, &r);
    if (st == LOOM_OK) print_report(a, s, r, counts, t, exact, comm_given, max_cols);
    if (st == LOOM_OK && a->trace[0]) {
        st = loom_sim_write_trace(s, r, a->trace);
        if (st == LOOM_OK) printf("trace     %s (open in https://ui.perfetto.dev)\n", a->trace);
    }
    loom_sim_free(r);
    loom_sim_free(exact);
    loom_sim_trace_free(t);
    loom_schedule_free(s);
    free(counts);
    free(scale);
    return st;
}

int cmd_sim(int argc, char **argv) {
    static sim_args a;
    a = (sim_args){.max_cols = UNSET_COLS};
    loom_layout_default(&a.l);
    a.l.pp = 4;
    a.l.micro_batches = 8;
    loom_sim_costs_default(&a.costs);
    /* NAN = not given (the flag parser only takes finite numbers) */
    a.costs.f = a.costs.b = a.costs.w = a.costs.comm = a.costs.opt = NAN;
    a.cost_embed = a.cost_head = NAN;
    static cli_enum e_schedule = {&a.l.schedule, loom_schedule_names},
                    e_recompute = {&a.l.recompute, loom_recompute_names};
    static cli_opt opts[] = {
        {"pp", OPT_INT, &a.l.pp, 0, "P", "pipeline stages (ranks) (default 4)"},
        {"micro-batches", OPT_INT, &a.l.micro_batches, 0, "M", "micro-batches per step (default 8)"},
        {"schedule", OPT_ENUM, &e_schedule, 0, "NAME",
         "gpipe, 1f1b, interleaved, zb, zbh2, zbv or dualpipev (default 1f1b)"},
        {"virtual-stages", OPT_INT, &a.l.virtual_stages, 0, "V",
         "chunks per rank, interleaved only (default 1)"},
        {"cost-f", OPT_DOUBLE, &a.costs.f, 0, "T", "forward of one chunk (default 1)"},
        {"cost-b", OPT_DOUBLE, &a.costs.b, 0, "T", "input-gradient part of a backward (default 1)"},
        {"cost-w", OPT_DOUBLE, &a.costs.w, 0, "T", "weight-gradient part of a backward (default 1)"},
        {"cost-comm", OPT_DOUBLE, &a.costs.comm, 0, "T",
         "latency of one activation/gradient message (default 0)"},
        {"cost-opt", OPT_DOUBLE, &a.costs.opt, 0, "T", "optimizer step (default 0)"},
        {"cores", OPT_DOUBLE, &a.costs.cores, 0, "C",
         "the ranks of a node time-share C processors (CPU cores): while k compute, each runs at "
         "min(1, C/k) of its speed and the costs are a rank's alone (default 0: own devices)"},
        {"share", OPT_INT, &a.costs.share, 0, "N",
         "with --cores: N consecutive ranks per node (default: all)"},
        {"layers", OPT_INT, &a.layers, 0, "N",
         "model layers: scale each stage's costs by its share (default: uniform)"},
        {"stage-layers", OPT_STR, a.stage_layers, sizeof a.stage_layers, "LIST",
         "layers per virtual stage, e.g. 3,3,2,2 (default: balanced)"},
        {"cost-embed", OPT_DOUBLE, &a.cost_embed, 0, "E", "embedding cost in blocks, on stage 0 (default 0)"},
        {"cost-head", OPT_DOUBLE, &a.cost_head, 0, "H",
         "LM head cost in blocks, on the last stage (default 0)"},
        {"max-cols", OPT_INT, &a.max_cols, 0, "N",
         "widest timeline in columns (default 400; 120 with --from-trace)"},
        {"recompute", OPT_ENUM, &e_recompute, 0, "MODE",
         "none, selective or full: full adds f to every backward (default none)"},
        {"trace", OPT_STR, a.trace, sizeof a.trace, "FILE", "write a Chrome trace-event JSON (Perfetto)"},
        {"from-trace", OPT_STR, a.from_trace, sizeof a.from_trace, "DIR",
         "costs measured by `loom train --trace DIR` (same --schedule, --pp, --micro-batches, "
         "--virtual-stages)"},
    };
    static const cli_cmd cmd = {
        "sim",
        "loom sim --pp P --micro-batches M --schedule gpipe|1f1b|interleaved|zb|zbh2|zbv|dualpipev [--virtual-stages V]\n"
        "                [--cost-f T --cost-b T --cost-w T --cost-comm T | --from-trace DIR] [--trace FILE.json]",
        "Simulate a pipeline schedule: the per-rank action lists the pipeline executor runs,\n"
        "replayed with per-action costs. Prints the timeline (one column per time unit\n"
        "for uniform costs), per-stage busy time and peak live activations, the bubble\n"
        "fraction 1 - busy/(pp x makespan) and the closed-form bubble.",
        "A backward costs b+w in schedules that do not split it (gpipe, 1f1b,\n"
        "interleaved) and b, then w as a separate W pass, in zb, zbh2, zbv and dualpipev\n"
        "(zbv and dualpipev: per chunk, half a rank's layers); the defaults f=b=w=1\n"
        "are the classic F=1, B=2. Stages are uniform unless --layers is given, which\n"
        "splits the layers with the partitioner (or --stage-layers) and scales each\n"
        "stage's f, b, w by its cost relative to the mean. --cores C replays ranks that\n"
        "time-share C processors (more ranks than CPU cores): a rank computing alone runs at\n"
        "full speed, k computing ranks on C < k cores each at C/k (busy = wall time computing).\n"
        "\n"
        "--recompute full charges what loom train --recompute full does: each\n"
        "backward first re-runs its chunk's forward (b + f), the embedding and head\n"
        "are not recomputed (so they weigh less against a block in the split); in the\n"
        "schedules that split the backward W re-runs it once more (w + f). selective\n"
        "changes nothing (the attention backward always recomputes its probabilities).\n"
        "\n"
        "--from-trace DIR replays the same schedule with costs measured by\n"
        "`loom train --trace DIR` (give the run's --schedule, --pp, --micro-batches and\n"
        "--virtual-stages; each trace file must hold exactly one rank's action list):\n"
        "each virtual stage's mean F, B and W in ms (B = the full backward, w = 0, when\n"
        "the schedule does not split it), the message latency from its SEND/RECV\n"
        "events (--cost-comm overrides it). It prints the simulated bubble beside the\n"
        "step's measured one (as loom train's pp_bubble), a replay at every action's\n"
        "own duration, and the closed form. Exit 66 if DIR or a trace file is missing,\n"
        "65 if one is malformed or holds another schedule or layout.\n"
        "example: loom sim --pp 4 --micro-batches 8 --schedule zb --trace zb.json\n"
        "         loom sim --pp 4 --micro-batches 4 --cores 2\n"
        "         loom sim --pp 2 --micro-batches 8 --schedule 1f1b --from-trace run/trace\n",
        opts,
        sizeof opts / sizeof opts[0]};
    int help;
    loom_status st = cli_parse(&cmd, argc, argv, 0, &help);
    if (st != LOOM_OK) return cli_fail(st);
    if (help) {
        cli_print_help(&cmd, stdout);
        return 0;
    }
    return cli_fail(run(&a));
}
