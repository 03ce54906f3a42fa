/* calibrate.c - the machine's peak for MFU: one sgemm measurement per thread
 * count, cached in $XDG_CACHE_HOME/loom (or ~/.cache/loom). Collective over
 * world (rank 0 measures, everyone gets the number). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "loom/kernels.h"
#include "loom/log.h"
#include "train/internal.h"

static void cache_path(char *buf, size_t n, int threads) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(buf, n, "%s/loom/peak_sgemm_t%d.txt", xdg, threads);
    else snprintf(buf, n, "%s/.cache/loom/peak_sgemm_t%d.txt", home ? home : "/tmp", threads);
}

static double measure_cached(void) {
    char path[1024];
    int threads = loom_kernels_get_threads();
    cache_path(path, sizeof path, threads);
    double v = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = 0;
        fclose(f);
    }
    if (v > 0) return v;
    v = loom_kernels_calibrate_sgemm();
    loom_info("measured sgemm peak: %.1f GFLOP/s on %d thread(s) (cached in %s)", v / 1e9, threads,
              path);
    /* best effort: a cache we cannot write only costs a re-measure */
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.6g\n", v);
        fclose(f);
    }
    return v;
}

loom_status loom_peak_flops(loom_comm *world, double given, double *out) {
    if (given > 0) {
        *out = given;
        return LOOM_OK;
    }
    double v = loom_comm_rank(world) == 0 ? measure_cached() : 0;
    LOOM_TRY(loom_comm_bcast(world, &v, sizeof v, 0));
    *out = v > 0 ? v : 1e9;
    return LOOM_OK;
}
