/* sysmem.c - peak resident memory from /proc/self/status
 * (sysmem.h). Reads one small file per call; 0 when it cannot (not Linux,
 * no /proc). Local to the calling process.
 */
#include "loom/sysmem.h"

#include <stdio.h>
#include <string.h>

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
