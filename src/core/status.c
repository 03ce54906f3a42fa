/* status.c - the per-thread error message behind loom_status. Not collective. */
#include "loom/status.h"

#include <stdio.h>

static _Thread_local char loom_msg_[2048];

loom_status loom_failv(loom_status st, const char *fmt, va_list ap) {
    vsnprintf(loom_msg_, sizeof loom_msg_, fmt, ap);
    return st;
}

loom_status loom_fail(loom_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    loom_failv(st, fmt, ap);
    va_end(ap);
    return st;
}

const char *loom_errmsg(void) { return loom_msg_; }

void loom_clear_error(void) { loom_msg_[0] = '\0'; }

const char *loom_status_name(loom_status st) {
    switch (st) {
    case LOOM_OK: return "ok";
    case LOOM_EUSAGE: return "usage";
    case LOOM_EDATA: return "data";
    case LOOM_ENOINPUT: return "no input";
    case LOOM_EUNAVAIL: return "communication";
    case LOOM_EINTERNAL: return "internal";
    case LOOM_EOS: return "os";
    case LOOM_ECANTCREAT: return "cannot create";
    case LOOM_EIO: return "io";
    case LOOM_EINTERRUPTED: return "interrupted";
    case LOOM_ECONFIG: return "config";
    }
    return "unknown";
}
