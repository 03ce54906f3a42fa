/* sysmem.c - peak resident memory from /proc/self/status
 * (sysmem.h). Reads one small file per call; 0 when it cannot (not Linux,
 * no /proc). Local to the calling process.
 */
#include "loom/sysmem.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* The value of a "Key:   N kB" line, in bytes. */
static size_t status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t klen = strlen(key), kib = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            unsigned long long v = 0;
            if (sscanf(line + klen + 1, "%llu", &v) == 1) kib = (size_t)v;
            break;
        }
    }
    fclose(f);
    return kib * 1024;
}

size_t loom_sysmem_peak_rss(void) { return status_kib("VmHWM"); }

double loom_sysmem_process_age(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* field 22 (starttime) counted after the ")" that closes the command name */
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    for (int field = 2; p && *p && field < 22; p++)
        if (*p == ' ') field++;
    if (!p || sscanf(p, "%llu", &start) != 1) return -1;
    struct timespec ts;
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts) != 0) return -1;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - (double)start / (double)hz;
}

double loom_sysmem_process_cpu(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}
