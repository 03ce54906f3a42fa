/* cmd_export.c - `loom export`: a sharded checkpoint to one safetensors file
 * with Hugging Face names and a config.json. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "loom/ckpt.h"
#include "loom/log.h"

static const cli_cmd CMD = {"export",
                            "loom export CHECKPOINT OUT.safetensors",
                            "Consolidate the parameters of a sharded checkpoint (written by `loom train\n"
                            "--save-dir DIR`, under any layout) into one safetensors file with Hugging Face\n"
                            "tensor names, as --save-params writes it (loadable with --load-params and\n"
                            "`loom eval`), plus config.json in the same directory (GPT-2's, or the Llama\n"
                            "family's as the checkpoint saved it: a directory from_pretrained loads).\n"
                            "CHECKPOINT is DIR/step_N, or DIR for its latest complete checkpoint; every\n"
                            "file's SHA-256 is verified first. OUT is written as OUT.tmp and renamed when\n"
                            "complete.\n"
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
