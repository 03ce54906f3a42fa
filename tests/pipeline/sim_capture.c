/* sim_capture.c - see sim_capture.h. Output goes through a temp file. */
#include "sim_capture.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int cmd_sim(int argc, char **argv);

char sim_out[1 << 17];

int sim(const char *first, ...) {
    char *argv[64];
    int argc = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 63; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    char path[] = "/tmp/loom_simXXXXXX";
    const int fd = mkstemp(path);
    fflush(stdout);
    fflush(stderr);
    const int o1 = dup(1), o2 = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    const int rc = cmd_sim(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(o1, 1);
    dup2(o2, 2);
    close(o1);
    close(o2);
    const ssize_t n = pread(fd, sim_out, sizeof sim_out - 1, 0);
    sim_out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}
