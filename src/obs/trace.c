/* trace.c - Chrome trace-event JSON writer (see trace.h). Local. */
#include "loom/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct loom_trace {
    FILE *f;
    char path[1100], tmp[1108];
    double base;
    int n;
    int failed;
};

loom_status loom_trace_open(const char *path, double base, loom_trace **out) {
    *out = NULL;
    loom_trace *t = calloc(1, sizeof *t);
    if (!t) return loom_fail(LOOM_EOS, "out of memory for a trace");
    snprintf(t->path, sizeof t->path, "%s", path);
    snprintf(t->tmp, sizeof t->tmp, "%s.tmp", path);
    t->base = base;
    t->f = fopen(t->tmp, "w");
    if (!t->f) {
        loom_status st =
            loom_fail(LOOM_ECANTCREAT, "trace %s: cannot create %s: %s", path, t->tmp, strerror(errno));
        free(t);
        return st;
    }
    fprintf(t->f, "{\"traceEvents\": [\n");
    *out = t;
    return LOOM_OK;
}

/* JSON string body: names here are ours (ASCII, no quotes), but be safe. */
static void put_str(FILE *f, const char *s) {
    for (; *s; s++) fputc(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20 ? '_' : *s, f);
}

void loom_trace_name_row(loom_trace *t, int pid, int tid, const char *name) {
    fprintf(t->f,
            "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"",
            t->n++ ? ",\n" : "", pid, tid);
    put_str(t->f, name);
    fprintf(t->f, "\"}}");
}

void loom_trace_event(loom_trace *t, const char *name, const char *cat, double t0, double t1, int pid,
                      int tid) {
    fprintf(t->f, "%s{\"name\": \"", t->n++ ? ",\n" : "");
    put_str(t->f, name);
    fprintf(t->f, "\", \"cat\": \"");
    put_str(t->f, cat);
    fprintf(t->f, "\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d}",
            1e6 * (t0 - t->base), 1e6 * (t1 - t0), pid, tid);
}

loom_status loom_trace_close(loom_trace *t) {
    errno = 0;
    fprintf(t->f, "\n]}\n");
    int bad = ferror(t->f) || fflush(t->f) != 0;
    int err = errno;
    if (fclose(t->f) != 0 && !bad) bad = 1, err = errno;
    loom_status st = LOOM_OK;
    if (bad) st = loom_fail(LOOM_EIO, "--trace %s: write failed: %s", t->path, strerror(err ? err : EIO));
    else if (rename(t->tmp, t->path) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "trace %s: cannot rename %s: %s", t->path, t->tmp, strerror(errno));
    if (st != LOOM_OK) remove(t->tmp);
    free(t);
    return st;
}
