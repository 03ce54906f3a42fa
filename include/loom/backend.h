/* backend.h - the compute backend table: the context, device memory, streams
 * and events, and every kernel, behind one table of function pointers per
 * backend.
 *
 * A backend fills one `loom_backend` with designated initializers (the CPU
 * table is src/backend/cpu_backend.c, the kernels it points to are the
 * loom_cpu_* functions of src/kernels/cpu). A device (device.h) is a table
 * plus the context its ctx_create made; every entry after ctx_create takes
 * that context first. Kernel entries are generated from kernel_list.h and
 * take, after the context, exactly the parameters listed there; every tensor
 * pointer is a device pointer of that backend, host pointers are named so
 * (`host`). Kernels and tensor ops return void and trust their shapes, as
 * kernels.h says; they are ordered on the backend's default stream (the CPU
 * backend runs them synchronously).
 *
 * Every entry is required (none may be NULL), except the kernels
 * kernel_list.h marks OPTIONAL and comm_native. Model, parallel, pipeline and train code
 * never call the table: they call kernels.h's loom_<kernel>(dev, ...) and
 * device.h's tensor ops. See docs/backends.md.
 */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/status.h"

/* Opaque per-backend handles (the CPU backend's are dummies). */
typedef struct loom_stream loom_stream;
typedef struct loom_event loom_event;

typedef struct loom_backend {
    const char *name; /* "cpu", "cuda", ... as --device spells it */
    /* 1 when device memory is host memory (the CPU): host code may then fill
     * it in place (parameter init) instead of staging and uploading. */
    int host_memory;

    /* ---- the context ---- */
    /* Sets dev->ctx to a new context for dev->threads and dev->bf16 (it may
     * settle dev->threads: the CPU's 0 becomes the online CPUs);
     * LOOM_EOS without memory, the backend's status when its device cannot
     * be used. ctx_free takes it back (NULL: nothing). */
    loom_status (*ctx_create)(loom_device *dev);
    void (*ctx_free)(void *ctx);

    /* ---- device memory ---- */
    /* bytes of ZEROED device memory, aligned to at least 64 bytes; NULL when
     * it cannot be had. free takes the same size back (p may be NULL). */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p, size_t bytes);
    void (*memcpy_h2d)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*memcpy_d2h)(void *ctx, void *host_dst, const void *src, size_t bytes);
    /* dst == src (a no-op) or regions that do not overlap */
    void (*memcpy_d2d)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*memset)(void *ctx, void *dst, int byte, size_t bytes);

    /* ---- streams and events (CPU: synchronous, so these keep order trivially) ---- */
    loom_status (*stream_create)(void *ctx, loom_stream **out);
    void (*stream_destroy)(void *ctx, loom_stream *s);
    void (*stream_sync)(void *ctx, loom_stream *s); /* NULL: the default stream */
    loom_status (*event_create)(void *ctx, loom_event **out);
    void (*event_destroy)(void *ctx, loom_event *e);
    void (*event_record)(void *ctx, loom_event *e, loom_stream *s);
    void (*stream_wait_event)(void *ctx, loom_stream *s, loom_event *e); /* s waits, the host does not */
    void (*event_sync)(void *ctx, loom_event *e);                        /* the host waits */

    /* loom_gemm_keeps_bf16 (kernels.h) */
    int (*gemm_keeps_bf16)(void *ctx);

    /* ---- communication (OPTIONAL: may be NULL) ---- */
    /* A group of the backend's own collective library over the ranks of
     * host_group (an MPI group on host memory, which the new group owns on
     * success: loom_comm_wrap_staged's contract) on buffers of mem: the
     * CUDA backend's NCCL groups (comm.h: loom_comm_wrap_nccl). Collective
     * over host_group. The device's communicator factory calls it when
     * native groups are asked for (device.h: LOOM_DEVICE_COMM_NATIVE);
     * NULL when this build of the backend has none. */
    loom_status (*comm_native)(void *ctx, loom_comm *host_group, const loom_comm_mem *mem, loom_comm **out);

    /* ---- kernels: kernel_list.h, each with the context first ---- */
#define LOOM_KERNEL(ret, name, params, args, need) ret (*name)(void *ctx, LOOM_UNPACK params);
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
} loom_backend;

/* The CPU backend (always built). */
extern const loom_backend loom_backend_cpu;

/* The first entry of t that is NULL but must not be ("name" for a missing
 * name), or NULL when the table is complete. */
const char *loom_backend_missing_entry(const loom_backend *t);

#endif
