/* comm_mpi.c - the communicator over MPI (the only file in loom that includes
 * mpi.h). Not tied to a mesh axis: every group, the world included, is a
 * loom_comm wrapping its own MPI communicator.
 *
 * Collective over the group: loom_comm_init / loom_comm_finalize (over the
 * world), loom_comm_split, loom_comm_free and every blocking or non-blocking
 * collective. Not collective: send / recv and their non-blocking forms, wait,
 * test, the accessors and the statistics.
 *
 * Each call is described once as an mpi_call (op, buffers, MPI counts) and
 * then either run blocking, or started as a request. Statistics follow the
 * byte convention of comm.h: a blocking call counts its calls, bytes and
 * seconds when it returns successfully; a non-blocking call counts calls and
 * bytes when it starts and its seconds (start to completion) in wait / test.
 *
 * Failures: every communicator has MPI_ERRORS_RETURN, and an MPI error comes
 * back as LOOM_EUNAVAIL with "rank R: <op> on group <g> failed: <MPI's
 * string>" (R is the world rank). A size that does not fit MPI's int counts is
 * refused before any communication; that check is local to the rank, like any
 * argument check in MPI, so callers must pass consistent sizes on all ranks.
 *
 * Progress and the watchdog: one helper thread per process ("the watch").
 * Every call in flight - a blocking call while it runs, a non-blocking one
 * from start to completion - is a node on one list, stamped with its op,
 * group, start time and sequence number (the group's call count). The watch
 * sleeps on a condition variable while the list is empty (no core spun).
 * While a non-blocking request is in flight it calls MPI_Iprobe on a private
 * duplicate of the world every 20 us, backing off to 1 ms: that drives MPI's
 * progress engine (Open MPI 4.1 has no progress thread of its own, so
 * libnbc collectives and rendezvous sends otherwise move only inside MPI
 * calls of the compute thread). It also makes the starts of non-blocking
 * collectives: Open MPI's start of a large one does real work in the calling
 * thread (a temporary buffer of the message's size, allocated and filled:
 * 150-230 ms for GPT-2's 154 MB wte gradient here), so a start is queued
 * (FIFO) and the watch makes it; the caller's test reports "not done" and
 * its wait blocks until then. Collectives on one group must run in the same
 * order on every rank, so before the caller makes any collective call on a
 * group itself (blocking, a start it keeps, a split or a free) it waits until
 * the watch has made that group's queued starts. Point-to-point starts and
 * alltoallv's (whose count arrays live in a reused scratch) stay with the
 * caller, as do blocking calls (no hand-off latency on the TP path's many
 * small collectives). The two threads share the list and the queue (one
 * mutex) and MPI itself, which needs MPI_THREAD_MULTIPLE; the watch can be
 * absent without changing any caller. If MPI provides less than MPI_THREAD_MULTIPLE (or
 * LOOM_COMM_PROGRESS=0), a warning says so and the watch only times calls:
 * non-blocking work then moves inside loom_comm calls, as before.
 * The watchdog is on by default (LOOM_COMM_TIMEOUT, default 600 s; 0 turns
 * it off): a call in flight longer than that prints "rank R: <op> on group
 * <g> (call #N on that group) has not completed after S s" and aborts the
 * job. Its cost is a mutex and a list insert per call.
 *
 * Honest overlap: besides each op's start-to-completion seconds, the stats
 * count call_seconds, the wall time the calling thread spent inside loom_comm
 * calls for that op (blocking calls, starts, tests, waits).
 */
#include "loom/comm.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "loom/bf16.h"
#include "loom/log.h"

struct loom_comm {
    MPI_Comm mpi;
    int rank, size;
    char name[64];
    loom_comm_stats stats;
    int *counts;            /* (4, size) scratch for alltoallv's int arrays */
    struct loom_req *spare; /* released requests, reused by the next start */
    uint64_t seq;           /* calls started on this group (the watchdog's #N) */
    int queued;             /* its starts the watch has not made yet (g_mu) */
};

/* Everything MPI needs for one call of any op, blocking or non-blocking. */
typedef struct mpi_call {
    loom_comm_op op;
    const void *send; /* may be MPI_IN_PLACE */
    void *recv;
    int count;        /* elements (typed ops) or bytes; per rank for gather/scatter */
    MPI_Datatype type;
    MPI_Op redop;
    int peer, tag;    /* peer is the root for bcast */
    const int *send_counts, *send_displs, *recv_counts, *recv_displs; /* alltoallv */
} mpi_call;

/* One call in flight, on the watch's list (guarded by g_mu). */
typedef struct inflight {
    loom_comm_op op;
    const char *group;
    uint64_t seq;
    double t0;
    int nonblocking;
    struct inflight *prev, *next;
} inflight;

struct loom_req {
    MPI_Request mpi;
    loom_comm *c;
    loom_comm_op op;
    double t0; /* when the call started */
    size_t bytes;
    inflight node; /* on the watch's list while in flight */
    struct loom_req *next;
    /* A start handed to the watch (g_mu): the call, and its outcome once made */
    mpi_call k;
    int pending, start_err;
    struct loom_req *qnext;
};

/* Process-wide state of the runtime, not of any group. */
static int g_world_rank = -1;   /* rank in MPI_COMM_WORLD, for messages */
static int g_started_mpi;       /* we called MPI_Init_thread, so we finalize */
static int g_live_worlds;       /* loom_comm_init calls not yet finalized */
static MPI_Op g_bf16_sum = MPI_OP_NULL; /* LOOM_BF16 sums (bf16_sum_op), made by loom_comm_init */
static double g_timeout_s;      /* LOOM_COMM_TIMEOUT, 0 = no watchdog */

#define LOOM_COMM_TIMEOUT_DEFAULT 600.0
#define WATCH_PROBE_MIN_NS 20000L    /* first probe period while requests fly */
#define WATCH_PROBE_MAX_NS 1000000L  /* backed off to this */
/* ... or only to this while a point-to-point request flies and Open MPI's
 * shared-memory transport has no single-copy mechanism: a large message then
 * crosses in fragments, each needing both sides to progress, so a 1 ms
 * back-off would cost a millisecond per fragment. With one (cma, as
 * scripts/loomrun sets where the machine allows it; xpmem, knem) the
 * receiver copies the whole message at once and the usual back-off is kept:
 * a probe every 50 us for as long as a pipeline has a message in flight
 * (nearly always) took the core from the compute thread when the ranks have
 * one core each - a pp=2 1f1b step ran 18 % slower than without the watch. */
#define WATCH_PROBE_P2P_NS 50000L

/* The watch thread and its list (see the file header). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static pthread_t g_watch;
static int g_watch_on;          /* thread running */
static int g_watch_stop;
static int g_progress;          /* watch may call MPI (MPI_THREAD_MULTIPLE) */
static MPI_Comm g_probe_comm = MPI_COMM_NULL;
static inflight *g_head;
static int g_nonblocking;       /* non-blocking nodes on the list */
static int g_p2p;               /* of which sends and receives */
static pthread_cond_t g_started_cv = PTHREAD_COND_INITIALIZER; /* a queued start was made */
static struct loom_req *g_q_head, *g_q_tail; /* starts queued for the watch, oldest first */
static long g_probe_ns = WATCH_PROBE_MIN_NS;
static int g_single_copy;       /* the launcher named a single-copy mechanism */
static int g_stall_starts;      /* LOOM_COMM_FAULT=stall-start (tests only) */

double loom_comm_wtime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- failures and the watchdog ---------------------------------------- */

static loom_status fail_mpi(const loom_comm *c, const char *op, int err) {
    char text[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) strcpy(text, "unknown MPI error");
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s failed: %s", g_world_rank, op,
                     c->name, text);
}

/* A size_t count as MPI's int, or a message naming the value; `index` >= 0
 * names the entry of a per-rank array. */
static loom_status to_int(const loom_comm *c, loom_comm_op op, const char *what, int index,
                          size_t n, int *out) {
    if (n > (size_t)INT_MAX) {
        char name[48];
        if (index >= 0) snprintf(name, sizeof name, "%s[%d]", what, index);
        else snprintf(name, sizeof name, "%s", what);
        return loom_fail(LOOM_EUNAVAIL,
                         "rank %d: %s on group %s: %s=%zu does not fit MPI's int count (max %d)",
                         g_world_rank, loom_comm_op_name(op), c->name, name, n, INT_MAX);
    }
    *out = (int)n;
    return LOOM_OK;
}

/* Called by the watch with g_mu held; does not return. */
static void watchdog_fire(const inflight *n, double now) {
    fprintf(stderr,
            "loom: error: rank %d: %s on group %s (call #%llu on that group) has not completed "
            "after %.0f s (LOOM_COMM_TIMEOUT=%g); aborting the job\n",
            g_world_rank, loom_comm_op_name(n->op), n->group, (unsigned long long)n->seq,
            now - n->t0, g_timeout_s);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, LOOM_EUNAVAIL);
    _Exit(LOOM_EUNAVAIL);
}

/* Fire if any call in flight is older than LOOM_COMM_TIMEOUT (g_mu held). */
static void watchdog_check(void) {
    if (g_timeout_s <= 0) return;
    double now = loom_comm_wtime();
    for (inflight *n = g_head; n; n = n->next)
        if (now - n->t0 > g_timeout_s) watchdog_fire(n, now);
}

static void watch_add(inflight *n, loom_comm *c, loom_comm_op op, int nonblocking) {
    *n = (inflight){.op = op, .group = c->name, .seq = ++c->seq, .t0 = loom_comm_wtime(),
                    .nonblocking = nonblocking};
    if (!g_watch_on) return;
    pthread_mutex_lock(&g_mu);
    n->next = g_head;
    if (g_head) g_head->prev = n;
    g_head = n;
    if (nonblocking) {
        g_probe_ns = WATCH_PROBE_MIN_NS;
        g_p2p += op == LOOM_OP_SEND || op == LOOM_OP_RECV;
        if (g_nonblocking++ == 0 && g_progress) pthread_cond_signal(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
}

static void watch_remove(inflight *n) {
    if (!g_watch_on) return;
    pthread_mutex_lock(&g_mu);
    if (n->prev) n->prev->next = n->next;
    else g_head = n->next;
    if (n->next) n->next->prev = n->prev;
    n->prev = n->next = NULL;
    if (n->nonblocking) {
        g_nonblocking--;
        g_p2p -= n->op == LOOM_OP_SEND || n->op == LOOM_OP_RECV;
    }
    pthread_mutex_unlock(&g_mu);
}

static void abs_after(struct timespec *ts, long ns) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ns;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* The watch: idle (a timed wait, a wake-up a second at most) while no
 * non-blocking request flies; probing with back-off while one does; checking
 * every node's age against LOOM_COMM_TIMEOUT at each wake-up. */
static int start_mpi(const mpi_call *k, MPI_Comm comm, MPI_Request *r);

/* Make the queued starts, oldest first (g_mu held; released around MPI). */
static void watch_start_queued(void) {
    while (g_q_head) {
        loom_req *r = g_q_head;
        g_q_head = r->qnext;
        if (!g_q_head) g_q_tail = NULL;
        pthread_mutex_unlock(&g_mu);
        if (g_stall_starts) /* test hook: a start that never returns */
            for (;;) pause();
        MPI_Request mr = MPI_REQUEST_NULL;
        int err = start_mpi(&r->k, r->c->mpi, &mr);
        pthread_mutex_lock(&g_mu);
        r->mpi = mr;
        r->start_err = err;
        r->pending = 0;
        r->c->queued--;
        pthread_cond_broadcast(&g_started_cv);
    }
}

static void *watch_main(void *arg) {
    (void)arg;
    double idle_s = g_timeout_s > 0 && g_timeout_s < 10 ? g_timeout_s / 10 : 1.0;
    pthread_mutex_lock(&g_mu);
    while (!g_watch_stop) {
        watch_start_queued();
        watchdog_check();
        struct timespec ts;
        if (g_progress && g_nonblocking > 0) {
            long ns = g_probe_ns;
            long cap = g_p2p > 0 && !g_single_copy ? WATCH_PROBE_P2P_NS : WATCH_PROBE_MAX_NS;
            g_probe_ns = ns * 2 > cap ? cap : ns * 2;
            pthread_mutex_unlock(&g_mu);
            int flag = 0;
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g_probe_comm, &flag, MPI_STATUS_IGNORE);
            pthread_mutex_lock(&g_mu);
            abs_after(&ts, ns); /* a queued start wakes it early */
            if (!g_q_head && !g_watch_stop) pthread_cond_timedwait(&g_cv, &g_mu, &ts);
        } else {
            abs_after(&ts, (long)(idle_s * 1e9));
            if (!g_q_head && !g_watch_stop) pthread_cond_timedwait(&g_cv, &g_mu, &ts);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void watch_start(int thread_level) {
    const char *p = getenv("LOOM_COMM_PROGRESS");
    int want = !(p && strcmp(p, "0") == 0);
    g_progress = 0;
    const char *sc = getenv("OMPI_MCA_btl_vader_single_copy_mechanism");
    g_single_copy = sc && (!strcmp(sc, "cma") || !strcmp(sc, "xpmem") || !strcmp(sc, "knem"));
    if (want && thread_level < MPI_THREAD_MULTIPLE)
        loom_warn("MPI provides thread level %d, not MPI_THREAD_MULTIPLE: no progress thread, "
                  "non-blocking communication moves only inside loom_comm calls",
                  thread_level);
    if (want && thread_level >= MPI_THREAD_MULTIPLE &&
        MPI_Comm_dup(MPI_COMM_WORLD, &g_probe_comm) == MPI_SUCCESS)
        g_progress = 1;
    if (!g_progress && g_timeout_s <= 0) return; /* nothing for a thread to do */
    g_watch_stop = 0;
    if (pthread_create(&g_watch, NULL, watch_main, NULL) != 0) {
        loom_warn("could not start the communicator's watch thread: no progress thread, "
                  "no hang watchdog");
        if (g_probe_comm != MPI_COMM_NULL) MPI_Comm_free(&g_probe_comm);
        g_progress = 0;
        return;
    }
    g_watch_on = 1;
}

static void watch_stop(void) {
    if (!g_watch_on) return;
    pthread_mutex_lock(&g_mu);
    g_watch_stop = 1;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(g_watch, NULL);
    g_watch_on = 0;
    g_progress = 0;
    if (g_probe_comm != MPI_COMM_NULL) MPI_Comm_free(&g_probe_comm);
}

static loom_status read_timeout(void) {
    const char *s = getenv("LOOM_COMM_TIMEOUT");
    g_timeout_s = LOOM_COMM_TIMEOUT_DEFAULT;
    if (!s || !*s) return LOOM_OK;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= 0))
        return loom_fail(LOOM_EUSAGE, "LOOM_COMM_TIMEOUT='%s' is not a number of seconds", s);
    g_timeout_s = v;
    return LOOM_OK;
}

/* ---- running one call ------------------------------------------------- */

static int run_blocking_mpi(const mpi_call *k, MPI_Comm comm) {
    switch (k->op) {
    case LOOM_OP_ALLREDUCE:
        return MPI_Allreduce(k->send, k->recv, k->count, k->type, k->redop, comm);
    case LOOM_OP_REDUCE_SCATTER:
        /* the v-variant with equal counts: Open MPI 4.1 runs it several times
         * faster than the _block one for the sizes sequence parallelism uses */
        if (k->recv_counts)
            return MPI_Reduce_scatter(k->send, k->recv, k->recv_counts, k->type, k->redop, comm);
        return MPI_Reduce_scatter_block(k->send, k->recv, k->count, k->type, k->redop, comm);
    case LOOM_OP_ALLGATHER:
        return MPI_Allgather(k->send, k->count, MPI_BYTE, k->recv, k->count, MPI_BYTE, comm);
    case LOOM_OP_ALLTOALL:
        return MPI_Alltoall(k->send, k->count, MPI_BYTE, k->recv, k->count, MPI_BYTE, comm);
    case LOOM_OP_ALLTOALLV:
        return MPI_Alltoallv(k->send, k->send_counts, k->send_displs, MPI_BYTE, k->recv,
                             k->recv_counts, k->recv_displs, MPI_BYTE, comm);
    case LOOM_OP_SEND: return MPI_Send(k->send, k->count, MPI_BYTE, k->peer, k->tag, comm);
    case LOOM_OP_RECV:
        return MPI_Recv(k->recv, k->count, MPI_BYTE, k->peer, k->tag, comm, MPI_STATUS_IGNORE);
    case LOOM_OP_BCAST: return MPI_Bcast(k->recv, k->count, MPI_BYTE, k->peer, comm);
    case LOOM_OP_BARRIER: return MPI_Barrier(comm);
    case LOOM_OP_COUNT: break;
    }
    return MPI_ERR_OTHER;
}

static int start_mpi(const mpi_call *k, MPI_Comm comm, MPI_Request *r) {
    switch (k->op) {
    case LOOM_OP_ALLREDUCE:
        return MPI_Iallreduce(k->send, k->recv, k->count, k->type, k->redop, comm, r);
    case LOOM_OP_REDUCE_SCATTER:
        return MPI_Ireduce_scatter_block(k->send, k->recv, k->count, k->type, k->redop, comm, r);
    case LOOM_OP_ALLGATHER:
        return MPI_Iallgather(k->send, k->count, MPI_BYTE, k->recv, k->count, MPI_BYTE, comm, r);
    case LOOM_OP_ALLTOALL:
        return MPI_Ialltoall(k->send, k->count, MPI_BYTE, k->recv, k->count, MPI_BYTE, comm, r);
    case LOOM_OP_ALLTOALLV:
        return MPI_Ialltoallv(k->send, k->send_counts, k->send_displs, MPI_BYTE, k->recv,
                              k->recv_counts, k->recv_displs, MPI_BYTE, comm, r);
    case LOOM_OP_SEND: return MPI_Isend(k->send, k->count, MPI_BYTE, k->peer, k->tag, comm, r);
    case LOOM_OP_RECV: return MPI_Irecv(k->recv, k->count, MPI_BYTE, k->peer, k->tag, comm, r);
    case LOOM_OP_BCAST: return MPI_Ibcast(k->recv, k->count, MPI_BYTE, k->peer, comm, r);
    case LOOM_OP_BARRIER: return MPI_Ibarrier(comm, r);
    case LOOM_OP_COUNT: break;
    }
    return MPI_ERR_OTHER;
}

static void account(loom_comm *c, loom_comm_op op, size_t bytes, double seconds) {
    c->stats.calls[op]++;
    c->stats.bytes[op] += bytes;
    c->stats.seconds[op] += seconds;
    c->stats.call_seconds[op] += seconds;
}

/* Run k to completion on c; count `bytes` if it succeeds. */
/* Collectives on a group run in the order they were called on every rank:
 * before the calling thread makes a collective call itself, the watch must
 * have made every start queued on that group. */
/* While the calling thread waits for the watch to make a start it checks
 * ages itself, a few times a second: the watch is the watchdog too, and a
 * start that never returned inside MPI would keep it from ever checking. */
static void wait_for_start(void) { /* g_mu held */
    struct timespec ts;
    abs_after(&ts, g_timeout_s > 0 && g_timeout_s < 2 ? (long)(g_timeout_s * 2.5e8) : 500000000L);
    pthread_cond_timedwait(&g_started_cv, &g_mu, &ts);
    watchdog_check();
}

static void flush_queued(loom_comm *c) {
    if (!g_watch_on) return;
    pthread_mutex_lock(&g_mu);
    while (c->queued > 0) wait_for_start();
    pthread_mutex_unlock(&g_mu);
}

/* Wait until the watch has made r's start (if it was queued). */
static void await_start(loom_req *r) {
    if (!g_watch_on) return;
    pthread_mutex_lock(&g_mu);
    while (r->pending) wait_for_start();
    pthread_mutex_unlock(&g_mu);
}

static int start_pending(loom_req *r) {
    if (!g_watch_on) return 0;
    pthread_mutex_lock(&g_mu);
    int p = r->pending;
    pthread_mutex_unlock(&g_mu);
    return p;
}

static loom_status run_blocking(loom_comm *c, const mpi_call *k, size_t bytes) {
    if (k->op != LOOM_OP_SEND && k->op != LOOM_OP_RECV) flush_queued(c);
    inflight n;
    watch_add(&n, c, k->op, 0);
    double t0 = n.t0;
    int err = run_blocking_mpi(k, c->mpi);
    watch_remove(&n);
    if (err != MPI_SUCCESS) return fail_mpi(c, loom_comm_op_name(k->op), err);
    double t1 = loom_comm_wtime();
    account(c, k->op, bytes, t1 - t0);
    loom_comm_trace_record(k->op, c->name, bytes, t0, t1);
    return LOOM_OK;
}

static loom_req *req_take(loom_comm *c) {
    loom_req *r = c->spare;
    if (r) c->spare = r->next;
    else r = malloc(sizeof *r);
    return r;
}

static void req_release(loom_req *r) {
    r->next = r->c->spare;
    r->c->spare = r;
}

/* Starts the watch can make for the caller: collectives whose arguments
 * are all in the mpi_call (alltoallv's count arrays live in a scratch the
 * next call reuses, and point-to-point starts are cheap). */
static int queueable(loom_comm_op op) {
    return op == LOOM_OP_ALLREDUCE || op == LOOM_OP_REDUCE_SCATTER || op == LOOM_OP_ALLGATHER ||
           op == LOOM_OP_ALLTOALL || op == LOOM_OP_BCAST || op == LOOM_OP_BARRIER;
}

/* Start k on c as *out; count calls and bytes now, seconds at completion. */
static loom_status run_started(loom_comm *c, const mpi_call *k, size_t bytes, loom_req **out) {
    *out = NULL;
    loom_req *r = req_take(c);
    if (!r)
        return loom_fail(LOOM_EOS, "rank %d: %s on group %s: out of memory for a request",
                         g_world_rank, loom_comm_op_name(k->op), c->name);
    *r = (loom_req){.mpi = MPI_REQUEST_NULL, .c = c, .op = k->op, .bytes = bytes};
    watch_add(&r->node, c, k->op, 1);
    r->t0 = r->node.t0;
    if (g_progress && queueable(k->op)) { /* the watch makes the start (file header) */
        r->k = *k;
        r->pending = 1;
        pthread_mutex_lock(&g_mu);
        c->queued++;
        if (g_q_tail) g_q_tail->qnext = r;
        else g_q_head = r;
        g_q_tail = r;
        r->qnext = NULL;
        pthread_cond_signal(&g_cv);
        pthread_mutex_unlock(&g_mu);
        account(c, k->op, bytes, 0.0);
        c->stats.call_seconds[k->op] += loom_comm_wtime() - r->t0;
        *out = r;
        return LOOM_OK;
    }
    if (k->op != LOOM_OP_SEND && k->op != LOOM_OP_RECV) flush_queued(c);
    int err = start_mpi(k, c->mpi, &r->mpi);
    if (err != MPI_SUCCESS) {
        watch_remove(&r->node);
        req_release(r);
        return fail_mpi(c, loom_comm_op_name(k->op), err);
    }
    account(c, k->op, bytes, 0.0);
    c->stats.call_seconds[k->op] += loom_comm_wtime() - r->t0;
    *out = r;
    return LOOM_OK;
}

/* ---- runtime and groups ----------------------------------------------- */

static loom_status comm_wrap(MPI_Comm mpi, const char *name, loom_comm **out) {
    loom_comm *c = calloc(1, sizeof *c);
    if (!c) {
        MPI_Comm_free(&mpi);
        return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", g_world_rank, name);
    }
    c->mpi = mpi;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
    int err = MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    if (err == MPI_SUCCESS) err = MPI_Comm_rank(mpi, &c->rank);
    if (err == MPI_SUCCESS) err = MPI_Comm_size(mpi, &c->size);
    if (err != MPI_SUCCESS) {
        loom_status st = fail_mpi(c, "create", err);
        loom_comm_free(c);
        return st;
    }
    c->counts = malloc(4 * (size_t)c->size * sizeof *c->counts);
    if (!c->counts) {
        loom_comm_free(c);
        return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", g_world_rank, name);
    }
    *out = c;
    return LOOM_OK;
}

/* A process that no launcher started (no mpirun/srun/hydra variables) is an
 * MPI singleton: one rank, no peers, ever (loom does not spawn). Open MPI 4.1
 * then opens every network transport and lets libpsm2 calibrate with 125 us
 * sleeps: 0.45 s of MPI_Init, measured on a 2-core Zen 3, against 0.12 s with
 * only what one rank uses (the self transport, ob1). Not
 * ess_singleton_isolated (0.03 s more saved): isolated singletons all take
 * job family 0, so concurrent ones share a session directory and one's
 * MPI_Finalize removes it under another's MPI_Init (1 failure in 48 runs, 4
 * at a time). Set before MPI_Init; a user's own OMPI_MCA_* values are kept,
 * and other MPIs ignore these names. */
static void singleton_settings(void) {
    static const char *launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                     "PMI_FD", "SLURM_PROCID", "HYDRA_CONTROL_FD"};
    for (size_t i = 0; i < sizeof launched / sizeof *launched; i++)
        if (getenv(launched[i])) return;
    setenv("OMPI_MCA_mtl", "^psm2,ofi", 0);
    setenv("OMPI_MCA_btl", "self", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
}

/* MPI's user-defined op for LOOM_BF16 sums (comm.h): one hop of the
 * reduction, inout = bf16(in + inout) element by element. Commutative (the
 * fp32 addition is), not associative (every hop rounds). */
static void bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    loom_bf16_sum(inout, in, (size_t)*len);
}

static loom_status start_runtime(int *argc, char ***argv) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return loom_fail(LOOM_EUNAVAIL, "MPI was already finalized; cannot restart it");
    if (inited) return LOOM_OK;
    singleton_settings();
    int provided = MPI_THREAD_SINGLE;
    int err = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (err != MPI_SUCCESS) return loom_fail(LOOM_EUNAVAIL, "MPI_Init_thread failed (code %d)", err);
    g_started_mpi = 1;
    return LOOM_OK;
}

loom_status loom_comm_init(int *argc, char ***argv, loom_comm **world) {
    *world = NULL;
    LOOM_TRY(read_timeout());
    const char *fault = getenv("LOOM_COMM_FAULT");
    g_stall_starts = fault && strcmp(fault, "stall-start") == 0;
    LOOM_TRY(start_runtime(argc, argv));
    if (g_bf16_sum == MPI_OP_NULL && MPI_Op_create(bf16_sum_op, 1, &g_bf16_sum) != MPI_SUCCESS)
        return loom_fail(LOOM_EUNAVAIL, "MPI_Op_create of the bf16 sum failed");
    int world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    loom_log_set_rank(g_world_rank, world_size);
    MPI_Comm dup = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS)
        return loom_fail(LOOM_EUNAVAIL, "rank %d: MPI_Comm_dup of the world failed", g_world_rank);
    LOOM_TRY(comm_wrap(dup, "world", world));
    if (g_live_worlds++ == 0) {
        int level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&level);
        watch_start(level);
    }
    return LOOM_OK;
}

void loom_comm_finalize(loom_comm *world) {
    if (world) {
        loom_comm_free(world);
        if (--g_live_worlds == 0) watch_stop();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_live_worlds <= 0 && g_started_mpi && !finalized) {
        if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
        MPI_Finalize();
    }
}

void loom_comm_abort(loom_comm *c, int code) {
    const char *msg = loom_errmsg();
    char own[32]; /* messages from this file already name the rank: say it once */
    int n = snprintf(own, sizeof own, "rank %d: ", g_world_rank);
    if (n > 0 && strncmp(msg, own, (size_t)n) == 0) msg += n;
    if (msg[0])
        fprintf(stderr, "loom: error: rank %d: %s (aborting all ranks, exit code %d)\n", g_world_rank,
                msg, code);
    else
        fprintf(stderr, "loom: error: rank %d: aborting all ranks from group %s, exit code %d\n",
                g_world_rank, c ? c->name : "world", code);
    fflush(stderr);
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    _Exit(code); /* not reached when MPI_Abort works */
}

int loom_comm_rank(const loom_comm *c) { return c->rank; }
int loom_comm_size(const loom_comm *c) { return c->size; }
const char *loom_comm_name(const loom_comm *c) { return c->name; }

loom_status loom_comm_split(loom_comm *parent, int color, int key, const char *name,
                            loom_comm **out) {
    *out = NULL;
    MPI_Comm mpi = MPI_COMM_NULL;
    flush_queued(parent);
    int err = MPI_Comm_split(parent->mpi, color < 0 ? MPI_UNDEFINED : color, key, &mpi);
    if (err != MPI_SUCCESS) return fail_mpi(parent, "split", err);
    if (mpi == MPI_COMM_NULL) return LOOM_OK;
    return comm_wrap(mpi, name, out);
}

void loom_comm_free(loom_comm *c) {
    if (!c) return;
    flush_queued(c);
    while (c->spare) {
        loom_req *r = c->spare;
        c->spare = r->next;
        free(r);
    }
    if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
    free(c->counts);
    free(c);
}

/* ---- describing each op ----------------------------------------------- */

static MPI_Datatype mpi_type(loom_dtype t) {
    switch (t) {
    case LOOM_F32: return MPI_FLOAT;
    case LOOM_F64: return MPI_DOUBLE;
    case LOOM_I32: return MPI_INT32_T;
    case LOOM_I64: return MPI_INT64_T;
    case LOOM_U8: return MPI_UINT8_T;
    case LOOM_BF16: return MPI_UINT16_T; /* summed by g_bf16_sum */
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(loom_redop op) {
    switch (op) {
    case LOOM_SUM: return MPI_SUM;
    case LOOM_MAX: return MPI_MAX;
    case LOOM_MIN: return MPI_MIN;
    }
    return MPI_OP_NULL;
}

/* Calls with one count (everything but alltoallv); `count` is checked. */
static loom_status describe(loom_comm *c, loom_comm_op op, const void *send, void *recv,
                            size_t count, mpi_call *k) {
    *k = (mpi_call){.op = op, .send = send, .recv = recv, .type = MPI_BYTE, .redop = MPI_OP_NULL};
    return to_int(c, op, "count", -1, count, &k->count);
}

static loom_status describe_reduce(loom_comm *c, loom_comm_op op, const void *send, void *recv,
                                   size_t count, loom_dtype t, loom_redop rop, mpi_call *k) {
    LOOM_TRY(describe(c, op, send, recv, count, k));
    k->type = mpi_type(t);
    k->redop = mpi_op(rop);
    if (t == LOOM_BF16) {
        if (rop != LOOM_SUM)
            return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s: bf16 reductions support only the sum",
                             g_world_rank, loom_comm_op_name(op), c->name);
        k->redop = g_bf16_sum;
    }
    return LOOM_OK;
}

/* send == recv + rank * bytes_per_rank means "my block is already in place". */
static const void *gather_send(const loom_comm *c, const void *send, void *recv, size_t bytes) {
    return send == (const char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
}

static loom_status describe_alltoallv(loom_comm *c, const void *send, const size_t *send_bytes,
                                      const size_t *send_displ, void *recv,
                                      const size_t *recv_bytes, const size_t *recv_displ,
                                      mpi_call *k, size_t *sent) {
    int n = c->size;
    *k = (mpi_call){.op = LOOM_OP_ALLTOALLV, .send = send, .recv = recv, .type = MPI_BYTE,
                    .send_counts = c->counts, .send_displs = c->counts + n,
                    .recv_counts = c->counts + 2 * n, .recv_displs = c->counts + 3 * n};
    *sent = 0;
    for (int i = 0; i < n; i++) {
        LOOM_TRY(to_int(c, k->op, "send_bytes", i, send_bytes[i], &c->counts[i]));
        LOOM_TRY(to_int(c, k->op, "send_displ", i, send_displ[i], &c->counts[n + i]));
        LOOM_TRY(to_int(c, k->op, "recv_bytes", i, recv_bytes[i], &c->counts[2 * n + i]));
        LOOM_TRY(to_int(c, k->op, "recv_displ", i, recv_displ[i], &c->counts[3 * n + i]));
        *sent += send_bytes[i];
    }
    return LOOM_OK;
}

/* ---- blocking calls --------------------------------------------------- */

loom_status loom_comm_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype t,
                                loom_redop op) {
    mpi_call k;
    LOOM_TRY(describe_reduce(c, LOOM_OP_ALLREDUCE, MPI_IN_PLACE, buf, count, t, op, &k));
    return run_blocking(c, &k, count * loom_dtype_size(t));
}

loom_status loom_comm_reduce_scatter(loom_comm *c, const void *send, void *recv,
                                     size_t count_per_rank, loom_dtype t, loom_redop op) {
    mpi_call k;
    const void *s = send == recv ? MPI_IN_PLACE : send;
    LOOM_TRY(describe_reduce(c, LOOM_OP_REDUCE_SCATTER, s, recv, count_per_rank, t, op, &k));
    for (int i = 0; i < c->size; i++) c->counts[i] = k.count; /* blocking: scratch is free */
    k.recv_counts = c->counts;
    return run_blocking(c, &k, count_per_rank * loom_dtype_size(t) * (size_t)c->size);
}

loom_status loom_comm_allgather(loom_comm *c, const void *send, void *recv,
                                size_t bytes_per_rank) {
    mpi_call k;
    const void *s = gather_send(c, send, recv, bytes_per_rank);
    LOOM_TRY(describe(c, LOOM_OP_ALLGATHER, s, recv, bytes_per_rank, &k));
    return run_blocking(c, &k, bytes_per_rank * (size_t)c->size);
}

loom_status loom_comm_alltoall(loom_comm *c, const void *send, void *recv, size_t bytes_per_rank) {
    mpi_call k;
    LOOM_TRY(describe(c, LOOM_OP_ALLTOALL, send, recv, bytes_per_rank, &k));
    return run_blocking(c, &k, bytes_per_rank * (size_t)c->size);
}

loom_status loom_comm_alltoallv(loom_comm *c, const void *send, const size_t *send_bytes,
                                const size_t *send_displ, void *recv, const size_t *recv_bytes,
                                const size_t *recv_displ) {
    mpi_call k;
    size_t sent = 0;
    LOOM_TRY(describe_alltoallv(c, send, send_bytes, send_displ, recv, recv_bytes, recv_displ, &k,
                                &sent));
    return run_blocking(c, &k, sent);
}

loom_status loom_comm_bcast(loom_comm *c, void *buf, size_t bytes, int root) {
    mpi_call k;
    LOOM_TRY(describe(c, LOOM_OP_BCAST, NULL, buf, bytes, &k));
    k.peer = root;
    return run_blocking(c, &k, bytes);
}

loom_status loom_comm_barrier(loom_comm *c) {
    mpi_call k;
    LOOM_TRY(describe(c, LOOM_OP_BARRIER, NULL, NULL, 0, &k));
    return run_blocking(c, &k, 0);
}

loom_status loom_comm_send(loom_comm *c, const void *buf, size_t bytes, int peer, int tag) {
    mpi_call k;
    LOOM_TRY(describe(c, LOOM_OP_SEND, buf, NULL, bytes, &k));
    k.peer = peer;
    k.tag = tag;
    return run_blocking(c, &k, bytes);
}

loom_status loom_comm_recv(loom_comm *c, void *buf, size_t bytes, int peer, int tag) {
    mpi_call k;
    LOOM_TRY(describe(c, LOOM_OP_RECV, NULL, buf, bytes, &k));
    k.peer = peer;
    k.tag = tag;
    return run_blocking(c, &k, bytes);
}

/* ---- non-blocking calls ----------------------------------------------- */

loom_status loom_comm_iallreduce(loom_comm *c, void *buf, size_t count, loom_dtype t,
                                 loom_redop op, loom_req **req) {
    mpi_call k;
    *req = NULL;
    LOOM_TRY(describe_reduce(c, LOOM_OP_ALLREDUCE, MPI_IN_PLACE, buf, count, t, op, &k));
    return run_started(c, &k, count * loom_dtype_size(t), req);
}

loom_status loom_comm_ireduce_scatter(loom_comm *c, const void *send, void *recv,
                                      size_t count_per_rank, loom_dtype t, loom_redop op,
                                      loom_req **req) {
    mpi_call k;
    *req = NULL;
    const void *s = send == recv ? MPI_IN_PLACE : send;
    LOOM_TRY(describe_reduce(c, LOOM_OP_REDUCE_SCATTER, s, recv, count_per_rank, t, op, &k));
    return run_started(c, &k, count_per_rank * loom_dtype_size(t) * (size_t)c->size, req);
}

loom_status loom_comm_iallgather(loom_comm *c, const void *send, void *recv,
                                 size_t bytes_per_rank, loom_req **req) {
    mpi_call k;
    *req = NULL;
    const void *s = gather_send(c, send, recv, bytes_per_rank);
    LOOM_TRY(describe(c, LOOM_OP_ALLGATHER, s, recv, bytes_per_rank, &k));
    return run_started(c, &k, bytes_per_rank * (size_t)c->size, req);
}

loom_status loom_comm_isend(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
                            loom_req **req) {
    mpi_call k;
    *req = NULL;
    LOOM_TRY(describe(c, LOOM_OP_SEND, buf, NULL, bytes, &k));
    k.peer = peer;
    k.tag = tag;
    return run_started(c, &k, bytes, req);
}

loom_status loom_comm_irecv(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
                            loom_req **req) {
    mpi_call k;
    *req = NULL;
    LOOM_TRY(describe(c, LOOM_OP_RECV, NULL, buf, bytes, &k));
    k.peer = peer;
    k.tag = tag;
    return run_started(c, &k, bytes, req);
}

/* Count the seconds of a finished request (or report its error), then
 * release it. */
static loom_status req_finish(loom_req *r, int err, double t_call) {
    loom_comm *c = r->c;
    loom_comm_op op = r->op;
    watch_remove(&r->node);
    c->stats.call_seconds[op] += loom_comm_wtime() - t_call;
    if (err == MPI_SUCCESS) {
        double t1 = loom_comm_wtime();
        c->stats.seconds[op] += t1 - r->t0;
        loom_comm_trace_record(op, c->name, r->bytes, r->t0, t1);
    }
    req_release(r);
    return err == MPI_SUCCESS ? LOOM_OK : fail_mpi(c, loom_comm_op_name(op), err);
}

loom_status loom_comm_wait(loom_req *req) {
    if (!req) return LOOM_OK;
    double t = loom_comm_wtime();
    await_start(req);
    if (req->start_err != MPI_SUCCESS) return req_finish(req, req->start_err, t);
    return req_finish(req, MPI_Wait(&req->mpi, MPI_STATUS_IGNORE), t);
}

loom_status loom_comm_test(loom_req *req, int *done) {
    *done = 1;
    if (!req) return LOOM_OK;
    double t = loom_comm_wtime();
    int flag = 0;
    if (start_pending(req)) {
        *done = 0;
        req->c->stats.call_seconds[req->op] += loom_comm_wtime() - t;
        return LOOM_OK;
    }
    int err = req->start_err;
    if (err == MPI_SUCCESS) err = MPI_Test(&req->mpi, &flag, MPI_STATUS_IGNORE);
    *done = flag || err != MPI_SUCCESS;
    if (!*done) {
        req->c->stats.call_seconds[req->op] += loom_comm_wtime() - t;
        return LOOM_OK;
    }
    return req_finish(req, err, t);
}

/* ---- statistics ------------------------------------------------------- */

const loom_comm_stats *loom_comm_get_stats(const loom_comm *c) { return &c->stats; }

void loom_comm_reset_stats(loom_comm *c) { memset(&c->stats, 0, sizeof c->stats); }

int loom_comm_progress_thread(void) { return g_progress; }
double loom_comm_timeout(void) { return g_timeout_s; }
