/* device.h - the device: one backend's compute table and its context, made
 * once and handed explicitly to everything that computes.
 *
 * A device is what --device, --threads and --precision say: the backend
 * table (backend.h) and the context its ctx_create made - on the CPU the
 * thread count, the GEMM precision, the kept bf16 operands and the kernels'
 * scratch (src/kernels/cpu/cpu_kernels.h: loom_cpu_ctx); on CUDA its cuBLAS
 * handles, precision and scratch. The CLI creates it once (tools/), before
 * any model memory, and passes it down: to the model part
 * (loom_model_part.dev), the TP and CP regions (loom_tp.dev, loom_cp.dev),
 * the engines that drive a part (through the part), arenas
 * (loom_device_arena_init), inference, calibration, serve. Every kernel
 * (kernels.h) and tensor op (below) takes it first. Nothing in loom keeps a
 * current device: two devices (a test comparing two thread counts) live side
 * by side. Memory of one device must never be handed to another.
 *
 * A device's kernels run from one host thread at a time (its scratch is
 * shared by its kernels). Creation and everything here are local to the
 * calling rank; nothing is collective.
 */
#ifndef LOOM_DEVICE_H
#define LOOM_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "loom/arena.h"
#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/status.h"

typedef struct loom_device_opts {
    const char *name; /* "cpu" (NULL or "" too) or "cuda", as --device spells it */
    int threads;      /* compute threads (the CPU's); 0: one per online CPU */
    int bf16;         /* GEMM precision: 0 fp32; 1 bf16 operands, fp32 accumulation */
} loom_device_opts;

/* Read-only after creation. */
struct loom_device {
    const loom_backend *be; /* the compute table */
    void *ctx;              /* its context, owned: the first argument of every entry */
    int threads;            /* compute threads (settled: never 0) */
    int bf16;               /* GEMM precision as created */
    loom_comm_mem comm_mem; /* the communicator's memory ops on it (loom_device_comm_mem) */
};

/* The device named by o->name, for o->threads and o->bf16. LOOM_EUSAGE
 * (exit 64) for a name no build knows, and for a backend this build left
 * out (the message names what is missing: "cuda" in a build without the
 * CUDA backend, or no visible CUDA device); LOOM_EOS without memory. */
loom_status loom_device_create(const loom_device_opts *o, loom_device **out);
/* The same with a table of one's own (a test's); LOOM_EINTERNAL naming
 * the first NULL entry of an incomplete table. */
loom_status loom_device_create_with(const loom_backend *be, const loom_device_opts *o, loom_device **out);
/* Frees the context and the device (NULL: nothing). Memory from it must be
 * freed first. */
void loom_device_free(loom_device *dev);

/* An arena (arena.h) whose one allocation is dev's memory. */
void loom_device_arena_init(const loom_device *dev, loom_arena *a, const char *name);

/* ---- the communicator's hook -------------------------------------------------
 * What a communicator needs of the device whose buffers it moves (comm.h's
 * loom_comm_mem): allocation, copies between its memory and the host
 * (host-staged MPI groups), and bf16 conversion in its own memory with the
 * device's kernels (bf16 communication). Valid while dev lives. */
const loom_comm_mem *loom_device_comm_mem(const loom_device *dev);

/* ---- device memory outside arenas (zeroed; NULL when it cannot be had) ---- */
static inline void *loom_device_alloc(loom_device *dev, size_t bytes) {
    return dev->be->alloc(dev->ctx, bytes);
}
static inline void loom_device_release(loom_device *dev, void *p, size_t bytes) {
    dev->be->free(dev->ctx, p, bytes);
}
/* bytes from device memory to device memory (dst == src, or apart) */
static inline void loom_device_copy(loom_device *dev, void *dst, const void *src, size_t bytes) {
    dev->be->memcpy_d2d(dev->ctx, dst, src, bytes);
}

/* ---- tensor copies (the other tensor ops are kernels: kernel_list.h) ------ */
static inline void loom_tensor_copy(loom_device *dev, float *dst, const float *src, size_t n) {
    dev->be->memcpy_d2d(dev->ctx, dst, src, n * sizeof(float));
}
static inline void loom_tensor_zero(loom_device *dev, float *x, size_t n) {
    dev->be->memset(dev->ctx, x, 0, n * sizeof(float));
}
/* Token ids and index lists (int32) from device to device, up and down. */
static inline void loom_tensor_copy_i32(loom_device *dev, int32_t *dst, const int32_t *src, size_t n) {
    dev->be->memcpy_d2d(dev->ctx, dst, src, n * sizeof(int32_t));
}
static inline void loom_tensor_upload_i32(loom_device *dev, int32_t *dst, const int32_t *host, size_t n) {
    dev->be->memcpy_h2d(dev->ctx, dst, host, n * sizeof(int32_t));
}
static inline void loom_tensor_download_i32(loom_device *dev, int32_t *host, const int32_t *src, size_t n) {
    dev->be->memcpy_d2h(dev->ctx, host, src, n * sizeof(int32_t));
}
static inline void loom_tensor_upload(loom_device *dev, float *dst, const float *host, size_t n) {
    dev->be->memcpy_h2d(dev->ctx, dst, host, n * sizeof(float));
}
static inline void loom_tensor_download(loom_device *dev, float *host, const float *src, size_t n) {
    dev->be->memcpy_d2h(dev->ctx, host, src, n * sizeof(float));
}

#endif
