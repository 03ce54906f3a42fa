/* device.c - the device (include/loom/device.h): a backend table chosen by
 * name, the context it makes, device-memory arenas, and the communicator
 * factory: the memory ops a group of the device carries and the choice of
 * its implementation (MPI, host-staged, or the backend's own library).
 * Local to the calling rank, except loom_device_comm_split, collective over
 * its parent group.
 */
#include "loom/device.h"

#include <stdlib.h>
#include <string.h>

#include "loom/status.h"

/* Registration hook of the CUDA backend (src/backend/cuda, loom_cuda_*). Its
 * table, src/backend/cuda_table.c, is linked only into `loom-cuda`, the
 * binary a build with -DLOOM_CUDA=ON adds: the plain `loom` never loads the
 * CUDA libraries (hundreds of MB mapped at start, counted in every memory
 * measurement, and absent on a CPU-only machine). So this reference is
 * weak: NULL in `loom`, the table in `loom-cuda`. */
extern const loom_backend loom_backend_cuda __attribute__((weak));

static loom_status device_table(const char *name, const loom_backend **out) {
    if (!name || !name[0] || strcmp(name, "cpu") == 0) {
        *out = &loom_backend_cpu;
        return LOOM_OK;
    }
    if (strcmp(name, "cuda") == 0) {
        if (&loom_backend_cuda != NULL) {
            *out = &loom_backend_cuda;
            return LOOM_OK;
        }
        return loom_fail(LOOM_EUSAGE, "--device cuda: this loom was built without the CUDA backend "
                                      "(configure with -DLOOM_CUDA=ON and run loom-cuda, the binary with it; "
                                      "it needs nvcc, cuBLAS and NCCL)");
    }
    return loom_fail(LOOM_EUSAGE, "--device %s: unknown backend (known: cpu, cuda)", name);
}

/* ---- the communicator's memory ops (ctx: the device) ---------------------- */

static void *cm_alloc(void *d, size_t bytes) {
    const loom_device *dev = d;
    return dev->be->alloc(dev->ctx, bytes);
}
static void cm_free(void *d, void *p, size_t bytes) {
    const loom_device *dev = d;
    dev->be->free(dev->ctx, p, bytes);
}
static loom_status cm_to_host(void *d, void *host_dst, const void *src, size_t bytes) {
    const loom_device *dev = d;
    dev->be->memcpy_d2h(dev->ctx, host_dst, src, bytes);
    return LOOM_OK;
}
static loom_status cm_from_host(void *d, void *dst, const void *host_src, size_t bytes) {
    const loom_device *dev = d;
    dev->be->memcpy_h2d(dev->ctx, dst, host_src, bytes);
    return LOOM_OK;
}
static void cm_pack(void *d, uint16_t *dst, const float *src, size_t n) {
    const loom_device *dev = d;
    dev->be->bf16_pack(dev->ctx, dst, src, n);
}
static void cm_unpack(void *d, float *dst, const uint16_t *src, size_t n) {
    const loom_device *dev = d;
    dev->be->bf16_unpack(dev->ctx, dst, src, n);
}

/* ---- which implementation the device's groups get --------------------------- */

static const char *const comm_names[LOOM_DEVICE_COMM_COUNT] = {"auto", "mpi", "staged", "nccl"};

const char *loom_device_comm_name(loom_device_comm c) {
    return (unsigned)c < LOOM_DEVICE_COMM_COUNT ? comm_names[c] : "?";
}

loom_status loom_device_comm_parse(const char *s, const char *what, loom_device_comm *out) {
    for (int i = 0; i < LOOM_DEVICE_COMM_COUNT; i++)
        if (s && strcmp(s, comm_names[i]) == 0) {
            *out = (loom_device_comm)i;
            return LOOM_OK;
        }
    if (s && strcmp(s, "native") == 0) {
        *out = LOOM_DEVICE_COMM_NATIVE;
        return LOOM_OK;
    }
    return loom_fail(LOOM_EUSAGE, "%s=%s: not a communicator (auto, mpi, staged, nccl)", what, s ? s : "");
}

/* AUTO settled by the memory; NATIVE only where the table has a library. */
static loom_status settle_comm(const loom_backend *be, loom_device_comm asked, loom_device_comm *out) {
    if ((unsigned)asked >= LOOM_DEVICE_COMM_COUNT)
        return loom_fail(LOOM_EUSAGE, "device communicator %d: not one of auto, mpi, staged, nccl",
                         (int)asked);
    if (asked == LOOM_DEVICE_COMM_AUTO)
        asked = be->host_memory ? LOOM_DEVICE_COMM_MPI : LOOM_DEVICE_COMM_STAGED;
    if (asked == LOOM_DEVICE_COMM_NATIVE && !be->comm_native)
        return loom_fail(LOOM_EUSAGE,
                         "--device %s: nccl groups asked for (LOOM_DEVICE_COMM), but this backend has no "
                         "collective library of its own in this build (NCCL comes with the CUDA backend); "
                         "use staged (any device, any MPI) or mpi",
                         be->name);
    *out = asked;
    return LOOM_OK;
}

loom_status loom_device_comm_split(loom_device *dev, loom_comm *parent, int color, int key, const char *name,
                                   loom_comm **out) {
    *out = NULL;
    loom_comm *h = NULL;
    LOOM_TRY(loom_comm_split(loom_comm_host(parent), color, key, name, &h));
    if (!h) return LOOM_OK;
    loom_status st = LOOM_OK;
    switch (dev->comm) {
    case LOOM_DEVICE_COMM_STAGED: st = loom_comm_wrap_staged(h, &dev->comm_mem, out); break;
    case LOOM_DEVICE_COMM_NATIVE: st = dev->be->comm_native(dev->ctx, h, &dev->comm_mem, out); break;
    default: /* MPI: the group itself, on the device's memory ops */
        st = loom_comm_set_memory(h, &dev->comm_mem);
        if (st == LOOM_OK) *out = h;
        break;
    }
    if (st != LOOM_OK) { /* every wrapper leaves h to us when it fails */
        *out = NULL;
        loom_comm_free(h);
    }
    return st;
}

loom_status loom_device_create_with(const loom_backend *be, const loom_device_opts *o, loom_device **out) {
    *out = NULL;
    const char *miss = loom_backend_missing_entry(be);
    if (miss)
        return loom_fail(LOOM_EINTERNAL, "backend %s: table entry %s is NULL",
                         be->name ? be->name : "(unnamed)", miss);
    loom_device_comm comm = LOOM_DEVICE_COMM_MPI;
    LOOM_TRY(settle_comm(be, o->comm, &comm));
    loom_device *dev = calloc(1, sizeof *dev);
    if (!dev) return loom_fail(LOOM_EOS, "out of memory for a device");
    dev->be = be;
    dev->threads = o->threads > 0 ? o->threads : 0;
    dev->bf16 = o->bf16 != 0;
    dev->comm = comm;
    dev->comm_mem = (loom_comm_mem){.name = be->name,
                                    .ctx = dev,
                                    .alloc = cm_alloc,
                                    .free = cm_free,
                                    .copy_to_host = cm_to_host,
                                    .copy_from_host = cm_from_host,
                                    .pack_bf16 = cm_pack,
                                    .unpack_bf16 = cm_unpack};
    loom_status st = be->ctx_create(dev);
    if (st != LOOM_OK) {
        free(dev);
        return st;
    }
    *out = dev;
    return LOOM_OK;
}

loom_status loom_device_create(const loom_device_opts *o, loom_device **out) {
    const loom_backend *be = NULL;
    *out = NULL;
    LOOM_TRY(device_table(o->name, &be));
    return loom_device_create_with(be, o, out);
}

void loom_device_free(loom_device *dev) {
    if (!dev) return;
    dev->be->ctx_free(dev->ctx);
    free(dev);
}

void loom_device_arena_init(const loom_device *dev, loom_arena *a, const char *name) {
    loom_arena_init(a, name);
    a->mem_alloc = dev->be->alloc;
    a->mem_free = dev->be->free;
    a->mem_ctx = dev->ctx;
}

const loom_comm_mem *loom_device_comm_mem(const loom_device *dev) { return &dev->comm_mem; }
