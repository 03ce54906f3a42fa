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
 * Ranks on other hosts are not visible (no shared memory): the watchdog says
 * so. The board costs one pointer scan and a few stores per call.
 */
#include "comm/comm_job.h"

#include <errno.h>
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

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

/* /proc/PID/stat: the state letter and the start time; 0 if unreadable. */
static int proc_stat(int pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %c", state) != 1) return 0;
    char *save = NULL, *tok = strtok_r(p + 1, " ", &save);
    for (int field = 3; tok && field < 22; field++) tok = strtok_r(NULL, " ", &save);
    *start = tok ? strtoull(tok, NULL, 10) : 0;
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
    STORE(s->magic, JOB_MAGIC);
    atexit(at_exit);
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

/* ---- the watch thread's checks ----------------------------------------------------- */

void loom_job_tick(void) {
    job_slot *me = g_me;
    if (me) STORE(me->beat_ns, now_ns());
}
