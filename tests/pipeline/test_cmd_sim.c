/* test_cmd_sim.c - `loom sim` through its command function (tools/cmd_sim.c,
 * linked into this test with the flag parser, so it runs before the
 * dispatcher knows the command): exit codes (0, 64 for bad flags and
 * layouts, 73 for a trace that cannot be created), the printed bubble and
 * closed form, and the trace file. Output is captured through a temp file.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sim_capture.h"

static void expect_usage(const char *msg, int rc) {
    CHECK(rc == 64, "exit %d, want 64 (%s)", rc, msg);
    CHECK(strstr(sim_out, msg) != NULL, "output lacks '%s':\n%s", msg, sim_out);
}

int main(void) {
    int rc = sim("--pp", "4", "--micro-batches", "8", "--schedule", "1f1b", NULL);
    CHECK(rc == 0, "1f1b exit %d:\n%s", rc, sim_out);
    CHECK(strstr(sim_out, "stage 0: F0 F1 F2 F3 .. .. .. .. .. .. B0 B0 F4 B1 B1") != NULL,
          "1f1b timeline:\n%s", sim_out);
    CHECK(strstr(sim_out, "bubble    0.272727 (simulated)") &&
              strstr(sim_out, "closed    0.272727 (p-1)/(m+p-1)"),
          "1f1b bubble lines:\n%s", sim_out);

    rc = sim("--pp", "4", "--micro-batches", "8", "--schedule", "zb", NULL);
    CHECK(rc == 0 && strstr(sim_out, "bubble    0.111111 (simulated)") &&
              strstr(sim_out, "closed    0.111111"),
          "zb:\n%s", sim_out);
    CHECK(strstr(sim_out, "stage 3: .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 W0 F4") != NULL, "zb timeline:\n%s",
          sim_out);

    rc = sim("--pp", "4", "--micro-batches", "8", "--schedule", "interleaved", "--virtual-stages", "2", NULL);
    CHECK(rc == 0 && strstr(sim_out, "bubble    0.157895 (simulated)") &&
              strstr(sim_out, "closed    0.157895"),
          "interleaved:\n%s", sim_out);

    rc = sim("--pp", "2", "--micro-batches", "4", "--schedule", "gpipe", "--cost-comm", "0.5", NULL);
    CHECK(rc == 0 && strstr(sim_out, "applies only with --cost-comm 0"), "latency note:\n%s", sim_out);

    rc = sim("--pp", "2", "--micro-batches", "4", "--layers", "12", "--cost-head", "6", NULL);
    CHECK(rc == 0 && strstr(sim_out, "layers per virtual stage (12 layers, embedding 0, head 6): 9 3"),
          "layers:\n%s", sim_out);

    /* --recompute full: b grows by f (same bubble as --cost-b 2 with latency,
     * where the bubble depends on the costs), the head weighs 3/4 as much
     * against a block, so the split moves a block off the head's stage */
    rc = sim("--pp", "4", "--micro-batches", "8", "--cost-comm", "0.5", "--recompute", "full", NULL);
    CHECK(rc == 0 && strstr(sim_out, "costs: f=1 b=2 w=1") && strstr(sim_out, "recompute: full") &&
              strstr(sim_out, "bubble    0.384615 (simulated)"),
          "recompute full:\n%s", sim_out);
    rc = sim("--pp", "4", "--micro-batches", "8", "--cost-comm", "0.5", NULL);
    CHECK(rc == 0 && strstr(sim_out, "bubble    0.414634 (simulated)") && !strstr(sim_out, "recompute"),
          "no recompute, same latency:\n%s", sim_out);
    rc = sim("--pp", "2", "--micro-batches", "4", "--layers", "12", "--cost-head", "6", "--recompute", "full",
             NULL);
    CHECK(rc == 0 && strstr(sim_out, "layers per virtual stage (12 layers, embedding 0, head 4.5): 8 4"),
          "recompute full split:\n%s", sim_out);
    /* zb with full recompute: B and W each re-run the forward (b = w = 2),
     * x = max(f, b, f+b-w) = 2: 3*2 / (8*5 + 3*2) */
    rc = sim("--pp", "4", "--micro-batches", "8", "--schedule", "zb", "--recompute", "full", NULL);
    CHECK(rc == 0 && strstr(sim_out, "costs: f=1 b=2 w=2") && strstr(sim_out, "W re-runs it too") &&
              strstr(sim_out, "bubble    0.130435 (simulated)"),
          "zb recompute full:\n%s", sim_out);
    rc = sim("--pp", "2", "--micro-batches", "4", "--recompute", "selective", NULL);
    CHECK(rc == 0 && strstr(sim_out, "costs: f=1 b=1 w=1"), "selective adds nothing:\n%s", sim_out);

    char dir[] = "/tmp/loom_cmd_sim_dirXXXXXX", trace[256], bad[300];
    if (mkdtemp(dir)) {
        snprintf(trace, sizeof trace, "%s/t.json", dir);
        rc = sim("--schedule", "zb", "--trace", trace, NULL);
        struct stat sb;
        CHECK(rc == 0 && stat(trace, &sb) == 0 && sb.st_size > 100, "trace written: exit %d\n%s", rc,
              sim_out);
        snprintf(bad, sizeof bad, "%s/no/such/dir/t.json", dir);
        rc = sim("--schedule", "zb", "--trace", bad, NULL);
        CHECK(rc == 73 && strstr(sim_out, "cannot create"), "bad trace path: exit %d\n%s", rc, sim_out);
        unlink(trace);
        rmdir(dir);
    }

    CHECK(sim("--help", NULL) == 0 && strstr(sim_out, "usage: loom sim") &&
              strstr(sim_out, "--from-trace DIR"),
          "--help:\n%s", sim_out);

    expect_usage(
        "interleaved needs --micro-batches divisible by pp=4, got 6",
        sim("--pp", "4", "--micro-batches", "6", "--schedule", "interleaved", "--virtual-stages", "2", NULL));
    expect_usage("v > 1 only with interleaved, zbv or dualpipev (schedule 1f1b)",
                 sim("--schedule", "1f1b", "--virtual-stages", "2", NULL));
    expect_usage("--schedule zb2: expected gpipe, 1f1b, interleaved, zb, zbh2, zbv or dualpipev",
                 sim("--schedule", "zb2", NULL));
    expect_usage("--pp 0: must be in 1..1024", sim("--pp", "0", NULL));
    expect_usage("--cost-b -2: must be a finite number >= 0", sim("--cost-b", "-2", NULL));
    expect_usage("--cost-head -1: must be a finite number >= 0",
                 sim("--layers", "8", "--cost-head", "-1", NULL));
    expect_usage("unknown flag --stages", sim("--stages", "4", NULL));
    expect_usage("--recompute some: expected none, selective or full", sim("--recompute", "some", NULL));
    expect_usage("--recompute full: not with --from-trace",
                 sim("--recompute", "full", "--from-trace", "/nonexistent", NULL));
    expect_usage("--cores: not with --from-trace", sim("--cores", "1", "--from-trace", "/nonexistent", NULL));
    expect_usage("--stage-layers needs --layers N", sim("--stage-layers", "2,2", NULL));
    expect_usage("pp=4 x v=2 = 8 virtual stages but the model has 6 layers",
                 sim("--pp", "4", "--micro-batches", "8", "--schedule", "interleaved", "--virtual-stages",
                     "2", "--layers", "6", NULL));
    expect_usage("--stage-layers sums to 9, model has 8 layers",
                 sim("--pp", "4", "--layers", "8", "--stage-layers", "3,2,2,2", NULL));
    return check_done();
}
