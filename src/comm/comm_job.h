/* comm_job.h - the progress board (src/comm only; see comm_job.c): every
 * rank of a host writes into shared memory how many calls it entered on
 * each group, what it waits in, a heartbeat and its state, which its peers
 * read without its help, so the watchdog names a stalled rank. Nothing here
 * is collective or talks to MPI (comm_mpi.c hands in the memory).
 * Async-signal-safe where noted.
 */
#ifndef LOOM_COMM_JOB_H
#define LOOM_COMM_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"

/* A rank's state on the board. */
enum { LOOM_JOB_RUNNING = 1, LOOM_JOB_DONE, LOOM_JOB_ABORT, LOOM_JOB_SIGNALLED };

/* Bytes of one rank's slot. */
size_t loom_job_slot_bytes(void);
/* Start publishing: slots[i] is the slot of the host's i-th rank (world
 * rank world_ranks[i]), shared memory every rank of the host maps; me is
 * this rank's index. Called once, before the watch thread starts. */
void loom_job_attach(void *const *slots, const int *world_ranks, int n, int me);
/* Stop reading and writing the board (its memory is about to go). */
void loom_job_detach(void);
/* This rank's state (LOOM_JOB_*) and exit code, for its peers. Async-signal-safe. */
void loom_job_set_state(int state, int code);

/* This rank is about to end by a stop signal (SIGTERM/SIGINT with its
 * default action) the launcher relayed to every rank: its peers do not
 * report it as died. Async-signal-safe. */
void loom_job_note_stop(int sig);

/* Groups: registered when made (members: world ranks), keyed by the
 * group's call counter, which loom_comm keeps and a wrapping group may
 * take over (rekey). */
void loom_job_group_add(const uint64_t *seq, const char *name, const int *members, int n);
void loom_job_group_rekey(const uint64_t *from, const uint64_t *to);
void loom_job_group_remove(const uint64_t *seq);
/* A call entered on the group counting in *seq (after the count went up) / left. */
void loom_job_enter(const uint64_t *seq, loom_comm_op op);
void loom_job_leave(void);

/* The watch thread, at every wake-up: the heartbeat (a peer whose heartbeat
 * is old does not run: stopped or frozen); a few times a second - and at
 * every SIGCONT, the first signal of Open MPI's kill of a job - whether a
 * peer of this host died while running (killed or crashed: the lowest
 * surviving rank of the host names it with its pid and host, and every
 * rank ends with exit 69), and whether the launcher that started this rank
 * is gone (it ends too). */
void loom_job_tick(void);
/* For the watchdog: which members of the group counting in *seqp have not
 * entered call number `seq`, or entered it but do not run (stopped, gone),
 * and what they are doing, one line each; with
 * p2p (a send or receive: call numbers differ between ranks) what every
 * other member is doing. */
void loom_job_report(const uint64_t *seqp, uint64_t seq, int p2p, char *out, size_t cap);

/* A bounded start-up (issue 31): loom_job_guard_start, before MPI_Init,
 * starts a thread that, unless loom_job_guard_done is called within
 * LOOM_COMM_INIT_TIMEOUT seconds (default 120; 0: no limit), prints that
 * this rank's MPI start-up has not finished and exits 69 - a rank that
 * never joins (killed while starting, unreachable) is reported, not waited
 * for. LOOM_EUSAGE for a bad LOOM_COMM_INIT_TIMEOUT. Test hook:
 * LOOM_COMM_FAULT=stall-init:R (launcher rank R never starts MPI). */
loom_status loom_job_guard_start(void);
void loom_job_guard_done(void);

#endif
