/* cmd_report.c - `loom report RUN.jsonl [-o report.html] [--trace trace.json]`:
 * one self-contained HTML page (inline SVG, no script, no network) of a
 * training run's metrics: the run's settings and environment (the header
 * row), loss and learning rate, tokens/s and MFU, memory, communication per
 * group and op, the pipeline bubble and, from a trace, the timeline, and
 * the MoE expert load. The rows themselves are embedded as JSON
 * (<script type="application/json" id="loom-data">). Local; no MPI. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/log.h"
#include "report_svg.h"

typedef struct run {
    cJSON *header; /* {"run": ..., "env": ...} or NULL (a metrics file from before headers) */
    cJSON **rows;  /* (n) step rows */
    int n;
    double *x; /* (n) step numbers */
} run;

static void run_free(run *r) {
    cJSON_Delete(r->header);
    for (int i = 0; i < r->n; i++) cJSON_Delete(r->rows[i]);
    free(r->rows);
    free(r->x);
}

static loom_status read_run(const char *path, run *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f) return loom_fail(LOOM_ENOINPUT, "loom report %s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, cap_rows = 0;
    loom_status st = LOOM_OK;
    for (ssize_t len; st == LOOM_OK && (len = getline(&line, &cap, f)) >= 0;) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        cJSON *j = cJSON_Parse(line);
        if (!j || !cJSON_IsObject(j)) {
            cJSON_Delete(j);
            st = loom_fail(LOOM_EDATA, "loom report %s: line %d is not a JSON object", path, lineno);
        } else if (cJSON_GetObjectItem(j, "run") && !r->header && r->n == 0) {
            r->header = j;
        } else if (!cJSON_IsNumber(cJSON_GetObjectItem(j, "step"))) {
            cJSON_Delete(j);
            st = loom_fail(LOOM_EDATA, "loom report %s: line %d has no \"step\": not a loom metrics row",
                           path, lineno);
        } else {
            if (r->n == cap_rows) {
                cap_rows = cap_rows ? 2 * cap_rows : 64;
                cJSON **rows = realloc(r->rows, (size_t)cap_rows * sizeof *rows);
                if (!rows) {
                    cJSON_Delete(j);
                    st = loom_fail(LOOM_EOS, "out of memory");
                    break;
                }
                r->rows = rows;
            }
            r->rows[r->n++] = j;
        }
    }
    free(line);
    fclose(f);
    if (st == LOOM_OK && r->n == 0) st = loom_fail(LOOM_EDATA, "loom report %s: no step rows", path);
    if (st == LOOM_OK) {
        r->x = malloc((size_t)r->n * sizeof *r->x);
        if (!r->x) st = loom_fail(LOOM_EOS, "out of memory");
        for (int i = 0; st == LOOM_OK && i < r->n; i++)
            r->x[i] = cJSON_GetObjectItem(r->rows[i], "step")->valuedouble;
    }
    if (st != LOOM_OK) run_free(r);
    return st;
}

/* The number at "a/b/c" in a row, NaN when absent. */
static double num_at(const cJSON *j, const char *path) {
    char key[128];
    while (j && *path) {
        size_t n = strcspn(path, "/");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        j = cJSON_GetObjectItemCaseSensitive(j, key);
        path += n + (path[n] == '/');
    }
    return j && cJSON_IsNumber(j) ? j->valuedouble : NAN;
}

/* One series per path, a chart of them; 0 when no row has any. */
static int chart(FILE *f, const run *r, const char *id, const char *title, const char *const *paths,
                 const int *right, int k, const char *left_label, const char *right_label) {
    svg_series s[16];
    double *y = malloc((size_t)r->n * k * sizeof *y);
    int any = 0;
    for (int c = 0; y && c < k && c < 16; c++) {
        for (int i = 0; i < r->n; i++) {
            y[c * r->n + i] = num_at(r->rows[i], paths[c]);
            any |= isfinite(y[c * r->n + i]);
        }
        s[c] = (svg_series){.name = paths[c], .y = y + c * r->n, .right = right ? right[c] : 0};
    }
    if (any) svg_lines(f, id, title, r->x, r->n, s, k < 16 ? k : 16, left_label, right_label);
    free(y);
    return any;
}

static void section(FILE *f, const char *title) {
    fputs("<h2>", f);
    html_text(f, title);
    fputs("</h2>\n", f);
}

/* Communication: every "group/op/bytes" any row has, one line each. */
static void comm_chart(FILE *f, const run *r) {
    char names[32][48];
    const char *paths[32];
    int k = 0;
    for (int i = 0; i < r->n; i++) {
        const cJSON *comm = cJSON_GetObjectItem(r->rows[i], "comm");
        for (const cJSON *g = comm ? comm->child : NULL; g; g = g->next)
            for (const cJSON *op = g->child; op; op = op->next) {
                char p[48];
                snprintf(p, sizeof p, "comm/%s/%s/bytes", g->string, op->string);
                int seen = 0;
                for (int q = 0; q < k; q++) seen |= strcmp(names[q], p) == 0;
                if (!seen && k < 16) {
                    snprintf(names[k], sizeof names[k], "%s", p);
                    paths[k] = names[k];
                    k++;
                }
            }
    }
    section(f, "Communication per group and op (bytes per step, this rank)");
    if (!k || !chart(f, r, "comm", "bytes moved per step by group and op", paths, NULL, k, "bytes", NULL))
        fputs("<p>No communication: a one-rank run.</p>\n", f);
}

/* MoE: imbalance per block over the steps, tokens per expert at the last step. */
static void moe_charts(FILE *f, const run *r) {
    const cJSON *last = cJSON_GetObjectItem(r->rows[r->n - 1], "moe");
    if (!cJSON_IsArray(last)) return;
    section(f, "Expert load (MoE)");
    char names[16][32];
    const char *paths[16];
    int nb = cJSON_GetArraySize(last);
    for (int b = 0; b < nb && b < 16; b++) {
        snprintf(names[b], sizeof names[b], "moe/%d/imbalance", b);
        paths[b] = names[b];
    }
    /* num_at walks objects only: arrays are read by index here */
    svg_series s[16];
    double *y = malloc((size_t)r->n * 16 * sizeof *y);
    for (int b = 0; y && b < nb && b < 16; b++) {
        for (int i = 0; i < r->n; i++) {
            const cJSON *blk = cJSON_GetArrayItem(cJSON_GetObjectItem(r->rows[i], "moe"), b);
            y[b * r->n + i] = num_at(blk, "imbalance");
        }
        s[b] = (svg_series){.name = paths[b], .y = y + b * r->n};
    }
    if (y)
        svg_lines(f, "moe_imbalance", "max / mean tokens per expert, per MoE block", r->x, r->n, s,
                  nb < 16 ? nb : 16, "imbalance", NULL);
    free(y);
    static char labels[1024][24];
    const char *lp[1024];
    double v[1024];
    int k = 0;
    for (int b = 0; b < nb; b++) {
        const cJSON *blk = cJSON_GetArrayItem(last, b), *tok = cJSON_GetObjectItem(blk, "tokens");
        int e = 0;
        for (const cJSON *t = tok ? tok->child : NULL; t && k < 1024; t = t->next, e++, k++) {
            snprintf(labels[k], sizeof labels[k], "L%d e%d", (int)num_at(blk, "layer"), e);
            v[k] = t->valuedouble;
            lp[k] = labels[k];
        }
    }
    if (k) svg_bars(f, "moe_tokens", "tokens per expert at the last step (all ranks)", lp, v, k, "tokens");
}

/* The pipeline timeline of a trace (loom train --trace): each rank's
 * compute row, spans coloured by kind. 0 when the file has none. */
static loom_status timeline(FILE *f, const char *path) {
    FILE *in = fopen(path, "rb");
    if (!in)
        return loom_fail(LOOM_ENOINPUT, "loom report --trace %s: cannot open: %s", path, strerror(errno));
    fseek(in, 0, SEEK_END);
    long len = ftell(in);
    fseek(in, 0, SEEK_SET);
    char *text = len > 0 ? malloc((size_t)len + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)len, in) : 0;
    fclose(in);
    if (!text) return loom_fail(LOOM_EDATA, "loom report --trace %s: empty or unreadable", path);
    text[got] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *ev = cJSON_GetObjectItem(root, "traceEvents");
    if (!cJSON_IsArray(ev)) {
        cJSON_Delete(root);
        return loom_fail(LOOM_EDATA, "loom report --trace %s: not a Chrome trace (no traceEvents)", path);
    }
    int n = cJSON_GetArraySize(ev), k = 0, ranks = 0;
    svg_span *spans = malloc((size_t)(n > 0 ? n : 1) * sizeof *spans);
    for (const cJSON *e = ev->child; spans && e; e = e->next) {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph")),
                   *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
        if (!ph || strcmp(ph, "X") != 0 || !name || num_at(e, "tid") != 0) continue;
        int pid = (int)num_at(e, "pid");
        double ts = num_at(e, "ts"), dur = num_at(e, "dur");
        if (pid < 0 || pid > 4095 || !isfinite(ts) || !isfinite(dur)) continue;
        int kind = name[0] == 'F' && name[1] != 'o'                         ? 0
                   : name[0] == 'B'                                         ? 1
                   : name[0] == 'W'                                         ? 2
                   : !strncmp(name, "SEND", 4) || !strncmp(name, "RECV", 4) ? 3
                                                                            : 4;
        spans[k++] = (svg_span){.row = pid, .t0 = ts, .t1 = ts + dur, .name = name, .kind = kind};
        ranks = pid + 1 > ranks ? pid + 1 : ranks;
    }
    section(f, "Pipeline timeline (from the trace)");
    if (k) {
        static char rowname[4096][16];
        const char *rows[4096];
        for (int r = 0; r < ranks; r++) {
            snprintf(rowname[r], sizeof rowname[r], "rank %d", r);
            rows[r] = rowname[r];
        }
        fputs("<p>Blue forward, orange backward, green weight gradients, grey sends and receives; "
              "times aligned across ranks.</p>\n",
              f);
        svg_timeline(f, "timeline", "each rank's actions over the traced steps", rows, ranks, spans, k);
    } else {
        fputs("<p>The trace has no compute row.</p>\n", f);
    }
    free(spans);
    cJSON_Delete(root);
    return LOOM_OK;
}

/* A table of the header's settings and environment, nested keys joined by '.'. */
static void table_rows(FILE *f, const cJSON *j, const char *prefix) {
    for (const cJSON *c = j->child; c; c = c->next) {
        char key[160];
        snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", c->string ? c->string : "");
        if (cJSON_IsObject(c)) {
            table_rows(f, c, key);
            continue;
        }
        char *v = cJSON_IsString(c) ? NULL : cJSON_PrintUnformatted(c);
        fputs("<tr><th>", f);
        html_text(f, key);
        fputs("</th><td>", f);
        html_text(f, v ? v : cJSON_GetStringValue(c) ? cJSON_GetStringValue(c) : "");
        fputs("</td></tr>\n", f);
        free(v);
    }
}

static void summary(FILE *f, const run *r) {
    double tok = 0, mfu = 0;
    int m = 0;
    for (int i = r->n > 1 ? 1 : 0; i < r->n; i++, m++) { /* the first step warms up */
        tok += num_at(r->rows[i], "tokens_per_s");
        mfu += num_at(r->rows[i], "mfu");
    }
    fprintf(
        f,
        "<p class=\"summary\">%d steps; final loss <b id=\"final-loss\">%.6g</b>; mean %.4g tokens/s, MFU %.2f%% "
        "(after the first step)</p>\n",
        r->n, num_at(r->rows[r->n - 1], "loss"), m ? tok / m : 0, m ? 100 * mfu / m : 0);
}

/* The rows as JSON inside the page, "</" escaped so no text ends the script. */
static void embed_data(FILE *f, const run *r) {
    cJSON *d = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    if (r->header) cJSON_AddItemReferenceToObject(d, "header", r->header);
    for (int i = 0; i < r->n; i++) cJSON_AddItemReferenceToArray(rows, r->rows[i]);
    cJSON_AddItemToObject(d, "steps", rows);
    char *t = cJSON_PrintUnformatted(d);
    fputs("<script type=\"application/json\" id=\"loom-data\">", f);
    for (const char *p = t ? t : "{}"; *p; p++) {
        if (p[0] == '<' && p[1] == '/') fputs("<\\", f);
        else fputc(*p, f);
    }
    fputs("</script>\n", f);
    free(t);
    cJSON_Delete(d);
}

static const char *STYLE =
    "body{font-family:sans-serif;margin:24px;max-width:900px;color:#222}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
    "table{border-collapse:collapse;font-size:12px}th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;"
    "vertical-align:top}th{background:#f4f4f4;white-space:nowrap}"
    ".chart{display:block;margin:8px 0}.chart .t{font-size:14px;font-weight:bold}.chart .a{font-size:11px;"
    "fill:#444}.chart .g{stroke:#eee}";

static loom_status write_page(FILE *f, const run *r, const char *src, const char *trace) {
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>loom run: ");
    html_text(f, src);
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<h1>loom run: ", STYLE);
    html_text(f, src);
    fputs("</h1>\n", f);
    summary(f, r);
    static const char *const loss[] = {"loss", "lr"}, *const thr[] = {"tokens_per_s", "mfu"},
                             *const mem[] = {"mem/params",      "mem/grads",    "mem/optimizer",
                                             "mem/activations", "mem/peak_rss", "mem/peak_rss_max"},
                             *const pp[] = {"pp_bubble"};
    static const int lr_right[] = {0, 1};
    section(f, "Loss and learning rate");
    chart(f, r, "loss", "loss (left) and learning rate (right)", loss, lr_right, 2, "loss", "lr");
    section(f, "Throughput");
    chart(f, r, "throughput", "tokens/s (left) and MFU (right, fraction of the peak)", thr, lr_right, 2,
          "tokens/s", "MFU");
    section(f, "Memory per rank (bytes: loom's plan per lifetime class, and the OS's peak RSS)");
    chart(f, r, "memory", "memory", mem, NULL, 6, "bytes", NULL);
    comm_chart(f, r);
    if (isfinite(num_at(r->rows[0], "pp_bubble"))) {
        section(f, "Pipeline bubble");
        chart(f, r, "bubble", "measured bubble per step (idle share of the pipeline's time)", pp, NULL, 1,
              "bubble", NULL);
    }
    if (trace && trace[0]) LOOM_TRY(timeline(f, trace));
    moe_charts(f, r);
    if (r->header) {
        section(f, "Run settings and environment");
        fputs("<table id=\"settings\">\n", f);
        table_rows(f, r->header, "");
        fputs("</table>\n", f);
    }
    embed_data(f, r);
    fputs("</body></html>\n", f);
    return LOOM_OK;
}

int cmd_report(int argc, char **argv) {
    static char out[1024], trace[1024];
    cli_opt opts[] = {
        {"out", OPT_STR, out, sizeof out, "FILE",
         "the HTML page (also -o FILE; default: RUN.jsonl's name with .html)"},
        {"trace", OPT_STR, trace, sizeof trace, "FILE",
         "a trace of the run (loom train --trace DIR writes DIR/trace.json): adds the pipeline timeline"},
    };
    const cli_cmd cmd = {
        "report",
        "loom report RUN.jsonl [-o report.html] [--trace trace.json]",
        "Plot a training run's metrics (loom train --metrics) as one self-contained HTML page.",
        "The page has no scripts and loads nothing: SVG charts of the loss and learning\n"
        "rate, tokens/s and MFU, memory, communication per group and op, the pipeline\n"
        "bubble and timeline, and MoE expert load, then the run's settings and\n"
        "environment from the first row. The rows are embedded as JSON in\n"
        "<script type=\"application/json\" id=\"loom-data\">.\n",
        opts,
        sizeof opts / sizeof opts[0]};
    char *rest[64], *input = NULL;
    int n = 0;
    for (int i = 0; i < argc && n < 62; i++) {
        if (strcmp(argv[i], "-o") == 0) rest[n++] = "--out";
        else if (argv[i][0] != '-' && !input &&
                 (i == 0 || (strcmp(argv[i - 1], "-o") != 0 && strcmp(argv[i - 1], "--out") != 0 &&
                             strcmp(argv[i - 1], "--trace") != 0)))
            input = argv[i];
        else rest[n++] = argv[i];
    }
    int go = cli_parse_local(&cmd, n, rest);
    if (go >= 0) return go;
    if (!input)
        return cli_fail(loom_fail(LOOM_EUSAGE, "loom report needs RUN.jsonl (see loom report --help)"));
    if (!out[0]) {
        size_t k = strlen(input);
        snprintf(out, sizeof out, "%.*s.html", (int)(k > 6 && !strcmp(input + k - 6, ".jsonl") ? k - 6 : k),
                 input);
    }
    run r;
    loom_status st = read_run(input, &r);
    if (st != LOOM_OK) return cli_fail(st);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!f) st = loom_fail(LOOM_ECANTCREAT, "loom report: cannot create %s: %s", tmp, strerror(errno));
    if (st == LOOM_OK) st = write_page(f, &r, input, trace);
    if (f && (ferror(f) | (fclose(f) != 0)) && st == LOOM_OK)
        st = loom_fail(LOOM_EIO, "loom report: writing %s failed", tmp);
    if (st == LOOM_OK && rename(tmp, out) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "loom report: cannot rename %s to %s: %s", tmp, out, strerror(errno));
    if (st != LOOM_OK && f) remove(tmp);
    if (st == LOOM_OK) loom_info("%d steps of %s -> %s", r.n, input, out);
    run_free(&r);
    return cli_fail(st);
}
