/* trace_run.c - `loom train --trace DIR`: one Chrome/Perfetto trace of the
 * whole job over the steps --trace-steps chooses, DIR/trace.json (every rank
 * a process, its compute and each group's communication a thread), with the
 * ranks' clocks aligned at start-up; and, for `loom sim --from-trace`, each
 * rank's last traced step in DIR/trace_rank<R>.json as before.
 *
 * Alignment: rank 0 plays ping-pong with every other rank (ten round trips
 * each) and keeps the one with the shortest round trip: the other rank's
 * clock read at the bounce, minus the midpoint of rank 0's send and receive,
 * is its offset, within half that round trip. Rank 0 reports the offsets and
 * broadcasts them; each rank then writes its events in rank 0's time.
 * Collective over the world: setup (loom_train_trace_setup) and the merge at
 * the last traced step (loom_train_trace_step); the rest is local.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/log.h"
#include "train/internal.h"

#define PING_ROUNDS 10
#define TAG_PING 7301
#define TAG_MERGE 7302

/* 1-based traced range of this run. */
static void range(const loom_train_config *c, int *first, int *last) {
    *last = c->trace_last > 0 ? c->trace_last : c->steps;
    *first = c->trace_first > 0 ? c->trace_first : *last;
}

int loom_train_trace_on(const loom_train_run_state *s, int step) {
    int first, last;
    if (!s->cfg->trace[0]) return 0;
    range(s->cfg, &first, &last);
    return step + 1 >= first && step + 1 <= last;
}

/* Rank 0: offset and round trip of rank r's clock. */
static loom_status ping(loom_comm *w, int r, double *off, double *rtt) {
    *rtt = INFINITY;
    for (int k = 0; k < PING_ROUNDS; k++) {
        double t0 = loom_comm_wtime(), tr;
        LOOM_TRY(loom_comm_send(w, &t0, sizeof t0, r, TAG_PING));
        LOOM_TRY(loom_comm_recv(w, &tr, sizeof tr, r, TAG_PING));
        double t1 = loom_comm_wtime();
        if (t1 - t0 < *rtt) {
            *rtt = t1 - t0;
            *off = tr - 0.5 * (t0 + t1);
        }
    }
    return LOOM_OK;
}

static void report_offsets(const loom_train_run_state *s) {
    char line[1024];
    size_t k = 0;
    for (int r = 1; r < s->mesh->world_size && k + 64 < sizeof line; r++)
        k += (size_t)snprintf(line + k, sizeof line - k, "%s rank %d %+.1f us (rtt %.1f us)",
                              r > 1 ? "," : "", r, 1e6 * s->trace_offs[r], 1e6 * s->trace_rtts[r]);
    loom_info("trace: rank clocks aligned to rank 0 by ping-pong at start-up (best of %d round trips):%s",
              PING_ROUNDS, k ? line : " one rank, nothing to align");
}

/* This rank's process and thread names, first in its events. */
static void name_rows(loom_train_run_state *s) {
    const loom_mesh *m = s->mesh;
    fprintf(
        s->trace_mem,
        "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d (tp %d cp %d "
        "dp %d pp %d ep %d)\"}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": "
        "{\"sort_index\": %d}},\n",
        m->rank, m->rank, m->tp_rank, m->cp_rank, m->dp_rank, m->pp_rank, m->ep_rank, m->rank, m->rank);
    fprintf(
        s->trace_mem,
        "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"%s\"}},\n",
        m->rank, s->pipelined ? "pipeline" : "compute");
    for (int g = 0; g < LOOM_REPORT_GROUPS; g++)
        fprintf(s->trace_mem,
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
                "\"comm %s\"}},\n",
                m->rank, g + 1, loom_report_group_names[g]);
}

loom_status loom_train_trace_setup(loom_train_run_state *s) {
    loom_comm *w = loom_comm_host(s->mesh->world);
    const int P = s->mesh->world_size, rank = s->mesh->rank;
    double *buf = calloc((size_t)P + 1, sizeof *buf); /* offsets, then rank 0's base */
    s->trace_offs = calloc((size_t)P, sizeof *s->trace_offs);
    s->trace_rtts = calloc((size_t)P, sizeof *s->trace_rtts);
    s->trace_mem = open_memstream(&s->trace_text, &s->trace_len);
    loom_status st = buf && s->trace_offs && s->trace_rtts && s->trace_mem
                         ? LOOM_OK
                         : loom_fail(LOOM_EOS, "out of memory for the trace");
    st = loom_comm_agree(s->mesh->world, st);
    for (int r = 1; st == LOOM_OK && r < P; r++) {
        if (rank == 0) {
            st = ping(w, r, &buf[r], &s->trace_rtts[r]);
        } else if (rank == r) {
            for (int k = 0; st == LOOM_OK && k < PING_ROUNDS; k++) {
                double x;
                st = loom_comm_recv(w, &x, sizeof x, 0, TAG_PING);
                x = loom_comm_wtime();
                if (st == LOOM_OK) st = loom_comm_send(w, &x, sizeof x, 0, TAG_PING);
            }
        }
    }
    if (st == LOOM_OK && rank == 0) buf[P] = loom_comm_wtime();
    if (st == LOOM_OK) st = loom_comm_bcast(w, buf, ((size_t)P + 1) * sizeof *buf, 0);
    if (st == LOOM_OK) {
        memcpy(s->trace_offs, buf, (size_t)P * sizeof *buf);
        s->trace_base = buf[P];
        name_rows(s);
        if (rank == 0) report_offsets(s);
    }
    free(buf);
    return st;
}

/* t on this rank's clock -> microseconds of rank 0's clock since the base. */
static double us(const loom_train_run_state *s, double t) {
    return 1e6 * (t - s->trace_offs[s->mesh->rank] - s->trace_base);
}

static void put_name(FILE *f, const char *s) {
    for (; *s; s++) fputc(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20 ? '_' : *s, f);
}

static void event(loom_train_run_state *s, int step, const char *name, const char *cat, double t0, double t1,
                  int tid) {
    fprintf(s->trace_mem, "{\"name\": \"");
    put_name(s->trace_mem, name);
    fprintf(s->trace_mem,
            "\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"step\": %d}},\n",
            cat, us(s, t0), 1e6 * (t1 - t0), s->mesh->rank, tid, step + 1);
}

/* A communication event's row (thread): its group's, after the compute row. */
static int comm_row(const loom_comm_event *e) {
    for (int g = 0; g < LOOM_REPORT_GROUPS; g++)
        if (strcmp(e->group, loom_report_group_names[g]) == 0) return g + 1;
    return LOOM_REPORT_GROUPS + 1;
}

static const char *comm_name(const loom_comm_event *e, char *name, size_t cap) {
    snprintf(name, cap, "%s %llu B", loom_comm_op_name(e->op), (unsigned long long)e->bytes);
    return name;
}

/* The traced step's events of this rank, kept for the merge. */
static void keep_step(loom_train_run_state *s, int step) {
    if (s->pipelined) {
        int n;
        const loom_pp_event *ev = loom_pp_exec_events(s->exec, &n);
        for (int i = 0; i < n; i++) {
            char name[96];
            loom_pp_action_format(&ev[i].a, s->cfg->layout.virtual_stages, name, sizeof name);
            int compute = ev[i].a.kind == LOOM_PP_F || ev[i].a.kind == LOOM_PP_B || ev[i].a.kind == LOOM_PP_W;
            event(s, step, name, compute ? "compute" : "pipeline", ev[i].t0, ev[i].t1, 0);
        }
    }
    for (int i = 0; i < s->n_phase; i++)
        event(s, step, s->phase[i].name, "compute", s->phase[i].t0, s->phase[i].t1, 0);
    size_t n;
    const loom_comm_event *ev = loom_comm_trace_events(&n);
    for (size_t i = 0; i < n; i++) {
        char name[64];
        event(s, step, comm_name(&ev[i], name, sizeof name), "comm", ev[i].t0, ev[i].t1, comm_row(&ev[i]));
    }
}

/* DIR/trace_rank<R>.json: this rank's last traced step, times from its start
 * on this rank's clock (the input of `loom sim --from-trace DIR`). Local. */
static loom_status write_rank_file(loom_train_run_state *s, double base) {
    char path[LOOM_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/trace_rank%d.json", s->cfg->trace, s->mesh->rank);
    loom_trace *t;
    LOOM_TRY(loom_trace_open(path, base, &t));
    const int pid = s->mesh->rank;
    loom_trace_name_row(t, pid, 0, s->pipelined ? "pipeline" : "compute");
    for (int g = 0; g < LOOM_REPORT_GROUPS; g++) {
        char row[32];
        snprintf(row, sizeof row, "comm %s", loom_report_group_names[g]);
        loom_trace_name_row(t, pid, g + 1, row);
    }
    if (s->pipelined) loom_train_pp_trace(s, t);
    for (int i = 0; i < s->n_phase; i++)
        loom_trace_event(t, s->phase[i].name, "compute", s->phase[i].t0, s->phase[i].t1, pid, 0);
    size_t n;
    const loom_comm_event *ev = loom_comm_trace_events(&n);
    for (size_t i = 0; i < n; i++) {
        char name[64];
        loom_trace_event(t, comm_name(&ev[i], name, sizeof name), ev[i].group, ev[i].t0, ev[i].t1, pid,
                         comm_row(&ev[i]));
    }
    return loom_trace_close(t);
}

/* Rank 0 writes the events of every rank into DIR/trace.json (.tmp, then
 * renamed); the others send theirs. Each buffer ends with ",\n": dropped. */
static loom_status merge(loom_train_run_state *s, int first, int last) {
    loom_comm *w = loom_comm_host(s->mesh->world);
    const int P = s->mesh->world_size;
    if (fflush(s->trace_mem) != 0) return loom_fail(LOOM_EOS, "out of memory for the trace");
    uint64_t len = s->trace_len >= 2 ? s->trace_len - 2 : 0;
    if (s->mesh->rank != 0) {
        LOOM_TRY(loom_comm_send(w, &len, sizeof len, 0, TAG_MERGE));
        return loom_comm_send(w, s->trace_text, len, 0, TAG_MERGE);
    }
    char path[LOOM_PATH_MAX + 16], tmp[LOOM_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/trace.json", s->cfg->trace);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return loom_fail(LOOM_ECANTCREAT, "--trace %s: cannot create %s: %s", s->cfg->trace, tmp,
                         strerror(errno));
    fputs("{\"traceEvents\": [\n", f);
    fwrite(s->trace_text, 1, len, f);
    loom_status st = LOOM_OK;
    for (int r = 1; st == LOOM_OK && r < P; r++) {
        uint64_t n = 0;
        st = loom_comm_recv(w, &n, sizeof n, r, TAG_MERGE);
        char *text = st == LOOM_OK ? malloc(n ? n : 1) : NULL;
        if (st == LOOM_OK && !text) st = loom_fail(LOOM_EOS, "out of memory for rank %d's trace", r);
        if (st == LOOM_OK) st = loom_comm_recv(w, text, n, r, TAG_MERGE);
        if (st == LOOM_OK) fputs(",\n", f), fwrite(text, 1, n, f);
        free(text);
    }
    fprintf(f,
            "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"steps\": \"%d-%d\", \"ranks\": %d, "
            "\"clock_alignment\": \"ping-pong with rank 0 at start-up, best of %d round trips\", "
            "\"clock_offsets_us\": [",
            first, last, P, PING_ROUNDS);
    for (int r = 0; r < P; r++) fprintf(f, "%s%.3f", r ? ", " : "", 1e6 * s->trace_offs[r]);
    fputs("], \"clock_rtt_us\": [", f);
    for (int r = 0; r < P; r++) fprintf(f, "%s%.3f", r ? ", " : "", 1e6 * s->trace_rtts[r]);
    fputs("]}}\n", f);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (st == LOOM_OK && bad) st = loom_fail(LOOM_EIO, "--trace %s: writing %s failed", s->cfg->trace, tmp);
    if (st == LOOM_OK && rename(tmp, path) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "--trace %s: cannot rename %s: %s", s->cfg->trace, tmp,
                       strerror(errno));
    if (st != LOOM_OK) remove(tmp);
    else
        loom_info("trace of steps %d-%d, %d rank(s) -> %s (open in https://ui.perfetto.dev)", first, last, P,
                  path);
    return st;
}

loom_status loom_train_trace_step(loom_train_run_state *s, int step, double t_step) {
    int first, last;
    range(s->cfg, &first, &last);
    keep_step(s, step);
    if (step + 1 != last) return LOOM_OK;
    LOOM_TRY(write_rank_file(s, t_step));
    return merge(s, first, last);
}

void loom_train_trace_free(loom_train_run_state *s) {
    if (s->trace_mem) fclose(s->trace_mem);
    free(s->trace_text);
    free(s->trace_offs);
    free(s->trace_rtts);
    s->trace_mem = NULL;
    s->trace_text = NULL;
    s->trace_offs = s->trace_rtts = NULL;
}
