/* internal.h - what the schedule generators share inside src/pipeline. */
#ifndef LOOM_PIPELINE_INTERNAL_H
#define LOOM_PIPELINE_INTERNAL_H

#include "loom/pipeline.h"

/* The order of computations of a list-scheduled schedule (zbh2, zbv,
 * dualpipev; s has kind, pp, micro_batches, virtual_stages and vshape set):
 * *order gets pp rows of 3*m*v entries, row r rank r's computations in
 * order, each (mb*v + chunk)*3 + kind (kind F, B or W). The caller frees it.
 * LOOM_EOS when out of memory; LOOM_EINTERNAL if the policy stalls (a bug,
 * never a layout the validator accepted). */
loom_status loom_pp_list_schedule(const loom_schedule *s, int **order);

#endif
