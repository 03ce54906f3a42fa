/* check.h - a tiny assertion layer for loom's C tests.
 *
 * CHECK(cond, fmt, ...) records a failure with file:line and the message and
 * goes on; check_done() prints "N passed, N failed" and returns the exit code.
 * Tests assert real numbers: compare against a reference computed another
 * way, never against the value under test.
 */
#ifndef LOOM_TESTS_CHECK_H
#define LOOM_TESTS_CHECK_H

#include <stdio.h>

extern int check_passed_, check_failed_;
void check_report_(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (cond) check_passed_++;                                                                           \
        else {                                                                                               \
            check_failed_++;                                                                                 \
            check_report_(__FILE__, __LINE__, __VA_ARGS__);                                                  \
        }                                                                                                    \
    } while (0)

/* A fresh directory /tmp/loom-TAG-XXXXXX for this test program; check_done()
 * removes it with everything in it. NULL (after a failed check) if it cannot
 * be made. */
const char *check_scratch_dir(const char *tag);

/* SCRATCH/name in one of 8 rotating buffers (check_scratch_dir first). */
const char *check_scratch_path(const char *name);
/* Write n bytes to path; a failed check if it cannot. */
void check_write_bytes(const char *path, const void *data, size_t n);

/* relative error max|a-b| / max(max|b|, tiny) over n floats */
double check_max_rel_err(const float *a, const float *b, size_t n);
int check_done(void);

#endif
