/* comm_internal.h - between the backend-independent comm.c and a backend. */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <stdint.h>

#include "loom/comm.h"

/* Keep one completed call as a trace event (no-op while tracing is off). */
void loom_comm_trace_record(loom_comm_op op, const char *group, uint64_t bytes, double t0, double t1);

#endif
