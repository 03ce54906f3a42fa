/* plan_calibrate.c - `loom calibrate`: measure this machine for the planner.
 * Collective over world (run under mpirun with the rank count to plan for):
 * sgemm FLOP/s at five shapes on every rank at once (the work each rank
 * completes in a shared window, so ranks sharing cores measure their share), memory copy
 * bandwidth, and for each
 * collective (all-reduce, all-gather, reduce-scatter, all-to-all, p2p) and
 * each group size 2, 4, .. world its latency (a tiny message) and bandwidth
 * (a large one), all through the communicator. Rank 0 writes a cluster JSON
 * (loom_plan_cluster_load reads it). */
#include "loom/plan_calibrate.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/device.h"
#include "loom/sysmem.h"
#include "plan_calibrate_links.h"

#define SMALL 64
#define LARGE (4u << 20)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median time of `reps` calls of op over c (every member calls). */
static loom_status time_op(loom_comm *c, loom_coll_op op, size_t bytes, int reps, float *a, float *b,
                           double *out) {
    const int g = loom_comm_size(c), r = loom_comm_rank(c);
    double t[64];
    if (reps > 64) reps = 64;
    for (int i = -1; i < reps; i++) { /* one warm-up */
        LOOM_TRY(loom_comm_barrier(c));
        const double t0 = loom_comm_wtime();
        switch (op) {
        case LOOM_COLL_ALLREDUCE: LOOM_TRY(loom_comm_allreduce(c, a, bytes / 4, LOOM_F32, LOOM_SUM)); break;
        case LOOM_COLL_ALLGATHER: LOOM_TRY(loom_comm_allgather(c, a, b, bytes / g)); break;
        case LOOM_COLL_REDUCESCATTER:
            LOOM_TRY(loom_comm_reduce_scatter(c, a, b, bytes / 4 / g, LOOM_F32, LOOM_SUM));
            break;
        case LOOM_COLL_ALLTOALL: LOOM_TRY(loom_comm_alltoall(c, a, b, bytes / g)); break;
        case LOOM_COLL_P2P: /* ping-pong between ranks 0 and 1: half the round trip */
            if (r == 0) {
                LOOM_TRY(loom_comm_send(c, a, bytes, 1, 7));
                LOOM_TRY(loom_comm_recv(c, b, bytes, 1, 8));
            } else if (r == 1) {
                LOOM_TRY(loom_comm_recv(c, b, bytes, 0, 7));
                LOOM_TRY(loom_comm_send(c, a, bytes, 0, 8));
            }
            break;
        default: break;
        }
        double dt = loom_comm_wtime() - t0;
        if (op == LOOM_COLL_P2P) dt /= 2;
        /* the group's time is its slowest member's */
        LOOM_TRY(loom_comm_allreduce(c, &dt, 1, LOOM_F64, LOOM_MAX));
        if (i >= 0) t[i] = dt;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    *out = t[reps / 2];
    return LOOM_OK;
}

static double copy_bandwidth(void) {
    const size_t n = 32u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int i = 0; i < 5; i++) {
        const double t0 = loom_comm_wtime();
        memcpy(b, a, n);
        const double dt = loom_comm_wtime() - t0;
        a[i] = b[n - 1 - i]; /* keep the copy */
        if (dt > 0 && 2.0 * n / dt > best) best = 2.0 * n / dt;
    }
    free(a);
    free(b);
    return best;
}

/* The sgemm rate each rank gets at shape (m x k) @ (k x n) while every rank
 * of world computes, as in training, in one window shared by all: rank 0
 * names [t0, t1] on the node's monotonic clock (loom_comm_wtime; one node,
 * so every rank reads the same clock), each rank sleeps until t0 and then
 * runs the product back to back until it passes t1 + GEMM_TAIL. So every
 * rank computes throughout the window, whatever its share of the cores,
 * and the work it completes inside the window is its calls that ended by
 * t1 plus the fraction of the one in progress at t1 (interpolated between
 * that call's start and end; the tail keeps the others computing while it
 * finishes). *out: the world's work in the window ÷ its length ÷ ranks.
 * Each rank timing its own calls from a barrier instead (and keeping its
 * best window) read 5-17 % more per core with 4 or 8 ranks on 2 cores than
 * the shared window does, and up to 12 % more than 1 or 2 ranks read
 * (docs/planning.md, "Measured here"): a rank that
 * left the barrier first, or was not descheduled in its window, counted
 * a core to itself. */
#define GEMM_WINDOW 0.2 /* seconds per shape and pass */
#define GEMM_TAIL 0.1   /* seconds every rank goes on computing after the window */
#define GEMM_PASSES 3   /* passes over all shapes; each shape keeps its best pass */
static loom_status gemm_rate_together(loom_comm *world, loom_device *dev, int m, int n, int k, double window,
                                      double *out) {
    const size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *buf = malloc((na + nb + nc) * sizeof *buf);
    if (!buf)
        return loom_fail(LOOM_EOS, "rank %d: out of memory for the sgemm calibration", loom_comm_rank(world));
    float *a = buf, *b = buf + na, *c = buf + na + nb;
    for (size_t i = 0; i < na; i++) a[i] = (float)(i % 17) * 0.0625f - 0.5f;
    for (size_t i = 0; i < nb; i++) b[i] = (float)(i % 13) * 0.0625f - 0.375f;
    loom_matmul_fwd(dev, c, a, b, NULL, m, k, n); /* warm-up: pages, threads */
    loom_status st = loom_comm_barrier(world);
    double t0 = loom_comm_wtime() + 0.1; /* time for every rank to hear it */
    if (st == LOOM_OK) st = loom_comm_bcast(world, &t0, sizeof t0, 0);
    const double t1 = t0 + window;
    double calls = 0, now;
    while ((now = loom_comm_wtime()) < t0) { /* again if a signal cut the sleep short */
        const double dt = t0 - now;
        struct timespec ts = {.tv_sec = (time_t)dt, .tv_nsec = (long)((dt - (double)(time_t)dt) * 1e9)};
        nanosleep(&ts, NULL);
    }
    for (; st == LOOM_OK && now < t1 + GEMM_TAIL;) {
        const double start = now;
        loom_matmul_fwd(dev, c, a, b, NULL, m, k, n);
        now = loom_comm_wtime();
        if (now <= t1) calls += 1;
        else if (start < t1) calls += (t1 - start) / (now - start);
    }
    free(buf);
    if (st == LOOM_OK) st = loom_comm_allreduce(world, &calls, 1, LOOM_F64, LOOM_SUM);
    *out = 2.0 * (double)m * n * k * calls / window / loom_comm_size(world);
    return st;
}

/* Processors the ranks may run on together: the union of every rank's
 * affinity mask (mpirun may bind each rank to one core when they fit, so
 * one rank's own mask is not the node's), as nproc counts them; the online
 * CPUs where the mask is unavailable. Collective over world. */
static loom_status cpus_usable(loom_comm *world, int *out) {
    enum { NCPU = 1024 };
    static unsigned char on[NCPU];
    memset(on, 0, sizeof on);
    cpu_set_t set;
    int any = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int i = 0; i < NCPU && i < CPU_SETSIZE; i++) any += on[i] = CPU_ISSET(i, &set) ? 1 : 0;
    if (!any) { /* no mask: the online CPUs */
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long i = 0; i < (n > 0 ? n : 1) && i < NCPU; i++) on[i] = 1;
    }
    LOOM_TRY(loom_comm_allreduce(world, on, NCPU, LOOM_U8, LOOM_MAX));
    int n = 0;
    for (int i = 0; i < NCPU; i++) n += on[i];
    *out = n > 0 ? n : 1;
    return LOOM_OK;
}

/* The scheduler's time slice, s: the kernel's base slice where debugfs
 * shows it (/sys/kernel/debug/sched/base_slice_ns, Linux >= 6.6, EEVDF;
 * root only), else EEVDF's default for this node's online CPUs (the
 * kernel scales its slice by all of them, whatever the ranks' affinity). */
static double sched_slice(void) {
    FILE *f = fopen("/sys/kernel/debug/sched/base_slice_ns", "r");
    double ns = 0;
    if (f) {
        if (fscanf(f, "%lf", &ns) != 1) ns = 0;
        fclose(f);
    }
    if (ns > 0 && isfinite(ns)) return ns * 1e-9;
    const long on = sysconf(_SC_NPROCESSORS_ONLN);
    return loom_plan_default_slice(on > 0 ? (double)on : 1);
}

static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static const char *KEYS[LOOM_COLL_COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                            "p2p"};

/* One small product through each GEMM path a training step takes (a
 * linear layer's forward, input and weight gradient), so that the GEMM
 * libraries loom loads at its first product - oneDNN's, on CPUs where it
 * takes the fp32 forward products, about 6 MB resident per rank - are part of
 * the resident bytes measured next, as they are part of a training rank's. */
static void gemm_libraries_loaded(loom_device *dev) {
    enum { S = 64 };
    static float x[S * S], w[S * S], y[S * S], dx[S * S], dw[S * S];
    loom_matmul_fwd(dev, y, x, w, NULL, S, S, S);
    loom_matmul_bwd(dev, dx, dw, NULL, y, x, w, S, S, S);
}

/* GEMM rate by size, every rank at once (gemm_rate_together): the skinny
 * shapes of small micro-batches up to square ones. The fastest is the
 * peak; each shape's efficiency is its share of it (the curve). */
static const int SHAPES[][3] = {
    {32, 512, 512}, {128, 512, 512}, {512, 512, 512}, {256, 1024, 1024}, {1024, 1024, 1024}};
enum { NSHAPE = sizeof SHAPES / sizeof SHAPES[0] };

/* Each shape's rate (shape_flops) and the fastest (*peak), every rank at
 * once. Passes over all shapes, each shape keeps its best pass (all ranks
 * together): one window of 0.4 s per shape let a passing disturbance halve
 * a shape's rate (a curve of 0.49-0.62 for the four smaller shapes in one
 * of five 2-rank calibrations, 0.77-0.99 in the others), and the planner
 * then predicted tp=2 63 % slow. Collective over world. */
static loom_status measure_gemm(loom_comm *world, loom_device *dev, double shape_flops[NSHAPE],
                                double *peak) {
    double gemm = 0;
    for (int pass = 0; pass < GEMM_PASSES; pass++)
        for (int i = 0; i < NSHAPE; i++) {
            double r = 0;
            LOOM_TRY(
                gemm_rate_together(world, dev, SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], GEMM_WINDOW, &r));
            shape_flops[i] = fmax(shape_flops[i], r);
        }
    for (int i = 0; i < NSHAPE; i++) gemm = fmax(gemm, shape_flops[i]);
    *peak = gemm;
    return LOOM_OK;
}

/* Measured collectives: per op, one point per group size. */
typedef struct coll_points {
    loom_plan_coll_point pts[LOOM_COLL_COUNT][LOOM_PLAN_MAX_POINTS];
    int npts[LOOM_COLL_COUNT];
} coll_points;

/* Every collective (p2p at g = 2 only) in groups of g consecutive ranks
 * (the ranks past the last whole group wait): its latency from a tiny
 * message, its bandwidth from a large one, the slowest group's. Collective
 * over world. */
static loom_status measure_group(loom_comm *world, int g, float *a, float *b, coll_points *cp, int verbose) {
    const int n = loom_comm_size(world), rank = loom_comm_rank(world);
    loom_comm *grp = NULL;
    const int color = rank / g < n / g ? rank / g : -1;
    loom_status st = loom_comm_split(world, color, rank, "calibrate", &grp);
    for (int op = 0; op < LOOM_COLL_COUNT && st == LOOM_OK; op++) {
        if (op == LOOM_COLL_P2P && g != 2) continue;
        double ts = 0, tl = 0;
        if (grp) {
            /* sizes rounded to the group (the per-rank piece a multiple of 4 bytes) */
            const size_t small = (size_t)g * 4 * ((SMALL + 4 * g - 1) / (4 * g));
            const size_t large = (size_t)g * 4 * (LARGE / (4 * g));
            st = time_op(grp, (loom_coll_op)op, small, 31, a, b, &ts);
            if (st == LOOM_OK) st = time_op(grp, (loom_coll_op)op, large, 7, a, b, &tl);
        }
        double v[2] = {ts, tl};
        if (st == LOOM_OK) st = loom_comm_allreduce(world, v, 2, LOOM_F64, LOOM_MAX);
        if (st == LOOM_OK && cp->npts[op] < LOOM_PLAN_MAX_POINTS) {
            loom_plan_coll_point *p = &cp->pts[op][cp->npts[op]++];
            p->group = g;
            p->latency = v[0];
            p->bandwidth = LARGE / fmax(v[1] - v[0], 1e-9);
            if (verbose && rank == 0)
                printf("  %-14s group %2d: latency %8.1f us, bandwidth %8.2f GB/s\n", KEYS[op], g, 1e6 * v[0],
                       p->bandwidth / 1e9);
        }
    }
    loom_comm_free(grp);
    return st;
}

/* measure_group at group sizes 2, 4, .. and the world. Collective over
 * world. */
static loom_status measure_collectives(loom_comm *world, coll_points *cp, int verbose) {
    const int n = loom_comm_size(world), rank = loom_comm_rank(world);
    float *a = calloc(LARGE / 4 + 16, sizeof(float)), *b = calloc(LARGE / 4 + 16, sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return loom_fail(LOOM_EOS, "rank %d: out of memory for calibration buffers", rank);
    }
    loom_status st = LOOM_OK;
    for (int g = 2; g <= n && st == LOOM_OK; g = g * 2 > n && g != n ? n : g * 2) {
        st = measure_group(world, g, a, b, cp, verbose);
        if (g == n) break;
    }
    free(a);
    free(b);
    return st;
}

/* Rank 0: the cluster file (path.tmp, renamed into place). */
static loom_status write_cluster(const char *path, int n, int cpus, int threads, double bw, double rss,
                                 double gemm, const double *shape_flops, const coll_points *cp,
                                 const plan_links *lk) {
    const double mem = (double)mem_available() / n;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return loom_fail(LOOM_ECANTCREAT, "rank 0: cannot create %s", tmp);
    char host[128] = "this machine";
    gethostname(host, sizeof host - 1);
    const loom_plan_coll_point *p2p = cp->npts[LOOM_COLL_P2P] ? &cp->pts[LOOM_COLL_P2P][0] : NULL;
    const double p2p_lat = p2p ? p2p->latency : 1e-6;
    const double p2p_bw = p2p ? p2p->bandwidth : bw;
    /* across hosts (lk->hosts > 1): a node is a host, its links measured
     * (plan_calibrate_links.c); hosts on one machine share its processors */
    const int hosts = lk->hosts > 1 ? lk->hosts : 1, shared = lk->hosts > 1 ? lk->shared : 1;
    fprintf(f, "{\n  \"name\": \"%s: %d ranks on %d host(s) (measured by loom calibrate)\",\n", host, n,
            hosts);
    fprintf(f, "  \"gpus_per_node\": %d,\n  \"nodes\": %d,\n", n / hosts, hosts);
    /* the processors the ranks time-share, in units of one rank's threads
     * (the rates below are each rank's with all n computing) */
    fprintf(f, "  \"cores_per_node\": %.6g,\n", (double)cpus / threads / shared);
    /* the time slice a rank woken from a synchronisation waits for a processor in */
    fprintf(f, "  \"sched_slice_us\": %.6g,\n", 1e6 * sched_slice());
    fprintf(f, "  \"memory_gb\": %.4f,\n  \"reserved_gb\": %.4f,\n", mem / 1e9, rss / 1e9);
    fprintf(f, "  \"peak_tflops\": {\"fp32\": %.6g, \"bf16\": %.6g},\n", gemm / 1e12, gemm / 1e12);
    fprintf(f, "  \"hbm_gbps\": %.4g,\n", bw / 1e9);
    const int two = hosts > 1 && lk->per_host >= 2;
    fprintf(f, "  \"intra_node\": {\"bandwidth_gbps\": %.4g, \"latency_us\": %.4g},\n",
            (two ? lk->intra_bw : p2p_bw) / 1e9, 1e6 * (two ? lk->intra_lat : p2p_lat));
    fprintf(f, "  \"inter_node\": {\"bandwidth_gbps\": %.4g, \"latency_us\": %.4g},\n",
            (hosts > 1 ? lk->inter_bw : p2p_bw) / 1e9, 1e6 * (hosts > 1 ? lk->inter_lat : p2p_lat));
    fprintf(f, "  \"efficiency\": {\"gemm\": 1, \"collective\": 1, \"overlap\": 0},\n");
    fprintf(f, "  \"gemm_curve\": [");
    for (int i = 0; i < NSHAPE; i++) {
        const double ef = fmin(1.0, shape_flops[i] / gemm);
        fprintf(f, "%s\n    {\"m\": %d, \"n\": %d, \"k\": %d, \"eff\": %.4f}", i ? "," : "", SHAPES[i][0],
                SHAPES[i][1], SHAPES[i][2], ef > 1e-4 ? ef : 1e-4);
    }
    fprintf(f, "\n  ],\n");
    fprintf(f, "  \"collectives\": {");
    int first = 1;
    for (int op = 0; op < LOOM_COLL_COUNT; op++) {
        if (!cp->npts[op]) continue;
        fprintf(f, "%s\n    \"%s\": [", first ? "" : ",", KEYS[op]);
        first = 0;
        for (int i = 0; i < cp->npts[op]; i++)
            fprintf(f, "%s{\"group\": %d, \"latency_us\": %.6g, \"bandwidth_gbps\": %.6g}", i ? ", " : "",
                    cp->pts[op][i].group, 1e6 * cp->pts[op][i].latency, cp->pts[op][i].bandwidth / 1e9);
        fprintf(f, "]");
    }
    fprintf(f, "\n  }\n}\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return loom_fail(LOOM_EIO, "rank 0: cannot write %s", path);
    }
    return LOOM_OK;
}

loom_status loom_plan_calibrate(loom_comm *world, loom_device *dev, const char *path, int verbose) {
    const int n = loom_comm_size(world), rank = loom_comm_rank(world);
    gemm_libraries_loaded(dev);
    const size_t base_rss = loom_sysmem_peak_rss();
    /* compute and memory bandwidth: every rank at once, as in training */
    double shape_flops[NSHAPE] = {0}, gemm = 0;
    LOOM_TRY(measure_gemm(world, dev, shape_flops, &gemm));
    int cpus = 1;
    LOOM_TRY(cpus_usable(world, &cpus));
    LOOM_TRY(loom_comm_barrier(world));
    double bw = copy_bandwidth();
    double sum[2] = {bw, (double)base_rss};
    LOOM_TRY(loom_comm_allreduce(world, sum, 2, LOOM_F64, LOOM_SUM));
    bw = sum[0] / n;
    const double rss = sum[1] / n;
    coll_points cp = {.npts = {0}};
    plan_links lk;
    LOOM_TRY(loom_plan_calibrate_links(world, &lk, verbose));
    /* one host: each collective by group size. Across hosts none: the
     * planner takes a measured group size for every group of that size,
     * inside a host or across, so the links above price them instead */
    if (lk.hosts <= 1) LOOM_TRY(measure_collectives(world, &cp, verbose));
    if (rank != 0) return LOOM_OK;
    LOOM_TRY(write_cluster(path, n, cpus, dev->threads, bw, rss, gemm, shape_flops, &cp, &lk));
    if (verbose)
        printf(
            "sgemm %.2f GFLOP/s per rank (the fastest of 5 shapes, all %d at once for %.1f s each, on %d cores), copy %.2f GB/s, "
            "%.1f MB resident per rank at start\nwrote %s\n",
            gemm / 1e9, n, GEMM_WINDOW, cpus, bw / 1e9, rss / 1e6, path);
    return LOOM_OK;
}
