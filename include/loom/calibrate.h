/* calibrate.h - the peak loom's MFU is measured against.
 *
 * Two peaks per thread count: the best sgemm rate the chosen GEMM kernel
 * reaches on this machine (best of several trials of 1024^3, threaded as the
 * model's matmuls are), and the FMA peak from the flags and a measured clock
 * (loom/cpu.h). Each record names the CPU, its flags and the kernel it was
 * measured with, and is cached in $XDG_CACHE_HOME/loom (or ~/.cache/loom)
 * under a name derived from all of them, so a different CPU or kernel (the
 * machines change between sessions) is measured afresh, never read from a
 * stale file. Local; rank 0 calls it and broadcasts (train/calibrate.c).
 */
#ifndef LOOM_CALIBRATE_H
#define LOOM_CALIBRATE_H

#include "loom/status.h"

typedef struct loom_peak {
    int threads;
    double sgemm_flops; /* best sgemm FLOP/s on `threads` threads */
    double fma_flops;   /* flop/cycle x clock x threads */
    double clock_hz;    /* measured when the record was made */
    int trials;         /* sgemm trials the best was taken from */
    char cpu[64], flags[160], kernel[96];
    int from_cache;     /* read from the cache, not measured now */
    char path[1024];    /* the cache file */
} loom_peak;

/* The record for this CPU, kernel and `threads`: from the cache, or (when
 * absent, different, or force) measured now on `threads` kernel threads and
 * written to the cache (best effort). Restores the thread setting. */
loom_status loom_peak_get(int threads, int force, loom_peak *out);

#endif
