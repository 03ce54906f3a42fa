/* test_arena.c - the plan / commit / alloc cycle of loom_arena: planned bytes,
 * 64-byte alignment, zeroed memory, overflow returning NULL, reset, and the
 * failures of commit (twice, or a plan too large for size_t). */
#include "check.h"
#include "loom/arena.h"

#include <stdint.h>
#include <string.h>

static int aligned(const void *p) { return ((uintptr_t)p % LOOM_ARENA_ALIGN) == 0; }

static void test_plan_commit_alloc(void) {
    loom_arena a;
    loom_arena_init(&a, "acts");
    const size_t sizes[] = {1, 64, 100, 0, 129};
    const size_t rounded[] = {64, 64, 128, 0, 192};
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        loom_arena_reserve(&a, sizes[i]);
        total += rounded[i];
    }
    CHECK(a.used == total, "planned %zu bytes, expected %zu", a.used, total);
    CHECK(loom_arena_alloc(&a, 8) == NULL, "alloc while planning must return NULL");
    CHECK(a.used == total, "alloc while planning must not count (used %zu)", a.used);

    CHECK(loom_arena_commit(&a) == LOOM_OK, "commit: %s", loom_errmsg());
    CHECK(a.cap == total && a.used == 0, "cap %zu used %zu after commit", a.cap, a.used);
    CHECK(aligned(a.base), "base %p not aligned", (void *)a.base);
    size_t nonzero = 0;
    for (size_t i = 0; i < a.cap; i++) nonzero += a.base[i] != 0;
    CHECK(nonzero == 0, "%zu committed bytes are not zero", nonzero);

    size_t off = 0;
    for (int i = 0; i < 5; i++) {
        char *p = loom_arena_alloc(&a, sizes[i]);
        CHECK(p == a.base + off, "alloc %d at offset %td, expected %zu", i, p - a.base, off);
        CHECK(aligned(p), "alloc %d not aligned", i);
        memset(p, 0xab, sizes[i]); /* ASan: the whole request is addressable */
        off += rounded[i];
    }
    CHECK(a.used == a.cap, "replay used %zu of %zu", a.used, a.cap);
    CHECK(loom_arena_alloc(&a, 1) == NULL, "alloc past the plan must return NULL");
    CHECK(a.used == a.cap, "a failed alloc must not advance (used %zu)", a.used);

    loom_arena_reset(&a);
    CHECK(a.used == 0 && loom_arena_alloc(&a, 10) == a.base, "reset rewinds to the base");
    CHECK((unsigned char)a.base[0] == 0xab, "reset keeps the memory");

    CHECK(loom_arena_commit(&a) == LOOM_EINTERNAL, "second commit must be LOOM_EINTERNAL");
    CHECK(strstr(loom_errmsg(), "acts") != NULL, "message names the arena: %s", loom_errmsg());
    loom_arena_free(&a);
    CHECK(a.base == NULL && a.cap == 0 && a.used == 0, "free clears the arena");
}

static void test_empty_and_overflow(void) {
    loom_arena a;
    loom_arena_init(&a, "empty");
    CHECK(loom_arena_commit(&a) == LOOM_OK, "empty commit: %s", loom_errmsg());
    CHECK(a.base != NULL && a.cap == 0, "empty arena has a base and cap 0");
    CHECK(loom_arena_alloc(&a, 1) == NULL, "alloc from an empty arena returns NULL");
    loom_arena_free(&a);

    loom_arena_init(&a, "huge");
    loom_arena_reserve(&a, SIZE_MAX - 10);
    CHECK(a.used == SIZE_MAX, "rounding overflow saturates");
    loom_arena_reserve(&a, 64);
    CHECK(a.used == SIZE_MAX, "sum overflow saturates");
    CHECK(loom_arena_commit(&a) == LOOM_EOS, "an impossible plan is LOOM_EOS");
    CHECK(a.base == NULL, "failed commit leaves no memory");
    loom_arena_free(&a);

    loom_arena_init(&a, "small");
    loom_arena_reserve(&a, 64);
    CHECK(loom_arena_commit(&a) == LOOM_OK, "commit: %s", loom_errmsg());
    CHECK(loom_arena_alloc(&a, SIZE_MAX) == NULL, "a SIZE_MAX request returns NULL");
    CHECK(loom_arena_alloc(&a, 64) == a.base, "the arena is still usable");
    loom_arena_free(&a);
    loom_arena_free(&a); /* freeing twice is harmless */
}

int main(void) {
    test_plan_commit_alloc();
    test_empty_and_overflow();
    return check_done();
}
