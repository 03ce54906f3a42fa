/* sysmem.h - this process's memory as the operating system counts it.
 *
 * The independent side of loom's memory accounting: the arenas say what
 * loom planned, these say what the kernel made resident (Linux
 * /proc/self/status: VmHWM, the peak resident set, and VmRSS, the current
 * one). Local; not collective; no allocation.
 */
#ifndef LOOM_SYSMEM_H
#define LOOM_SYSMEM_H

#include <stddef.h>

/* Peak resident bytes of this process so far (VmHWM); 0 where unknown. */
size_t loom_sysmem_peak_rss(void);
/* Resident bytes now (VmRSS); 0 where unknown. */
size_t loom_sysmem_rss(void);

#endif
