/* backend.c - the kernels of include/loom/kernels.h as thin dispatchers to
 * the device's backend, and the check that a backend table is complete.
 *
 * Both are generated from include/loom/kernel_list.h. A kernel call costs
 * one indirect call (the table's entry, with the device's context first);
 * nothing here runs per element. Local to the calling rank; nothing is
 * collective.
 */
#include "loom/backend.h"

#include <stddef.h>

#include "loom/device.h"

/* ---- kernels.h: each kernel is the device's backend's ---------------------- */

/* A required kernel: the entry's value. */
#define LOOM_DISPATCH_REQUIRED(ret, name, params, args)                                                      \
    ret loom_##name(loom_device *dev, LOOM_UNPACK params) {                                                  \
        LOOM_KERNEL_RETURN_##ret dev->be->name(dev->ctx, LOOM_UNPACK args);                                  \
    }
/* An optional kernel: 1 when the backend ran it, 0 when it has none. */
#define LOOM_DISPATCH_OPTIONAL(ret, name, params, args)                                                      \
    int loom_##name(loom_device *dev, LOOM_UNPACK params) {                                                  \
        if (!dev->be->name) return 0;                                                                        \
        dev->be->name(dev->ctx, LOOM_UNPACK args);                                                           \
        return 1;                                                                                            \
    }
#define LOOM_KERNEL(ret, name, params, args, need) LOOM_DISPATCH_##need(ret, name, params, args)
#include "loom/kernel_list.h"
#undef LOOM_KERNEL

int loom_gemm_keeps_bf16(loom_device *dev) { return dev->be->gemm_keeps_bf16(dev->ctx); }

/* ---- completeness ------------------------------------------------------------ */

/* The entries that are not kernels, by name. */
/* clang-format off */
#define BE_ENTRIES(X)                                                                            \
    X(ctx_create) X(ctx_free) X(alloc) X(free) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d)         \
    X(memset) X(stream_create) X(stream_destroy) X(stream_sync) X(event_create) X(event_destroy) \
    X(event_record) X(stream_wait_event) X(event_sync) X(gemm_keeps_bf16)
/* clang-format on */

#define LOOM_KERNEL_NEEDED_REQUIRED 1
#define LOOM_KERNEL_NEEDED_OPTIONAL 0

const char *loom_backend_missing_entry(const loom_backend *t) {
    if (!t->name) return "name";
#define BE_CHECK(e)                                                                                          \
    if (!t->e) return #e;
    BE_ENTRIES(BE_CHECK)
#undef BE_CHECK
#define LOOM_KERNEL(ret, name, params, args, need)                                                           \
    if (LOOM_KERNEL_NEEDED_##need && !t->name) return #name;
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
    return NULL;
}
