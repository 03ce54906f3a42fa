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

#endif
