/* report.c - what a training run shows and writes: a progress bar on a
 * terminal, one plain line per step otherwise, metrics as JSONL, and a final
 * summary. Rank 0 only; local, no collectives. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/log.h"
#include "loom/tboard.h"
#include "train/internal.h"

loom_status loom_report_open(loom_report *r, const loom_train_config *c, int rank) {
    memset(r, 0, sizeof *r);
    r->cfg = c;
    r->active = rank == 0 && !c->quiet;
    r->bar = r->active && (c->progress == 1 || (c->progress == -1 && isatty(STDERR_FILENO)));
    r->t_start = loom_comm_wtime();
    if (rank == 0 && c->tensorboard[0]) LOOM_TRY(loom_tboard_open(c->tensorboard, &r->tb));
    if (rank != 0 || !c->metrics[0]) return LOOM_OK;
    struct stat sb; /* a directory there would refuse the final rename: fail before training */
    if (stat(c->metrics, &sb) == 0 && S_ISDIR(sb.st_mode))
        return loom_fail(LOOM_ECANTCREAT, "--metrics %s: is a directory; give a file name", c->metrics);
    snprintf(r->metrics_tmp, sizeof r->metrics_tmp, "%s.tmp", c->metrics);
    r->metrics = fopen(r->metrics_tmp, "w");
    if (!r->metrics)
        return loom_fail(LOOM_ECANTCREAT, "--metrics %s: cannot create %s: %s", c->metrics, r->metrics_tmp,
                         strerror(errno));
    return LOOM_OK;
}

static void human_rate(char *buf, size_t n, double x) {
    if (x >= 1e6) snprintf(buf, n, "%.2fM", x / 1e6);
    else if (x >= 1e3) snprintf(buf, n, "%.1fk", x / 1e3);
    else snprintf(buf, n, "%.0f", x);
}

static void draw_bar(const loom_report *r, int step, const loom_step_stats *s) {
    const int width = 24, total = r->cfg->steps;
    int filled = (int)((double)(step + 1) / total * width);
    char bar[32], rate[32];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    human_rate(rate, sizeof rate, s->tokens_per_s);
    double elapsed = loom_comm_wtime() - r->t_start;
    double eta = elapsed / (step + 1) * (total - step - 1);
    fprintf(stderr,
            "\r\033[Kstep %d/%d [%s] loss %.4f | lr %.2e | norm %.3f | %s tok/s | MFU %.1f%% | eta %.0fs",
            step + 1, total, bar, s->loss, s->lr, s->grad_norm, rate, 100 * s->mfu, eta);
    if (step + 1 == total) fputc('\n', stderr);
    fflush(stderr);
}

const char *const loom_report_group_names[LOOM_REPORT_GROUPS] = {"tp",   "cp", "dp",   "pp",
                                                                 "dpcp", "ep", "world"};

/* "comm": {"tp": {"allreduce": {"calls": 4, "bytes": 8192, "ms": 0.1}, ...}, ...}
 * with only the groups and ops that moved something. */
static void write_comm_json(FILE *f, const loom_step_stats *s) {
    fprintf(f, "\"comm\": {");
    int first_group = 1;
    for (int g = 0; g < LOOM_REPORT_GROUPS; g++) {
        const loom_comm_stats *c = &s->comm[g];
        int first_op = 1;
        for (int op = 0; op < LOOM_OP_COUNT; op++) {
            if (!c->calls[op]) continue;
            if (first_op) fprintf(f, "%s\"%s\": {", first_group ? "" : ", ", loom_report_group_names[g]);
            fprintf(f, "%s\"%s\": {\"calls\": %llu, \"bytes\": %llu, \"ms\": %.4f}", first_op ? "" : ", ",
                    loom_comm_op_name((loom_comm_op)op), (unsigned long long)c->calls[op],
                    (unsigned long long)c->bytes[op], 1e3 * c->seconds[op]);
            first_op = first_group = 0;
        }
        if (!first_op) fputc('}', f);
    }
    fputc('}', f);
}

/* Context parallelism's communication this step (the "cp" group): its
 * transfer time (start to completion, summed over calls), the part of it the
 * compute thread spent inside the communicator (exposed: blocking calls and
 * waits), and the fraction hidden behind attention compute. 0 if no cp. */
static int cp_overlap(const loom_step_stats *s, double *ms, double *exposed_ms, double *hidden) {
    const loom_comm_stats *c = &s->comm[1]; /* loom_report_group_names[1] == "cp" */
    double t = 0, e = 0;
    uint64_t calls = 0;
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        calls += c->calls[op];
        t += c->seconds[op];
        e += c->call_seconds[op];
    }
    if (!calls) return 0;
    *ms = 1e3 * t;
    *exposed_ms = 1e3 * e;
    *hidden = t > 0 ? 1.0 - (e < t ? e : t) / t : 1.0;
    return 1;
}

/* The collectives of one step as a table, printed once so a user sees what
 * each group does (calls and bytes per step, on rank 0). */
static void print_comm_table(const loom_step_stats *s) {
    uint64_t calls = 0;
    for (int g = 0; g < LOOM_REPORT_GROUPS; g++)
        for (int op = 0; op < LOOM_OP_COUNT; op++) calls += s->comm[g].calls[op];
    if (!calls) return; /* one rank: nothing to list */
    loom_info("collectives per step on rank 0 (group, op, calls, bytes, time):");
    for (int g = 0; g < LOOM_REPORT_GROUPS; g++)
        for (int op = 0; op < LOOM_OP_COUNT; op++) {
            const loom_comm_stats *c = &s->comm[g];
            if (!c->calls[op]) continue;
            loom_info("  %-6s %-15s %6llu  %12llu B  %8.2f ms", loom_report_group_names[g],
                      loom_comm_op_name((loom_comm_op)op), (unsigned long long)c->calls[op],
                      (unsigned long long)c->bytes[op], 1e3 * c->seconds[op]);
        }
}

/* %.9g, or null for NaN/Inf (not JSON numbers; a step --nan-policy skip skipped) */
static const char *json_num(char buf[32], double x) {
    if (isfinite(x)) snprintf(buf, 32, "%.9g", x);
    else snprintf(buf, 32, "null");
    return buf;
}

/* The step's metrics row (one JSON object, no newline) into f. */
static void write_row(FILE *f, int step, const loom_step_stats *s) {
    char loss[32], gn[32];
    fprintf(f,
            "{\"step\": %d, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"skipped\": %s, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.6g, \"step_ms\": %.4f, "
            "\"comm_bytes\": %llu, \"mem\": {\"params\": %zu, \"grads\": %zu, "
            "\"optimizer\": %zu, \"activations\": %zu, \"peak_rss\": %zu, "
            "\"peak_rss_max\": %zu}, ",
            step + 1, json_num(loss, s->loss), s->lr, json_num(gn, s->grad_norm),
            s->skipped ? "true" : "false", s->tokens_per_s, s->mfu, 1e3 * s->seconds,
            (unsigned long long)s->comm_bytes, s->mem.params, s->mem.grads, s->mem.optimizer,
            s->mem.activations, s->peak_rss, s->peak_rss_max);
    if (s->pp_bubble >= 0) {
        fprintf(f, "\"pp_bubble\": %.6f, \"pp_peak_live\": %d, ", s->pp_bubble, s->pp_peak_live);
        for (int k = 0; k < 2 && s->pp_idle_ms; k++) { /* per pipeline rank */
            fprintf(f, "\"%s\": [", k ? "pp_wait_ms" : "pp_idle_ms");
            const double *x = k ? s->pp_wait_ms : s->pp_idle_ms;
            for (int i = 0; i < s->pp_ranks; i++) fprintf(f, "%s%.4f", i ? ", " : "", x[i]);
            fprintf(f, "], ");
        }
    }
    fprintf(f,
            "\"dp\": {\"exposed_ms\": %.4f, \"reduce_ms\": %.4f, \"gather_ms\": %.4f, "
            "\"reductions\": %d, \"overlapped\": %d}, ",
            1e3 * s->dp.exposed_s, 1e3 * s->dp.reduce_s, 1e3 * s->dp.gather_s, s->dp.reductions,
            s->dp.overlapped);
    if (s->moe_json) fputs(s->moe_json, f);
    double cp_ms, cp_exposed, cp_hidden;
    if (cp_overlap(s, &cp_ms, &cp_exposed, &cp_hidden))
        fprintf(f, "\"cp\": {\"ms\": %.4f, \"exposed_ms\": %.4f, \"hidden\": %.4f}, ", cp_ms, cp_exposed,
                cp_hidden);
    write_comm_json(f, s);
    fputc('}', f);
}

/* The row to the metrics file and, as scalars, to TensorBoard: the same
 * text, so each scalar is the number the JSONL holds. */
static loom_status write_outputs(loom_report *r, int step, const loom_step_stats *s) {
    if (!r->metrics && !r->tb) return LOOM_OK;
    char *row = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&row, &len);
    if (!mem) return loom_fail(LOOM_EOS, "out of memory for a metrics row");
    write_row(mem, step, s);
    if (fclose(mem) != 0 || !row) {
        free(row);
        return loom_fail(LOOM_EOS, "out of memory for a metrics row");
    }
    loom_status st = LOOM_OK;
    if (r->metrics) {
        errno = 0;
        /* ferror: any earlier write failed too (errno says why); fflush: the line reaches the file */
        if (fwrite(row, 1, len, r->metrics) != len || fputc('\n', r->metrics) == EOF || ferror(r->metrics) ||
            fflush(r->metrics) != 0)
            st = loom_fail(LOOM_EIO, "--metrics %s: write failed: %s", r->cfg->metrics,
                           strerror(errno ? errno : EIO));
    }
    if (st == LOOM_OK && r->tb) {
        static const char *const skip[] = {"step", NULL};
        loom_tboard_begin(r->tb, step + 1);
        st = loom_tboard_add_json(r->tb, row, skip);
        if (st == LOOM_OK) st = loom_tboard_end(r->tb);
    }
    free(row);
    return st;
}

loom_status loom_report_step(loom_report *r, int step, const loom_step_stats *s) {
    LOOM_TRY(write_outputs(r, step, s));
    if (!r->active) return LOOM_OK;
    if (step == 0) print_comm_table(s);
    double cp_ms, cp_exposed, cp_hidden; /* step 2: the first is warm-up */
    if (step == 1 && cp_overlap(s, &cp_ms, &cp_exposed, &cp_hidden) && cp_hidden < 0.5)
        loom_warn("context parallelism: %.0f%% of its communication is exposed on rank 0 (%.1f ms "
                  "of %.1f ms waited for, not hidden behind attention compute); longer sequences "
                  "per rank, or --cp-impl ring rather than ulysses, hide more",
                  100 * (1 - cp_hidden), cp_exposed, cp_ms);
    if (r->bar) {
        draw_bar(r, step, s);
    } else if ((step + 1) % r->cfg->log_every == 0 || step + 1 == r->cfg->steps) {
        loom_info("step %d/%d loss %.6f lr %.3e grad_norm %.4f tok/s %.0f mfu %.2f%% comm %llu B", step + 1,
                  r->cfg->steps, s->loss, s->lr, s->grad_norm, s->tokens_per_s, 100 * s->mfu,
                  (unsigned long long)s->comm_bytes);
    }
    return LOOM_OK;
}

loom_status loom_report_close(loom_report *r, loom_status st, const loom_train_result *res) {
    const loom_train_config *c = r->cfg;
    loom_status tst = loom_tboard_close(r->tb);
    r->tb = NULL;
    if (st == LOOM_OK) st = tst;
    if (r->metrics) {
        int closed = !ferror(r->metrics); /* fclose alone misses an earlier failed write */
        closed &= fclose(r->metrics) == 0;
        int err = errno;
        r->metrics = NULL;
        if (st == LOOM_OK && !closed) {
            st = loom_fail(LOOM_EIO, "--metrics %s: writing %s failed: %s; %s left as it was", c->metrics,
                           r->metrics_tmp, strerror(err), c->metrics);
        } else if (st == LOOM_OK && rename(r->metrics_tmp, c->metrics) != 0) {
            err = errno;
            st = loom_fail(LOOM_ECANTCREAT,
                           "--metrics %s: cannot rename %s over it: %s; the metrics are in %s", c->metrics,
                           r->metrics_tmp, strerror(err), r->metrics_tmp);
        } else if (st != LOOM_OK) {
            loom_warn("metrics up to the failure are in %s (%s left as it was)", r->metrics_tmp, c->metrics);
        }
    }
    if (!r->active || st != LOOM_OK) return st;
    if (r->bar) fputc('\n', stderr);
    char rate[32];
    human_rate(rate, sizeof rate, res->tokens_per_s);
    loom_info("done: %d steps in %.1f s, final loss %.4f, %s tok/s, MFU %.1f%%%s%s%s%s", res->steps_done,
              loom_comm_wtime() - r->t_start, res->final_loss, rate, 100 * res->mfu,
              c->metrics[0] ? "; metrics -> " : "", c->metrics, c->save_params[0] ? "; params -> " : "",
              c->save_params);
    return LOOM_OK;
}
