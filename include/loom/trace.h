/* trace.h - Chrome trace-event JSON (opens in Perfetto and chrome://tracing).
 *
 * One file per rank: complete events ("ph": "X") with a name, a category, a
 * start and a duration in microseconds, on a process (pid) and a thread
 * (tid) row; rows can be named. Written to PATH.tmp and renamed when closed.
 * Local; nothing collective.
 */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H

#include "loom/status.h"

typedef struct loom_trace loom_trace;

/* base: the time (seconds) that becomes ts = 0. */
loom_status loom_trace_open(const char *path, double base, loom_trace **out);
void loom_trace_name_row(loom_trace *t, int pid, int tid, const char *name);
/* t0, t1 in seconds on the same clock as base. */
void loom_trace_event(loom_trace *t, const char *name, const char *cat, double t0, double t1, int pid,
                      int tid);
/* Finish and rename into place; LOOM_EIO / LOOM_ECANTCREAT with the path named.
 * Frees t whatever the outcome. */
loom_status loom_trace_close(loom_trace *t);

#endif
