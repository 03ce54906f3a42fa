/* cli.h - table-driven flags for the loom command: parsing, --help, and JSON
 * config files whose keys are the flag names. Only the CLI calls exit(). */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/status.h"

typedef enum { OPT_INT, OPT_U64, OPT_FLOAT, OPT_DOUBLE, OPT_STR, OPT_FLAG, OPT_STRLIST, OPT_ENUM } cli_type;

#define CLI_LIST_MAX 4096 /* values of one repeatable flag (loom data --input also takes DIR, GLOB, @LIST) */

typedef struct cli_strlist {
    int n;
    const char *items[CLI_LIST_MAX];
} cli_strlist;

/* OPT_ENUM's dst: an enum (int-sized) set to the index of its word in
 * `words` (NULL-terminated: layout.h's name tables). */
typedef struct cli_enum {
    void *value;
    const char *const *words;
} cli_enum;

typedef struct cli_opt {
    const char *name; /* without dashes: "steps" */
    cli_type type;
    void *dst;  /* int*, uint64_t*, float*, double*, char[cap], int* (flag), cli_strlist*, cli_enum* */
    size_t cap; /* OPT_STR: buffer size */
    const char *metavar;
    const char *help;
} cli_opt;

typedef struct cli_cmd {
    const char *name, *usage, *summary, *details;
    cli_opt *opts;
    int n_opts;
} cli_cmd;

/* Parse argv[0..argc) (after the subcommand). --help sets *help and stops;
 * the caller prints the help (rank 0 only under MPI). `--config FILE` (when
 * allow_config) is applied first, then flags override it. LOOM_EUSAGE for a
 * bad flag, LOOM_ECONFIG for a bad config file, LOOM_ENOINPUT for a missing
 * one, each with a message naming the flag or key. */
loom_status cli_parse(const cli_cmd *cmd, int argc, char **argv, int allow_config, int *help);
void cli_print_help(const cli_cmd *cmd, FILE *out);
/* Set by `--help-man` on the command line (loom.c): --help prints the
 * command's manual page (troff) instead of its text (cli_man.c). */
extern int cli_help_man;
void cli_print_man(const cli_cmd *cmd, FILE *out);
/* loom(1): the top-level usage text and the NULL-terminated command names. */
void cli_print_man_main(const char *usage, const char *const *commands, FILE *out);
/* For commands without MPI: cli_parse (no config file), printing --help to
 * stdout. Returns -1 to go on, else the exit code to return (0 after help). */
int cli_parse_local(const cli_cmd *cmd, int argc, char **argv);

/* Subcommands. Each returns the process exit code. */
/* loom train: a SIGTERM / SIGINT that arrived while the command started
 * (tools/loom.c holds it until the flags say whether --save-dir catches
 * it), 0 if none; cli_release_stop_signals gives them back their default
 * action (and delivers a held one). */
int cli_held_stop_signal(void);
void cli_release_stop_signals(void);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_report(int argc, char **argv);

/* Default corpus and where `loom data` writes it. */
#define LOOM_DEFAULT_CORPUS_DIR "/usr/share/games/fortunes"
#define LOOM_DEFAULT_TRAIN "data/fortunes_train.bin"
#define LOOM_DEFAULT_VAL "data/fortunes_val.bin"
/* Build the default shards from the default corpus. */
loom_status cli_build_default_data(const char *train, const char *val, int verbose);

/* 1 if paths a and b name the same file: the same inode when both exist,
 * else the same canonical directory and file name. "" names no file. */
int cli_same_file(const char *a, const char *b);

/* Commands that run under MPI (train, eval, generate, serve). */
typedef struct loom_comm loom_comm;
typedef struct loom_device loom_device;
/* --threads 0: OMP_NUM_THREADS if set, else every core for a one-rank job
 * and one thread per rank otherwise (ranks usually fill the cores). */
int cli_pick_threads(int asked, int world);
/* --device NAME: the compute backend of train, eval, generate and serve
 * (include/loom/device.h, docs/backends.md). */
#define CLI_DEVICE_OPT(var)                                                                                  \
    {                                                                                                        \
        "device", OPT_STR, var, sizeof var, "cpu|cuda",                                                      \
            "compute backend: cpu, or cuda (needs a build with the CUDA backend; docs/backends.md) "         \
            "(default cpu)"                                                                                  \
    }
/* The device of a command: --device `name` ("" = cpu), --threads `threads`
 * (0 = auto: cli_pick_threads over `world` ranks), GEMM precision bf16 or
 * not, and its groups' implementation from the environment:
 * LOOM_DEVICE_COMM=auto|mpi|staged|nccl (auto when unset: MPI on the CPU,
 * host-staged on a GPU), and LOOM_CUDA_AWARE_MPI=1, the older spelling of
 * mpi when LOOM_DEVICE_COMM is unset (this MPI reads device memory: no
 * staging). Made once, after the flags are parsed and before anything
 * allocates model memory; an unknown backend, one this build left out or
 * an unknown LOOM_DEVICE_COMM is LOOM_EUSAGE (exit 64) with the reason. */
loom_status cli_device_create(const char *name, int threads, int world, int bf16, loom_device **dev);
/* Start MPI; errors before this point are printed by every rank, so parse
 * flags after it. */
loom_status cli_mpi_start(int *argc, char ***argv, loom_comm **world);
/* Print a failure, finalize MPI, return the exit code. */
int cli_mpi_finish(loom_comm *world, loom_status st);
/* --help printed by rank 0 only. */
void cli_help_once(loom_comm *world, const cli_cmd *cmd);
/* A command that runs the model on every rank (generate, serve): start MPI,
 * parse cmd's flags (--help: rank 0 prints it), check(cfg, ranks) on every
 * rank, create the fp32 device `device` with *threads compute threads (0 =
 * auto), agree on the outcome (one failing rank stops all), run(cfg, dev,
 * world), free the device, finalize; returns the exit code. */
int cli_mpi_command(int argc, char **argv, const cli_cmd *cmd, const void *cfg, const char *device,
                    const int *threads, loom_status (*check)(const void *cfg, int ranks),
                    loom_status (*run)(const void *cfg, loom_device *dev, loom_comm *world));

/* Print the error of a failed status (if it has a message) and return the
 * exit code. */
int cli_fail(loom_status st);

#endif
