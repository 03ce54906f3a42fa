#include "check.h"

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

int check_done(void) {
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}
