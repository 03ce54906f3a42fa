/* cmd_calibrate.c - `loom calibrate`: measure this machine (GEMM, memory
 * bandwidth, every collective by group size) into a cluster JSON that
 * `loom plan --cluster FILE` reads. Run under mpirun with the ranks to plan
 * for. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "loom/plan_calibrate.h"

int cmd_calibrate(int argc, char **argv) {
    static char out[1024];
    static int threads, quiet;
    snprintf(out, sizeof out, "this-machine.json");
    static cli_opt opts[] = {
        {"out", OPT_STR, out, sizeof out, "FILE", "cluster JSON to write (default this-machine.json)"},
        {"threads", OPT_INT, &threads, 0, "N", "compute threads per rank, as loom train would use (default 1)"},
        {"quiet", OPT_FLAG, &quiet, 0, NULL, "print errors only"},
    };
    static const cli_cmd cmd = {
        "calibrate",
        "scripts/loomrun -np N loom calibrate [--out FILE] [--threads T]",
        "Measure this machine for `loom plan`: sgemm FLOP/s per rank with every rank busy\n"
        "(times the rank's share of the cores when the ranks oversubscribe them),\n"
        "memory-copy bandwidth, and the latency and bandwidth of all-reduce, all-gather,\n"
        "reduce-scatter and all-to-all for group sizes 2, 4, .., N and of a point-to-point\n"
        "message, each through loom's communicator. Rank 0 writes a cluster JSON (one node of\n"
        "N devices; the measured collectives replace the link model for those group sizes).",
        "Latency is the median time of a 64-byte call; bandwidth the extra time of a 4 MiB\n"
        "call (the buffer each rank passes, as in docs/planning.md). Exit 73 if FILE cannot\n"
        "be created; an existing FILE is replaced whole or not at all.\n"
        "example: scripts/loomrun -np 4 build/loom calibrate --out this-machine.json\n",
        opts,
        sizeof opts / sizeof opts[0]};
    loom_comm *world = NULL;
    loom_status st = loom_comm_init(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    loom_log_set_rank(loom_comm_rank(world), loom_comm_size(world));
    int help = 0;
    st = loom_comm_agree(world, cli_parse(&cmd, argc, argv, 0, &help));
    if (st == LOOM_OK && help) {
        if (loom_comm_rank(world) == 0) cli_print_help(&cmd, stdout);
    } else if (st == LOOM_OK) {
        loom_kernels_set_threads(threads > 0 ? threads : 1);
        st = loom_comm_agree(world, loom_plan_calibrate(world, out, !quiet));
    }
    const int code = cli_fail(st);
    loom_comm_finalize(world);
    return code;
}
