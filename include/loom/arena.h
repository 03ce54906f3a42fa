/* arena.h - one allocation per lifetime class of memory.
 *
 * Params, grads, optimizer state and activations each live in one arena; a
 * tensor is a pointer into it. Sizes are planned before anything runs: first
 * a plan pass counts bytes (loom_arena_reserve on a NULL-base arena), then
 * loom_arena_commit allocates once, then the same sequence of
 * loom_arena_alloc calls hands out pointers. The step loop never calls malloc.
 */
#ifndef LOOM_ARENA_H
#define LOOM_ARENA_H

#include <stddef.h>
#include "loom/status.h"

typedef struct loom_arena {
    const char *name; /* "params", "grads", ... for messages and reports */
    char *base;       /* NULL while planning */
    size_t used;      /* bytes handed out (or planned) so far */
    size_t cap;       /* bytes committed */
    int mapped;       /* base came from mmap (large arenas), else aligned_alloc */
    /* Where the memory comes from: NULL = host memory (loom_host_alloc);
     * a device's memory otherwise (loom_device_arena_init), mem_ctx being
     * its backend context, which both take first. */
    void *(*mem_alloc)(void *mem_ctx, size_t bytes);
    void (*mem_free)(void *mem_ctx, void *p, size_t bytes);
    void *mem_ctx;
} loom_arena;

#define LOOM_ARENA_ALIGN 64

void loom_arena_init(loom_arena *a, const char *name);

/* Host memory as arenas take it: bytes zeroed and 64-byte aligned; from
 * 1 MiB on mapped from the kernel's zero pages (resident only once written).
 * NULL when it cannot be had. loom_host_free takes the same size back. The
 * CPU backend's device memory is this memory. */
void *loom_host_alloc(size_t bytes);
void loom_host_free(void *p, size_t bytes);
/* Planning: count n bytes (aligned) without memory. */
void loom_arena_reserve(loom_arena *a, size_t nbytes);
/* Allocate cap = planned bytes, zeroed; rewinds `used` to 0. The memory is
 * not touched: a large arena is mapped from the kernel's zero pages, which
 * become resident only when first written, so bytes planned but never used
 * (a buffer a ZeRO stage leaves alone) cost no resident memory. LOOM_EOS when
 * the memory cannot be had (message names the arena and the size);
 * LOOM_EINTERNAL if the arena is already committed. */
loom_status loom_arena_commit(loom_arena *a);
/* Hand out n bytes (rounded up to 64), 64-byte aligned. Returns NULL while
 * planning (without counting: planning is loom_arena_reserve's job) or when
 * the arena would overflow (a planning bug: the caller reports
 * LOOM_EINTERNAL); a failed call does not advance `used`. */
void *loom_arena_alloc(loom_arena *a, size_t nbytes);
void loom_arena_reset(loom_arena *a); /* used = 0, keep memory (not re-zeroed) */
void loom_arena_free(loom_arena *a);  /* back to the empty planning state */

#endif
