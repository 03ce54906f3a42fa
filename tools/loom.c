/* loom.c - the `loom` command: dispatch to subcommands. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/cpu.h"
#include "loom/runinfo.h"
#include "loom/version.h"

static const char *USAGE =
    "usage: loom <command> [options]\n"
    "\n"
    "Train, evaluate and serve GPT-2-style models on many ranks, every parallelism in one mesh.\n"
    "\n"
    "commands:\n"
    "  train     train a model (run under mpirun or scripts/loomrun for many ranks)\n"
    "  eval      mean loss of saved parameters on a token shard\n"
    "  data      build token shards (.bin, llm.c layout) from text, byte-level or GPT-2 BPE\n"
    "  generate  continue prompts with a KV cache (greedy or sampled; --tp/--pp under mpirun)\n"
    "  serve     HTTP completion server (OpenAI-style, streaming, continuous batching)\n"
    "  export    consolidate a sharded checkpoint into one safetensors file + config.json\n"
    "  sim       replay a pipeline schedule with a cost model: timeline, bubble, trace\n"
    "  plan      rank every layout of a model on a cluster with a calibrated cost model\n"
    "  report    one HTML page of a run's metrics: loss, LR, throughput, memory, comm, pipeline, experts\n"
    "  calibrate the GEMM kernel and peaks MFU is measured against; --out: collectives for plan\n"
    "  version   version, commit, compiler, MPI, BLAS/oneDNN/oneMKL and CUDA of this build\n"
    "\n"
    "`loom <command> --help` documents every option of a command.\n"
    "\n"
    "exit codes (sysexits):\n"
    "  0 ok, 64 usage (bad flag or layout), 65 bad data (malformed file, non-finite loss),\n"
    "  66 missing input file, 69 communication failure, 70 internal error,\n"
    "  71 out of memory / OS error, 73 cannot create output, 74 I/O error,\n"
    "  75 stopped by SIGTERM/SIGINT after saving a checkpoint (--save-dir; resume with --resume),\n"
    "  78 bad config file;\n"
    "  an error on one rank after training starts aborts every rank (the launcher exits\n"
    "  with its code; the message names the rank)\n"
    "\n"
    "example (4 data-parallel ranks on the built-in default model and data):\n"
    "  scripts/loomrun -np 4 build/loom train --dp 4 --steps 50\n";

static const char *const COMMANDS[] = {"train", "eval", "data",      "generate", "serve", "export",
                                       "sim",   "plan", "calibrate", "report",   NULL};

static int print_version(void) {
    loom_runinfo ri;
    char text[4096];
    loom_runinfo_get(&ri);
    loom_runinfo_format(&ri, text, sizeof text);
    fputs(text, stdout);
    printf("data:      %s (plan presets)\n", loom_plan_dir());
    return 0;
}

/* `--help-man` anywhere: print the manual page where --help prints text
 * (cli_man.c; cmake/LoomDocs.cmake makes the man pages with it). */
static void take_help_man(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help-man") == 0) {
            cli_help_man = 1;
            argv[i] = "--help";
        }
}

/* scripts/loomrun relays a stop (SIGINT / SIGTERM, Ctrl-C) to mpirun as
 * SIGUSR1 / SIGUSR2, which Open MPI forwards to every rank (it would treat
 * SIGINT / SIGTERM as a kill of the job instead): each rank raises the
 * signal it stands for, so the command's own handling of SIGINT / SIGTERM
 * (train with --save-dir: finish the step, save, exit 75; serve: stop) or
 * their default action applies. */
static void relay_stop(int sig) {
    int to = sig == SIGUSR1 ? SIGINT : SIGTERM;
    struct sigaction cur;
    if (sigaction(to, NULL, &cur) == 0 && cur.sa_handler == SIG_DFL)
        loom_comm_note_stop_signal(to); /* every rank dies of it: not "rank R died" (comm.h) */
    raise(to);
}

/* loom train holds SIGTERM / SIGINT from its start (MPI start-up included)
 * until its flags are read: with --save-dir a held one asks the run to stop
 * after its first step; without, it is delivered with its default action. */
static volatile sig_atomic_t g_held_stop;

static void hold_stop(int sig) { g_held_stop = sig; }

int cli_held_stop_signal(void) { return g_held_stop; }

void cli_release_stop_signals(void) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (g_held_stop) {
        loom_comm_note_stop_signal(g_held_stop);
        raise(g_held_stop);
    }
}

static void catch_two(void (*handler)(int), int a, int b) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(a, &sa, NULL);
    sigaction(b, &sa, NULL);
}

int main(int argc, char **argv) {
    catch_two(relay_stop, SIGUSR1, SIGUSR2);
    if (argc >= 2 && strcmp(argv[1], "train") == 0) catch_two(hold_stop, SIGTERM, SIGINT);
    loom_blas_select(argv); /* may re-execute with OPENBLAS_CORETYPE set (loom/cpu.h) */
    take_help_man(argc, argv);
    if (cli_help_man && argc == 2) {
        cli_print_man_main(USAGE, COMMANDS, stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 64 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "eval") == 0) return cmd_eval(argc - 2, argv + 2);
    if (strcmp(cmd, "data") == 0) return cmd_data(argc - 2, argv + 2);
    if (strcmp(cmd, "sim") == 0) return cmd_sim(argc - 2, argv + 2);
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 2, argv + 2);
    if (strcmp(cmd, "serve") == 0) return cmd_serve(argc - 2, argv + 2);
    if (strcmp(cmd, "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 2, argv + 2);
    if (strcmp(cmd, "calibrate") == 0) return cmd_calibrate(argc - 2, argv + 2);
    if (strcmp(cmd, "report") == 0) return cmd_report(argc - 2, argv + 2);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) return print_version();
    fprintf(
        stderr,
        "loom: error: unknown command '%s' (commands: train, eval, data, export, sim, plan, calibrate, report, generate, serve, version)\n",
        cmd);
    return 64;
}
