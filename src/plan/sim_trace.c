/* sim_trace.c - `loom sim --from-trace DIR`: the Chrome traces a run of
 * `loom train --trace DIR` wrote, one per rank, read back as the costs of
 * the schedule that ran (pp axis; pure, not collective): each file's
 * pipeline actions matched to one pipeline rank's list (or the layout they
 * do fit named), each virtual stage's mean F, B and W, the measured bubble,
 * every action's duration, and the message latency with rank clocks
 * aligned on the pp all-reduce after the step. docs/pipeline.md. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/sim.h"

typedef struct tr_file {
    int world;  /* R of trace_rank<R>.json */
    int n, cap; /* pipeline actions, in time order */
    char **name;
    double *t0, *t1; /* ms */
    double sync;     /* end of the first pp all-reduce after the actions; NAN if none */
    int rank;        /* matched pipeline rank */
} tr_file;

static void tr_file_free(tr_file *f) {
    for (int i = 0; i < f->n; i++) free(f->name[i]);
    free(f->name);
    free(f->t0);
    free(f->t1);
    memset(f, 0, sizeof *f);
}

/* 1 if name is a label loom_pp_action_format can produce. */
static int is_action_label(const char *n) {
    if ((n[0] == 'F' || n[0] == 'B' || n[0] == 'W') && n[1] >= '0' && n[1] <= '9') {
        const char *p = n + 1;
        while (*p >= '0' && *p <= '9') p++;
        if (*p == '.') {
            if (!(p[1] >= '0' && p[1] <= '9')) return 0;
            for (p++; *p >= '0' && *p <= '9'; p++) {}
        }
        return *p == '\0';
    }
    return strncmp(n, "SEND_ACT ", 9) == 0 || strncmp(n, "RECV_ACT ", 9) == 0 ||
           strncmp(n, "SEND_GRAD ", 10) == 0 || strncmp(n, "RECV_GRAD ", 10) == 0 ||
           strcmp(n, "OPT_STEP") == 0;
}

static loom_status tr_push(tr_file *f, const char *path, const char *name, double t0, double t1) {
    if (f->n == f->cap) {
        const int cap = f->cap ? 2 * f->cap : 256;
        char **nm = realloc(f->name, (size_t)cap * sizeof *nm);
        if (nm) f->name = nm;
        double *a = realloc(f->t0, (size_t)cap * sizeof *a);
        if (a) f->t0 = a;
        double *b = realloc(f->t1, (size_t)cap * sizeof *b);
        if (b) f->t1 = b;
        if (!nm || !a || !b) return loom_fail(LOOM_EOS, "%s: out of memory", path);
        f->cap = cap;
    }
    if (!(f->name[f->n] = strdup(name))) return loom_fail(LOOM_EOS, "%s: out of memory", path);
    f->t0[f->n] = t0;
    f->t1[f->n] = t1;
    f->n++;
    return LOOM_OK;
}

/* Sort the actions by start time, keeping file order among equal starts. */
static void tr_sort(tr_file *f) {
    for (int i = 1; i < f->n; i++) { /* insertion sort: already sorted in practice */
        char *nm = f->name[i];
        const double a = f->t0[i], b = f->t1[i];
        int j = i;
        for (; j > 0 && f->t0[j - 1] > a; j--) {
            f->name[j] = f->name[j - 1];
            f->t0[j] = f->t0[j - 1];
            f->t1[j] = f->t1[j - 1];
        }
        f->name[j] = nm;
        f->t0[j] = a;
        f->t1[j] = b;
    }
}

static loom_status slurp(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            return loom_fail(LOOM_EOS, "%s: out of memory", path);
        }
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) break;
        if (cap >= ((size_t)1 << 31)) {
            free(buf);
            fclose(fp);
            return loom_fail(LOOM_EDATA, "%s: larger than 2 GiB: not a trace of one step", path);
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    const int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return loom_fail(LOOM_ENOINPUT, "%s: read failed", path);
    }
    *out = buf;
    *len = n;
    return LOOM_OK;
}

/* Start and end times of the "pp" group's all-reduces of one file, ms. */
typedef struct tr_spans {
    double *t0, *t1;
    int n, cap;
} tr_spans;

static loom_status spans_push(tr_spans *a, const char *path, double t0, double t1) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 16;
        double *x = realloc(a->t0, (size_t)a->cap * sizeof *x);
        if (x) a->t0 = x;
        double *y = realloc(a->t1, (size_t)a->cap * sizeof *y);
        if (y) a->t1 = y;
        if (!x || !y) return loom_fail(LOOM_EOS, "%s: out of memory", path);
    }
    a->t0[a->n] = t0;
    a->t1[a->n++] = t1;
    return LOOM_OK;
}

/* One event (number idx) of a trace file: a complete ("X") event that is a
 * pipeline action goes to f, one of the "pp" group's all-reduces to ar;
 * anything else is skipped. LOOM_EDATA for an event that is not an object
 * with a "ph" string, or an "X" event without a name, a finite "ts" or a
 * finite "dur" >= 0. */
static loom_status tr_event(const char *path, int idx, const cJSON *e, tr_file *f, tr_spans *ar) {
    if (!cJSON_IsObject(e)) return loom_fail(LOOM_EDATA, "%s: event %d is not a JSON object", path, idx);
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    if (!cJSON_IsString(ph)) return loom_fail(LOOM_EDATA, "%s: event %d has no \"ph\" string", path, idx);
    if (strcmp(ph->valuestring, "X") != 0) return LOOM_OK;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"),
                *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"),
                *du = cJSON_GetObjectItemCaseSensitive(e, "dur"),
                *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    if (!cJSON_IsString(nm)) return loom_fail(LOOM_EDATA, "%s: event %d has no \"name\" string", path, idx);
    if (!cJSON_IsNumber(ts) || !isfinite(ts->valuedouble) || fabs(ts->valuedouble) > 1e15)
        return loom_fail(LOOM_EDATA, "%s: event %d (%s): \"ts\" must be a finite number of microseconds",
                         path, idx, nm->valuestring);
    if (!cJSON_IsNumber(du) || !isfinite(du->valuedouble) || du->valuedouble < 0 || du->valuedouble > 1e15)
        return loom_fail(LOOM_EDATA,
                         "%s: event %d (%s): \"dur\" must be a finite number of microseconds >= 0", path, idx,
                         nm->valuestring);
    const double t0 = ts->valuedouble / 1000.0, t1 = (ts->valuedouble + du->valuedouble) / 1000.0;
    if (is_action_label(nm->valuestring)) return tr_push(f, path, nm->valuestring, t0, t1);
    if (cJSON_IsString(cat) && strcmp(cat->valuestring, "pp") == 0 &&
        strncmp(nm->valuestring, "allreduce", 9) == 0)
        return spans_push(ar, path, t0, t1);
    return LOOM_OK;
}

/* Read one trace file: its pipeline actions (sorted by time) and the end of
 * the first all-reduce of the "pp" group that starts after them. */
static loom_status tr_read(const char *path, tr_file *f) {
    char *buf = NULL;
    size_t len = 0;
    LOOM_TRY(slurp(path, &buf, &len));
    cJSON *root = cJSON_ParseWithLength(buf, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        const long off = at && at >= buf && at <= buf + len ? (long)(at - buf) : -1;
        free(buf);
        return loom_fail(LOOM_EDATA, "%s: not valid JSON (near byte %ld): not a Chrome trace", path, off);
    }
    free(buf);
    const cJSON *events = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    loom_status st = LOOM_OK;
    if (!cJSON_IsArray(events))
        st = loom_fail(LOOM_EDATA, "%s: no \"traceEvents\" array: not a Chrome trace", path);
    tr_spans ar = {0}; /* pp all-reduces */
    int idx = -1;
    const cJSON *e;
    const cJSON *walk = st == LOOM_OK ? events : NULL;
    cJSON_ArrayForEach(e, walk) {
        if ((st = tr_event(path, ++idx, e, f, &ar)) != LOOM_OK) break;
    }
    cJSON_Delete(root);
    f->sync = NAN;
    if (st == LOOM_OK) {
        tr_sort(f);
        const double last = f->n ? f->t1[f->n - 1] : 0;
        double first = INFINITY;
        for (int i = 0; i < ar.n; i++)
            if (ar.t0[i] >= last - 1e-6 && ar.t0[i] < first) {
                first = ar.t0[i];
                f->sync = ar.t1[i];
            }
    }
    free(ar.t0);
    free(ar.t1);
    return st;
}

/* Length of the common prefix of f's actions and rank r's list (v for the
 * labels); the first difference is described in why (if not NULL). Returns 1
 * when they are equal. */
static int tr_match(const tr_file *f, const loom_schedule *s, int r, int *prefix, char *why, size_t cap) {
    int n;
    const loom_pp_action *a = loom_schedule_rank(s, r, &n);
    char lab[96];
    int i = 0;
    for (; i < n && i < f->n; i++) {
        loom_pp_action_format(&a[i], s->virtual_stages, lab, sizeof lab);
        if (strcmp(lab, f->name[i]) != 0) break;
    }
    *prefix = i;
    if (i == n && i == f->n) return 1;
    if (why) {
        if (i < n && i < f->n)
            snprintf(why, cap, "its action %d is '%s' where rank %d runs '%s'", i, f->name[i], r,
                     (loom_pp_action_format(&a[i], s->virtual_stages, lab, sizeof lab), lab));
        else if (i < n) snprintf(why, cap, "it ends after %d actions where rank %d runs %d", f->n, r, n);
        else
            snprintf(why, cap, "it has %d actions where rank %d runs %d (the next is '%s')", f->n, r, n,
                     f->name[i]);
    }
    return 0;
}

/* Match every file to a pipeline rank of s; 1 if each matches one and every
 * rank has n_files / pp of them. */
static int tr_match_all(tr_file *files, int n_files, const loom_schedule *s) {
    if (n_files % s->pp) return 0;
    int *count = calloc((size_t)s->pp, sizeof *count), ok = count != NULL;
    for (int i = 0; ok && i < n_files; i++) {
        int prefix, found = -1;
        for (int r = 0; r < s->pp && found < 0; r++)
            if (tr_match(&files[i], s, r, &prefix, NULL, 0)) found = r;
        files[i].rank = found;
        ok = found >= 0 && ++count[found] <= n_files / s->pp;
    }
    free(count);
    return ok;
}

/* Some layout (schedule, pp, m, v) other than s's that every file fits, as
 * flags in hint; "" if none. */
static void tr_guess(tr_file *files, int n_files, const loom_schedule *cur, char *hint, size_t cap) {
    hint[0] = '\0';
    if (n_files < 1) return;
    int n_f = 0, v = 1;
    for (int i = 0; i < files[0].n; i++) {
        const char *nm = files[0].name[i];
        if (nm[0] != 'F' || nm[1] < '0' || nm[1] > '9') continue;
        n_f++;
        const char *dot = strchr(nm, '.');
        if (dot && atoi(dot + 1) + 1 > v) v = atoi(dot + 1) + 1;
    }
    if (n_f == 0 || n_f % v) return;
    const int m = n_f / v;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", loom_errmsg()); /* the checks below overwrite it */
    for (int k = 0; k < LOOM_SCHED_COUNT && !hint[0]; k++)
        for (int pp = 1; pp <= n_files && pp <= LOOM_PP_MAX_PP && !hint[0]; pp++) {
            if (n_files % pp || ((loom_sched_kind)k == cur->kind && pp == cur->pp &&
                                 m == cur->micro_batches && v == cur->virtual_stages))
                continue;
            loom_schedule *s = NULL;
            if (loom_schedule_check((loom_sched_kind)k, pp, m, v) != LOOM_OK ||
                loom_schedule_build((loom_sched_kind)k, pp, m, v, &s) != LOOM_OK)
                continue;
            if (tr_match_all(files, n_files, s))
                snprintf(hint, cap, "; the traces match --schedule %s --pp %d --micro-batches %d%s",
                         loom_schedule_name(s->kind), pp, m, v > 1 ? " --virtual-stages" : "");
            if (hint[0] && v > 1) {
                const size_t l = strlen(hint);
                snprintf(hint + l, cap > l ? cap - l : 0, " %d", v);
            }
            loom_schedule_free(s);
        }
    loom_fail(LOOM_OK, "%s", saved);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    if (n <= 0) return 0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

void loom_sim_trace_free(loom_sim_trace *t) {
    if (!t) return;
    free(t->mean);
    free(t->dur);
    free(t);
}

/* The trace files of dir: count (0..n-1 all present) or a failure. */
static loom_status tr_list(const char *dir, int *n_out) {
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d)
        return loom_fail(LOOM_ENOINPUT, "--from-trace %s: cannot open the directory: %s", dir,
                         strerror(errno));
    int count = 0, max = -1;
    const struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int r, end = 0;
        if (sscanf(de->d_name, "trace_rank%d.json%n", &r, &end) != 1 || de->d_name[end] != '\0' || r < 0 ||
            r >= (1 << 20))
            continue;
        char canon[64];
        snprintf(canon, sizeof canon, "trace_rank%d.json", r);
        if (strcmp(canon, de->d_name) != 0) continue; /* "trace_rank01.json" is not ours */
        count++;
        if (r > max) max = r;
    }
    closedir(d);
    if (count == 0)
        return loom_fail(
            LOOM_ENOINPUT,
            "--from-trace %s: no trace_rank<R>.json files (write them with loom train --trace %s)", dir, dir);
    if (count != max + 1) {
        for (int r = 0; r <= max; r++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/trace_rank%d.json", dir, r);
            if (access(path, F_OK) != 0)
                return loom_fail(
                    LOOM_ENOINPUT,
                    "--from-trace %s: trace_rank%d.json is missing (the directory has traces up to "
                    "trace_rank%d.json; a run writes one per rank)",
                    dir, r, max);
        }
    }
    *n_out = max + 1;
    return LOOM_OK;
}

/* Which pipeline rank of s wrote each file (files[i].rank): each file must
 * be exactly one rank's list and every rank must have n_files / pp of them;
 * LOOM_EDATA naming the first that is not, with the layout the files do
 * fit when there is one. */
static loom_status tr_assign(tr_file *files, int n_files, const loom_schedule *s, const char *dir) {
    const int pp = s->pp;
    char desc[160];
    snprintf(desc, sizeof desc, "%s pp=%d micro-batches=%d virtual-stages=%d", loom_schedule_name(s->kind),
             pp, s->micro_batches, s->virtual_stages);
    int *per = calloc((size_t)pp, sizeof *per);
    loom_status st = per ? LOOM_OK : loom_fail(LOOM_EOS, "out of memory");
    for (int i = 0; i < n_files && st == LOOM_OK; i++) {
        int best = -1, best_prefix = -1, prefix;
        files[i].rank = -1;
        for (int r = 0; r < pp && files[i].rank < 0; r++) {
            if (tr_match(&files[i], s, r, &prefix, NULL, 0)) files[i].rank = r;
            else if (prefix > best_prefix) best = r, best_prefix = prefix;
        }
        if (files[i].rank >= 0) {
            per[files[i].rank]++;
            continue;
        }
        char why[400], hint[200];
        if (files[i].n == 0)
            snprintf(why, sizeof why, "it has no pipeline actions (F0, SEND_ACT ..., OPT_STEP)");
        else tr_match(&files[i], s, best, &prefix, why, sizeof why);
        tr_guess(files, n_files, s, hint, sizeof hint);
        st = loom_fail(LOOM_EDATA, "%s/trace_rank%d.json is not a trace of %s: %s%s", dir, i, desc, why,
                       hint[0]
                           ? hint
                           : "; pass the --schedule, --pp, --micro-batches and --virtual-stages of the run "
                             "that wrote it");
    }
    for (int r = 0; r < pp && st == LOOM_OK; r++)
        if (per[r] * pp != n_files) {
            char hint[200], why[200];
            tr_guess(files, n_files, s, hint, sizeof hint);
            if (n_files % pp)
                snprintf(why, sizeof why, "%d trace file(s) is not a multiple of pp=%d", n_files, pp);
            else
                snprintf(why, sizeof why, "pipeline rank %d wrote %d of the %d trace files, not %d", r,
                         per[r], n_files, n_files / pp);
            st = loom_fail(LOOM_EDATA, "--from-trace %s is not a trace of %s: %s%s", dir, desc, why,
                           hint[0] ? hint : "");
        }
    free(per);
    return st;
}

/* Per virtual stage, the mean F, B, W over every file; the measured bubble
 * averaged over the groups of pp files (gf[k*pp + r]: file of rank r in
 * group k); every action's duration in group 0 (t->dur); the mean compute
 * action. */
static void tr_stage_means(const tr_file *files, const int *gf, const loom_schedule *s, int G, double *sums,
                           loom_sim_trace *t) {
    const int pp = s->pp, S = pp * s->virtual_stages;
    int n_compute = 0;
    double compute = 0, bubble = 0;
    for (int k = 0; k < G; k++) {
        double busy = 0, span = 0;
        for (int r = 0; r < pp; r++) {
            const tr_file *f = &files[gf[k * pp + r]];
            int n;
            const loom_pp_action *a = loom_schedule_rank(s, r, &n);
            for (int i = 0; i < n; i++) {
                const double d = f->t1[i] - f->t0[i];
                if (a[i].kind <= LOOM_PP_W) {
                    sums[3 * loom_pp_vstage(s, r, a[i].chunk) + (int)a[i].kind] += d;
                    busy += d;
                    compute += d;
                    n_compute++;
                }
                const int timed =
                    a[i].kind <= LOOM_PP_W || a[i].kind == LOOM_PP_SEND_ACT || a[i].kind == LOOM_PP_SEND_GRAD;
                if (k == 0) t->dur[s->offset[r] + i] = timed ? d : 0.0;
            }
            if (n && f->t1[n - 1] - f->t0[0] > span) span = f->t1[n - 1] - f->t0[0];
        }
        bubble += span > 0 ? 1.0 - busy / (pp * span) : 0.0;
    }
    t->bubble = bubble / G;
    t->compute_mean = n_compute ? compute / n_compute : 0;
    const double per_stage = (double)G * s->micro_batches; /* samples of each kind per virtual stage */
    for (int v = 0; v < S; v++) {
        t->mean[v].f = sums[3 * v] / per_stage;
        t->mean[v].b = sums[3 * v + 1] / per_stage;
        t->mean[v].w = s->split_backward ? sums[3 * v + 2] / per_stage : 0.0;
    }
}

/* The messages of group k (files gf[k*pp ..]), clocks aligned on the pp
 * all-reduce after the step when every file has it: each receive's delay
 * from both sides ready to its end (delays), and RECV end - SEND end of
 * those whose receiver already waited (lat). 0 if the clocks could not be
 * aligned. */
static int tr_group_messages(const tr_file *files, const int *gf, const loom_schedule *s, int k,
                             double *send_end, double *delays, int *n_del, double *lat, int *n_lat) {
    const int pp = s->pp;
    const double ref = files[gf[k * pp]].sync;
    int aligned = isfinite(ref);
    for (int r = 0; r < pp; r++) aligned = aligned && isfinite(files[gf[k * pp + r]].sync);
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < pp; r++) {
            const tr_file *f = &files[gf[k * pp + r]];
            const double off = aligned ? f->sync - ref : 0.0;
            int n;
            const loom_pp_action *a = loom_schedule_rank(s, r, &n);
            for (int i = 0; i < n; i++) {
                const int tag = loom_pp_tag(s, r, &a[i]);
                if (tag < 0) continue;
                const int is_send = a[i].kind == LOOM_PP_SEND_ACT || a[i].kind == LOOM_PP_SEND_GRAD;
                if (pass == 0 && is_send) send_end[tag] = f->t1[i] - off;
                if (pass == 1 && !is_send) {
                    const double rs = f->t0[i] - off, re = f->t1[i] - off, se = send_end[tag];
                    delays[(*n_del)++] = re - (se > rs ? se : rs);
                    if (rs < se) lat[(*n_lat)++] = re - se;
                }
            }
        }
    return aligned;
}

/* The message statistics of every group: late messages, delays, the
 * message latency (the median of lat). */
static void tr_messages(const tr_file *files, const int *gf, const loom_schedule *s, int G, double *send_end,
                        double *delays, double *lat, loom_sim_trace *t) {
    int n_del = 0, n_lat = 0;
    for (int k = 0; k < G; k++)
        if (!tr_group_messages(files, gf, s, k, send_end, delays, &n_del, lat, &n_lat)) t->aligned = 0;
    t->n_msgs = n_del;
    t->late_threshold = 0.1 * t->compute_mean > 0.05 ? 0.1 * t->compute_mean : 0.05;
    for (int i = 0; i < n_del; i++) {
        if (delays[i] > t->late_threshold) t->n_late++;
        if (delays[i] > t->delay_max) t->delay_max = delays[i];
    }
    t->delay_median = median(delays, n_del);
    t->comm_samples = n_lat;
    t->comm = n_lat ? median(lat, n_lat) : 0.0;
    if (t->comm < 0) t->comm = 0;
    for (int i = 0; i < s->n_total; i++)
        if (t->dur[i] < 0) t->dur[i] = 0;
}

/* What the assigned files measured, as a loom_sim_trace. */
static loom_status tr_measure(const tr_file *files, int n_files, const loom_schedule *s,
                              loom_sim_trace **out) {
    const int pp = s->pp, S = pp * s->virtual_stages, G = n_files / pp;
    const int tags = loom_pp_tag_limit(s) + 1;
    int *gf = malloc((size_t)n_files * sizeof *gf); /* gf[k*pp + r]: file of rank r in group k */
    int *per = calloc((size_t)pp, sizeof *per);
    loom_sim_trace *t = calloc(1, sizeof *t);
    double *sums = calloc(3 * (size_t)S, sizeof *sums);
    double *delays = malloc(((size_t)G * (size_t)tags + 1) * sizeof *delays);
    double *lat = malloc(((size_t)G * (size_t)tags + 1) * sizeof *lat);
    double *send_end = malloc((size_t)tags * sizeof *send_end);
    if (t) {
        t->mean = calloc((size_t)S, sizeof *t->mean);
        t->dur = calloc((size_t)s->n_total + 1, sizeof *t->dur);
    }
    loom_status st = LOOM_OK;
    if (!gf || !per || !t || !sums || !delays || !lat || !send_end || !t->mean || !t->dur) {
        st = loom_fail(LOOM_EOS, "out of memory reading %d traces", n_files);
    } else {
        for (int i = 0; i < n_files; i++) gf[per[files[i].rank]++ * pp + files[i].rank] = i;
        t->n_files = n_files;
        t->per_rank = G;
        t->n_stages = S;
        t->aligned = 1;
        tr_stage_means(files, gf, s, G, sums, t);
        tr_messages(files, gf, s, G, send_end, delays, lat, t);
    }
    free(gf);
    free(per);
    free(sums);
    free(delays);
    free(lat);
    free(send_end);
    if (st != LOOM_OK) {
        loom_sim_trace_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

loom_status loom_sim_trace_read(const loom_schedule *s, const char *dir, loom_sim_trace **out) {
    *out = NULL;
    LOOM_TRY(loom_schedule_validate(s));
    int n_files;
    LOOM_TRY(tr_list(dir, &n_files));
    tr_file *files = calloc((size_t)n_files, sizeof *files);
    if (!files) return loom_fail(LOOM_EOS, "out of memory reading %d traces", n_files);
    loom_status st = LOOM_OK;
    char path[4200];
    for (int i = 0; i < n_files && st == LOOM_OK; i++) {
        snprintf(path, sizeof path, "%s/trace_rank%d.json", dir, i);
        files[i].world = i;
        st = tr_read(path, &files[i]);
    }
    if (st == LOOM_OK) st = tr_assign(files, n_files, s, dir);
    if (st == LOOM_OK) st = tr_measure(files, n_files, s, out);
    for (int i = 0; i < n_files; i++) tr_file_free(&files[i]);
    free(files);
    return st;
}
