/* device.h - the device: one backend's compute table and its context, and
 * the factory of the communication groups that move its memory; made once
 * and handed explicitly to everything that computes or communicates.
 *
 * A device is what --device, --threads and --precision say: the backend
 * table (backend.h) and the context its ctx_create made - on the CPU the
 * thread count, the GEMM precision, the kept bf16 operands and the kernels'
 * scratch (src/kernels/cpu/cpu_kernels.h: loom_cpu_ctx); on CUDA its cuBLAS
 * handles, precision and scratch - plus which implementation of loom_comm
 * its groups get (LOOM_DEVICE_COMM; loom_device_comm_split below). The CLI
 * creates it once (tools/), before any model memory, and passes it down: to
 * the mesh (mesh.h: every group of the run), to the model part
 * (loom_model_part.dev), the TP and CP regions (loom_tp.dev, loom_cp.dev),
 * the engines that drive a part (through the part), arenas
 * (loom_device_arena_init), inference, calibration, serve. Every kernel
 * (kernels.h) and tensor op (below) takes it first. Nothing in loom keeps a
 * current device: two devices (a test comparing two thread counts) live side
 * by side. Memory of one device must never be handed to another.
 *
 * A device's kernels run from one host thread at a time (its scratch is
 * shared by its kernels). Creation and everything here are local to the
 * calling rank, except loom_device_comm_split (collective over its parent).
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

/* Which implementation of loom_comm (comm.h) the device gives the groups
 * it makes (loom_device_comm_split below). */
typedef enum loom_device_comm {
    LOOM_DEVICE_COMM_AUTO,   /* MPI on a host-memory device (the CPU), host-staged otherwise */
    LOOM_DEVICE_COMM_MPI,    /* MPI groups on the device's buffers: host memory, or device
                                memory under a CUDA-aware MPI (the user's promise) */
    LOOM_DEVICE_COMM_STAGED, /* host-staged MPI groups: work with any device and any MPI,
                                several ranks on one GPU included */
    LOOM_DEVICE_COMM_NATIVE, /* the backend's own library (the table's comm_native: NCCL for
                                CUDA), one GPU per rank */
    LOOM_DEVICE_COMM_COUNT
} loom_device_comm;

typedef struct loom_device_opts {
    const char *name;      /* "cpu" (NULL or "" too) or "cuda", as --device spells it */
    int threads;           /* compute threads (the CPU's); 0: one per online CPU */
    int bf16;              /* GEMM precision: 0 fp32; 1 bf16 operands, fp32 accumulation */
    loom_device_comm comm; /* its groups' implementation; 0 is AUTO */
} loom_device_opts;

/* Read-only after creation. */
struct loom_device {
    const loom_backend *be; /* the compute table */
    void *ctx;              /* its context, owned: the first argument of every entry */
    int threads;            /* compute threads (settled: never 0) */
    int bf16;               /* GEMM precision as created */
    loom_device_comm comm;  /* its groups' implementation (settled: never AUTO) */
    loom_comm_mem comm_mem; /* the communicator's memory ops on it (loom_device_comm_mem) */
};

/* The device named by o->name, for o->threads, o->bf16 and o->comm.
 * LOOM_EUSAGE (exit 64) for a name no build knows, for a backend this build
 * left out (the message names what is missing: "cuda" in a build without
 * the CUDA backend, or no visible CUDA device), and for native groups on a
 * backend without a library of its own; LOOM_EOS without memory. */
loom_status loom_device_create(const loom_device_opts *o, loom_device **out);
/* The same with a table of one's own (a test's); LOOM_EINTERNAL naming
 * the first NULL entry of an incomplete table. */
loom_status loom_device_create_with(const loom_backend *be, const loom_device_opts *o, loom_device **out);
/* Frees the context and the device (NULL: nothing). Memory from it must be
 * freed first. */
void loom_device_free(loom_device *dev);

/* An arena (arena.h) whose one allocation is dev's memory. */
void loom_device_arena_init(const loom_device *dev, loom_arena *a, const char *name);

/* ---- the communicator factory ------------------------------------------------
 * What a communicator needs of the device whose buffers it moves (comm.h's
 * loom_comm_mem): allocation, copies between its memory and the host
 * (host-staged MPI groups), and bf16 conversion in its own memory with the
 * device's kernels (bf16 communication). Valid while dev lives. */
const loom_comm_mem *loom_device_comm_mem(const loom_device *dev);

/* The group of parent's ranks that pass this color, ordered by key and
 * named `name`, for tensors in dev's memory, in dev->comm's implementation:
 *   MPI     an MPI group carrying dev's memory ops (comm.h:
 *           loom_comm_set_memory), so the bf16 wire format packs with the
 *           device's kernels
 *   STAGED  loom_comm_wrap_staged over an MPI group, with dev's memory ops
 *   NATIVE  the backend's comm_native (NCCL) over an MPI group
 * parent is any group (the world, a mesh group); its host side
 * (loom_comm_host) is split, so the new group's calls count in its own
 * statistics. color < 0: this rank joins none and *out is NULL. Collective
 * over parent. The mesh (mesh.h) makes every group of a run through here;
 * host buffers (scalars, agreement) go to loom_comm_host of a group. Fails
 * as loom_comm_split and the wrapping do (NCCL refuses two ranks on one
 * GPU: LOOM_EUSAGE naming both). */
loom_status loom_device_comm_split(loom_device *dev, loom_comm *parent, int color, int key, const char *name,
                                   loom_comm **out);

/* "auto", "mpi", "staged", "nccl" (NATIVE); LOOM_EUSAGE naming `what` and
 * the value for any other word ("native" is also NATIVE). */
loom_status loom_device_comm_parse(const char *s, const char *what, loom_device_comm *out);
const char *loom_device_comm_name(loom_device_comm c);

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
