/* comm_mpi.c - the MPI implementation of the communicator (comm_impl.h),
 * on host memory, and the MPI runtime: the only file in loom that includes
 * mpi.h. Not tied to a mesh axis: every group, the world included, wraps its
 * own MPI communicator.
 *
 * Collective over the group: loom_comm_init / loom_comm_finalize (over the
 * world), split, free and every blocking or non-blocking collective. Not
 * collective: send / recv and their non-blocking forms, wait, test.
 *
 * Each call comes from the entry points (comm_call.c: checks, statistics,
 * trace, in-flight registration) as a loom_comm_call, becomes one mpi_call
 * (MPI counts and types) and is run blocking, or started as a request.
 *
 * Failures: every communicator has MPI_ERRORS_RETURN, and an MPI error comes
 * back as LOOM_EUNAVAIL with "rank R: <op> on group <g> failed: <MPI's
 * string>" (R is the world rank).
 *
 * Progress (the watch thread of comm_watch.c, with this file's probe): while
 * a non-blocking request is in flight the watch calls MPI_Iprobe on a private
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
 * the watch has made that group's queued starts. Point-to-point starts
 * stay with the caller, as do blocking calls (no hand-off latency on the TP
 * path's many small collectives). The two threads share MPI, which needs
 * MPI_THREAD_MULTIPLE; the watch can be absent without changing any caller.
 * If MPI provides less than MPI_THREAD_MULTIPLE (or LOOM_COMM_PROGRESS=0),
 * a warning says so and the watch only times calls: non-blocking work then
 * moves inside loom_comm calls.
 */
#include "loom/comm.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "comm/comm_job.h"
#include "loom/bf16.h"
#include "loom/log.h"

/* One group's MPI side (loom_comm.impl). */
typedef struct mpi_group {
    MPI_Comm mpi;
    int is_world; /* made by loom_comm_init */
    int *counts;  /* (4, size) scratch for alltoallv's and reduce_scatter's int arrays */
    int queued;   /* its starts the watch has not made yet */
} mpi_group;

/* Everything MPI needs for one call of any op, blocking or non-blocking. */
typedef struct mpi_call {
    loom_comm_op op;
    const void *send; /* may be MPI_IN_PLACE */
    void *recv;
    int count; /* elements (typed ops) or bytes; per rank for gather/scatter */
    MPI_Datatype type;
    MPI_Op redop;
    int peer, tag;                                                    /* peer is the root for bcast */
    const int *send_counts, *send_displs, *recv_counts, *recv_displs; /* alltoallv */
} mpi_call;

/* A request's MPI side (loom_req.impl). */
typedef struct mpi_req {
    loom_watch_start start; /* when the watch makes the start */
    MPI_Request mpi;
    MPI_Comm comm;
    mpi_call k;
    int *counts; /* alltoallv: its own (4, size) int arrays, kept until completion */
} mpi_req;

/* Process-wide state of the runtime, not of any group. */
static int g_world_rank = -1;                 /* rank in loom's world (placement below), for messages */
static int g_launcher_ranks = 1;              /* what the launcher's environment said (comm_launch.c) */
static char g_launcher_why[96];               /* and the variable that said it */
static int g_started_mpi;                     /* we called MPI_Init_thread, so we finalize */
static int g_live_worlds;                     /* worlds made by loom_comm_init not yet freed */
static MPI_Op g_bf16_sum = MPI_OP_NULL;       /* LOOM_BF16 sums (bf16_sum_op), made by loom_comm_init */
static MPI_Comm g_probe_comm = MPI_COMM_NULL; /* the watch's probes */

#define WATCH_PROBE_MAX_NS 1000000L /* probe back-off limit */
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

static const loom_comm_ops mpi_ops;

static loom_status fail_mpi(const loom_comm *c, const char *op, int err) {
    char text[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) strcpy(text, "unknown MPI error");
    return loom_fail(LOOM_EUNAVAIL, "rank %d: %s on group %s failed: %s", g_world_rank, op, c->name, text);
}

/* ---- describing each call ------------------------------------------------ */

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

static MPI_Op mpi_op(loom_dtype t, loom_redop op) {
    if (t == LOOM_BF16) return g_bf16_sum; /* a sum: comm_call.c checked */
    switch (op) {
    case LOOM_SUM: return MPI_SUM;
    case LOOM_MAX: return MPI_MAX;
    case LOOM_MIN: return MPI_MIN;
    }
    return MPI_OP_NULL;
}

/* k as MPI's arguments (every size fits an int: comm_call.c checked). A
 * blocking reduce_scatter uses the group's count scratch; alltoallv uses
 * `counts` (4 size ints: the group's scratch when blocking, the request's
 * own when started). */
static void describe(const loom_comm *c, const loom_comm_call *k, int blocking, int *counts, mpi_call *m) {
    mpi_group *g = c->impl;
    *m = (mpi_call){.op = k->op,
                    .send = k->send,
                    .recv = k->recv,
                    .count = (int)k->count,
                    .type = MPI_BYTE,
                    .redop = MPI_OP_NULL,
                    .peer = k->peer,
                    .tag = k->tag};
    const int n = c->size;
    switch (k->op) {
    case LOOM_OP_ALLREDUCE:
    case LOOM_OP_REDUCE_SCATTER:
        if (k->op == LOOM_OP_ALLREDUCE || k->send == k->recv) m->send = MPI_IN_PLACE;
        m->type = mpi_type(k->type);
        m->redop = mpi_op(k->type, k->redop);
        if (k->op == LOOM_OP_REDUCE_SCATTER && blocking) {
            for (int i = 0; i < n; i++) g->counts[i] = m->count;
            m->recv_counts = g->counts;
        }
        break;
    case LOOM_OP_ALLGATHER: /* "my block is already in place" */
        if (k->send == (const char *)k->recv + (size_t)c->rank * k->count) m->send = MPI_IN_PLACE;
        break;
    case LOOM_OP_ALLTOALLV:
        for (int i = 0; i < n; i++) {
            counts[i] = (int)k->send_bytes[i];
            counts[n + i] = (int)k->send_displ[i];
            counts[2 * n + i] = (int)k->recv_bytes[i];
            counts[3 * n + i] = (int)k->recv_displ[i];
        }
        m->send_counts = counts, m->send_displs = counts + n;
        m->recv_counts = counts + 2 * n, m->recv_displs = counts + 3 * n;
        break;
    default: break;
    }
}

/* ---- running one call ------------------------------------------------- */

static int run_blocking_mpi(const mpi_call *k, MPI_Comm comm) {
    switch (k->op) {
    case LOOM_OP_ALLREDUCE: return MPI_Allreduce(k->send, k->recv, k->count, k->type, k->redop, comm);
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
        return MPI_Alltoallv(k->send, k->send_counts, k->send_displs, MPI_BYTE, k->recv, k->recv_counts,
                             k->recv_displs, MPI_BYTE, comm);
    case LOOM_OP_SEND: return MPI_Send(k->send, k->count, MPI_BYTE, k->peer, k->tag, comm);
    case LOOM_OP_RECV: return MPI_Recv(k->recv, k->count, MPI_BYTE, k->peer, k->tag, comm, MPI_STATUS_IGNORE);
    case LOOM_OP_BCAST: return MPI_Bcast(k->recv, k->count, MPI_BYTE, k->peer, comm);
    case LOOM_OP_BARRIER: return MPI_Barrier(comm);
    case LOOM_OP_COUNT: break;
    }
    return MPI_ERR_OTHER;
}

static int start_mpi(const mpi_call *k, MPI_Comm comm, MPI_Request *r) {
    switch (k->op) {
    case LOOM_OP_ALLREDUCE: return MPI_Iallreduce(k->send, k->recv, k->count, k->type, k->redop, comm, r);
    case LOOM_OP_REDUCE_SCATTER:
        return MPI_Ireduce_scatter_block(k->send, k->recv, k->count, k->type, k->redop, comm, r);
    case LOOM_OP_ALLGATHER:
        return MPI_Iallgather(k->send, k->count, MPI_BYTE, k->recv, k->count, MPI_BYTE, comm, r);
    case LOOM_OP_ALLTOALLV:
        return MPI_Ialltoallv(k->send, k->send_counts, k->send_displs, MPI_BYTE, k->recv, k->recv_counts,
                              k->recv_displs, MPI_BYTE, comm, r);
    case LOOM_OP_SEND: return MPI_Isend(k->send, k->count, MPI_BYTE, k->peer, k->tag, comm, r);
    case LOOM_OP_RECV: return MPI_Irecv(k->recv, k->count, MPI_BYTE, k->peer, k->tag, comm, r);
    default: break; /* the entry points start nothing else */
    }
    return MPI_ERR_OTHER;
}

static int is_p2p(loom_comm_op op) { return op == LOOM_OP_SEND || op == LOOM_OP_RECV; }

static loom_status mpi_run(loom_comm *c, const loom_comm_call *k) {
    mpi_group *g = c->impl;
    mpi_call m;
    describe(c, k, 1, g->counts, &m);
    if (!is_p2p(k->op)) loom_watch_flush(&g->queued);
    int err = run_blocking_mpi(&m, g->mpi);
    return err == MPI_SUCCESS ? LOOM_OK : fail_mpi(c, loom_comm_op_name(k->op), err);
}

/* The watch thread makes a queued start. */
static int make_start(loom_watch_start *s) {
    mpi_req *r = (mpi_req *)s; /* start is the first member */
    return start_mpi(&r->k, r->comm, &r->mpi);
}

static loom_status mpi_start(loom_comm *c, const loom_comm_call *k, void *req) {
    mpi_group *g = c->impl;
    mpi_req *r = req;
    *r = (mpi_req){.mpi = MPI_REQUEST_NULL, .comm = g->mpi};
    if (k->op == LOOM_OP_ALLTOALLV && !(r->counts = malloc(4 * (size_t)c->size * sizeof *r->counts)))
        return loom_fail(LOOM_EOS, "rank %d: alltoallv on group %s: out of memory for its counts",
                         c->world_rank, c->name);
    describe(c, k, 0, r->counts, &r->k);
    /* the watch makes a collective's start (file header), but for alltoallv:
     * its start (never in place) allocates nothing of the message's size, and
     * the caller, which starts it to hide it behind compute, pays no hand-off */
    if (loom_watch_progress() && !is_p2p(k->op) && k->op != LOOM_OP_ALLTOALLV) {
        r->start.make = make_start;
        r->start.queued = &g->queued;
        loom_watch_queue(&r->start);
        return LOOM_OK;
    }
    if (!is_p2p(k->op)) loom_watch_flush(&g->queued);
    int err = start_mpi(&r->k, g->mpi, &r->mpi);
    if (err == MPI_SUCCESS) return LOOM_OK;
    free(r->counts);
    return fail_mpi(c, loom_comm_op_name(k->op), err);
}

static loom_status mpi_wait(loom_comm *c, void *req) {
    mpi_req *r = req;
    loom_watch_await(&r->start);
    int err = r->start.err;
    if (err == MPI_SUCCESS) err = MPI_Wait(&r->mpi, MPI_STATUS_IGNORE);
    free(r->counts);
    return err == MPI_SUCCESS ? LOOM_OK : fail_mpi(c, loom_comm_op_name(r->k.op), err);
}

static loom_status mpi_test(loom_comm *c, void *req, int *done) {
    mpi_req *r = req;
    *done = 0;
    if (loom_watch_pending(&r->start)) return LOOM_OK;
    int err = r->start.err, flag = 0;
    if (err == MPI_SUCCESS) err = MPI_Test(&r->mpi, &flag, MPI_STATUS_IGNORE);
    *done = flag || err != MPI_SUCCESS;
    if (*done) free(r->counts);
    return err == MPI_SUCCESS ? LOOM_OK : fail_mpi(c, loom_comm_op_name(r->k.op), err);
}

/* ---- groups --------------------------------------------------------------- */

/* A loom_comm around mpi whose buffers are in mem (freed on failure). */
/* The group's members as world ranks, for the progress board (comm_job.h). */
static void register_members(loom_comm *c, MPI_Comm mpi, int size) {
    MPI_Group grp, world;
    int *mine = malloc(2 * (size_t)size * sizeof *mine);
    if (!mine || MPI_Comm_group(mpi, &grp) != MPI_SUCCESS) {
        free(mine);
        return;
    }
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    for (int i = 0; i < size; i++) mine[i] = i;
    if (MPI_Group_translate_ranks(grp, size, mine, world, mine + size) == MPI_SUCCESS)
        loom_job_group_add(c->seq, c->name, mine + size, size);
    MPI_Group_free(&grp);
    MPI_Group_free(&world);
    free(mine);
}

static loom_status mpi_wrap(MPI_Comm mpi, const loom_comm_mem *mem, const char *name, int is_world,
                            loom_comm **out) {
    *out = NULL;
    mpi_group *g = calloc(1, sizeof *g);
    if (!g) {
        MPI_Comm_free(&mpi);
        return loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", g_world_rank, name);
    }
    g->mpi = mpi;
    int rank = 0, size = 1;
    int err = MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    if (err == MPI_SUCCESS) err = MPI_Comm_rank(mpi, &rank);
    if (err == MPI_SUCCESS) err = MPI_Comm_size(mpi, &size);
    g->counts = malloc(4 * (size_t)size * sizeof *g->counts);
    loom_comm *c = NULL;
    LOOM_TRY(loom_comm_create(&mpi_ops, g, sizeof(mpi_req), mem, rank, size, g_world_rank, name, &c));
    loom_status st = LOOM_OK;
    if (err != MPI_SUCCESS) st = fail_mpi(c, "create", err);
    else if (!g->counts)
        st = loom_fail(LOOM_EOS, "rank %d: out of memory for group %s", g_world_rank, c->name);
    if (st != LOOM_OK) {
        loom_comm_free(c);
        return st;
    }
    g->is_world = is_world;
    if (is_world) g_live_worlds++;
    register_members(c, mpi, size);
    *out = c;
    return LOOM_OK;
}

static loom_status mpi_split(loom_comm *parent, int color, int key, const char *name, loom_comm **out) {
    mpi_group *g = parent->impl;
    MPI_Comm mpi = MPI_COMM_NULL;
    loom_watch_flush(&g->queued);
    int err = MPI_Comm_split(g->mpi, color < 0 ? MPI_UNDEFINED : color, key, &mpi);
    if (err != MPI_SUCCESS) return fail_mpi(parent, "split", err);
    if (mpi == MPI_COMM_NULL) return LOOM_OK;
    return mpi_wrap(mpi, &parent->mem, name, 0, out); /* the parent's memory (loom_comm_set_memory) */
}

static void watch_stop(void);

static void mpi_free(loom_comm *c) {
    mpi_group *g = c->impl;
    if (!g) return;
    loom_watch_flush(&g->queued);
    loom_job_group_remove(c->seq);
    if (g->mpi != MPI_COMM_NULL) MPI_Comm_free(&g->mpi);
    if (g->is_world && --g_live_worlds == 0) watch_stop();
    free(g->counts);
    free(g);
    c->impl = NULL;
}

static const loom_comm_ops mpi_ops = {
    .name = "mpi",
    .run = mpi_run,
    .start = mpi_start,
    .wait = mpi_wait,
    .test = mpi_test,
    .split = mpi_split,
    .reserve = NULL, /* nothing of its own: MPI reads the caller's buffers */
    .free = mpi_free,
};

/* ---- placement: which ranks share a host ---------------------------------------- */

/* One rank's place, as every rank learns it at start-up. */
typedef struct rank_place {
    int leader;   /* lowest launcher rank on this rank's host: the host's id */
    int local;    /* rank among those sharing its host (launcher order) */
    int launcher; /* rank in MPI_COMM_WORLD */
    int host;     /* host index: hosts numbered by their leader, from 0 */
    char name[64];
} rank_place;

static rank_place *g_place; /* indexed by loom world rank; NULL before loom_comm_init */
static int g_place_n, g_hosts = 1;

static int place_cmp(const void *a, const void *b) {
    const rank_place *x = a, *y = b;
    if (x->leader != y->leader) return x->leader < y->leader ? -1 : 1;
    return x->local < y->local ? -1 : x->local > y->local;
}

static int launcher_cmp(const void *a, const void *b) {
    const rank_place *x = a, *y = b;
    return x->launcher < y->launcher ? -1 : x->launcher > y->launcher;
}

/* Learn every rank's host (MPI's shared-memory split: the ranks one host
 * runs) and choose this rank's place in loom's world: host by host, hosts in
 * the order of their lowest launcher rank, launcher order inside a host - so
 * the mesh's innermost axes land inside a host whatever order the launcher
 * numbered the ranks in (mpirun --map-by node, srun --distribution=cyclic).
 * LOOM_PLACEMENT=launcher keeps the launcher's numbering. *key: this rank's
 * place. Collective over MPI_COMM_WORLD. */
static loom_status place_ranks(int launcher, int size, int *key) {
    const char *mode = getenv("LOOM_PLACEMENT");
    int by_host = 1;
    if (mode && mode[0] && strcmp(mode, "host") != 0) {
        if (strcmp(mode, "launcher") != 0)
            return loom_fail(LOOM_EUSAGE, "LOOM_PLACEMENT=%s: expected host (default) or launcher", mode);
        by_host = 0;
    }
    MPI_Comm node = MPI_COMM_NULL;
    rank_place me = {.leader = launcher, .launcher = launcher};
    int err = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, launcher, MPI_INFO_NULL, &node);
    if (err == MPI_SUCCESS) err = MPI_Comm_rank(node, &me.local);
    if (err == MPI_SUCCESS) err = MPI_Allreduce(MPI_IN_PLACE, &me.leader, 1, MPI_INT, MPI_MIN, node);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (err != MPI_SUCCESS)
        return loom_fail(LOOM_EUNAVAIL, "rank %d: MPI's shared-memory split of the world failed (code %d)",
                         launcher, err);
    char name[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS) snprintf(name, sizeof name, "?");
    snprintf(me.name, sizeof me.name, "%.*s", (int)sizeof me.name - 1, name); /* a longer host name is cut */
    rank_place *all = calloc((size_t)size, sizeof *all);
    if (!all)
        return loom_fail(LOOM_EOS, "rank %d: out of memory for the placement of %d ranks", launcher, size);
    err = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) {
        free(all);
        return loom_fail(LOOM_EUNAVAIL, "rank %d: gathering the ranks' hosts failed (code %d)", launcher,
                         err);
    }
    /* hosts numbered by their leader: sort by (leader, local) and count */
    qsort(all, (size_t)size, sizeof *all, place_cmp);
    int hosts = 0;
    for (int r = 0; r < size; r++) {
        if (r == 0 || all[r].leader != all[r - 1].leader) hosts++;
        all[r].host = hosts - 1;
    }
    if (!by_host) qsort(all, (size_t)size, sizeof *all, launcher_cmp);
    for (int r = 0; r < size; r++)
        if (all[r].launcher == launcher) *key = r;
    free(g_place);
    g_place = all;
    g_place_n = size;
    g_hosts = hosts;
    return LOOM_OK;
}

int loom_comm_hosts(void) { return g_hosts; }

int loom_comm_host_of(int rank) { return g_place && rank >= 0 && rank < g_place_n ? g_place[rank].host : 0; }

const char *loom_comm_host_name(int rank) {
    return g_place && rank >= 0 && rank < g_place_n ? g_place[rank].name : "";
}

int loom_comm_launcher_rank(int rank) {
    return g_place && rank >= 0 && rank < g_place_n ? g_place[rank].launcher : rank;
}

/* ---- the runtime -------------------------------------------------------------- */

static void probe(void) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g_probe_comm, &flag, MPI_STATUS_IGNORE);
}

static void abort_job(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

/* The watch thread, with progress when MPI allows a second thread in
 * (LOOM_COMM_PROGRESS=0 says no). */
static void watch_start(int thread_level) {
    const char *p = getenv("LOOM_COMM_PROGRESS");
    int want = !(p && strcmp(p, "0") == 0), progress = 0;
    const char *sc = getenv("OMPI_MCA_btl_vader_single_copy_mechanism");
    int single_copy = sc && (!strcmp(sc, "cma") || !strcmp(sc, "xpmem") || !strcmp(sc, "knem"));
    if (want && thread_level < MPI_THREAD_MULTIPLE)
        loom_warn("MPI provides thread level %d, not MPI_THREAD_MULTIPLE: no progress thread, "
                  "non-blocking communication moves only inside loom_comm calls",
                  thread_level);
    if (want && thread_level >= MPI_THREAD_MULTIPLE &&
        MPI_Comm_dup(MPI_COMM_WORLD, &g_probe_comm) == MPI_SUCCESS)
        progress = 1;
    loom_watch_hooks hooks = {.world_rank = g_world_rank,
                              .probe = probe,
                              .abort = abort_job,
                              .probe_max_ns = WATCH_PROBE_MAX_NS,
                              .probe_p2p_ns = single_copy ? WATCH_PROBE_MAX_NS : WATCH_PROBE_P2P_NS};
    if (g_place && g_world_rank >= 0 && g_world_rank < g_place_n)
        snprintf(hooks.host, sizeof hooks.host, "%s", g_place[g_world_rank].name);
    loom_watch_start_thread(&hooks, progress);
    if (progress && !loom_watch_progress()) MPI_Comm_free(&g_probe_comm); /* no thread */
}

/* The progress board (comm_job.c): one slot per rank of this host in
 * memory they share. Without it (an MPI that cannot share memory) the
 * watchdog only names the waiting rank. */
static void board_start(void) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Win win = MPI_WIN_NULL;
    void *base = NULL;
    int n = 0, me = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world_rank, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return;
    MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
    MPI_Comm_size(node, &n);
    MPI_Comm_rank(node, &me);
    void **slots = malloc((size_t)n * sizeof *slots);
    int *ranks = malloc((size_t)n * sizeof *ranks);
    int ok = slots && ranks &&
             MPI_Win_allocate_shared((MPI_Aint)loom_job_slot_bytes(), 1, MPI_INFO_NULL, node, &base, &win) ==
                 MPI_SUCCESS &&
             MPI_Allgather(&g_world_rank, 1, MPI_INT, ranks, 1, MPI_INT, node) == MPI_SUCCESS;
    for (int r = 0; ok && r < n; r++) {
        MPI_Aint size;
        int disp;
        ok = MPI_Win_shared_query(win, r, &size, &disp, &slots[r]) == MPI_SUCCESS;
    }
    if (ok) loom_job_attach(slots, ranks, n, me);
    free(slots);
    free(ranks);
}

static void watch_stop(void) {
    loom_watch_stop_thread();
    if (g_probe_comm != MPI_COMM_NULL) MPI_Comm_free(&g_probe_comm);
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
    static const char *launched[] = {
        "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",       "PMI_RANK", "PMI_SIZE", "PMI_FD",
        "SLURM_PROCID",         "HYDRA_CONTROL_FD"};
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
    /* before MPI_Init: Open MPI's PMIx client rewrites PMIX_RANK in a singleton */
    g_launcher_ranks = loom_comm_launcher_ranks(g_launcher_why, sizeof g_launcher_why);
    singleton_settings();
    int provided = MPI_THREAD_SINGLE;
    int err = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (err != MPI_SUCCESS) return loom_fail(LOOM_EUNAVAIL, "MPI_Init_thread failed (code %d)", err);
    g_started_mpi = 1;
    return LOOM_OK;
}

void loom_comm_library(char *buf, size_t cap) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0, major = 0, minor = 0;
    MPI_Get_library_version(lib, &len); /* both may be called before MPI_Init */
    MPI_Get_version(&major, &minor);
    size_t n = strcspn(lib, "\n,"); /* the first line, up to Open MPI's ", package: ..." */
    while (n > 0 && (lib[n - 1] == ' ' || lib[n - 1] == '\t')) n--;
    snprintf(buf, cap, "%.*s (MPI %d.%d)", (int)n, lib, major, minor);
}

/* The world MPI made against what the launcher said: a world of one where
 * the environment says several ranks (this loom's MPI is not the
 * launcher's: each process would run alone), or another size than
 * LOOM_EXPECT_WORLD (scripts/loomrun -np N sets it). Every process sees the
 * same, so each stops with LOOM_EUSAGE; MPI is finalized first when loom
 * started it. */
static loom_status check_launcher(int world_size) {
    char lib[256];
    const char *want = getenv("LOOM_EXPECT_WORLD"), *why = g_launcher_why;
    int expected = want && *want ? atoi(want) : 0;
    int n = world_size == 1 ? g_launcher_ranks : 1;
    if (n <= 1 && (expected <= 0 || expected == world_size)) return LOOM_OK;
    loom_comm_library(lib, sizeof lib);
    if (g_started_mpi) {
        if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
        MPI_Finalize();
        g_started_mpi = 0;
    }
    if (n <= 1)
        return loom_fail(LOOM_EUSAGE,
                         "launcher mismatch: the job was started for %d ranks (LOOM_EXPECT_WORLD=%s, "
                         "set by scripts/loomrun -np) but MPI (%s) made a world of %d",
                         expected, want, lib, world_size);
    return loom_fail(LOOM_EUSAGE,
                     "launcher mismatch: the environment says this job has %d ranks (%s) but MPI "
                     "(%s) started this process alone, as a world of 1: loom was built against another "
                     "MPI than the launcher's. Start it with that MPI's own mpirun (scripts/loomrun "
                     "finds it) or rebuild loom against the launcher's MPI",
                     n, why, lib);
}

static loom_status init_world(int *argc, char ***argv, loom_comm **world);

/* The start-up guard (comm_job.h) bounds all of it: MPI_Init, the world's
 * split, the progress board, until the watch thread takes over. */
loom_status loom_comm_init(int *argc, char ***argv, loom_comm **world) {
    *world = NULL;
    LOOM_TRY(loom_watch_configure());
    LOOM_TRY(loom_job_guard_start());
    loom_status st = init_world(argc, argv, world);
    loom_job_guard_done();
    return st;
}

static loom_status init_world(int *argc, char ***argv, loom_comm **world) {
    LOOM_TRY(start_runtime(argc, argv));
    if (g_bf16_sum == MPI_OP_NULL && MPI_Op_create(bf16_sum_op, 1, &g_bf16_sum) != MPI_SUCCESS)
        return loom_fail(LOOM_EUNAVAIL, "MPI_Op_create of the bf16 sum failed");
    int world_size = 1, launcher = 0, key = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &launcher);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    g_world_rank = launcher;
    LOOM_TRY(check_launcher(world_size));
    loom_log_set_rank(g_world_rank, world_size);
    LOOM_TRY(place_ranks(launcher, world_size, &key));
    MPI_Comm dup = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, key, &dup) != MPI_SUCCESS)
        return loom_fail(LOOM_EUNAVAIL, "rank %d: MPI_Comm_split of the world (placed by host) failed",
                         launcher);
    g_world_rank = key;
    loom_log_set_rank(g_world_rank, world_size);
    LOOM_TRY(mpi_wrap(dup, &loom_comm_mem_host, "world", 1, world));
    if (g_live_worlds == 1) {
        int level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&level);
        if (world_size > 1) board_start();
        watch_start(level);
    }
    return LOOM_OK;
}

void loom_comm_finalize(loom_comm *world) {
    loom_job_set_state(LOOM_JOB_DONE, 0); /* leaving: what peers report of this rank (comm_job.c) */
    loom_comm_free(world);                /* the last world stops the watch (mpi_free) */
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_live_worlds <= 0 && g_started_mpi && !finalized) {
        /* the board's window is left to MPI_Finalize: freeing it would wait for every rank of the host */
        loom_job_detach();
        if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
        MPI_Finalize();
    }
}

void loom_comm_abort(loom_comm *c, int code) {
    const char *msg = loom_errmsg();
    char own[32]; /* messages from the communicator already name the rank: say it once */
    int n = snprintf(own, sizeof own, "rank %d: ", g_world_rank);
    if (n > 0 && strncmp(msg, own, (size_t)n) == 0) msg += n;
    if (msg[0])
        fprintf(stderr, "loom: error: rank %d: %s (aborting all ranks, exit code %d)\n", g_world_rank, msg,
                code);
    else
        fprintf(stderr, "loom: error: rank %d: aborting all ranks from group %s, exit code %d\n",
                g_world_rank, c ? c->name : "world", code);
    fflush(stderr);
    loom_job_set_state(LOOM_JOB_ABORT, code); /* what peers report of this rank (comm_job.c) */
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) {
        loom_watch_abort_timer(code); /* MPI_Abort can block on an unreachable host */
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    _Exit(code); /* not reached when MPI_Abort works */
}
