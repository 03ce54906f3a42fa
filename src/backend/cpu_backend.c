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
#include <string.h>

#include "loom/arena.h"
#include "loom/backend.h"
#include "kernels/cpu/cpu_kernels.h"

static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}
static void cpu_memset(void *dst, int byte, size_t bytes) {
    if (bytes) memset(dst, byte, bytes);
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
    .layernorm_fwd = loom_cpu_layernorm_fwd,
    .layernorm_bwd = loom_cpu_layernorm_bwd,
    .matmul_fwd = loom_cpu_matmul_fwd,
    .matmul_bwd = loom_cpu_matmul_bwd,
    .matmul_nt_fwd = loom_cpu_matmul_nt_fwd,
    .matmul_nt_bwd = loom_cpu_matmul_nt_bwd,
    .gelu_fwd = loom_cpu_gelu_fwd,
    .gelu_bwd = loom_cpu_gelu_bwd,
    .residual_fwd = loom_cpu_residual_fwd,
    .residual_bwd = loom_cpu_residual_bwd,
    .attention_fwd = loom_cpu_attention_fwd,
    .attention_bwd = loom_cpu_attention_bwd,
    .attention_part_fwd = loom_cpu_attention_part_fwd,
    .attention_part_bwd = loom_cpu_attention_part_bwd,
    .attention_merge = loom_cpu_attention_merge,
    .attention_kv_fwd = loom_cpu_attention_kv_fwd,
    .embed_fwd = loom_cpu_embed_fwd,
    .embed_bwd = loom_cpu_embed_bwd,
    .pos_fwd = loom_cpu_pos_fwd,
    .pos_bwd = loom_cpu_pos_bwd,
    .vxent_max = loom_cpu_vxent_max,
    .vxent_exp = loom_cpu_vxent_exp,
    .vxent_finish = loom_cpu_vxent_finish,
    .vxent_bwd = loom_cpu_vxent_bwd,
    .adamw_update = loom_cpu_adamw_update,
    .sumsq = loom_cpu_sumsq,
    .scale = loom_cpu_scale,
    .all_finite = loom_cpu_all_finite,
    .round_bf16 = loom_cpu_round_bf16,
    .add = loom_cpu_add,
    .add2 = loom_cpu_add2,
    .add_bias_residual = loom_cpu_add_bias_residual,
    .colsum_acc = loom_cpu_colsum_acc,
    .sum_acc = loom_cpu_sum_acc,
};
