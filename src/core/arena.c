/* arena.c - bump allocators, one per lifetime class of memory.
 *
 * Implements include/loom/arena.h. An arena lives in two phases: while its
 * base is NULL, loom_arena_reserve() only counts bytes (each request rounded up
 * to LOOM_ARENA_ALIGN, so every pointer handed out later stays aligned);
 * loom_arena_commit() then allocates exactly that many zeroed bytes once, and
 * loom_arena_alloc() replays the same requests as pointers into it. Local to
 * the calling rank; nothing here is collective or thread-safe.
 */
#include "loom/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* From this size on, arenas are mapped: zero pages, resident only once written. */
#define ARENA_MAP_MIN ((size_t)1 << 20)

/* n rounded up to the alignment, or SIZE_MAX when that overflows. */
static size_t arena_round_up(size_t n) {
    if (n > SIZE_MAX - (LOOM_ARENA_ALIGN - 1)) return SIZE_MAX;
    return (n + LOOM_ARENA_ALIGN - 1) & ~(size_t)(LOOM_ARENA_ALIGN - 1);
}

/* a + b, saturating at SIZE_MAX (a plan that large can never commit). */
static size_t arena_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

void loom_arena_init(loom_arena *a, const char *name) {
    a->name = name ? name : "arena";
    a->base = NULL;
    a->used = 0;
    a->cap = 0;
    a->mapped = 0;
    a->mem_alloc = NULL;
    a->mem_free = NULL;
    a->mem_ctx = NULL;
}

void *loom_host_alloc(size_t bytes) {
    if (bytes >= ARENA_MAP_MIN) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p; /* page-aligned, zero */
    }
    /* C11's aligned_alloc wants a size that is a multiple of the alignment */
    const size_t whole =
        bytes ? (bytes + LOOM_ARENA_ALIGN - 1) / LOOM_ARENA_ALIGN * LOOM_ARENA_ALIGN : LOOM_ARENA_ALIGN;
    void *p = aligned_alloc(LOOM_ARENA_ALIGN, whole);
    if (p) memset(p, 0, whole);
    return p;
}

void loom_host_free(void *p, size_t bytes) {
    if (!p) return;
    if (bytes >= ARENA_MAP_MIN) munmap(p, bytes);
    else free(p);
}

void loom_arena_reserve(loom_arena *a, size_t nbytes) {
    a->used = arena_add(a->used, arena_round_up(nbytes));
}

loom_status loom_arena_commit(loom_arena *a) {
    if (a->base) return loom_fail(LOOM_EINTERNAL, "arena %s: committed twice", a->name);
    size_t cap = a->used;
    if (cap == SIZE_MAX) return loom_fail(LOOM_EOS, "arena %s: planned size overflows size_t", a->name);
    /* Allocate at least one aligned block so an empty arena has a base too. */
    size_t bytes = cap ? cap : LOOM_ARENA_ALIGN;
    int mapped = !a->mem_alloc && bytes >= ARENA_MAP_MIN;
    char *base = a->mem_alloc ? a->mem_alloc(a->mem_ctx, bytes) : loom_host_alloc(bytes);
    if (!base)
        return loom_fail(LOOM_EOS, "arena %s: cannot allocate %zu bytes (%.1f MiB)", a->name, cap,
                         (double)cap / (1024.0 * 1024.0));
    a->base = base;
    a->mapped = mapped;
    a->cap = cap;
    a->used = 0;
    return LOOM_OK;
}

void *loom_arena_alloc(loom_arena *a, size_t nbytes) {
    if (!a->base) return NULL;
    size_t n = arena_round_up(nbytes);
    if (n > a->cap - a->used) return NULL;
    void *p = a->base + a->used;
    a->used += n;
    return p;
}

void loom_arena_reset(loom_arena *a) { a->used = 0; }

void loom_arena_free(loom_arena *a) {
    size_t bytes = a->cap ? a->cap : LOOM_ARENA_ALIGN;
    if (a->mem_free) a->mem_free(a->mem_ctx, a->base, bytes);
    else if (a->base) loom_host_free(a->base, bytes);
    a->mapped = 0;
    a->base = NULL;
    a->used = 0;
    a->cap = 0;
}
