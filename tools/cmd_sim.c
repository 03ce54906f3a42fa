/* cmd_sim.c - `loom sim`: build a pipeline schedule (the lists the executor
 * runs), validate it, replay it with a cost model and print the timeline,
 * bubble, peak live activations per stage and the closed-form bubble; write a
 * Chrome trace with --trace. One process, no MPI. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/pipeline.h"
#include "loom/sim.h"


typedef struct sim_args {
    int pp, m, v, layers, max_cols;
    char schedule[32], stage_layers[1024], trace[1024];
    loom_sim_costs costs;
    double cost_embed, cost_head;
} sim_args;

static const char *closed_form_text(loom_sched_kind k) {
    switch (k) {
    case LOOM_SCHED_GPIPE:
    case LOOM_SCHED_1F1B: return "(p-1)/(m+p-1)";
    case LOOM_SCHED_INTERLEAVED: return "(p-1)/(v*m+p-1)";
    case LOOM_SCHED_ZB: return "(p-1)x/(m(f+b+w)+(p-1)x), x=max(f,b,f+b-w)";
    default: return "?";
    }
}

/* Per-stage cost factors from a layer partition: stage cost relative to the
 * mean, so an even split gives all 1. */
static loom_status stage_scales(const sim_args *a, int *counts, double *scale) {
    const int S = a->pp * a->v;
    if (a->stage_layers[0])
        LOOM_TRY(loom_partition_parse(a->stage_layers, a->layers, a->pp, a->v, counts));
    else
        LOOM_TRY(loom_partition_balance(a->layers, a->pp, a->v, a->cost_embed, a->cost_head, counts));
    const double total = a->layers + a->cost_embed + a->cost_head;
    for (int s = 0; s < S; s++)
        scale[s] = loom_partition_stage_cost(counts, S, s, a->cost_embed, a->cost_head) * S / total;
    return LOOM_OK;
}

static void print_report(const sim_args *a, const loom_schedule *s, const loom_sim_result *r,
                         const int *counts) {
    const loom_sim_costs *c = &a->costs;
    printf("loom sim: %s, pp=%d, micro-batches=%d, virtual-stages=%d\n", loom_schedule_name(s->kind), s->pp,
           s->micro_batches, s->virtual_stages);
    printf("costs: f=%g b=%g w=%g (%s) comm=%g opt=%g\n", c->f, c->b, c->w,
           s->split_backward ? "B and W separate" : "full backward b+w", c->comm, c->opt);
    if (counts) {
        printf("layers per virtual stage (%d layers, embedding %g, head %g):", a->layers, a->cost_embed,
               a->cost_head);
        for (int i = 0; i < s->pp * s->virtual_stages; i++) printf(" %d", counts[i]);
        printf("\n");
    }
    size_t n = loom_sim_format_timeline(s, r, a->max_cols, NULL, 0);
    char *text = malloc(n + 1);
    if (text) {
        loom_sim_format_timeline(s, r, a->max_cols, text, n + 1);
        fputs(text, stdout);
        free(text);
    }
    printf("\n%-6s %10s %10s %10s %10s\n", "stage", "busy", "idle", "end", "peak live");
    for (int k = 0; k < s->pp; k++)
        printf("%-6d %10g %10g %10g %10d\n", k, r->busy[k], r->makespan - r->busy[k], r->rank_end[k],
               r->peak_live[k]);
    printf("\nmakespan  %g\n", r->makespan);
    printf("bubble    %.6f (simulated)\n", r->bubble);
    const double cf = loom_sim_closed_form_bubble(s->kind, s->pp, s->micro_batches, s->virtual_stages, c);
    if (isnan(cf) || c->comm != 0 || counts)
        printf("closed    %s: %s\n", closed_form_text(s->kind),
               isnan(cf) ? "none for m < pp" : "applies only with --cost-comm 0 and uniform stages");
    else
        printf("closed    %.6f %s\n", cf, closed_form_text(s->kind));
    printf("peak live = activation sets alive at once (F done, %s not yet)%s\n",
           s->split_backward ? "W" : "B", s->virtual_stages > 1 ? ", one per (micro-batch, chunk)" : "");
}

static loom_status run(sim_args *a) {
    loom_sched_kind k;
    LOOM_TRY(loom_schedule_parse(a->schedule, &k));
    LOOM_TRY(loom_schedule_check(k, a->pp, a->m, a->v));
    if (a->max_cols < 1 || a->max_cols > 100000)
        return loom_fail(LOOM_EUSAGE, "--max-cols %d: must be in 1..100000", a->max_cols);
    if (a->stage_layers[0] && a->layers == 0)
        return loom_fail(LOOM_EUSAGE, "--stage-layers needs --layers N (the model's layer count)");
    if (a->layers < 0) return loom_fail(LOOM_EUSAGE, "--layers %d: must be >= 1", a->layers);
    LOOM_TRY(loom_sim_costs_check(&a->costs, 0));
    if (!(isfinite(a->cost_embed) && a->cost_embed >= 0))
        return loom_fail(LOOM_EUSAGE, "--cost-embed %g: must be a finite number >= 0", a->cost_embed);
    if (!(isfinite(a->cost_head) && a->cost_head >= 0))
        return loom_fail(LOOM_EUSAGE, "--cost-head %g: must be a finite number >= 0", a->cost_head);
    const int S = a->pp * a->v;
    int *counts = NULL;
    double *scale = NULL;
    loom_schedule *s = NULL;
    loom_sim_result *r = NULL;
    loom_status st = LOOM_OK;
    if (a->layers > 0) {
        counts = malloc((size_t)S * sizeof *counts);
        scale = malloc((size_t)S * sizeof *scale);
        st = !counts || !scale ? loom_fail(LOOM_EOS, "out of memory") : stage_scales(a, counts, scale);
        a->costs.stage_scale = scale;
    }
    if (st == LOOM_OK) st = loom_schedule_build(k, a->pp, a->m, a->v, &s);
    if (st == LOOM_OK) st = loom_sim_run(s, &a->costs, &r);
    if (st == LOOM_OK) print_report(a, s, r, counts);
    if (st == LOOM_OK && a->trace[0]) {
        st = loom_sim_write_trace(s, r, a->trace);
        if (st == LOOM_OK) printf("trace     %s (open in https://ui.perfetto.dev)\n", a->trace);
    }
    loom_sim_free(r);
    loom_schedule_free(s);
    free(counts);
    free(scale);
    return st;
}

int cmd_sim(int argc, char **argv) {
    static sim_args a;
    a = (sim_args){.pp = 4, .m = 8, .v = 1, .max_cols = 400, .schedule = "1f1b"};
    loom_sim_costs_default(&a.costs);
    static cli_opt opts[] = {
        {"pp", OPT_INT, &a.pp, 0, "P", "pipeline stages (ranks) (default 4)"},
        {"micro-batches", OPT_INT, &a.m, 0, "M", "micro-batches per step (default 8)"},
        {"schedule", OPT_STR, a.schedule, sizeof a.schedule, "NAME",
         "gpipe, 1f1b, interleaved or zb (default 1f1b)"},
        {"virtual-stages", OPT_INT, &a.v, 0, "V", "chunks per rank, interleaved only (default 1)"},
        {"cost-f", OPT_DOUBLE, &a.costs.f, 0, "T", "forward of one chunk (default 1)"},
        {"cost-b", OPT_DOUBLE, &a.costs.b, 0, "T", "input-gradient part of a backward (default 1)"},
        {"cost-w", OPT_DOUBLE, &a.costs.w, 0, "T", "weight-gradient part of a backward (default 1)"},
        {"cost-comm", OPT_DOUBLE, &a.costs.comm, 0, "T",
         "latency of one activation/gradient message (default 0)"},
        {"cost-opt", OPT_DOUBLE, &a.costs.opt, 0, "T", "optimizer step (default 0)"},
        {"layers", OPT_INT, &a.layers, 0, "N",
         "model layers: scale each stage's costs by its share (default: uniform)"},
        {"stage-layers", OPT_STR, a.stage_layers, sizeof a.stage_layers, "LIST",
         "layers per virtual stage, e.g. 3,3,2,2 (default: balanced)"},
        {"cost-embed", OPT_DOUBLE, &a.cost_embed, 0, "E", "embedding cost in blocks, on stage 0 (default 0)"},
        {"cost-head", OPT_DOUBLE, &a.cost_head, 0, "H",
         "LM head cost in blocks, on the last stage (default 0)"},
        {"max-cols", OPT_INT, &a.max_cols, 0, "N", "widest timeline in columns (default 400)"},
        {"trace", OPT_STR, a.trace, sizeof a.trace, "FILE", "write a Chrome trace-event JSON (Perfetto)"},
    };
    static const cli_cmd cmd = {
        "sim",
        "loom sim --pp P --micro-batches M --schedule gpipe|1f1b|interleaved|zb [--virtual-stages V]\n"
        "                [--cost-f T --cost-b T --cost-w T --cost-comm T] [--trace FILE.json]",
        "Simulate a pipeline schedule: the per-rank action lists the pipeline executor runs,\n"
        "replayed with per-action costs. Prints the timeline (one column per time unit\n"
        "for uniform costs), per-stage busy time and peak live activations, the bubble\n"
        "fraction 1 - busy/(pp x makespan) and the closed-form bubble.",
        "A backward costs b+w in schedules that do not split it (gpipe, 1f1b,\n"
        "interleaved) and b, then w as a separate W pass, in zb; the defaults f=b=w=1\n"
        "are the classic F=1, B=2. Stages are uniform unless --layers is given, which\n"
        "splits the layers with the partitioner (or --stage-layers) and scales each\n"
        "stage's f, b, w by its cost relative to the mean.\n"
        "example: loom sim --pp 4 --micro-batches 8 --schedule zb --trace zb.json\n",
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
