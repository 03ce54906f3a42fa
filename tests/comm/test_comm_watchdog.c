/* test_comm_watchdog.c - the hang watchdog (LOOM_COMM_TIMEOUT).
 *
 *   test_comm_watchdog bad-env   one process: a malformed LOOM_COMM_TIMEOUT
 *                                makes loom_comm_init fail with LOOM_EUSAGE
 *   test_comm_watchdog default   one process: with LOOM_COMM_TIMEOUT unset the
 *                                watchdog is on with 600 s
 *   test_comm_watchdog off       one process: LOOM_COMM_TIMEOUT=0 turns it off
 *   test_comm_watchdog recv      two barriers, then every rank receives a
 *                                message nobody sends
 *   test_comm_watchdog wait      the same through irecv + wait
 *
 *   test_comm_watchdog stall     with LOOM_COMM_FAULT=stall-start: an
 *                                iallreduce whose start the watch thread
 *                                never makes (as if MPI never returned from
 *                                it); the caller's wait must report it
 *
 * In the recv and wait modes the job must abort with "rank R: recv on group world
 * (call #3 on that group) has not completed after N s" - #3 proves the
 * sequence number counts the group's earlier calls; CTest matches that line,
 * so the test
 * passes by hanging and being stopped, never by returning. Collective over
 * the world in those modes.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/comm.h"

static int test_bad_env(void) {
    setenv("LOOM_COMM_TIMEOUT", "ten", 1);
    loom_comm *w = NULL;
    loom_status st = loom_comm_init(NULL, NULL, &w);
    CHECK(st == LOOM_EUSAGE, "init with LOOM_COMM_TIMEOUT=ten returned %d", st);
    CHECK(strstr(loom_errmsg(), "LOOM_COMM_TIMEOUT='ten'") != NULL, "message: %s", loom_errmsg());
    CHECK(w == NULL, "no world on failure");
    return check_done();
}

static int test_default(void) {
    unsetenv("LOOM_COMM_TIMEOUT");
    loom_comm *w = NULL;
    CHECK(loom_comm_init(NULL, NULL, &w) == LOOM_OK, "init: %s", loom_errmsg());
    CHECK(loom_comm_timeout() == 600.0, "default timeout %g s, want 600", loom_comm_timeout());
    CHECK(loom_comm_barrier(w) == LOOM_OK, "barrier with the watchdog on: %s", loom_errmsg());
    loom_comm_finalize(w);
    return check_done();
}

static int test_off(void) {
    setenv("LOOM_COMM_TIMEOUT", "0", 1);
    loom_comm *w = NULL;
    CHECK(loom_comm_init(NULL, NULL, &w) == LOOM_OK, "init: %s", loom_errmsg());
    CHECK(loom_comm_timeout() == 0.0, "LOOM_COMM_TIMEOUT=0 gave %g s", loom_comm_timeout());
    CHECK(loom_comm_barrier(w) == LOOM_OK, "barrier with the watchdog off: %s", loom_errmsg());
    loom_comm_finalize(w);
    return check_done();
}

static int hang(int argc, char **argv, int nonblocking) {
    loom_comm *w = NULL;
    if (loom_comm_init(&argc, &argv, &w) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_errmsg());
        return 1;
    }
    int x = 0, from = (loom_comm_rank(w) + 1) % loom_comm_size(w);
    if (loom_comm_barrier(w) != LOOM_OK || loom_comm_barrier(w) != LOOM_OK) return 1;
    if (nonblocking == 2) {
        loom_req *req = NULL;
        if (loom_comm_iallreduce(w, &x, 1, LOOM_I32, LOOM_SUM, &req) == LOOM_OK) loom_comm_wait(req);
    } else if (nonblocking) {
        loom_req *req = NULL;
        if (loom_comm_irecv(w, &x, sizeof x, from, 42, &req) == LOOM_OK) loom_comm_wait(req);
    } else {
        loom_comm_recv(w, &x, sizeof x, from, 42);
    }
    fprintf(stderr, "the watchdog did not fire\n");
    loom_comm_finalize(w);
    return 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "bad-env") == 0) return test_bad_env();
    if (strcmp(mode, "default") == 0) return test_default();
    if (strcmp(mode, "off") == 0) return test_off();
    if (strcmp(mode, "recv") == 0) return hang(argc, argv, 0);
    if (strcmp(mode, "wait") == 0) return hang(argc, argv, 1);
    if (strcmp(mode, "stall") == 0) return hang(argc, argv, 2);
    fprintf(stderr, "usage: test_comm_watchdog bad-env|default|off|recv|wait|stall\n");
    return 64;
}
