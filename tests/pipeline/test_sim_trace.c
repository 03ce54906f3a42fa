/* test_sim_trace.c - `loom sim --from-trace DIR` and loom_sim_trace_read:
 *
 *  1. A hand-written trace directory of pp=2 gpipe, 2 micro-batches (the
 *     shape `loom train --trace` writes: thread names, pipeline actions,
 *     phases and collectives; rank 1's clock 0.5 ms ahead), timed by hand:
 *     stage 0 F = 1 ms, B = 2 ms; stage 1 F = 2 ms, B = 3 ms; messages
 *     arrive 0.1 ms after their SEND. Every number the command prints is
 *     worked out below from that timeline, not from the simulator.
 *  2. Round trip for every schedule (interleaved with v = 2, zb split):
 *     the simulator's own timeline written as traces reads back as the same
 *     per-stage costs, latency and bubble.
 *  3. Bad directories: exit 66 for a missing directory or file, 65 for
 *     malformed JSON, bad events and traces of another layout (with the
 *     layout that fits), 64 for cost flags beside --from-trace.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sim_capture.h"
#include "loom/sim.h"
#include "loom/status.h"

static char root[] = "/tmp/loom_sim_trace_dirXXXXXX";

/* root/sub/name with the given text. */
static void put_file(const char *sub, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

static const char *dir_of(const char *sub) {
    static char path[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(path[k], sizeof path[k], "%s/%s", root, sub);
    return path[k];
}

/* ---- 1. the hand-written trace ------------------------------------------------
 * rank 0: F0 [0,1] SEND [1,1] F1 [1,2] SEND [2,2] RECV_GRAD0 [2,8.2] B0 [8.2,10.2]
 *         RECV_GRAD1 [10.2,11.2] B1 [11.2,13.2] OPT [13.2,13.2]
 * rank 1: RECV_ACT0 [0,1.1] F0 [1.1,3.1] RECV_ACT1 [3.1,3.1] (arrived at 2.1)
 *         F1 [3.1,5.1] B0 [5.1,8.1] SEND [8.1,8.1] B1 [8.1,11.1] SEND [11.1,11.1]
 *         OPT [11.1,11.1]
 * Busy: rank 0 6 ms, rank 1 10 ms; spans 13.2 and 11.1 ms, so the bubble is
 * 1 - 16 / (2 x 13.2) = 0.393939... Messages whose receiver waited: RECV_ACT0,
 * RECV_GRAD0, RECV_GRAD1, each 0.1 ms after its SEND: latency 0.1. The
 * closed form for gpipe, (p-1)/(m+p-1), is 1/3. Rank 1 writes every time
 * 0.5 ms later (its step started later); the "pp" all-reduce after the step
 * ends at 13.4 ms on rank 0 and 13.9 ms on rank 1, which aligns them. */
static const char *RANK0 =
    "{\"traceEvents\": [\n"
    "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"pipeline\"}},\n"
    "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 4, \"args\": {\"name\": \"comm pp\"}},\n"
    "{\"name\": \"F0\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 0.000, \"dur\": 1000.000, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"SEND_ACT mb 0 chunk 0 -> rank 1\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 1000, \"dur\": 0, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"F1\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 1000, \"dur\": 1000, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"SEND_ACT mb 1 chunk 0 -> rank 1\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 2000, \"dur\": 0, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"RECV_GRAD mb 0 chunk 0 from rank 1\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 2000, \"dur\": 6200, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"send 262144 B\", \"cat\": \"pp\", \"ph\": \"X\", \"ts\": 1000, \"dur\": 1200, \"pid\": 0, \"tid\": 4},\n"
    "{\"name\": \"B0\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 8200, \"dur\": 2000, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"RECV_GRAD mb 1 chunk 0 from rank 1\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 10200, \"dur\": 1000, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"B1\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 11200, \"dur\": 2000, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"OPT_STEP\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 13200, \"dur\": 0, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"gradient sync\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 13500, \"dur\": 100, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"optimizer\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 13600, \"dur\": 900, \"pid\": 0, \"tid\": 0},\n"
    "{\"name\": \"allreduce 8 B\", \"cat\": \"pp\", \"ph\": \"X\", \"ts\": 13300, \"dur\": 100, \"pid\": 0, \"tid\": 4},\n"
    "{\"name\": \"allreduce 8 B\", \"cat\": \"pp\", \"ph\": \"X\", \"ts\": 14600, \"dur\": 10, \"pid\": 0, \"tid\": 4}\n"
    "]}\n";
static const char *RANK1 =
    "{\"traceEvents\": [\n"
    "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": {\"name\": \"pipeline\"}},\n"
    "{\"name\": \"RECV_ACT mb 0 chunk 0 from rank 0\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 500, \"dur\": 1100, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"F0\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 1600, \"dur\": 2000, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"RECV_ACT mb 1 chunk 0 from rank 0\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 3600, \"dur\": 0, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"F1\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 3600, \"dur\": 2000, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"B0\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 5600, \"dur\": 3000, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"SEND_GRAD mb 0 chunk 0 -> rank 0\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 8600, \"dur\": 0, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"B1\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": 8600, \"dur\": 3000, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"SEND_GRAD mb 1 chunk 0 -> rank 0\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 11600, \"dur\": 0, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"OPT_STEP\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": 11600, \"dur\": 0, \"pid\": 1, \"tid\": 0},\n"
    "{\"name\": \"allreduce 8 B\", \"cat\": \"pp\", \"ph\": \"X\", \"ts\": 12000, \"dur\": 1900, \"pid\": 1, \"tid\": 4}\n"
    "]}\n";

static void test_hand_written(void) {
    put_file("hand", "trace_rank0.json", RANK0);
    put_file("hand", "trace_rank1.json", RANK1);
    put_file("hand", "trace_rank1.json.tmp", "not ours: ignored");
    put_file("hand", "notes.txt", "ignored");

    loom_schedule *s = NULL;
    loom_sim_trace *t = NULL;
    CHECK(loom_schedule_build(LOOM_SCHED_GPIPE, 2, 2, 1, &s) == LOOM_OK, "build gpipe");
    loom_status st = loom_sim_trace_read(s, dir_of("hand"), &t);
    CHECK(st == LOOM_OK, "read hand trace: %s", loom_errmsg());
    if (st == LOOM_OK) {
        CHECK(t->n_files == 2 && t->per_rank == 1 && t->n_stages == 2, "files %d per rank %d stages %d",
              t->n_files, t->per_rank, t->n_stages);
        CHECK(fabs(t->mean[0].f - 1) < 1e-9 && fabs(t->mean[0].b - 2) < 1e-9 && t->mean[0].w == 0,
              "stage 0 costs %g %g %g", t->mean[0].f, t->mean[0].b, t->mean[0].w);
        CHECK(fabs(t->mean[1].f - 2) < 1e-9 && fabs(t->mean[1].b - 3) < 1e-9 && t->mean[1].w == 0,
              "stage 1 costs %g %g %g", t->mean[1].f, t->mean[1].b, t->mean[1].w);
        CHECK(t->aligned == 1, "clocks aligned on the pp all-reduce");
        CHECK(t->comm_samples == 3 && fabs(t->comm - 0.1) < 1e-9, "latency %g from %d messages", t->comm,
              t->comm_samples);
        CHECK(t->n_msgs == 4 && fabs(t->delay_median - 0.1) < 1e-9 && fabs(t->delay_max - 0.1) < 1e-9 &&
                  t->n_late == 0,
              "delays: %d messages, median %g, max %g, late %d", t->n_msgs, t->delay_median, t->delay_max,
              t->n_late);
        CHECK(fabs(t->bubble - (1 - 16 / 26.4)) < 1e-9, "measured bubble %.9f", t->bubble);
        CHECK(fabs(t->compute_mean - 2) < 1e-9, "mean compute action %g", t->compute_mean);
        loom_sim_costs c;
        loom_sim_costs_default(&c);
        c.stage = t->mean;
        c.comm = t->comm;
        loom_sim_result *r = NULL, *x = NULL;
        CHECK(loom_sim_run(s, &c, &r) == LOOM_OK && loom_sim_run_durations(s, t->dur, t->comm, &x) == LOOM_OK,
              "simulate: %s", loom_errmsg());
        if (r && x) {
            CHECK(fabs(r->makespan - 13.2) < 1e-9 && fabs(r->bubble - (1 - 16 / 26.4)) < 1e-9,
                  "simulated makespan %g bubble %g", r->makespan, r->bubble);
            CHECK(fabs(x->bubble - r->bubble) < 1e-12, "replay %g", x->bubble);
        }
        loom_sim_free(r);
        loom_sim_free(x);
    }
    loom_sim_trace_free(t);
    loom_schedule_free(s);

    /* the command prints the same numbers */
    int rc =
        sim("--pp", "2", "--micro-batches", "2", "--schedule", "gpipe", "--from-trace", dir_of("hand"), NULL);
    CHECK(rc == 0, "from-trace exit %d:\n%s", rc, sim_out);
    CHECK(strstr(sim_out, "bubble    0.393939 (simulated") && strstr(sim_out, "replayed  0.393939") &&
              strstr(sim_out, "measured  0.393939") && strstr(sim_out, "diff      +0.000000") &&
              strstr(sim_out, "closed    0.333333 (p-1)/(m+p-1)"),
          "bubble lines:\n%s", sim_out);
    CHECK(strstr(sim_out, "comm 0.1000 ms: median of RECV end - SEND end over the 3 messages") != NULL,
          "comm:\n%s", sim_out);
    CHECK(strstr(sim_out, "  0                0     0      1.000      2.000          -") &&
              strstr(sim_out, "  1                1     0      2.000      3.000          -"),
          "per-stage costs:\n%s", sim_out);
    CHECK(strstr(sim_out, "warning") == NULL, "no transport warning:\n%s", sim_out);
    CHECK(strstr(sim_out, "makespan  13.2 ms") != NULL, "makespan:\n%s", sim_out);

    /* --cost-comm overrides the estimate */
    rc = sim("--pp", "2", "--micro-batches", "2", "--schedule", "gpipe", "--from-trace", dir_of("hand"),
             "--cost-comm", "0", NULL);
    /* comm 0: rank 1 runs F0 [1,3] F1 [3,5] B0 [5,8] B1 [8,11]; rank 0 B0 [8,10] B1 [11,13] */
    CHECK(rc == 0 && strstr(sim_out, "comm 0 ms (--cost-comm; the trace's estimate is 0.1000 ms)") &&
              strstr(sim_out, "makespan  13 ms"),
          "--cost-comm 0:\n%s", sim_out);

    /* without the all-reduce the clocks stay 0.5 ms apart: rank 0's messages
     * seem 0.6 ms late, rank 1's -0.4 (clamped); the estimate says so */
    char r1[8192];
    snprintf(r1, sizeof r1, "%s", RANK1);
    char *ar = strstr(r1, ",\n{\"name\": \"allreduce 8 B\"");
    if (ar) strcpy(ar, "\n]}\n");
    put_file("noalign", "trace_rank0.json", RANK0);
    put_file("noalign", "trace_rank1.json", r1);
    rc = sim("--pp", "2", "--micro-batches", "2", "--schedule", "gpipe", "--from-trace", dir_of("noalign"),
             NULL);
    CHECK(rc == 0 && strstr(sim_out, "(clocks not aligned)") && strstr(sim_out, "measured  0.393939"),
          "no all-reduce:\n%s", sim_out);
}

/* ---- 2. round trip for every schedule ------------------------------------------ */

static void write_sim_trace(const char *sub, const loom_schedule *s, const loom_sim_result *r) {
    for (int rk = 0; rk < s->pp; rk++) {
        size_t cap = 1 << 20, len = 0;
        char *text = malloc(cap);
        len += (size_t)snprintf(text + len, cap - len, "[\n");
        for (int i = s->offset[rk]; i < s->offset[rk + 1]; i++) {
            char lab[96];
            loom_pp_action_format(&s->actions[i], s->virtual_stages, lab, sizeof lab);
            len += (size_t)snprintf(text + len, cap - len,
                                    "{\"name\": \"%s\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": %.3f, "
                                    "\"dur\": %.3f, \"pid\": %d, \"tid\": 0},\n",
                                    lab, 1000 * r->start[i], 1000 * (r->end[i] - r->start[i]), rk);
        }
        /* every rank leaves the all-reduce at the same time */
        len += (size_t)snprintf(text + len, cap - len,
                                "{\"name\": \"allreduce 8 B\", \"cat\": \"pp\", \"ph\": \"X\", \"ts\": %.3f, "
                                "\"dur\": %.3f, \"pid\": %d, \"tid\": 4}\n]\n",
                                1000 * r->rank_end[rk], 1000 * (r->makespan + 1 - r->rank_end[rk]), rk);
        char name[64];
        snprintf(name, sizeof name, "trace_rank%d.json", rk);
        put_file(sub, name, text);
        free(text);
    }
}

static void test_round_trip(void) {
    const struct {
        loom_sched_kind k;
        int pp, m, v;
    } cases[] = {{LOOM_SCHED_GPIPE, 2, 4, 1},
                 {LOOM_SCHED_1F1B, 4, 8, 1},
                 {LOOM_SCHED_INTERLEAVED, 2, 4, 2},
                 {LOOM_SCHED_ZB, 3, 6, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        loom_schedule *s = NULL;
        CHECK(loom_schedule_build(cases[ci].k, cases[ci].pp, cases[ci].m, cases[ci].v, &s) == LOOM_OK,
              "build");
        if (!s) continue;
        const int S = s->pp * s->virtual_stages;
        loom_sim_stage_cost want[16];
        for (int i = 0; i < S; i++) /* uneven stages, costs on a 1 us grid */
            want[i] = (loom_sim_stage_cost){1.25 + 0.125 * i, 2.5 - 0.25 * (i % 3),
                                            s->split_backward ? 0.75 + 0.5 * (i % 2) : 0};
        loom_sim_costs c;
        loom_sim_costs_default(&c);
        c.stage = want;
        c.comm = 0.05;
        loom_sim_result *r = NULL;
        CHECK(loom_sim_run(s, &c, &r) == LOOM_OK, "simulate %s: %s", loom_schedule_name(s->kind),
              loom_errmsg());
        char sub[32];
        snprintf(sub, sizeof sub, "rt%zu", ci);
        if (r) write_sim_trace(sub, s, r);
        loom_sim_trace *t = NULL;
        loom_status st = loom_sim_trace_read(s, dir_of(sub), &t);
        CHECK(st == LOOM_OK, "read back %s: %s", loom_schedule_name(s->kind), loom_errmsg());
        if (st == LOOM_OK && r) {
            double err = 0;
            for (int i = 0; i < S; i++)
                err = fmax(err, fmax(fabs(t->mean[i].f - want[i].f),
                                     fmax(fabs(t->mean[i].b - want[i].b), fabs(t->mean[i].w - want[i].w))));
            CHECK(err < 1e-6, "%s: per-stage costs read back within %g", loom_schedule_name(s->kind), err);
            CHECK(t->aligned && t->comm_samples > 0 && fabs(t->comm - 0.05) < 1e-6,
                  "%s: latency %g (%d samples)", loom_schedule_name(s->kind), t->comm, t->comm_samples);
            CHECK(fabs(t->bubble - r->bubble) < 1e-6, "%s: measured bubble %g, simulated %g",
                  loom_schedule_name(s->kind), t->bubble, r->bubble);
            loom_sim_result *x = NULL;
            CHECK(loom_sim_run_durations(s, t->dur, t->comm, &x) == LOOM_OK &&
                      fabs(x->bubble - r->bubble) < 1e-6,
                  "%s: replay at measured durations %g vs %g", loom_schedule_name(s->kind),
                  x ? x->bubble : -1, r->bubble);
            loom_sim_free(x);
        }
        loom_sim_trace_free(t);
        loom_sim_free(r);
        loom_schedule_free(s);
    }
    /* through the command, interleaved needs --virtual-stages and prints chunk labels */
    int rc = sim("--pp", "2", "--micro-batches", "4", "--schedule", "interleaved", "--virtual-stages", "2",
                 "--from-trace", dir_of("rt2"), NULL);
    CHECK(rc == 0 && strstr(sim_out, "diff      +0.000000") && strstr(sim_out, "F0.1"),
          "interleaved from trace:\n%s", sim_out);
    rc = sim("--pp", "3", "--micro-batches", "6", "--schedule", "zb", "--from-trace", dir_of("rt3"), NULL);
    CHECK(rc == 0 && strstr(sim_out, "B and W separate") && strstr(sim_out, "diff      +0.000000"),
          "zb from trace:\n%s", sim_out);
}

/* ---- 3. bad directories ---------------------------------------------------------- */

static void expect(int want, const char *msg, int rc) {
    CHECK(rc == want, "exit %d, want %d (%s):\n%s", rc, want, msg, sim_out);
    CHECK(strstr(sim_out, msg) != NULL, "output lacks '%s':\n%s", msg, sim_out);
}

#define GPIPE2 "--pp", "2", "--micro-batches", "2", "--schedule", "gpipe", "--from-trace"

static void test_bad(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/no/such/dir", root);
    expect(66, "cannot open the directory", sim(GPIPE2, path, NULL));
    put_file("empty", "readme", "x");
    expect(66, "no trace_rank<R>.json files (write them with loom train --trace",
           sim(GPIPE2, dir_of("empty"), NULL));
    put_file("gap", "trace_rank0.json", RANK0);
    put_file("gap", "trace_rank2.json", RANK1);
    expect(66, "trace_rank1.json is missing", sim(GPIPE2, dir_of("gap"), NULL));

    put_file("badjson", "trace_rank0.json", RANK0);
    put_file("badjson", "trace_rank1.json", "{\"traceEvents\": [ {\"name\": \"F0\", ");
    expect(65, "trace_rank1.json: not valid JSON", sim(GPIPE2, dir_of("badjson"), NULL));
    put_file("noevents", "trace_rank0.json", RANK0);
    put_file("noevents", "trace_rank1.json", "{\"events\": []}");
    expect(65, "trace_rank1.json: no \"traceEvents\" array", sim(GPIPE2, dir_of("noevents"), NULL));
    put_file("notobj", "trace_rank0.json", "[1, 2]");
    put_file("notobj", "trace_rank1.json", RANK1);
    expect(65, "trace_rank0.json: event 0 is not a JSON object", sim(GPIPE2, dir_of("notobj"), NULL));
    put_file("negdur", "trace_rank0.json", RANK0);
    put_file("negdur", "trace_rank1.json",
             "[{\"name\": \"F0\", \"ph\": \"X\", \"ts\": 0, \"dur\": -5, \"pid\": 1, \"tid\": 0}]");
    expect(65, "event 0 (F0): \"dur\" must be a finite number of microseconds >= 0",
           sim(GPIPE2, dir_of("negdur"), NULL));
    put_file("strts", "trace_rank0.json", "[{\"name\": \"F0\", \"ph\": \"X\", \"ts\": \"0\", \"dur\": 1}]");
    put_file("strts", "trace_rank1.json", RANK1);
    expect(65, "event 0 (F0): \"ts\" must be a finite number", sim(GPIPE2, dir_of("strts"), NULL));
    put_file("noactions", "trace_rank0.json", "{\"traceEvents\": []}");
    put_file("noactions", "trace_rank1.json", RANK1);
    expect(
        65,
        "trace_rank0.json is not a trace of gpipe pp=2 micro-batches=2 virtual-stages=1: it has no pipeline",
        sim(GPIPE2, dir_of("noactions"), NULL));

    /* the right files, the wrong flags: the message names the layout that fits */
    expect(
        65,
        "trace_rank1.json is not a trace of 1f1b pp=2 micro-batches=2 virtual-stages=1: its action 2 is "
        "'RECV_ACT mb 1 chunk 0 from rank 0' where rank 1 runs 'B0'; the traces match --schedule gpipe --pp 2 "
        "--micro-batches 2",
        sim("--pp", "2", "--micro-batches", "2", "--schedule", "1f1b", "--from-trace", dir_of("hand"), NULL));
    expect(65, "the traces match --schedule gpipe --pp 2 --micro-batches 2",
           sim("--pp", "2", "--micro-batches", "4", "--schedule", "gpipe", "--from-trace", dir_of("hand"),
               NULL));
    expect(65, "is not a trace of gpipe pp=4 micro-batches=2",
           sim("--pp", "4", "--micro-batches", "2", "--schedule", "gpipe", "--from-trace", dir_of("hand"),
               NULL));
    expect(65, "the traces match --schedule interleaved --pp 2 --micro-batches 4 --virtual-stages 2",
           sim("--pp", "2", "--micro-batches", "4", "--schedule", "interleaved", "--from-trace",
               dir_of("rt2"), NULL));
    /* a stale extra file of another run */
    put_file("extra", "trace_rank0.json", RANK0);
    put_file("extra", "trace_rank1.json", RANK1);
    put_file("extra", "trace_rank2.json", RANK1);
    expect(65, "3 trace file(s) is not a multiple of pp=2", sim(GPIPE2, dir_of("extra"), NULL));
    /* the simulator's own trace (every rank in one file, no messages) is not a run's trace */
    snprintf(path, sizeof path, "%s/simtrace/trace_rank0.json", root);
    put_file("simtrace", "x", "");
    CHECK(sim(GPIPE2, dir_of("hand"), "--trace", path, NULL) == 0, "sim trace");
    expect(65, "trace_rank0.json is not a trace of gpipe pp=2", sim(GPIPE2, dir_of("simtrace"), NULL));

    /* cost flags the trace replaces */
    expect(64, "--cost-f: not with --from-trace", sim(GPIPE2, dir_of("hand"), "--cost-f", "2", NULL));
    expect(64, "--layers: not with --from-trace", sim(GPIPE2, dir_of("hand"), "--layers", "8", NULL));
    expect(64, "--cost-head: not with --from-trace", sim(GPIPE2, dir_of("hand"), "--cost-head", "1", NULL));
    expect(64, "--cost-comm -1: must be a finite number >= 0",
           sim(GPIPE2, dir_of("hand"), "--cost-comm", "-1", NULL));
}

int main(void) {
    if (!mkdtemp(root)) {
        CHECK(0, "mkdtemp");
        return check_done();
    }
    test_hand_written();
    test_round_trip();
    test_bad();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return check_done();
}
