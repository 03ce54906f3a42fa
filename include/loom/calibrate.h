/* calibrate.h - the peak loom's MFU is measured against.
 *
 * Two peaks per thread count and precision: the best rate the chosen GEMM
 * kernel reaches on this machine (best of several trials of 1024^3, 2048^3 and 2048x2304x768, threaded
 * as the model's matmuls are: OpenBLAS's sgemm for fp32, the bf16 provider
 * for bf16), and the FMA peak from a measured FMA rate and clock (loom/cpu.h). Each record names the CPU, its flags and the kernel it was
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
    int bf16;              /* the record of bf16 products (the bf16 GEMM provider) */
    double sgemm_flops;    /* best GEMM FLOP/s on `threads` threads (sgemm, or the bf16 provider's) */
    double fma_flops;      /* flop/cycle x clock x threads */
    double clock_hz;       /* measured when the record was made */
    double flop_per_cycle; /* per core, measured (loom_cpu_flop_per_cycle_measured; x2 for VDPBF16PS) */
    int trials;            /* sgemm trials the best was taken from */
    char cpu[64], flags[160], kernel[160];
    int from_cache;  /* read from the cache, not measured now */
    char path[1024]; /* the cache file */
} loom_peak;

/* The record for this CPU, kernel and `threads`: from the cache, or (when
 * absent, different, or force) measured now on `threads` kernel threads and
 * written to the cache (best effort). Restores the thread setting. */
loom_status loom_peak_get(int threads, int force, int bf16, loom_peak *out);

#endif
