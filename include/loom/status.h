/* status.h - loom's error model.
 *
 * Every fallible function returns a loom_status. The values are the BSD
 * sysexits codes, so the CLI can exit() with the status as it is and a script
 * can tell a usage error (64) from bad data (65) or a bad config (78).
 * The human message lives in a per-thread buffer set by loom_fail(); the code
 * that detects a problem writes the message once, callers only pass the status
 * up. Messages name the file, flag or numbers involved: "tp=3 does not divide
 * n_head=8", not "invalid layout".
 */
#ifndef LOOM_STATUS_H
#define LOOM_STATUS_H

#include <stdarg.h>

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_EUSAGE = 64,       /* bad flag or layout on the command line */
    LOOM_EDATA = 65,        /* malformed input data, or a non-finite loss */
    LOOM_ENOINPUT = 66,     /* an input file is missing or unreadable */
    LOOM_EUNAVAIL = 69,     /* a communication failure (MPI) */
    LOOM_EINTERNAL = 70,    /* a bug in loom: an invariant did not hold */
    LOOM_EOS = 71,          /* out of memory or another OS failure */
    LOOM_ECANTCREAT = 73,   /* an output file cannot be created */
    LOOM_EIO = 74,          /* read or write failed part way */
    LOOM_EINTERRUPTED = 75, /* stopped by SIGTERM/SIGINT after saving a checkpoint (EX_TEMPFAIL: resume) */
    LOOM_ECONFIG = 78,      /* a config file has unknown keys or wrong types */
} loom_status;

/* Record the message for the current failure and return `st` (so callers can
 * write `return loom_fail(LOOM_EDATA, "...", ...)`). printf-style. */
loom_status loom_fail(loom_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
loom_status loom_failv(loom_status st, const char *fmt, va_list ap);

/* The message of the most recent loom_fail() on this thread ("" if none). */
const char *loom_errmsg(void);
/* Forget the last message. */
void loom_clear_error(void);
/* A short name for a status: "usage", "data", "config", ... */
const char *loom_status_name(loom_status st);

/* Propagate a failure: LOOM_TRY(f(x)); returns the status if not LOOM_OK. */
#define LOOM_TRY(expr)                                                                                       \
    do {                                                                                                     \
        loom_status loom_try_st_ = (expr);                                                                   \
        if (loom_try_st_ != LOOM_OK) return loom_try_st_;                                                    \
    } while (0)

#endif
