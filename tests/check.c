#include "check.h"

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <math.h>
#include <stdarg.h>
#include <stddef.h>

int check_passed_, check_failed_;

void check_report_(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double check_max_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num || d != d) num = d != d ? INFINITY : d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

static char scratch_[128];

const char *check_scratch_dir(const char *tag) {
    snprintf(scratch_, sizeof scratch_, "/tmp/loom-%s-XXXXXX", tag);
    if (mkdtemp(scratch_)) return scratch_;
    scratch_[0] = '\0';
    CHECK(0, "cannot make a scratch directory under /tmp");
    return NULL;
}

const char *check_scratch_path(const char *name) {
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", scratch_, name);
    return p;
}

void check_write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, n, fp) != n) CHECK(0, "cannot write %s", path);
    if (fp) fclose(fp);
}

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int check_done(void) {
    if (scratch_[0]) nftw(scratch_, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}
