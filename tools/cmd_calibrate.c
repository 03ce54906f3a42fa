/* cmd_calibrate.c - `loom calibrate`: measure this machine.
 *
 * Two measurements, one command:
 *   - without --out: the CPU's features, the GEMM kernel loom runs and, per
 *     thread count, the peaks MFU is reported against (loom/calibrate.h);
 *     local, no MPI needed (under mpirun, rank 0 measures, the others wait);
 *   - with --out FILE: this machine as a cluster for `loom plan` - sgemm with
 *     every rank busy, copy bandwidth, and every collective by group size
 *     through loom's communicator (loom/plan_calibrate.h); run it under
 *     mpirun with the ranks to plan for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "loom/calibrate.h"
#include "loom/comm.h"
#include "loom/cpu.h"
#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "loom/plan_calibrate.h"

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

/* The kernel and its peaks, per thread count (rank 0 only). */
static loom_status print_peaks(const int *counts, int n, int force) {
    char flags[160], gemm[512], bf16[512];
    const loom_cpu_features *f = loom_cpu_features_get();
    loom_cpu_features_str(f, flags, sizeof flags);
    loom_blas_describe(gemm, sizeof gemm);
    loom_bf16_gemm_describe(bf16, sizeof bf16);
    printf("cpu: %s\nflags: %s\ngemm: %s\nbf16 gemm: %s\n", loom_cpu_name(), flags, gemm, bf16);
    printf("\n%-9s %7s %13s %12s %7s %9s %8s  %s\n", "precision", "threads", "GEMM GFLOP/s", "FMA GFLOP/s",
           "of FMA", "flop/cyc", "clock", "record");
    int precisions = loom_kernels_bf16_provider() ? 2 : 1; /* bf16 without a provider is the fp32 row */
    for (int bf = 0; bf < precisions; bf++)
        for (int i = 0; i < n; i++) {
            loom_peak p;
            LOOM_TRY(loom_peak_get(counts[i], force, bf, &p));
            printf("%-9s %7d %13.1f %12.1f %6.1f%% %9.0f %6.2fGHz  %s (%s)\n", bf ? "bf16" : "fp32",
                   p.threads, p.sgemm_flops / 1e9, p.fma_flops / 1e9, 100 * p.sgemm_flops / p.fma_flops,
                   p.flop_per_cycle, p.clock_hz / 1e9, p.from_cache ? "cached" : "measured now", p.path);
        }
    fflush(stdout);
    return LOOM_OK;
}

int cmd_calibrate(int argc, char **argv) {
    static char threads[256], out[1024];
    static int force, quiet;
    static cli_opt opts[] = {
        {"threads", OPT_STR, threads, sizeof threads, "LIST",
         "thread counts to measure, e.g. 1,2 (default 1 .. the online CPUs); with --out, the "
         "first is the threads per rank (default 1)"},
        {"force", OPT_FLAG, &force, 0, NULL, "measure the peaks again even when the cache has a record"},
        {"out", OPT_STR, out, sizeof out, "FILE",
         "instead: measure this machine's ranks for `loom plan` and write a cluster JSON"},
        {"quiet", OPT_FLAG, &quiet, 0, NULL, "print errors only (with --out)"},
    };
    static const cli_cmd cmd = {
        "calibrate",
        "loom calibrate [--threads LIST] [--force]\n"
        "       scripts/loomrun -np N loom calibrate --out FILE [--threads T] [--quiet]",
        "Without --out: print the CPU's vector features, the GEMM kernels loom runs (chosen\n"
        "from the flags, or the user's OPENBLAS_CORETYPE; and the bf16 provider) and, per\n"
        "precision and thread count, the peaks MFU is reported against: the best of 7\n"
        "GEMMs of that kernel at each of 1024^3, 2048^3 and 2048x2304x768, and the FMA peak (flop/cycle measured with the widest FMA the\n"
        "flags allow, x2 for bf16 dot products, x a measured clock x threads).\n"
        "With --out FILE, for `loom plan --cluster FILE`: sgemm FLOP/s per rank with every\n"
        "rank computing at once (the work all ranks complete in one 0.2 s window they share, a call\n"
        "in progress at its end counted by its fraction; best of 3 passes, so ranks that oversubscribe\n"
        "the cores measure their share), GEMM efficiency by size (gemm_curve:\n"
        "five sgemm shapes from 32x512x512 to 1024^3, each as a share of the fastest), memory-copy bandwidth, and the latency and bandwidth of all-reduce,\n"
        "all-gather, reduce-scatter and all-to-all for group sizes 2, 4, .., N and of a\n"
        "point-to-point message, each through loom's communicator; rank 0 writes the file\n"
        "(one node of N devices). Under a launcher across hosts (the same ranks on each), the\n"
        "file has one node per host: the link inside a host (ranks 0-1 ping-pong) and between\n"
        "hosts (every rank exchanging with its peer on the next host at once), no measured\n"
        "collectives, and hosts on one machine sharing its cores (docs/cluster.md).",
        "Peak records are cached in $XDG_CACHE_HOME/loom (~/.cache/loom) under a name made\n"
        "from the CPU, its flags and the kernel, so another CPU or kernel is measured afresh;\n"
        "`loom train` reads the record for its thread count (or measures it). Measure on an\n"
        "idle machine: a busy one gives a low peak (a run that beats it raises its own peak\n"
        "to the rate it reached, so MFU never reads above 100%).\n"
        "Cluster file: latency is the median time of a 64-byte call, bandwidth the extra time\n"
        "of a 4 MiB call (docs/planning.md). Exit 73 if FILE cannot be created; an existing\n"
        "FILE is replaced whole or not at all.\n"
        "examples: build/loom calibrate --threads 1,2\n"
        "          scripts/loomrun -np 4 build/loom calibrate --out this-machine.json\n",
        opts,
        sizeof opts / sizeof opts[0]};
    loom_comm *world = NULL;
    loom_status st = loom_comm_init(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    loom_log_set_rank(loom_comm_rank(world), loom_comm_size(world));
    int help = 0, counts[64], n = 0;
    st = loom_comm_agree(world, cli_parse(&cmd, argc, argv, 0, &help));
    if (st == LOOM_OK && !help) st = loom_comm_agree(world, parse_threads(threads, counts, &n, 64));
    if (st == LOOM_OK && help) {
        if (loom_comm_rank(world) == 0) cli_print_help(&cmd, stdout);
    } else if (st == LOOM_OK && out[0]) {
        loom_device *dev = NULL; /* the CPU, the first count's threads */
        st = loom_comm_agree(world, cli_device_create("cpu", threads[0] ? counts[0] : 1, 1, 0, &dev));
        if (st == LOOM_OK) st = loom_comm_agree(world, loom_plan_calibrate(world, dev, out, !quiet));
        loom_device_free(dev);
    } else if (st == LOOM_OK) {
        loom_status mine = loom_comm_rank(world) == 0 ? print_peaks(counts, n, force) : LOOM_OK;
        st = loom_comm_agree(world, mine);
    }
    const int code = cli_fail(st);
    loom_comm_finalize(world);
    return code;
}
