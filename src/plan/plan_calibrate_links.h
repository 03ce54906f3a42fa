/* plan_calibrate_links.h - `loom calibrate` across hosts: ranks a host and
 * the links inside and between hosts, measured (plan_calibrate_links.c). */
#ifndef LOOM_PLAN_CALIBRATE_LINKS_H
#define LOOM_PLAN_CALIBRATE_LINKS_H

#include "loom/comm.h"

typedef struct plan_links {
    int hosts, per_host;        /* hosts of the job (loom_comm_hosts) and ranks on each */
    int shared;                 /* hosts on one machine (the same boot id): they share its processors */
    double intra_bw, intra_lat; /* one rank to another of its host: bytes/s, s (per_host >= 2) */
    double inter_bw, inter_lat; /* per rank, every rank of a host sending at once: bytes/s; s */
} plan_links;

/* With one host: hosts = 1 and nothing measured. Else the links (the
 * file's comment says how), every host needing the same number of ranks
 * (LOOM_EUSAGE naming the rank and host otherwise). Collective over world;
 * rank 0 prints them when verbose. */
loom_status loom_plan_calibrate_links(loom_comm *world, plan_links *out, int verbose);

#endif
