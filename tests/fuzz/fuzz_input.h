/* fuzz_input.h - the readers take paths, so each libFuzzer input is written
 * to one per-process scratch file first. */
#ifndef LOOM_FUZZ_INPUT_H
#define LOOM_FUZZ_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_path_[256];
static void fuzz_cleanup(void) {
    if (fuzz_path_[0]) unlink(fuzz_path_);
}

/* The input as the scratch file's whole content; its path (NULL on failure). */
static const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix) {
    char *path = fuzz_path_;
    if (!path[0]) {
        /* memory-backed when there is one: ten times the executions per second */
        const char *dir = getenv("TMPDIR")                ? getenv("TMPDIR")
                          : access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                          : "/tmp";
        snprintf(path, sizeof fuzz_path_, "%s/loom-fuzz-%d%s", dir, (int)getpid(), suffix);
    }
    static int registered;
    if (!registered) registered = atexit(fuzz_cleanup) == 0;
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    if (size && fwrite(data, 1, size, f) != size) {
        fclose(f);
        return NULL;
    }
    fclose(f);
    return path;
}

#endif
