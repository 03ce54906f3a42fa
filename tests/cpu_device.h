/* cpu_device.h - the CPU device a C test runs its kernels on
 * (include/loom/device.h): made for `threads` threads (0: one per online
 * CPU) and GEMM precision bf16 or fp32. A test that cannot make
 * one stops at once with the reason (exit 1). */
#ifndef LOOM_TESTS_CPU_DEVICE_H
#define LOOM_TESTS_CPU_DEVICE_H

#include <stdio.h>
#include <stdlib.h>

#include "loom/device.h"

static inline loom_device *test_cpu_device(int threads, int bf16) {
    const loom_device_opts o = {.name = "cpu", .threads = threads, .bf16 = bf16};
    loom_device *dev = NULL;
    if (loom_device_create(&o, &dev) != LOOM_OK) {
        fprintf(stderr, "cannot make a CPU device: %s\n", loom_errmsg());
        exit(1);
    }
    return dev;
}

#endif
