/* plan_calibrate_links.c - `loom calibrate` across hosts: which ranks share
 * a host and what the links between and inside hosts carry, measured with
 * real transfers through loom's communicator (plan_calibrate_links.h).
 *
 * loom_comm_init numbers the world host by host (ranks of a host
 * consecutive), so with L ranks on each of H hosts, host h holds ranks
 * h*L .. h*L+L-1. Measured:
 *   - inside a host (L >= 2): a ping-pong between ranks 0 and 1, half the
 *     round trip: latency from 64 bytes, bandwidth from 4 MiB;
 *   - between hosts: latency from a 64-byte ping-pong between rank 0 and
 *     rank L (the first rank of host 1), every other rank waiting; the
 *     bandwidth one rank gets when every rank of a host sends to its peer on
 *     the neighbouring host at once and receives from it (hosts paired 0-1,
 *     2-3, ..; an odd last host waits): 1 MiB each way, the slowest pair's
 *     time, so that the ranks of a host share its link as a collective's do.
 * Hosts that run on one machine (the same kernel boot id: emulated hosts,
 * scripts/cluster) share its processors; `shared` counts them. */
#include "plan_calibrate_links.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINK_SMALL 64
#define LINK_LARGE (4u << 20)   /* inside a host */
#define LINK_LARGE_X (1u << 20) /* between hosts: 0.2-0.4 s a call at 100 Mbit/s */
#define LINK_REPS 9

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median over LINK_REPS of the slowest rank's time to exchange `bytes` with
 * `peer` (-1: wait). ping: rank `first` sends then receives, its peer the
 * reverse (half the round trip); else both directions at once. Collective
 * over world. */
static loom_status exchange_time(loom_comm *world, int peer, int first, int ping, size_t bytes, char *a,
                                 char *b, double *out) {
    double t[LINK_REPS];
    for (int i = -1; i < LINK_REPS; i++) { /* one warm-up */
        LOOM_TRY(loom_comm_barrier(world));
        const double t0 = loom_comm_wtime();
        if (peer >= 0 && ping) {
            if (first) {
                LOOM_TRY(loom_comm_send(world, a, bytes, peer, 11));
                LOOM_TRY(loom_comm_recv(world, b, bytes, peer, 12));
            } else {
                LOOM_TRY(loom_comm_recv(world, b, bytes, peer, 11));
                LOOM_TRY(loom_comm_send(world, a, bytes, peer, 12));
            }
        } else if (peer >= 0) {
            loom_req *rr = NULL, *sr = NULL;
            LOOM_TRY(loom_comm_irecv(world, b, bytes, peer, 13, &rr));
            loom_status st = loom_comm_isend(world, a, bytes, peer, 13, &sr);
            loom_status st2 = loom_comm_wait(rr);
            if (st == LOOM_OK) st = loom_comm_wait(sr);
            LOOM_TRY(st);
            LOOM_TRY(st2);
        }
        double dt = peer >= 0 ? loom_comm_wtime() - t0 : 0;
        if (ping) dt /= 2;
        LOOM_TRY(loom_comm_allreduce(world, &dt, 1, LOOM_F64, LOOM_MAX));
        if (i >= 0) t[i] = dt;
    }
    qsort(t, LINK_REPS, sizeof t[0], cmp_dbl);
    *out = t[LINK_REPS / 2];
    return LOOM_OK;
}

/* Hosts of this machine (one kernel boot id), the most of any machine's.
 * Collective over world. */
static loom_status hosts_sharing(loom_comm *world, int *out) {
    char id[64] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(id, sizeof id, f)) id[0] = '\0';
        fclose(f);
    }
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of the boot id, top bit clear; 0 where unreadable */
    for (const char *p = id; *p && *p != '\n'; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    const int n = loom_comm_size(world);
    int64_t *all = calloc((size_t)n, sizeof *all);
    if (!all) return loom_fail(LOOM_EOS, "rank %d: out of memory", loom_comm_rank(world));
    all[loom_comm_rank(world)] = id[0] ? (int64_t)(h >> 1) : 0; /* each rank its entry; a sum gathers them */
    loom_status st = loom_comm_allreduce(world, all, (size_t)n, LOOM_I64, LOOM_SUM);
    int best = 1;
    unsigned char *seen = calloc((size_t)loom_comm_hosts(), 1);
    for (int r = 0; st == LOOM_OK && seen && r < n; r++) {
        if (!all[r]) continue;
        int k = 0;
        memset(seen, 0, (size_t)loom_comm_hosts());
        for (int q = 0; q < n; q++)
            if (all[q] == all[r] && !seen[loom_comm_host_of(q)]) seen[loom_comm_host_of(q)] = 1, k++;
        if (k > best) best = k;
    }
    free(seen);
    free(all);
    *out = best;
    return st;
}

loom_status loom_plan_calibrate_links(loom_comm *world, plan_links *out, int verbose) {
    const int n = loom_comm_size(world), rank = loom_comm_rank(world), hosts = loom_comm_hosts();
    memset(out, 0, sizeof *out);
    out->hosts = hosts;
    out->per_host = n / (hosts > 0 ? hosts : 1);
    if (hosts <= 1) return LOOM_OK;
    for (int r = 0; r < n; r++)
        if (loom_comm_host_of(r) != r / out->per_host || n % hosts)
            return loom_fail(
                LOOM_EUSAGE,
                "rank %d: calibrate across hosts needs the same number of ranks on every host (%d ranks "
                "on %d hosts; rank %d is on host %d)",
                rank, n, hosts, r, loom_comm_host_of(r));
    const int L = out->per_host;
    char *a = calloc(LINK_LARGE, 1), *b = calloc(LINK_LARGE, 1);
    if (!a || !b) {
        free(a);
        free(b);
        return loom_fail(LOOM_EOS, "rank %d: out of memory for link buffers", rank);
    }
    loom_status st = LOOM_OK;
    double ts = 0, tl = 0;
    if (L >= 2) { /* inside host 0: ranks 0 and 1 */
        const int peer = rank == 0 ? 1 : rank == 1 ? 0 : -1;
        st = exchange_time(world, peer, rank == 0, 1, LINK_SMALL, a, b, &ts);
        if (st == LOOM_OK) st = exchange_time(world, peer, rank == 0, 1, LINK_LARGE, a, b, &tl);
        out->intra_lat = ts;
        out->intra_bw = LINK_LARGE / fmax(tl - ts, 1e-9);
    }
    if (st == LOOM_OK) { /* between hosts 0 and 1: ranks 0 and L */
        const int peer = rank == 0 ? L : rank == L ? 0 : -1;
        st = exchange_time(world, peer, rank == 0, 1, LINK_SMALL, a, b, &ts);
        out->inter_lat = ts;
    }
    if (st == LOOM_OK) { /* every rank with its peer on the paired host, both ways at once */
        const int h = rank / L, ph = h ^ 1;
        const int peer = ph < hosts ? ph * L + rank % L : -1;
        st = exchange_time(world, peer, h < ph, 0, LINK_LARGE_X, a, b, &tl);
        out->inter_bw = LINK_LARGE_X / fmax(tl - out->inter_lat, 1e-9);
    }
    free(a);
    free(b);
    if (st == LOOM_OK) st = hosts_sharing(world, &out->shared);
    if (st == LOOM_OK && verbose && rank == 0) {
        printf("hosts: %d x %d ranks (%d host(s) a machine)\n", hosts, L, out->shared);
        if (L >= 2)
            printf("  inside a host  : latency %8.1f us, bandwidth %8.3f GB/s (ranks 0-1 ping-pong)\n",
                   1e6 * out->intra_lat, out->intra_bw / 1e9);
        printf(
            "  between hosts  : latency %8.1f us, bandwidth %8.3f GB/s per rank (all %d of a host at once)\n",
            1e6 * out->inter_lat, out->inter_bw / 1e9, L);
    }
    return st;
}
