/* test_report.c - the training report's metrics file (src/train/report.c).
 *
 * Invariant 5 for --metrics: the JSONL goes to PATH.tmp and is renamed over
 * PATH only when the run succeeded. A rename that fails on an otherwise
 * successful run is a failure of the run (LOOM_ECANTCREAT naming the file and
 * where the metrics are), not a log line; a failed run leaves PATH as it
 * was; a directory at PATH is refused when the report opens, before any
 * training. Local, no MPI. */
#include "check.h"
#include "loom/status.h"
#include "train/internal.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *scratch; /* check_scratch_dir */

static int exists(const char *path) { return access(path, F_OK) == 0; }

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Lines in a file, -1 if it cannot be read. */
static int count_lines(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) return -1;
    int n = 0, c;
    while ((c = fgetc(fp)) != EOF) n += c == '\n';
    fclose(fp);
    return n;
}

static void config_for(loom_train_config *c, const char *metrics) {
    loom_train_config_default(c);
    snprintf(c->metrics, sizeof c->metrics, "%s", metrics);
    c->steps = 2;
    c->quiet = 1;
    c->progress = 0;
}

/* Open, log `steps` steps, close with run status `run`; returns close's status. */
static loom_status run_report(const loom_train_config *c, int rank, int steps, loom_status run,
                              const char *make_dir_at) {
    loom_report r;
    loom_status st = loom_report_open(&r, c, rank);
    CHECK(st == LOOM_OK, "open %s: %s", c->metrics, loom_errmsg());
    if (st != LOOM_OK) return st;
    loom_step_stats s = {.loss = 5.5, .grad_norm = 1, .seconds = 0.01, .tokens_per_s = 1000, .lr = 1e-3f};
    for (int i = 0; i < steps; i++) CHECK(loom_report_step(&r, i, &s) == LOOM_OK, "step %d", i);
    if (make_dir_at) { /* something takes the name during the run: the rename must fail */
        char inner[512];
        snprintf(inner, sizeof inner, "%s/occupied", make_dir_at);
        CHECK(mkdir(make_dir_at, 0755) == 0, "mkdir %s", make_dir_at);
        FILE *fp = fopen(inner, "w");
        CHECK(fp != NULL, "create %s", inner);
        if (fp) fclose(fp);
    }
    loom_train_result res = {.steps_done = steps, .final_loss = 5.5, .tokens_per_s = 1000};
    loom_clear_error();
    return loom_report_close(&r, run, &res);
}

static void test_success(void) {
    loom_train_config c;
    const char *m = check_scratch_path("ok.jsonl");
    config_for(&c, m);
    loom_status st = run_report(&c, 0, 2, LOOM_OK, NULL);
    CHECK(st == LOOM_OK, "successful run: close gave %d (%s)", st, loom_errmsg());
    CHECK(count_lines(m) == 2, "metrics hold %d lines, expected 2", count_lines(m));
    CHECK(!exists(check_scratch_path("ok.jsonl.tmp")), "tmp left after a successful run");

    /* other ranks write nothing and pass the status through */
    const char *m1 = check_scratch_path("rank1.jsonl");
    config_for(&c, m1);
    CHECK(run_report(&c, 1, 2, LOOM_OK, NULL) == LOOM_OK, "rank 1: close");
    CHECK(!exists(m1) && !exists(check_scratch_path("rank1.jsonl.tmp")), "rank 1 wrote a metrics file");
    CHECK(run_report(&c, 1, 2, LOOM_EDATA, NULL) == LOOM_EDATA, "rank 1: a failure passes through");
}

static void test_rename_fails(void) {
    loom_train_config c;
    const char *m = check_scratch_path("taken.jsonl"), *tmp = check_scratch_path("taken.jsonl.tmp");
    config_for(&c, m);
    loom_status st = run_report(&c, 0, 2, LOOM_OK, m);
    const char *msg = loom_errmsg();
    CHECK(st == LOOM_ECANTCREAT, "rename over a directory: close gave %d, expected %d (%s)", st,
          LOOM_ECANTCREAT, msg);
    CHECK(strstr(msg, "--metrics") && strstr(msg, m) && strstr(msg, tmp),
          "message names the flag, file and tmp: %s", msg);
    CHECK(count_lines(tmp) == 2, "the metrics stay in %s (%d lines)", tmp, count_lines(tmp));
    CHECK(is_dir(m) && exists(check_scratch_path("taken.jsonl/occupied")), "what took the name is untouched");
}

static void test_failed_run_keeps_old(void) {
    loom_train_config c;
    const char *m = check_scratch_path("old.jsonl");
    FILE *fp = fopen(m, "w");
    CHECK(fp != NULL, "create %s", m);
    if (fp) {
        fputs("{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n", fp);
        fclose(fp);
    }
    config_for(&c, m);
    loom_status st = run_report(&c, 0, 1, LOOM_EDATA, NULL);
    CHECK(st == LOOM_EDATA, "failed run: close gave %d, expected the run's %d", st, LOOM_EDATA);
    CHECK(count_lines(m) == 3, "a failed run changed the existing metrics (%d lines)", count_lines(m));
    CHECK(count_lines(check_scratch_path("old.jsonl.tmp")) == 1, "partial metrics kept in the tmp file");
}

static void test_directory_refused_at_open(void) {
    loom_train_config c;
    const char *d = check_scratch_path("adir");
    CHECK(mkdir(d, 0755) == 0, "mkdir %s", d);
    config_for(&c, d);
    loom_report r;
    loom_clear_error();
    loom_status st = loom_report_open(&r, &c, 0);
    CHECK(st == LOOM_ECANTCREAT, "--metrics naming a directory: open gave %d, expected %d", st,
          LOOM_ECANTCREAT);
    CHECK(strstr(loom_errmsg(), "--metrics") && strstr(loom_errmsg(), d) &&
              strstr(loom_errmsg(), "directory"),
          "message: %s", loom_errmsg());
    CHECK(!exists(check_scratch_path("adir.tmp")), "a refused open created the tmp file");
    if (st == LOOM_OK) {
        loom_train_result res = {0};
        loom_report_close(&r, LOOM_EDATA, &res);
    }
}

int main(void) {
    scratch = check_scratch_dir("report");
    if (!scratch) return check_done();
    test_success();
    test_rename_fails();
    test_failed_run_keeps_old();
    test_directory_refused_at_open();
    return check_done();
}
