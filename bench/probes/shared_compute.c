/* shared_compute.c - does a model's forward+backward run slower per core
 * when more processes than cores share them?
 *
 * K processes (fork, no MPI) each build the same model part, warm up, then
 * all start together at one instant and run forward+backward back to back
 * for WINDOW seconds. Every process keeps going until all have passed the
 * window's end, so the load stays K processes throughout the window. The
 * work done inside the window is counted with fractions: a process's
 * progress at time t is the iterations completed before t plus the
 * fraction of the one in progress, interpolated between its two
 * timestamps. Instruments, none of them loom's: CLOCK_MONOTONIC per
 * iteration, each process's CPU time (CLOCK_PROCESS_CPUTIME_ID, interpolated
 * the same way), its context switches (/proc/self/status), and the
 * machine's idle and steal time (/proc/stat) over the window.
 *
 * Prints one line: iterations per second per busy core (the sum over the K
 * processes ÷ min(K, cores)), iterations per CPU-second, and the rest.
 * Comparing K = 4 or 8 against K = 2 (both cores busy in each) isolates
 * what sharing a core costs: switches, refilling caches and TLB, more
 * working sets in the shared L3.
 *
 * Not part of the build:
 *   cc -O2 -std=c11 -Iinclude bench/probes/shared_compute.c -o /tmp/shared_compute \
 *      build/libloom.a $(sed 's/.*libloom.a//' build/CMakeFiles/loom.dir/link.txt)
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /tmp/shared_compute mini 4 128 4 5
 *   (MODEL B T K WINDOW_S [N_EMBD]; N_EMBD overrides the width, heads = N_EMBD/64)
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/model.h"
#include "loom/rng.h"

enum { MAX_K = 64, MAX_IT = 8192 };

typedef struct {
    double progress, cpu_s; /* inside the window */
    long nvcsw, nivcsw;     /* voluntary / involuntary switches, whole run */
    int iters;              /* timestamps recorded */
} proc_result;

typedef struct {
    atomic_int ready, go, crossed;
    double t0, t1; /* the window, CLOCK_MONOTONIC seconds */
    proc_result r[MAX_K];
} shared;

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

static void ctx_switches(long *vol, long *invol) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    *vol = *invol = 0;
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "voluntary_ctxt_switches: %ld", vol);
        sscanf(line, "nonvoluntary_ctxt_switches: %ld", invol);
    }
    fclose(f);
}

/* The machine's idle and steal jiffies (all CPUs) from /proc/stat. */
static void cpu_stat(long long *idle, long long *steal, long long *total) {
    long long v[10] = {0};
    FILE *f = fopen("/proc/stat", "r");
    *idle = *steal = *total = 0;
    if (!f) return;
    if (fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
        for (int i = 0; i < 8; i++) *total += v[i];
        *idle = v[3] + v[4];
        *steal = v[7];
    }
    fclose(f);
}

/* Value of the piecewise-linear curve (ts[i], ys[i]) at t; ts rising. */
static double at(const double *ts, const double *ys, int n, double t) {
    if (t <= ts[0]) return ys[0];
    for (int i = 1; i < n; i++)
        if (t <= ts[i]) return ys[i - 1] + (ys[i] - ys[i - 1]) * (t - ts[i - 1]) / (ts[i] - ts[i - 1]);
    return ys[n - 1];
}

/* One unit of work: the model's forward+backward, or (gemm_n > 0) one
 * sgemm of B x gemm_n x gemm_n, the shape `loom calibrate` times. */
typedef struct {
    loom_device *dev; /* the CPU, one thread */
    loom_gpt *m;
    int32_t *in, *tg;
    float dloss, *a, *b, *c;
    int B, gemm_n;
} work;

static void step(const work *w) {
    double loss = 0;
    if (w->gemm_n) {
        loom_matmul_fwd(w->dev, w->c, w->a, w->b, NULL, w->B, w->gemm_n, w->gemm_n);
        return;
    }
    loom_gpt_zero_grad(w->m);
    loom_gpt_forward(w->m, 0, w->in, w->tg, &loss);
    loom_gpt_backward(w->m, 0, NULL, w->dloss);
}

static int worker(shared *s, int id, int k, const loom_model_config *cfg, int B, int T, int gemm_n) {
    work w = {.B = B, .gemm_n = gemm_n, .dloss = 1.0f / (float)(B * T)};
    if (gemm_n) {
        w.a = calloc((size_t)B * gemm_n, sizeof(float));
        w.b = calloc((size_t)gemm_n * gemm_n, sizeof(float));
        w.c = calloc((size_t)B * gemm_n, sizeof(float));
    }
    const loom_device_opts dopts = {.name = "cpu", .threads = 1};
    if (loom_device_create(&dopts, &w.dev) != LOOM_OK) return 1;
    loom_model_part part = loom_model_part_whole(w.dev, cfg);
    loom_gpt_opts opts = {.B = B, .T = T, .n_slots = 1};
    loom_gpt *m;
    if (!gemm_n && loom_gpt_create(cfg, &part, &opts, &m) != LOOM_OK) return 1;
    if (gemm_n) m = NULL;
    else loom_gpt_init_params(m, 1);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    loom_rng_key key = loom_rng_key_make(7 + (uint64_t)id, "tokens");
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(loom_rng_u64(key, 2 * (uint64_t)i) % (uint64_t)cfg->vocab_size);
        tg[i] = (int32_t)(loom_rng_u64(key, 2 * (uint64_t)i + 1) % (uint64_t)cfg->vocab_size);
    }
    w.m = m, w.in = in, w.tg = tg;
    static double ts[MAX_IT], cpu[MAX_IT], count[MAX_IT];
    for (int i = 0; i < 2; i++) step(&w); /* warm-up: pages touched, kernels chosen */
    atomic_fetch_add(&s->ready, 1);
    while (!atomic_load(&s->go)) usleep(1000);
    sleep_until(s->t0);
    long v0, i0;
    ctx_switches(&v0, &i0);
    int n = 0, crossed = 0;
    ts[n] = now(CLOCK_MONOTONIC), cpu[n] = now(CLOCK_PROCESS_CPUTIME_ID), count[n] = 0, n++;
    while (n < MAX_IT) {
        step(&w);
        ts[n] = now(CLOCK_MONOTONIC), cpu[n] = now(CLOCK_PROCESS_CPUTIME_ID), count[n] = n, n++;
        if (!crossed && ts[n - 1] >= s->t1) {
            crossed = 1;
            atomic_fetch_add(&s->crossed, 1);
        }
        if (crossed && atomic_load(&s->crossed) == k) break;
    }
    proc_result *r = &s->r[id];
    r->progress = at(ts, count, n, s->t1) - at(ts, count, n, s->t0);
    r->cpu_s = at(ts, cpu, n, s->t1) - at(ts, cpu, n, s->t0);
    r->iters = n;
    long v1, i1;
    ctx_switches(&v1, &i1);
    r->nvcsw = v1 - v0, r->nivcsw = i1 - i0;
    if (m) loom_gpt_free(m);
    loom_device_free(w.dev);
    free(w.a), free(w.b), free(w.c);
    free(in);
    free(tg);
    return crossed ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: shared_compute MODEL B T K WINDOW_S [N_EMBD]\n");
        return 64;
    }
    loom_model_config cfg;
    const int gemm = strcmp(argv[1], "sgemm") == 0;
    if (loom_model_config_builtin(gemm ? "tiny" : argv[1], &cfg) != LOOM_OK) return 64;
    const int B = atoi(argv[2]), T = atoi(argv[3]), k = atoi(argv[4]);
    const double window = atof(argv[5]);
    const int gemm_n = gemm ? T : 0;
    if (argc > 6 && !gemm) cfg.n_embd = atoi(argv[6]), cfg.n_head = cfg.n_embd / 64;
    if (k < 1 || k > MAX_K || window <= 0 || loom_model_config_check(&cfg) != LOOM_OK) return 64;
    shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) return 1;
    memset(s, 0, sizeof *s);
    for (int id = 0; id < k; id++)
        if (fork() == 0) _exit(worker(s, id, k, &cfg, B, gemm ? 128 : T, gemm_n));
    while (atomic_load(&s->ready) < k) usleep(1000);
    s->t0 = now(CLOCK_MONOTONIC) + 0.1;
    s->t1 = s->t0 + window;
    atomic_store(&s->go, 1);
    long long idle0, steal0, tot0, idle1, steal1, tot1;
    sleep_until(s->t0);
    cpu_stat(&idle0, &steal0, &tot0);
    sleep_until(s->t1);
    cpu_stat(&idle1, &steal1, &tot1);
    int bad = 0;
    for (int id = 0; id < k; id++) {
        int st;
        wait(&st);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double prog = 0, cpu_s = 0, lo = 1e30, hi = 0;
    long nv = 0, ni = 0;
    for (int id = 0; id < k; id++) {
        const proc_result *r = &s->r[id];
        prog += r->progress, cpu_s += r->cpu_s, nv += r->nvcsw, ni += r->nivcsw;
        lo = r->progress < lo ? r->progress : lo;
        hi = r->progress > hi ? r->progress : hi;
    }
    const double busy = k < cores ? k : cores;
    const double jif = (double)(tot1 - tot0);
    printf(
        "%s C=%d B=%d T=%d K=%d window %.1f s: %.3f it/s per busy core, %.3f it/CPU-s, CPU %.2f of %.0f cores,"
        " per-process %.2f-%.2f it, switches %.0f vol %.0f invol per process-s, idle %.1f %%, steal %.1f %%%s\n",
        argv[1], cfg.n_embd, B, T, k, window, prog / window / busy, prog / cpu_s, cpu_s / window, busy, lo,
        hi, nv / (k * window), ni / (k * window), jif > 0 ? 100 * (idle1 - idle0) / jif : 0,
        jif > 0 ? 100 * (steal1 - steal0) / jif : 0, bad ? " (A WORKER FAILED)" : "");
    return bad;
}
