/* cpu_backend.c - the CPU backend's table: host memory as device memory,
 * synchronous streams and events, and the loom_cpu_* kernels of
 * src/kernels/cpu.
 *
 * Device memory is the arenas' host memory (loom_host_alloc: zeroed, aligned,
 * large blocks mapped from zero pages), so memory use and peak RSS are what
 * they were before the backend table. Every operation runs to completion
 * before it returns, so a stream is only a name and an event is always
 * complete: order is kept trivially. Local to the calling rank.
 */
#include <stdint.h>
#include <string.h>

#include "loom/arena.h"
#include "loom/backend.h"
#include "kernels/cpu/cpu_kernels.h"

/* A copy onto itself (a TP region at degree 1 passes the same buffer) is a no-op. */
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memcpy(dst, src, bytes);
}
/* Zeroing whole floats (gradients before a step) is shared out over the
 * compute threads; anything else is one memset. */
static void cpu_memset(void *dst, int byte, size_t bytes) {
    if (byte == 0 && bytes % sizeof(float) == 0 && (uintptr_t)dst % sizeof(float) == 0)
        loom_cpu_zero(dst, bytes / sizeof(float));
    else if (bytes)
        memset(dst, byte, bytes);
}

/* One dummy object each: a CPU stream or event has no state. */
static char cpu_stream_obj, cpu_event_obj;

static loom_status cpu_stream_create(loom_stream **out) {
    *out = (loom_stream *)&cpu_stream_obj;
    return LOOM_OK;
}
static void cpu_stream_destroy(loom_stream *s) { (void)s; }
static void cpu_stream_sync(loom_stream *s) { (void)s; }
static loom_status cpu_event_create(loom_event **out) {
    *out = (loom_event *)&cpu_event_obj;
    return LOOM_OK;
}
static void cpu_event_destroy(loom_event *e) { (void)e; }
static void cpu_event_record(loom_event *e, loom_stream *s) {
    (void)e;
    (void)s;
}
static void cpu_stream_wait_event(loom_stream *s, loom_event *e) {
    (void)s;
    (void)e;
}
static void cpu_event_sync(loom_event *e) { (void)e; }

const loom_backend loom_backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = loom_host_alloc,
    .free = loom_host_free,
    .memcpy_h2d = cpu_copy,
    .memcpy_d2h = cpu_copy,
    .memcpy_d2d = cpu_copy,
    .memset = cpu_memset,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .set_precision = loom_kernels_set_precision,
    .gemm_keep = loom_cpu_gemm_keep,
    .gemm_unkeep = loom_cpu_gemm_unkeep,
    LOOM_BACKEND_KERNELS(loom_cpu_),
    .add = loom_cpu_add,
    .add2 = loom_cpu_add2,
    .add_bias_residual = loom_cpu_add_bias_residual,
    .colsum_acc = loom_cpu_colsum_acc,
    .sum_acc = loom_cpu_sum_acc,
    .softmax_lse = loom_cpu_softmax_lse,
    .topk_gate = loom_cpu_topk_gate,
    .topk_gate_bwd = loom_cpu_topk_gate_bwd,
    .gather_rows = loom_cpu_gather_rows,
    .scatter_add_rows = loom_cpu_scatter_add_rows,
    .combine_rows = loom_cpu_combine_rows,
    .combine_rows_bwd = loom_cpu_combine_rows_bwd,
    .fill = loom_cpu_fill,
    .vxent_local = loom_cpu_vxent_local,
    .vxent_local_grad = loom_cpu_vxent_local_grad,
    .adamw_update_zero = loom_cpu_adamw_update_zero,
    .gemm_keeps_bf16 = loom_cpu_gemm_keeps_bf16,
    .gemm_keep_fill = loom_cpu_gemm_keep_fill,
    .gemm_keep_filled = loom_cpu_gemm_keep_filled,
};
