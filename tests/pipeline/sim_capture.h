/* sim_capture.h - run `loom sim` in-process (tools/cmd_sim.c linked into the
 * test) and capture what it prints. */
#ifndef LOOM_TESTS_SIM_CAPTURE_H
#define LOOM_TESTS_SIM_CAPTURE_H

/* stdout and stderr of the last sim() call, NUL-terminated. */
extern char sim_out[1 << 17];

/* Run `loom sim ARGS...` (NULL-terminated); returns its exit code. */
int sim(const char *first, ...);

#endif
