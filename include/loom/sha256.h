/* sha256.h - SHA-256 (FIPS 180-4), the content hash of checkpoint files.
 * Incremental: init, update any number of times, final. Local, no state
 * outside the context. */
#ifndef LOOM_SHA256_H
#define LOOM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "loom/status.h"

typedef struct loom_sha256 {
    uint32_t h[8];
    uint64_t bytes;        /* message length so far */
    unsigned char buf[64]; /* a partial block */
    size_t used;
} loom_sha256;

void loom_sha256_init(loom_sha256 *s);
void loom_sha256_update(loom_sha256 *s, const void *data, size_t n);
/* The 32-byte digest; s must be initialised again before reuse. */
void loom_sha256_final(loom_sha256 *s, unsigned char out[32]);
/* The digest of data[0..n) as 64 lowercase hex digits and a NUL. */
void loom_sha256_hex(const void *data, size_t n, char out[65]);
/* The digest of a whole file as hex: LOOM_ENOINPUT if it cannot be opened,
 * LOOM_EIO if reading fails. */
loom_status loom_sha256_file(const char *path, char out[65]);
/* The block function: on (default) the CPU's SHA extensions where it has
 * them, off the portable C one. Returns 1 if the extensions are in use.
 * Process-wide; for tests and benchmarks. */
int loom_sha256_use_extensions(int on);

#endif
