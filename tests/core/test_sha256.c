/* test_sha256.c - SHA-256 against the FIPS 180-2 / NIST published example
 * digests ("", "abc", the 448- and 896-bit messages, one million 'a'), fed
 * whole and in every split of two updates (block-boundary handling), and
 * the file digest against the in-memory one; all of it with the portable
 * block function and again with the CPU's SHA extensions where it has them,
 * plus random messages of every length up to 1000 bytes hashed by both. */
#include "check.h"
#include "loom/sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void vectors(void) {
    static const struct {
        const char *msg, *want;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
         "mnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t n = strlen(v[i].msg);
        loom_sha256_hex(v[i].msg, n, hex);
        CHECK(strcmp(hex, v[i].want) == 0, "vector %zu: %s, expected %s", i, hex, v[i].want);
        for (size_t cut = 0; cut <= n; cut++) { /* two updates, every split */
            loom_sha256 s;
            unsigned char d[32], w[32];
            loom_sha256_init(&s);
            loom_sha256_update(&s, v[i].msg, cut);
            loom_sha256_update(&s, v[i].msg + cut, n - cut);
            loom_sha256_final(&s, d);
            for (int k = 0; k < 32; k++) sscanf(v[i].want + 2 * k, "%2hhx", &w[k]);
            CHECK(memcmp(d, w, 32) == 0, "vector %zu split at %zu differs", i, cut);
        }
    }
    size_t n = 1000000;
    char *a = malloc(n);
    CHECK(a != NULL, "out of memory");
    if (!a) return;
    memset(a, 'a', n);
    const char *million = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    loom_sha256_hex(a, n, hex);
    CHECK(strcmp(hex, million) == 0, "one million 'a': %s", hex);
    if (check_scratch_dir("sha256")) {
        const char *path = check_scratch_path("a.bin");
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(a, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
        char fh[65];
        CHECK(loom_sha256_file(path, fh) == LOOM_OK && strcmp(fh, million) == 0, "file digest %s", fh);
        CHECK(loom_sha256_file(check_scratch_path("missing"), fh) == LOOM_ENOINPUT,
              "a missing file is LOOM_ENOINPUT");
    }
    free(a);
}

int main(void) {
    loom_sha256_use_extensions(0);
    vectors();
    if (loom_sha256_use_extensions(1)) {
        printf("SHA extensions present: vectors again with them\n");
        vectors();
        unsigned char msg[1000];
        unsigned x = 12345;
        for (size_t i = 0; i < sizeof msg; i++)
            msg[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
        for (size_t n = 0; n <= sizeof msg; n++) {
            char h0[65], h1[65];
            loom_sha256_use_extensions(0);
            loom_sha256_hex(msg, n, h0);
            loom_sha256_use_extensions(1);
            loom_sha256_hex(msg, n, h1);
            CHECK(strcmp(h0, h1) == 0, "length %zu: portable %s, extensions %s", n, h0, h1);
        }
    } else {
        printf("no SHA extensions on this CPU: portable block function only\n");
    }
    return check_done();
}
