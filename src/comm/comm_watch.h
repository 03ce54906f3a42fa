/* comm_watch.h - the watch: the hang watchdog over every call in flight, and
 * the helper thread that drives an implementation's progress and makes the
 * starts it queues (src/comm only; see comm_watch.c).
 *
 * The entry points (comm_call.c) put each call on the in-flight list for as
 * long as it runs - a blocking call while it runs, a non-blocking one from
 * start to completion - whatever implementation runs it. An implementation
 * that needs a helper thread (MPI: comm_mpi.c) starts it with its hooks;
 * without one, calls are still stamped (op, group, call number) but nobody
 * checks their age.
 */
#ifndef LOOM_COMM_WATCH_H
#define LOOM_COMM_WATCH_H

#include <stdint.h>

#include "loom/comm.h"

/* One call in flight (owned by the caller; on the list between add and remove). */
typedef struct loom_watch_node {
    loom_comm_op op;
    const char *group;
    uint64_t seq;         /* the group's call number, from 1 */
    const uint64_t *seqp; /* the group's counter (its key on the progress board, comm_job.h) */
    double t0;            /* loom_comm_wtime at the start */
    int nonblocking;
    struct loom_watch_node *prev, *next;
} loom_watch_node;

/* A start the watch makes for the caller (queued, oldest first). `make` runs
 * on the watch thread without the lock and returns the runtime's error code
 * (0 success), kept in `err`; `*queued` is the group's count of starts not
 * yet made. */
typedef struct loom_watch_start {
    int (*make)(struct loom_watch_start *s);
    int *queued;
    int pending, err;
    struct loom_watch_start *next;
} loom_watch_start;

/* What the thread calls into the implementation that started it. */
typedef struct loom_watch_hooks {
    int world_rank;                  /* for the report */
    char host[64];                   /* the rank's host, for the report ("" : not said) */
    void (*probe)(void);             /* drive the runtime's progress once (NULL: none) */
    void (*abort)(int code);         /* abort the job after the report (then _Exit) */
    long probe_max_ns, probe_p2p_ns; /* back-off limits: any request / one with send or recv */
} loom_watch_hooks;

/* Read LOOM_COMM_TIMEOUT (default 600 s; LOOM_EUSAGE if not a number) and
 * LOOM_COMM_FAULT. */
loom_status loom_watch_configure(void);
/* End this process with _Exit(code) a few seconds from now, whatever else
 * happens (after a report, before an abort that could block). */
void loom_watch_abort_timer(int code);
/* Start the thread (when `progress` or a timeout gives it work). `progress`:
 * it may call hooks->probe and make queued starts. */
void loom_watch_start_thread(const loom_watch_hooks *hooks, int progress);
void loom_watch_stop_thread(void);
/* 1 while the thread makes queued starts and probes. */
int loom_watch_progress(void);

/* Stamp n (the group's next call number, the time) and put it on the list. */
void loom_watch_add(loom_watch_node *n, loom_comm_op op, const char *group, uint64_t *seq, int nonblocking);
void loom_watch_remove(loom_watch_node *n);

/* Hand s to the thread (loom_watch_progress() must be 1). */
void loom_watch_queue(loom_watch_start *s);
/* Wait until the thread has made every start counted in *queued / s's start
 * (checking the ages meanwhile: a start stuck in the runtime is reported). */
void loom_watch_flush(int *queued);
void loom_watch_await(loom_watch_start *s);
int loom_watch_pending(loom_watch_start *s);

#endif
