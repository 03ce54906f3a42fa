/* comm_job.c - the progress board (comm_job.h). Not tied to a mesh axis;
 * nothing here is collective and nothing talks to MPI.
 *
 * Every rank of a host owns one slot of a shared memory segment
 * (MPI_Win_allocate_shared over the host's ranks, made by comm_mpi.c) and
 * writes into it, with plain atomic stores and no lock: its pid, host and
 * process start time; its state (running, finished, aborting); for each
 * group it belongs to (by name and how many groups of that name it made
 * before, the same on every member) how many calls it has entered; the call
 * it entered last and how many are in flight; and a heartbeat its watch
 * thread stamps at every wake-up. Its peers read the slot without its help,
 * so a rank that is stopped (SIGSTOP), stuck outside loom_comm or dead is
 * still seen: the watchdog (comm_watch.c) names the members of the stalled
 * group that have not entered the stalled call, with what each is doing.
 *
 * A peer that dies: a few times a second the watch thread, and at once at
 * a SIGCONT (Open MPI's first signal when it ends a job), checks that each
 * running peer of the host still lives (kill(pid, 0), not a zombie, the same
 * start time). One that ended while running - not finished, not aborting
 * after its own message, not ended by a stop signal relayed to every rank -
 * is named once, by the lowest rank of the host still running: "rank R (pid
 * P on host H) died", and every rank ends with exit 69 rather than wait in
 * a collective that cannot finish. A rank whose launcher (its parent) has
 * ended ends too.
 *
 * Ranks on other hosts are not visible (no shared memory): the watchdog says
 * so. The board costs one pointer scan and a few stores per call.
 */
#include "comm/comm_job.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/status.h"

#define JOB_MAGIC 0x6c6f6f6d626f6172ULL /* "loomboar" */
#define JOB_GROUPS 64                   /* groups a slot publishes */
#define JOB_LOCAL 256                   /* groups alive at once in this process */
#define STALE_NS 2000000000ULL          /* a heartbeat older than this: the process does not run */
#define CHECK_NS 250000000ULL           /* the watch thread looks for dead peers at most every 0.25 s */

typedef struct job_group {
    char name[24];
    uint32_t gen; /* groups of this name this rank made before it */
    uint64_t entered;
} job_group;

typedef struct job_slot {
    uint64_t magic;
    int32_t world_rank, pid;
    uint64_t start_time; /* /proc/PID/stat starttime: a reused pid is not this rank */
    char host[64];
    int32_t state, code;
    uint64_t beat_ns; /* CLOCK_MONOTONIC of the watch thread's last wake-up */
    uint32_t n_groups, in_flight;
    int32_t cur_op, cur_group; /* the call entered last */
    uint64_t cur_seq, cur_t0_ns;
    job_group groups[JOB_GROUPS];
} job_slot;

typedef struct local_group {
    const uint64_t *seq; /* NULL: a free entry */
    char name[24];
    int slot; /* in groups[], -1 while not published (no board yet, or its slot full) */
    int n;
    int *members; /* world ranks */
} local_group;

static job_slot *const *g_slots; /* the host's ranks' slots */
static job_slot *g_me;
static int g_n, g_me_i;
static job_slot *g_slot_ptrs[1024];
static local_group g_local[JOB_LOCAL];
static int g_n_local;
static pid_t g_launcher; /* this rank's parent when the board started */
static uint64_t g_last_check;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

/* /proc/PID/stat: the state letter and the start time; 0 if unreadable.
 * Async-signal-safe (open/read, no stdio): the SIGCONT handler calls it. */
static int proc_stat(int pid, char *state, uint64_t *start) {
    char path[64] = "/proc/", buf[1024], digits[16];
    int nd = 0, at = 6;
    for (unsigned v = (unsigned)pid; nd == 0 || v; v /= 10) digits[nd++] = (char)('0' + v % 10);
    while (nd) path[at++] = digits[--nd];
    memcpy(path + at, "/stat", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2]) return 0;
    *state = p[2];
    p += 3;                                          /* field 3 (state) read; the start time is field 22 */
    for (int field = 4; field < 22 && *p; field++) { /* skip fields 4..21 */
        while (*p == ' ') p++;
        while (*p && *p != ' ') p++;
    }
    while (*p == ' ') p++;
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
    *start = v;
    return 1;
}

/* The process of slot s still runs (a zombie or another process with its pid does not). */
static int slot_alive(const job_slot *s) {
    if (kill(s->pid, 0) != 0 && errno == ESRCH) return 0;
    char state;
    uint64_t start;
    if (!proc_stat(s->pid, &state, &start)) return 1; /* no /proc here: trust kill */
    return state != 'Z' && state != 'X' && (!s->start_time || start == s->start_time);
}

size_t loom_job_slot_bytes(void) { return sizeof(job_slot); }

static void publish(struct local_group *l);
static void on_cont(int sig);

static void at_exit(void) { loom_job_set_state(LOOM_JOB_DONE, 0); }

void loom_job_attach(void *const *slots, const int *world_ranks, int n, int me) {
    if (n > (int)(sizeof g_slot_ptrs / sizeof *g_slot_ptrs) || me < 0 || me >= n) return;
    for (int i = 0; i < n; i++) g_slot_ptrs[i] = slots[i];
    job_slot *s = g_slot_ptrs[me];
    memset(s, 0, sizeof *s);
    s->world_rank = world_ranks[me];
    s->pid = (int32_t)getpid();
    char st;
    proc_stat(s->pid, &st, &s->start_time);
    gethostname(s->host, sizeof s->host - 1);
    s->state = LOOM_JOB_RUNNING;
    s->beat_ns = now_ns();
    g_n = n;
    g_me_i = me;
    g_slots = g_slot_ptrs;
    g_me = s;
    for (int i = 0; i < g_n_local; i++) /* groups made before the board (the world) */
        if (g_local[i].seq && g_local[i].slot < 0) publish(&g_local[i]);
    g_launcher = getppid();
    STORE(s->magic, JOB_MAGIC);
    atexit(at_exit);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_cont;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGCONT, NULL, &old) == 0 && old.sa_handler == SIG_DFL) sigaction(SIGCONT, &sa, NULL);
}

void loom_job_detach(void) {
    g_me = NULL;
    g_slots = NULL;
}

void loom_job_set_state(int state, int code) {
    job_slot *s = g_me;
    if (!s) return;
    STORE(s->code, code);
    STORE(s->state, state);
}

/* ---- groups ------------------------------------------------------------------- */

static local_group *find(const uint64_t *seq) {
    for (int i = 0; i < g_n_local; i++)
        if (LOAD(g_local[i].seq) == seq) return &g_local[i];
    return NULL;
}

/* A slot entry for group l (name and generation as every member counts them). */
static void publish(local_group *l) {
    const char *name = l->name;
    job_slot *s = g_me;
    if (!s || s->n_groups >= JOB_GROUPS) {
        l->slot = -1;
        return;
    }
    uint32_t gen = 0;
    for (uint32_t i = 0; i < s->n_groups; i++)
        gen += strncmp(s->groups[i].name, name, sizeof s->groups[i].name) == 0;
    job_group *g = &s->groups[s->n_groups];
    snprintf(g->name, sizeof g->name, "%s", name);
    g->gen = gen;
    STORE(g->entered, 0);
    l->slot = (int)s->n_groups;
    STORE(s->n_groups, s->n_groups + 1);
}

void loom_job_group_add(const uint64_t *seq, const char *name, const int *members, int n) {
    local_group *l = NULL;
    for (int i = 0; i < g_n_local && !l; i++)
        if (!g_local[i].seq) l = &g_local[i];
    if (!l && g_n_local < JOB_LOCAL) l = &g_local[g_n_local++];
    if (!l) return;
    l->members = malloc((size_t)(n > 0 ? n : 1) * sizeof *l->members);
    l->n = l->members ? n : 0;
    if (l->members) memcpy(l->members, members, (size_t)n * sizeof *members);
    snprintf(l->name, sizeof l->name, "%s", name);
    publish(l);
    STORE(l->seq, seq);
}

void loom_job_group_rekey(const uint64_t *from, const uint64_t *to) {
    local_group *l = find(from);
    if (l) STORE(l->seq, to);
}

void loom_job_group_remove(const uint64_t *seq) {
    local_group *l = find(seq);
    if (!l) return;
    STORE(l->seq, NULL);
    free(l->members);
    l->members = NULL;
}

void loom_job_enter(const uint64_t *seq, loom_comm_op op) {
    job_slot *s = g_me;
    if (!s) return;
    local_group *l = find(seq);
    if (!l || l->slot < 0) return;
    STORE(s->groups[l->slot].entered, *seq);
    STORE(s->cur_op, (int32_t)op);
    STORE(s->cur_group, l->slot);
    STORE(s->cur_seq, *seq);
    STORE(s->cur_t0_ns, now_ns());
    __atomic_add_fetch(&s->in_flight, 1, __ATOMIC_RELEASE);
}

void loom_job_leave(void) {
    job_slot *s = g_me;
    if (s && LOAD(s->in_flight) > 0) __atomic_sub_fetch(&s->in_flight, 1, __ATOMIC_RELEASE);
}

/* ---- reading peers ------------------------------------------------------------ */

static job_slot *slot_of(int world_rank) {
    for (int i = 0; g_slots && i < g_n; i++) {
        job_slot *s = g_slots[i];
        if (LOAD(s->magic) == JOB_MAGIC && s->world_rank == world_rank) return s;
    }
    return NULL;
}

static const job_group *group_in(const job_slot *s, const char *name, uint32_t gen) {
    uint32_t n = LOAD(s->n_groups);
    for (uint32_t i = 0; i < n && i < JOB_GROUPS; i++)
        if (s->groups[i].gen == gen && strncmp(s->groups[i].name, name, sizeof s->groups[i].name) == 0)
            return &s->groups[i];
    return NULL;
}

/* Peer s does not take part any more: ended, aborting, gone, or its
 * process does not run (its heartbeat is old: stopped or frozen). */
static int not_running(const job_slot *s) {
    uint64_t now = now_ns(), beat = LOAD(s->beat_ns);
    return LOAD(s->state) != LOOM_JOB_RUNNING || !slot_alive(s) || (now > beat && now - beat > STALE_NS);
}

/* What peer s is doing, as a clause. */
static void activity(const job_slot *s, char *out, size_t cap) {
    uint64_t now = now_ns(), beat = LOAD(s->beat_ns);
    int state = LOAD(s->state);
    if (state == LOOM_JOB_DONE) snprintf(out, cap, "it has finished and left");
    else if (state == LOOM_JOB_ABORT) snprintf(out, cap, "it is aborting");
    else if (!slot_alive(s)) snprintf(out, cap, "its process is gone (killed, or crashed)");
    else if (now > beat && now - beat > STALE_NS)
        snprintf(out, cap, "its process has not run for %.0f s (stopped, e.g. SIGSTOP, or frozen)",
                 (double)(now - beat) / 1e9);
    else if (LOAD(s->in_flight) > 0) {
        int g = LOAD(s->cur_group);
        snprintf(out, cap, "it waits in %s on group %.24s (call #%llu) for %.0f s",
                 loom_comm_op_name((loom_comm_op)LOAD(s->cur_op)),
                 g >= 0 && g < JOB_GROUPS ? s->groups[g].name : "?", (unsigned long long)LOAD(s->cur_seq),
                 (double)(now - LOAD(s->cur_t0_ns)) / 1e9);
    } else snprintf(out, cap, "it is in no communication call (computing, or stuck outside loom_comm)");
}

void loom_job_report(const uint64_t *seqp, uint64_t seq, int p2p, char *out, size_t cap) {
    out[0] = '\0';
    local_group *l = find(seqp);
    job_slot *me = g_me;
    if (!me || !l || l->slot < 0) {
        snprintf(out, cap, "\n  (this group is not on the progress board: no report of its members)");
        return;
    }
    const job_group *mine = &me->groups[l->slot];
    size_t len = 0;
    int behind = 0, remote = 0;
    for (int i = 0; i < l->n && len + 1 < cap; i++) {
        int m = l->members[i];
        if (m == me->world_rank) continue;
        const job_slot *s = slot_of(m);
        if (!s) {
            remote++;
            continue;
        }
        const job_group *g = group_in(s, mine->name, mine->gen);
        uint64_t entered = g ? LOAD(g->entered) : 0;
        char what[256];
        activity(s, what, sizeof what);
        if (p2p) {
            len += (size_t)snprintf(out + len, cap - len, "\n  rank %d (pid %d on host %s) of group %s: %s",
                                    m, s->pid, s->host, mine->name, what);
            continue;
        }
        if (entered >= seq && !not_running(s)) continue;
        behind++;
        if (entered >= seq) /* inside the call, but not running: stopped in it */
            len += (size_t)snprintf(out + len, cap - len, "\n  rank %d (pid %d on host %s) entered it but %s",
                                    m, s->pid, s->host, what);
        else
            len +=
                (size_t)snprintf(out + len, cap - len,
                                 "\n  rank %d (pid %d on host %s) has not entered it: it made %llu calls on "
                                 "group %s; %s",
                                 m, s->pid, s->host, (unsigned long long)entered, mine->name, what);
    }
    if (!behind && !p2p && len + 1 < cap)
        len +=
            (size_t)snprintf(out + len, cap - len,
                             "\n  every member of group %s on this host has entered call #%llu (a transport "
                             "problem, or a mismatched call)",
                             mine->name, (unsigned long long)seq);
    if (remote && len + 1 < cap)
        snprintf(out + len, cap - len, "\n  %d member(s) on other hosts: not visible from here", remote);
}

/* ---- a dead peer ---------------------------------------------------------------- */

/* Text for one message built without stdio (async-signal-safe). */
typedef struct msg_buf {
    char b[512];
    size_t n;
} msg_buf;

static void put_s(msg_buf *m, const char *t) {
    while (*t && m->n + 1 < sizeof m->b) m->b[m->n++] = *t++;
}

static void put_i(msg_buf *m, long v) {
    char d[24];
    int k = 0;
    unsigned long u = v < 0 ? (unsigned long)-v : (unsigned long)v;
    if (v < 0) put_s(m, "-");
    do d[k++] = (char)('0' + u % 10);
    while ((u /= 10) && k < (int)sizeof d);
    while (k && m->n + 1 < sizeof m->b) m->b[m->n++] = d[--k];
}

static int g_ending; /* set once: this rank is ending (one message) */

/* End this rank with `code` after writing m (if any) to stderr. Async-signal-safe. */
static void end_rank(const msg_buf *m, int code) __attribute__((noreturn));
static void end_rank(const msg_buf *m, int code) {
    if (__atomic_exchange_n(&g_ending, 1, __ATOMIC_ACQ_REL)) m = NULL; /* the other path speaks */
    if (m && m->n) {
        ssize_t w = write(2, m->b, m->n);
        (void)w;
    }
    loom_job_set_state(LOOM_JOB_ABORT, code);
    _Exit(code);
}

/* A peer of this host whose process ended while it was running (not
 * finished; and no peer aborting after its own message or ended by a stop
 * signal relayed to every rank: then the job ends already, and the ranks the
 * launcher kills for it would be named in vain): named - by the lowest rank of the host still
 * running, so once - and this rank ends with exit 69. The others of the job
 * would wait for it in a collective that cannot finish. Async-signal-safe. */
static void check_peers(void) {
    job_slot *me = g_me;
    job_slot *const *slots = g_slots;
    if (!me || !slots || LOAD(me->state) != LOOM_JOB_RUNNING) return;
    for (int i = 0; i < g_n; i++) { /* a peer aborting after its own message, or a relayed stop: */
        int state = LOAD(slots[i]->magic) == JOB_MAGIC ? LOAD(slots[i]->state) : 0;
        if (state == LOOM_JOB_ABORT || state == LOOM_JOB_SIGNALLED) return; /* the job ends already */
    }
    for (int i = 0; i < g_n; i++) {
        const job_slot *s = slots[i];
        if (i == g_me_i || LOAD(s->magic) != JOB_MAGIC || LOAD(s->state) != LOOM_JOB_RUNNING || slot_alive(s))
            continue;
        int lowest = 1;
        for (int k = 0; k < g_n && lowest; k++) {
            const job_slot *o = slots[k];
            lowest = k == g_me_i || LOAD(o->magic) != JOB_MAGIC || LOAD(o->state) != LOOM_JOB_RUNNING ||
                     o->world_rank > me->world_rank || !slot_alive(o);
        }
        msg_buf m = {.n = 0};
        if (lowest) {
            put_s(&m, "loom: error: rank ");
            put_i(&m, s->world_rank);
            put_s(&m, " (pid ");
            put_i(&m, s->pid);
            put_s(&m, " on host ");
            put_s(&m, s->host);
            put_s(&m, ") died (killed by a signal, or crashed) before the job finished; rank ");
            put_i(&m, me->world_rank);
            put_s(&m, " ends every rank (exit 69)\n");
        }
        end_rank(&m, LOOM_EUNAVAIL);
    }
    if (g_launcher > 1 && getppid() != g_launcher) {
        msg_buf m = {.n = 0};
        put_s(&m, "loom: error: rank ");
        put_i(&m, me->world_rank);
        put_s(&m, ": the launcher process ");
        put_i(&m, g_launcher);
        put_s(&m, " that started it has ended; ending this rank (exit 69)\n");
        end_rank(&m, LOOM_EUNAVAIL);
    }
}

/* Open MPI ends a job whose rank died with SIGCONT, SIGTERM and, after
 * odls_base_sigkill_timeout, SIGKILL: at the SIGCONT the survivors look at
 * the board at once, so the dead rank is named before they are killed. */
static void on_cont(int sig) {
    (void)sig;
    int saved = errno;
    check_peers();
    errno = saved;
}

void loom_job_note_stop(int sig) {
    if (g_me) loom_job_set_state(LOOM_JOB_SIGNALLED, 128 + sig);
}

/* ---- the watch thread's checks ----------------------------------------------------- */

void loom_job_tick(void) {
    job_slot *me = g_me;
    if (!me) return;
    uint64_t now = now_ns();
    STORE(me->beat_ns, now);
    if (now - g_last_check < CHECK_NS) return;
    g_last_check = now;
    check_peers();
}

/* ---- the start-up guard ------------------------------------------------------------- */

static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_guard_cv = PTHREAD_COND_INITIALIZER;
static int g_guard_started, g_guard_done;
static double g_guard_s;

/* This rank as the launcher numbers it (before MPI knows it). */
static const char *env_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (getenv(names[i])) return getenv(names[i]);
    return "?";
}

static void *guard_main(void *arg) {
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double whole = (double)(time_t)g_guard_s;
    ts.tv_sec += (time_t)g_guard_s;
    ts.tv_nsec += (long)((g_guard_s - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_guard_mu);
    int rc = 0;
    while (!g_guard_done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g_guard_cv, &g_guard_mu, &ts);
    int done = g_guard_done;
    pthread_mutex_unlock(&g_guard_mu);
    if (done) return NULL;
    fprintf(stderr,
            "loom: error: rank %s: MPI start-up has not finished after %g s (LOOM_COMM_INIT_TIMEOUT): "
            "another rank died or never started, or the launcher cannot reach every rank; giving up "
            "(exit 69)\n",
            env_rank(), g_guard_s);
    fflush(stderr);
    _Exit(LOOM_EUNAVAIL);
}

loom_status loom_job_guard_start(void) {
    if (g_guard_started) return LOOM_OK;
    const char *t = getenv("LOOM_COMM_INIT_TIMEOUT");
    char *end = NULL;
    double v = t && *t ? strtod(t, &end) : 120.0;
    if (t && *t && (end == t || *end || !(v >= 0) || v > 1e9))
        return loom_fail(LOOM_EUSAGE, "LOOM_COMM_INIT_TIMEOUT='%s' is not a number of seconds", t);
    g_guard_s = v;
    g_guard_started = 1;
    pthread_t th;
    if (g_guard_s > 0 && pthread_create(&th, NULL, guard_main, NULL) == 0) pthread_detach(th);
    const char *fault = getenv("LOOM_COMM_FAULT");
    if (fault && strncmp(fault, "stall-init:", 11) == 0 && strcmp(fault + 11, env_rank()) == 0)
        for (;;) pause(); /* test hook: this rank never starts MPI */
    return LOOM_OK;
}

void loom_job_guard_done(void) {
    pthread_mutex_lock(&g_guard_mu);
    g_guard_done = 1;
    pthread_cond_signal(&g_guard_cv);
    pthread_mutex_unlock(&g_guard_mu);
}
