/* cpu_backend.c - the CPU backend's table: its context (loom_cpu_ctx),
 * host memory as device memory, synchronous streams and events, and the
 * loom_cpu_* kernels of src/kernels/cpu.
 *
 * Device memory is the arenas' host memory (loom_host_alloc: zeroed, aligned,
 * large blocks mapped from zero pages), so memory use and peak RSS are what
 * they were before the backend table. Every operation runs to completion
 * before it returns, so a stream is only a name and an event is always
 * complete: order is kept trivially. The kernel entries are generated from
 * include/loom/kernel_list.h. Local to the calling rank.
 */
#include <stdint.h>
#include <string.h>

#include "loom/arena.h"
#include "loom/device.h"
#include "kernels/cpu/cpu_kernels.h"

static loom_status cpu_ctx_create(loom_device *dev) {
    loom_cpu_ctx *c = loom_cpu_ctx_create(dev->threads, dev->bf16);
    if (!c) return loom_fail(LOOM_EOS, "out of memory for a CPU device");
    dev->ctx = c;
    dev->threads = c->threads;
    return LOOM_OK;
}
static void cpu_ctx_free(void *ctx) { loom_cpu_ctx_free(ctx); }

static void *cpu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return loom_host_alloc(bytes);
}
static void cpu_free(void *ctx, void *p, size_t bytes) {
    (void)ctx;
    loom_host_free(p, bytes);
}
/* A copy onto itself (a TP region at degree 1 passes the same buffer) is a no-op. */
static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes && dst != src) memcpy(dst, src, bytes);
}
/* Zeroing whole floats (gradients before a step) is shared out over the
 * compute threads; anything else is one memset. */
static void cpu_memset(void *ctx, void *dst, int byte, size_t bytes) {
    if (byte == 0 && bytes % sizeof(float) == 0 && (uintptr_t)dst % sizeof(float) == 0)
        loom_cpu_zero(ctx, dst, bytes / sizeof(float));
    else if (bytes) memset(dst, byte, bytes);
}

/* One dummy object each: a CPU stream or event has no state. */
static char cpu_stream_obj, cpu_event_obj;

static loom_status cpu_stream_create(void *ctx, loom_stream **out) {
    (void)ctx;
    *out = (loom_stream *)&cpu_stream_obj;
    return LOOM_OK;
}
static void cpu_stream_op(void *ctx, loom_stream *s) { (void)ctx, (void)s; }
static loom_status cpu_event_create(void *ctx, loom_event **out) {
    (void)ctx;
    *out = (loom_event *)&cpu_event_obj;
    return LOOM_OK;
}
static void cpu_event_op(void *ctx, loom_event *e) { (void)ctx, (void)e; }
static void cpu_event_record(void *ctx, loom_event *e, loom_stream *s) { (void)ctx, (void)e, (void)s; }
static void cpu_stream_wait_event(void *ctx, loom_stream *s, loom_event *e) { (void)ctx, (void)s, (void)e; }

const loom_backend loom_backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .ctx_create = cpu_ctx_create,
    .ctx_free = cpu_ctx_free,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy_h2d = cpu_copy,
    .memcpy_d2h = cpu_copy,
    .memcpy_d2d = cpu_copy,
    .memset = cpu_memset,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_op,
    .stream_sync = cpu_stream_op,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_op,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_op,
    .gemm_keeps_bf16 = loom_cpu_gemm_keeps_bf16,
#define LOOM_KERNEL(ret, name, params, args, need) .name = loom_cpu_##name,
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
};
