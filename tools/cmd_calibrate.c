/* cmd_calibrate.c - `loom calibrate`: the GEMM kernel loom chose and the
 * peaks MFU is measured against, per thread count (loom/calibrate.h). Local:
 * no MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "loom/calibrate.h"
#include "loom/cpu.h"
#include "loom/kernels.h"

/* "1,2,4" -> counts; "" -> 1 .. online CPUs. */
static loom_status parse_threads(const char *s, int *out, int *n, int cap) {
    *n = 0;
    if (!*s) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        for (int t = 1; t <= (cpus > 0 ? cpus : 1) && *n < cap; t++) out[(*n)++] = t;
        return LOOM_OK;
    }
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 4096 || (*end && *end != ',') || *n >= cap)
            return loom_fail(LOOM_EUSAGE, "--threads %s: expected a comma list of counts >= 1", s);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return LOOM_OK;
}

int cmd_calibrate(int argc, char **argv) {
    static char threads[256];
    static int force;
    cli_opt opts[] = {
        {"threads", OPT_STR, threads, sizeof threads, "LIST",
         "thread counts to measure, e.g. 1,2 (default 1 .. the online CPUs)"},
        {"force", OPT_FLAG, &force, 0, NULL, "measure again even when the cache has a record"},
    };
    const cli_cmd cmd = {
        "calibrate", "loom calibrate [--threads LIST] [--force]",
        "Print the CPU's vector features, the GEMM kernel loom runs (chosen from the\n"
        "flags, or the user's OPENBLAS_CORETYPE) and, per thread count, the peaks MFU is\n"
        "reported against: the best of 7 1024^3 sgemms of that kernel, and the FMA peak\n"
        "(flop/cycle from the flags x a measured clock x threads).",
        "Records are cached in $XDG_CACHE_HOME/loom (~/.cache/loom) under a name made\n"
        "from the CPU, its flags and the kernel, so another CPU or kernel is measured\n"
        "afresh; `loom train` reads the record for its thread count (or measures it).\n"
        "Measure on an idle machine: a busy one gives a low peak (a run that beats\n"
        "it raises its own peak to the rate it reached, so MFU never reads above 100%).\n",
        opts, sizeof opts / sizeof opts[0]};
    int rc = cli_parse_local(&cmd, argc, argv);
    if (rc >= 0) return rc;
    loom_status st;
    int counts[64], n;
    if ((st = parse_threads(threads, counts, &n, 64)) != LOOM_OK) return cli_fail(st);
    char flags[160], gemm[512];
    const loom_cpu_features *f = loom_cpu_features_get();
    loom_cpu_features_str(f, flags, sizeof flags);
    loom_blas_describe(gemm, sizeof gemm);
    printf("cpu: %s\nflags: %s\ngemm: %s\n", loom_cpu_name(), flags, gemm);
    printf("\n%7s %14s %14s %8s %8s  %s\n", "threads", "sgemm GFLOP/s", "FMA GFLOP/s", "of FMA", "clock", "record");
    for (int i = 0; i < n; i++) {
        loom_peak p;
        if ((st = loom_peak_get(counts[i], force, &p)) != LOOM_OK) return cli_fail(st);
        printf("%7d %14.1f %14.1f %7.1f%% %5.2fGHz  %s (%s)\n", p.threads, p.sgemm_flops / 1e9,
               p.fma_flops / 1e9, 100 * p.sgemm_flops / p.fma_flops, p.clock_hz / 1e9,
               p.from_cache ? "cached" : "measured now", p.path);
    }
    return 0;
}
