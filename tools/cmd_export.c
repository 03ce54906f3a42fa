/* cmd_export.c - `loom export`: a sharded checkpoint to one safetensors file
 * with Hugging Face GPT-2 names and a config.json. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "loom/ckpt.h"
#include "loom/log.h"

static const cli_cmd CMD = {
    "export",
    "loom export CHECKPOINT OUT.safetensors",
    "Consolidate the parameters of a sharded checkpoint (written by `loom train\n"
    "--save-dir DIR`, under any layout) into one safetensors file with Hugging Face\n"
    "GPT-2 tensor names, as --save-params writes it (loadable with --load-params and\n"
    "`loom eval`), plus config.json in the same directory. CHECKPOINT is DIR/step_N,\n"
    "or DIR for its latest complete checkpoint; every file's SHA-256 is verified\n"
    "first. OUT is written as OUT.tmp and renamed when complete.\n"
    "One process; no MPI launcher needed. Exit codes as `loom --help`.",
    NULL,
    NULL,
    0};

int cmd_export(int argc, char **argv) {
    if (argc == 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
        cli_print_help(&CMD, stdout);
        return 0;
    }
    if (argc != 2 || argv[0][0] == '-' || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s\n", CMD.usage);
        return cli_fail(loom_fail(LOOM_EUSAGE, "export needs CHECKPOINT and OUT.safetensors"));
    }
    loom_status st = loom_ckpt_export(argv[0], argv[1]);
    if (st == LOOM_OK) loom_info("wrote %s and config.json beside it", argv[1]);
    return cli_fail(st);
}
