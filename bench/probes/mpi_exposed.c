/* mpi_exposed.c - an instrument outside loom for bench/bench_ep_overlap.py:
 * a PMPI shim (LD_PRELOAD) that times, on the thread that initialised MPI
 * (loom's compute thread; the communicator's watch thread is not counted),
 * the wall time spent inside MPI calls - the expert all-to-all's exposed
 * time. Everything a waiting or polling compute thread does happens inside
 * one of them: MPI_Alltoall (the row counts), MPI_Alltoallv (the blocking
 * rows), MPI_Ialltoallv (a started one) and MPI_Wait / MPI_Test on a request
 * an MPI_Ialltoallv returned. Every other MPI call of the compute thread
 * counts as "other". At MPI_Finalize each rank writes one JSON line to
 * $MPI_EXPOSED_OUT.<world rank>: a2a_s, a2a_calls, other_s, other_calls and
 * a2a_call_s, the seconds of every exchange call in order.
 * Not part of loom; built by the bench with mpicc -shared -fPIC.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_t g_main;
static int g_have_main;
static double g_a2a_s, g_other_s;
static long g_a2a_calls, g_other_calls;
static double *g_dur; /* every exchange call's seconds, in order (the bench skips the warm-up's) */
static long g_cap;
#define MAX_REQ 256
static MPI_Request g_req[MAX_REQ]; /* requests of MPI_Ialltoallv still in flight */
static int g_nreq;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int on_main(void) { return g_have_main && pthread_equal(pthread_self(), g_main); }

static void add(int a2a, double t0) {
    if (!on_main()) return;
    double dt = now() - t0;
    if (!a2a) {
        g_other_s += dt, g_other_calls++;
        return;
    }
    if (g_a2a_calls == g_cap) {
        double *d = realloc(g_dur, (size_t)(g_cap ? 2 * g_cap : 1024) * sizeof *d);
        if (!d) return;
        g_dur = d, g_cap = g_cap ? 2 * g_cap : 1024;
    }
    g_dur[g_a2a_calls++] = dt;
    g_a2a_s += dt;
}

static int req_find(MPI_Request r) {
    for (int i = 0; i < g_nreq; i++)
        if (g_req[i] == r) return i;
    return -1;
}

static void req_drop(int i) {
    if (i >= 0) g_req[i] = g_req[--g_nreq];
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    g_main = pthread_self();
    g_have_main = 1;
    return PMPI_Init_thread(argc, argv, required, provided);
}

int MPI_Init(int *argc, char ***argv) {
    g_main = pthread_self();
    g_have_main = 1;
    return PMPI_Init(argc, argv);
}

int MPI_Alltoall(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, MPI_Comm c) {
    double t0 = now();
    int e = PMPI_Alltoall(sb, sc, st, rb, rc, rt, c);
    add(1, t0);
    return e;
}

int MPI_Alltoallv(const void *sb, const int *sc, const int *sd, MPI_Datatype st, void *rb, const int *rc,
                  const int *rd, MPI_Datatype rt, MPI_Comm c) {
    double t0 = now();
    int e = PMPI_Alltoallv(sb, sc, sd, st, rb, rc, rd, rt, c);
    add(1, t0);
    return e;
}

int MPI_Ialltoallv(const void *sb, const int *sc, const int *sd, MPI_Datatype st, void *rb, const int *rc,
                   const int *rd, MPI_Datatype rt, MPI_Comm c, MPI_Request *r) {
    double t0 = now();
    int e = PMPI_Ialltoallv(sb, sc, sd, st, rb, rc, rd, rt, c, r);
    if (e == MPI_SUCCESS && g_nreq < MAX_REQ && on_main()) g_req[g_nreq++] = *r;
    add(1, t0);
    return e;
}

int MPI_Wait(MPI_Request *r, MPI_Status *s) {
    int i = on_main() ? req_find(*r) : -1;
    double t0 = now();
    int e = PMPI_Wait(r, s);
    add(i >= 0, t0);
    req_drop(i);
    return e;
}

int MPI_Test(MPI_Request *r, int *flag, MPI_Status *s) {
    int i = on_main() ? req_find(*r) : -1;
    double t0 = now();
    int e = PMPI_Test(r, flag, s);
    add(i >= 0, t0);
    if (*flag || e != MPI_SUCCESS) req_drop(i);
    return e;
}

/* the compute thread's other blocking calls (the dp gradient reductions,
 * the trainer's statistics) */
int MPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    double t0 = now();
    int e = PMPI_Allreduce(sb, rb, n, t, op, c);
    add(0, t0);
    return e;
}

int MPI_Barrier(MPI_Comm c) {
    double t0 = now();
    int e = PMPI_Barrier(c);
    add(0, t0);
    return e;
}

int MPI_Finalize(void) {
    const char *out = getenv("MPI_EXPOSED_OUT");
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (out && out[0]) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", out, rank);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(
                f,
                "{\"rank\": %d, \"a2a_s\": %.9f, \"a2a_calls\": %ld, \"other_s\": %.9f, \"other_calls\": %ld, \"a2a_call_s\": [",
                rank, g_a2a_s, g_a2a_calls, g_other_s, g_other_calls);
            for (long i = 0; i < g_a2a_calls; i++) fprintf(f, "%s%.9f", i ? ", " : "", g_dur[i]);
            fprintf(f, "]}\n");
            fclose(f);
        }
    }
    return PMPI_Finalize();
}
