/* comm_test.h - the start and end every communicator test shares. */
#ifndef LOOM_TESTS_COMM_TEST_H
#define LOOM_TESTS_COMM_TEST_H

#include <stdio.h>

#include "check.h"
#include "loom/comm.h"

/* The world, or NULL (message printed). */
static inline loom_comm *comm_test_start(int *argc, char ***argv) {
    loom_comm *w = NULL;
    if (loom_comm_init(argc, argv, &w) != LOOM_OK) fprintf(stderr, "init: %s\n", loom_errmsg());
    return w;
}

/* The exit code: 1 if any rank saw a failure (collective), after
 * finalizing the world. */
static inline int comm_test_end(loom_comm *world) {
    int failed = check_failed_;
    loom_comm_allreduce(world, &failed, 1, LOOM_I32, LOOM_SUM);
    if (loom_comm_rank(world) == 0) printf("failures on all %d ranks: %d\n", loom_comm_size(world), failed);
    int local = check_done();
    loom_comm_finalize(world);
    return failed || local ? 1 : 0;
}

#endif
