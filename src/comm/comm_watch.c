/* comm_watch.c - the watch (comm_watch.h): one helper thread per process
 * and the list of calls in flight. Not tied to a mesh axis; nothing here is
 * collective and nothing here talks to MPI (the MPI implementation hands in
 * its probe and abort as hooks).
 *
 * Every call in flight - a blocking call while it runs, a non-blocking one
 * from start to completion - is a node on one list, stamped with its op,
 * group, start time and sequence number (the group's call count). The thread
 * sleeps on a condition variable while no non-blocking call is in flight (no
 * core spun), waking at least once a second to check ages. While one is, it
 * calls the implementation's probe every 20 us, backing off to a limit the
 * implementation gives (comm_mpi.c says why MPI needs this). It also makes
 * the starts an implementation queues (FIFO): the caller's test then reports
 * "not done" and its wait blocks until the start is made. The two threads
 * share the list and the queue (one mutex).
 *
 * The watchdog: a call in flight longer than LOOM_COMM_TIMEOUT seconds
 * (default 600; 0 turns it off) prints "rank R: <op> on group <g> (call #N
 * on that group) has not completed after S s", then, from the progress board
 * (comm_job.c), each member of the group on this host that has not entered
 * that call and what it is doing (for a send or receive, whose call numbers
 * differ between ranks: what every member is doing), and aborts the job. At
 * every wake-up the thread also stamps this rank's heartbeat there. Its cost
 * is a mutex and a list insert per call. A caller waiting for a queued start
 * checks the ages itself, so a start that never returns inside the runtime
 * (test hook: LOOM_COMM_FAULT=stall-start stops the thread at its first) is
 * reported the same way.
 *
 * The ages are checked by a second thread, the watchdog, that never enters
 * the runtime: the watch thread's probe or a start it makes can block inside
 * MPI (seen across hosts with a link down: a blocking all-reduce reported
 * 28-47 s late with LOOM_COMM_TIMEOUT=5), and a check that waits for them
 * would fire late or never. After the report the watchdog asks the
 * implementation to abort the job; that too can block (Open MPI's abort
 * waits for its daemons, one of them unreachable), so a timer ends this
 * process with _Exit after LOOM_ABORT_GRACE_S whatever the abort does.
 *
 * Both run at a real-time priority (SCHED_FIFO 1, the timer 2) where the
 * process may set one (root, CAP_SYS_NICE or an RLIMIT_RTPRIO), else as any
 * thread: ranks spinning in the runtime's progress loop (sched_yield) with
 * the watch thread waking beside them kept every other ordinary thread of
 * the machine off both cores for up to a minute (Linux 6.18, 2 cores,
 * cluster_fail: the watchdog reported 54-67 s after the link went down,
 * a real-time thread of the same machine woke on time throughout). The
 * watchdog sleeps between checks, so its priority costs the ranks nothing.
 */
#include "comm/comm_watch.h"

#include "comm/comm_job.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/log.h"

#define LOOM_COMM_TIMEOUT_DEFAULT 600.0
#define WATCH_PROBE_MIN_NS 20000L /* first probe period while requests fly */
#define LOOM_ABORT_GRACE_S 5      /* the abort's time to end the job before this process ends itself */

static double g_timeout_s; /* LOOM_COMM_TIMEOUT, 0 = no watchdog */
static int g_stall_starts; /* LOOM_COMM_FAULT=stall-start (tests only) */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_started_cv = PTHREAD_COND_INITIALIZER; /* a queued start was made */
static pthread_t g_thread;
static pthread_t g_dog; /* the watchdog thread (ages only; never in the runtime) */
static pthread_cond_t g_dog_cv = PTHREAD_COND_INITIALIZER;
static int g_dog_on;
static loom_watch_hooks g_hooks;
static int g_on; /* thread running */
static int g_stop;
static int g_progress; /* thread probes and makes starts */
static loom_watch_node *g_head;
static int g_nonblocking;                     /* non-blocking nodes on the list */
static int g_p2p;                             /* of which sends and receives */
static loom_watch_start *g_q_head, *g_q_tail; /* queued starts, oldest first */
static long g_probe_ns = WATCH_PROBE_MIN_NS;

loom_status loom_watch_configure(void) {
    const char *fault = getenv("LOOM_COMM_FAULT");
    g_stall_starts = fault && strcmp(fault, "stall-start") == 0;
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

double loom_comm_timeout(void) { return g_timeout_s; }
int loom_comm_progress_thread(void) { return g_progress; }
int loom_watch_progress(void) { return g_progress; }

/* ---- the watchdog -------------------------------------------------------- */

static int is_p2p(loom_comm_op op);

/* _Exit(code), first putting every thread of this process at SCHED_FIFO 1
 * where allowed: the process ends only once each of its threads has run
 * again, and threads left to ordinary scheduling beside spinning ranks kept
 * a rank that had called _Exit alive for 49 s (cluster_fail). */
static void exit_promptly(int code) {
    struct sched_param sp = {.sched_priority = 1};
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        const int tid = atoi(e->d_name);
        if (tid > 0) sched_setscheduler(tid, SCHED_FIFO, &sp);
    }
    if (d) closedir(d);
    _Exit(code);
}

static void *abort_timer(void *arg) {
    int code = (int)(intptr_t)arg;
    struct timespec ts = {.tv_sec = LOOM_ABORT_GRACE_S, .tv_nsec = 0};
    while (nanosleep(&ts, &ts) != 0) {}
    fprintf(stderr,
            "loom: error: rank %d: the job's abort did not end this process within %d s (a host "
            "unreachable?); exiting with code %d\n",
            g_hooks.world_rank, LOOM_ABORT_GRACE_S, code);
    fflush(stderr);
    exit_promptly(code);
    return NULL;
}

/* pthread_create at SCHED_FIFO `prio` where the process may, else with the
 * default attributes (0 or pthread_create's error). */
static int create_rt(pthread_t *t, int detached, int prio, void *(*fn)(void *), void *arg) {
    pthread_attr_t a;
    struct sched_param sp = {.sched_priority = prio};
    int err = pthread_attr_init(&a);
    if (err == 0) {
        if (detached) pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED);
        pthread_attr_setschedpolicy(&a, SCHED_FIFO);
        pthread_attr_setschedparam(&a, &sp);
        err = pthread_create(t, &a, fn, arg);
        if (err != 0) { /* EPERM: no real-time priority for this process */
            pthread_attr_setinheritsched(&a, PTHREAD_INHERIT_SCHED);
            err = pthread_create(t, &a, fn, arg);
        }
        pthread_attr_destroy(&a);
    }
    return err;
}

void loom_watch_abort_timer(int code) {
    pthread_t t;
    if (create_rt(&t, 1, 2, abort_timer, (void *)(intptr_t)code) != 0) _Exit(code);
}

/* Called with g_mu held; does not return. */
static void watchdog_fire(const loom_watch_node *n, double now) {
    static char who[4096];
    loom_job_report(n->seqp, n->seq, is_p2p(n->op), who, sizeof who);
    fprintf(stderr,
            "loom: error: rank %d: %s on group %s (call #%llu on that group) has not completed "
            "after %.0f s (LOOM_COMM_TIMEOUT=%g)%s%s; aborting the job%s\n",
            g_hooks.world_rank, loom_comm_op_name(n->op), n->group, (unsigned long long)n->seq, now - n->t0,
            g_timeout_s, g_hooks.host[0] ? " on host " : "", g_hooks.host, who);
    fflush(stderr);
    loom_job_set_state(LOOM_JOB_ABORT, LOOM_EUNAVAIL);
    loom_watch_abort_timer(LOOM_EUNAVAIL);
    if (g_hooks.abort) g_hooks.abort(LOOM_EUNAVAIL);
    exit_promptly(LOOM_EUNAVAIL);
}

/* Fire if any call in flight is older than LOOM_COMM_TIMEOUT (g_mu held). */
static void watchdog_check(void) {
    if (g_timeout_s <= 0) return;
    double now = loom_comm_wtime();
    for (loom_watch_node *n = g_head; n; n = n->next)
        if (now - n->t0 > g_timeout_s) watchdog_fire(n, now);
}

static int is_p2p(loom_comm_op op) { return op == LOOM_OP_SEND || op == LOOM_OP_RECV; }

void loom_watch_add(loom_watch_node *n, loom_comm_op op, const char *group, uint64_t *seq, int nonblocking) {
    *n = (loom_watch_node){.op = op,
                           .group = group,
                           .seq = ++*seq,
                           .seqp = seq,
                           .t0 = loom_comm_wtime(),
                           .nonblocking = nonblocking};
    loom_job_enter(seq, op);
    if (!g_on) return;
    pthread_mutex_lock(&g_mu);
    n->next = g_head;
    if (g_head) g_head->prev = n;
    g_head = n;
    if (nonblocking) {
        g_probe_ns = WATCH_PROBE_MIN_NS;
        g_p2p += is_p2p(op);
        if (g_nonblocking++ == 0 && g_progress) pthread_cond_signal(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
}

void loom_watch_remove(loom_watch_node *n) {
    loom_job_leave();
    if (!g_on) return;
    pthread_mutex_lock(&g_mu);
    if (n->prev) n->prev->next = n->next;
    else g_head = n->next;
    if (n->next) n->next->prev = n->prev;
    n->prev = n->next = NULL;
    if (n->nonblocking) {
        g_nonblocking--;
        g_p2p -= is_p2p(n->op);
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- queued starts --------------------------------------------------------- */

static void abs_after(struct timespec *ts, long ns) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ns;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* Make the queued starts, oldest first (g_mu held; released around each). */
static void make_queued(void) {
    while (g_q_head) {
        loom_watch_start *s = g_q_head;
        g_q_head = s->next;
        if (!g_q_head) g_q_tail = NULL;
        pthread_mutex_unlock(&g_mu);
        if (g_stall_starts) /* test hook: a start that never returns */
            for (;;) pause();
        int err = s->make(s);
        pthread_mutex_lock(&g_mu);
        s->err = err;
        s->pending = 0;
        (*s->queued)--;
        pthread_cond_broadcast(&g_started_cv);
    }
}

void loom_watch_queue(loom_watch_start *s) {
    s->pending = 1;
    s->err = 0;
    s->next = NULL;
    pthread_mutex_lock(&g_mu);
    (*s->queued)++;
    if (g_q_tail) g_q_tail->next = s;
    else g_q_head = s;
    g_q_tail = s;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* While the calling thread waits for the watch to make a start it checks
 * ages itself, a few times a second: the watch is the watchdog too, and a
 * start that never returned inside the runtime would keep it from checking
 * (g_mu held). */
static void wait_for_start(void) {
    struct timespec ts;
    abs_after(&ts, g_timeout_s > 0 && g_timeout_s < 2 ? (long)(g_timeout_s * 2.5e8) : 500000000L);
    pthread_cond_timedwait(&g_started_cv, &g_mu, &ts);
    watchdog_check();
}

void loom_watch_flush(int *queued) {
    if (!g_on) return;
    pthread_mutex_lock(&g_mu);
    while (*queued > 0) wait_for_start();
    pthread_mutex_unlock(&g_mu);
}

void loom_watch_await(loom_watch_start *s) {
    if (!g_on) return;
    pthread_mutex_lock(&g_mu);
    while (s->pending) wait_for_start();
    pthread_mutex_unlock(&g_mu);
}

int loom_watch_pending(loom_watch_start *s) {
    if (!g_on) return 0;
    pthread_mutex_lock(&g_mu);
    int p = s->pending;
    pthread_mutex_unlock(&g_mu);
    return p;
}

/* ---- the thread -------------------------------------------------------------- */

/* Idle (a timed wait) while no non-blocking call flies; probing with
 * back-off while one does; checking every node's age at each wake-up. */
static void *watch_main(void *arg) {
    (void)arg;
    double idle_s = g_timeout_s > 0 && g_timeout_s < 10 ? g_timeout_s / 10 : 1.0;
    pthread_mutex_lock(&g_mu);
    while (!g_stop) {
        make_queued();
        watchdog_check();
        loom_job_tick();
        struct timespec ts;
        if (g_progress && g_nonblocking > 0) {
            long ns = g_probe_ns;
            long cap = g_p2p > 0 ? g_hooks.probe_p2p_ns : g_hooks.probe_max_ns;
            g_probe_ns = ns * 2 > cap ? cap : ns * 2;
            pthread_mutex_unlock(&g_mu);
            if (g_hooks.probe) g_hooks.probe();
            pthread_mutex_lock(&g_mu);
            abs_after(&ts, ns); /* a queued start wakes it early */
        } else {
            abs_after(&ts, (long)(idle_s * 1e9));
        }
        if (!g_q_head && !g_stop) pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* The watchdog: a timed wait, the ages checked, this rank's heartbeat
 * stamped; nothing else (no runtime call, no lock held outside g_mu). */
static void *dog_main(void *arg) {
    (void)arg;
    double idle_s = g_timeout_s < 10 ? g_timeout_s / 10 : 1.0;
    pthread_mutex_lock(&g_mu);
    while (!g_stop) {
        watchdog_check();
        loom_job_tick();
        struct timespec ts;
        abs_after(&ts, (long)(idle_s * 1e9));
        pthread_cond_timedwait(&g_dog_cv, &g_mu, &ts);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

void loom_watch_start_thread(const loom_watch_hooks *hooks, int progress) {
    g_hooks = *hooks;
    g_progress = progress;
    if (!g_progress && g_timeout_s <= 0) return; /* nothing for a thread to do */
    g_stop = 0;
    if (pthread_create(&g_thread, NULL, watch_main, NULL) != 0) {
        loom_warn("could not start the communicator's watch thread: no progress thread, "
                  "no hang watchdog");
        g_progress = 0;
        return;
    }
    g_on = 1;
    if (g_timeout_s > 0 && g_progress) { /* else the watch thread never enters the runtime */
        if (create_rt(&g_dog, 0, 1, dog_main, NULL) == 0) g_dog_on = 1;
        else loom_warn("could not start the hang watchdog's thread: the watch thread checks the ages");
    }
}

void loom_watch_stop_thread(void) {
    if (!g_on) {
        g_progress = 0;
        return;
    }
    pthread_mutex_lock(&g_mu);
    g_stop = 1;
    pthread_cond_signal(&g_cv);
    pthread_cond_signal(&g_dog_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(g_thread, NULL);
    if (g_dog_on) pthread_join(g_dog, NULL);
    g_dog_on = 0;
    g_on = 0;
    g_progress = 0;
}
