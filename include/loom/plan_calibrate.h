/* plan_calibrate.h - `loom calibrate`: measure this machine into a cluster
 * JSON for `loom plan` (collective over world; src/plan/plan_calibrate.c). */
#ifndef LOOM_PLAN_CALIBRATE_H
#define LOOM_PLAN_CALIBRATE_H

#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/plan.h"

/* sgemm FLOP/s on dev's threads and memory-copy bandwidth per rank (all ranks at once), each
 * collective's latency and bandwidth by group size 2, 4, .., world, p2p
 * between two ranks; rank 0 writes PATH (via PATH.tmp, renamed: an existing
 * file is replaced whole or not at all) and, when verbose, prints them.
 * LOOM_ECANTCREAT / LOOM_EIO naming the path; communicator errors. */
loom_status loom_plan_calibrate(loom_comm *world, loom_device *dev, const char *path, int verbose);

#endif
