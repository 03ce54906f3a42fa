/* log.c - leveled logging to stderr, with the rank in parallel jobs.
 * Info and debug print from rank 0 only; warnings and errors from any rank,
 * prefixed with it, because the question in MPI code is always "which rank". */
#include "loom/log.h"

#include <stdarg.h>
#include <stdio.h>

static loom_log_level g_level = LOOM_LOG_INFO;
static int g_rank = -1, g_world = 1;

void loom_log_set_level(loom_log_level lvl) { g_level = lvl; }

void loom_log_set_rank(int rank, int world_size) {
    g_rank = rank;
    g_world = world_size;
}

void loom_log(loom_log_level lvl, const char *fmt, ...) {
    if (lvl < g_level) return;
    if (lvl < LOOM_LOG_WARN && g_rank > 0) return;
    static const char *tag[] = {"debug", "info", "warning", "error"};
    char buf[4096];
    int n = 0;
    if (lvl >= LOOM_LOG_WARN || lvl == LOOM_LOG_DEBUG) {
        if (g_rank >= 0 && g_world > 1)
            n = snprintf(buf, sizeof buf, "loom: %s: rank %d: ", tag[lvl], g_rank);
        else n = snprintf(buf, sizeof buf, "loom: %s: ", tag[lvl]);
    }
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    /* one fputs per line so lines from different ranks do not interleave */
    fprintf(stderr, "%s\n", buf);
}
