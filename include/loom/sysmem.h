/* sysmem.h - this process's memory as the operating system counts it.
 *
 * The independent side of loom's memory accounting: the arenas say what
 * loom planned, this says what the kernel made resident (Linux
 * /proc/self/status: VmHWM, the peak resident set). Local; not collective;
 * no allocation.
 */
#ifndef LOOM_SYSMEM_H
#define LOOM_SYSMEM_H

#include <stddef.h>

/* Peak resident bytes of this process so far (VmHWM); 0 where unknown. */
size_t loom_sysmem_peak_rss(void);

/* Seconds since this process started (the kernel's start time in
 * /proc/self/stat, clock ticks, against CLOCK_BOOTTIME; exec and a re-exec
 * included); -1 where unknown. */
double loom_sysmem_process_age(void);

/* CPU seconds (user + system, all threads) this process has used so far;
 * -1 where unknown. Beside the wall time above it tells start-up's own cost
 * from the wait for a busy machine's cores. */
double loom_sysmem_process_cpu(void);

#endif
