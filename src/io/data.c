/* data.c - token shards in llm.c's .bin layout, the byte-level tokenizer and
 * the layout-independent batch sampler.
 *
 * Implements include/loom/data.h. A shard is mapped read-only and validated
 * once (magic, version, token count against the file size); batches are then
 * plain copies out of the mapping. loom_data_sample() is a pure function of
 * its arguments: the start of global sample g of step s comes from the
 * counter RNG stream (seed, "data") at index s*global_batch + g, so any
 * data-parallel rank can produce exactly its slice of the one global batch.
 * Shards are written to PATH.tmp.PID (the writer's process id), fsynced and
 * renamed, so an existing shard is replaced only by a complete one, and two
 * processes building the same shard at once (two first runs of `loom train`
 * in one folder, each building the default data set) each rename a complete
 * file of their own. Local I/O only: nothing here is collective.
 */
#include "loom/data.h"

#include "loom/rng.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_HEADER_BYTES (LOOM_TOKENS_HEADER_INTS * sizeof(int32_t))
#define SHARD_MAX_TOKENS 2147483647u /* llm.c reads the count as int32 */

/* ------------------------------------------------------------------------ */
/* Reading shards                                                           */
/* ------------------------------------------------------------------------ */

/* Map the file into t->map; ENOINPUT if it cannot be opened. */
static loom_status tokens_map(loom_tokens *t) {
    int fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loom_fail(LOOM_ENOINPUT, "file %s: cannot open: %s", t->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return loom_fail(LOOM_ENOINPUT, "file %s: not a readable regular file", t->path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < SHARD_HEADER_BYTES) {
        close(fd);
        return loom_fail(LOOM_EDATA, "file %s: %zu bytes, shorter than the %zu-byte shard header", t->path,
                         size, (size_t)SHARD_HEADER_BYTES);
    }
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) return loom_fail(LOOM_EIO, "file %s: cannot map: %s", t->path, strerror(err));
    t->map = m;
    t->map_len = size;
    return LOOM_OK;
}

/* Check magic, version and that the file holds exactly the announced tokens. */
static loom_status tokens_check_header(loom_tokens *t) {
    int32_t hdr[3];
    memcpy(hdr, t->map, sizeof hdr);
    if (hdr[0] != LOOM_TOKENS_MAGIC)
        return loom_fail(LOOM_EDATA, "file %s: magic %d, expected %d: not a token shard", t->path, hdr[0],
                         LOOM_TOKENS_MAGIC);
    if (hdr[1] != 1 && hdr[1] != 2)
        return loom_fail(LOOM_EDATA, "file %s: version %d, expected 1 (uint16) or 2 (uint32)", t->path,
                         hdr[1]);
    size_t tsize = hdr[1] == 1 ? 2 : 4;
    if (hdr[2] < 0) /* llm.c reads the count as int32: say what it would read */
        return loom_fail(LOOM_EDATA, "file %s: header says %d tokens, a negative count", t->path, hdr[2]);
    size_t count = (size_t)hdr[2];
    size_t have = t->map_len - SHARD_HEADER_BYTES;
    if (count == 0) return loom_fail(LOOM_EDATA, "file %s: empty shard (header says 0 tokens)", t->path);
    if (have != count * tsize)
        return loom_fail(LOOM_EDATA,
                         "file %s: header says %zu tokens (%zu bytes) but the file holds %zu bytes of tokens",
                         t->path, count, count * tsize, have);
    t->version = hdr[1];
    t->n = count;
    t->data = (const char *)t->map + SHARD_HEADER_BYTES;
    return LOOM_OK;
}

loom_status loom_tokens_open(const char *path, loom_tokens *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    loom_status st = tokens_map(t);
    if (st == LOOM_OK) st = tokens_check_header(t);
    if (st != LOOM_OK) loom_tokens_close(t);
    return st;
}

void loom_tokens_close(loom_tokens *t) {
    if (t->map) munmap(t->map, t->map_len);
    t->map = NULL;
    t->map_len = 0;
    t->data = NULL;
    t->n = 0;
}

loom_status loom_tokens_check_vocab(const loom_tokens *t, int vocab_size) {
    if (vocab_size <= 0) return loom_fail(LOOM_EUSAGE, "vocab size %d must be positive", vocab_size);
    for (size_t i = 0; i < t->n; i++) {
        uint32_t tok = loom_tokens_get(t, i);
        if (tok >= (uint32_t)vocab_size)
            return loom_fail(LOOM_EDATA, "file %s: token %u at index %zu is >= the vocab size %d", t->path,
                             tok, i, vocab_size);
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------------------ */
/* Writing shards: PATH.tmp.PID, then rename                                */
/* ------------------------------------------------------------------------ */

/* Tokens to write: either 32-bit tokens or bytes (the byte tokenizer). */
typedef struct token_src {
    const uint32_t *u32;
    const uint8_t *u8;
} token_src;

static uint32_t token_at(const token_src *s, size_t i) { return s->u32 ? s->u32[i] : s->u8[i]; }

/* "PATH.tmp.PID" in a malloc'd string, NULL when out of memory. Per
 * process: with one PATH.tmp, a second writer's fopen truncated the first
 * one's file under it, and the loser's rename failed (ENOENT). */
static char *tmp_path(const char *path) {
    size_t len = strlen(path) + 32;
    char *tmp = malloc(len);
    if (tmp) snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    return tmp;
}

/* Header then tokens, converted in chunks to the shard's width; 0 on error. */
static int shard_write_body(FILE *fp, const token_src *src, size_t n, int version) {
    int32_t hdr[LOOM_TOKENS_HEADER_INTS] = {LOOM_TOKENS_MAGIC, version, (int32_t)n};
    if (fwrite(hdr, sizeof hdr, 1, fp) != 1) return 0;
    enum { CHUNK = 4096 };
    uint16_t c16[CHUNK];
    uint32_t c32[CHUNK];
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t m = n - at < CHUNK ? n - at : CHUNK;
        for (size_t i = 0; i < m; i++) {
            if (version == 1) c16[i] = (uint16_t)token_at(src, at + i);
            else c32[i] = token_at(src, at + i);
        }
        size_t w = version == 1 ? fwrite(c16, 2, m, fp) : fwrite(c32, 4, m, fp);
        if (w != m) return 0;
    }
    return fflush(fp) == 0 && fsync(fileno(fp)) == 0;
}

/* Write the complete shard to PATH.tmp.PID; on failure nothing is left behind. */
static loom_status shard_write_tmp(const char *path, const token_src *src, size_t n) {
    if (n == 0) return loom_fail(LOOM_EDATA, "file %s: refusing to write an empty shard", path);
    if (n > SHARD_MAX_TOKENS)
        return loom_fail(LOOM_EDATA, "file %s: %zu tokens exceed the shard limit of %u", path, n,
                         SHARD_MAX_TOKENS);
    uint32_t max = 0;
    for (size_t i = 0; i < n; i++) max = token_at(src, i) > max ? token_at(src, i) : max;
    char *tmp = tmp_path(path);
    if (!tmp) return loom_fail(LOOM_EOS, "file %s: out of memory", path);
    loom_status st = LOOM_OK;
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        st = loom_fail(LOOM_ECANTCREAT, "file %s: cannot create %s: %s", path, tmp, strerror(errno));
        free(tmp);
        return st;
    }
    int ok = shard_write_body(fp, src, n, max < 65536 ? 1 : 2);
    int err = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        st = loom_fail(LOOM_EIO, "file %s: writing %s failed: %s", path, tmp, strerror(err));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* Rename PATH.tmp.PID over PATH (commit = 1) or remove it (commit = 0). */
static loom_status shard_finish_tmp(const char *path, int commit) {
    char *tmp = tmp_path(path);
    if (!tmp) return loom_fail(LOOM_EOS, "file %s: out of memory", path);
    loom_status st = LOOM_OK;
    if (commit && rename(tmp, path) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "file %s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    if (!commit || st != LOOM_OK) unlink(tmp);
    free(tmp);
    return st;
}

loom_status loom_tokens_write(const char *path, const uint32_t *tokens, size_t n) {
    token_src src = {.u32 = tokens};
    LOOM_TRY(shard_write_tmp(path, &src, n));
    return shard_finish_tmp(path, 1);
}

/* ------------------------------------------------------------------------ */
/* Byte-level tokenizer                                                     */
/* ------------------------------------------------------------------------ */

typedef struct byte_buf {
    uint8_t *p;
    size_t len, cap;
} byte_buf;

/* Append the whole file to b. */
static loom_status read_append(const char *path, byte_buf *b) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return loom_fail(LOOM_ENOINPUT, "input %s: cannot open: %s", path, strerror(errno));
    struct stat sb; /* Linux opens a directory for reading; the first read then fails */
    if (fstat(fileno(fp), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(fp);
        return loom_fail(LOOM_ENOINPUT, "input %s: is a directory, not a file", path);
    }
    loom_status st = LOOM_OK;
    for (;;) {
        if (b->cap - b->len < 65536) {
            size_t ncap = b->cap ? 2 * b->cap : 1 << 20;
            uint8_t *p = realloc(b->p, ncap);
            if (!p) {
                st = loom_fail(LOOM_EOS, "input %s: out of memory after %zu bytes", path, b->len);
                break;
            }
            b->p = p;
            b->cap = ncap;
        }
        size_t got = fread(b->p + b->len, 1, b->cap - b->len, fp);
        b->len += got;
        if (got == 0) break;
    }
    if (st == LOOM_OK && ferror(fp))
        st = loom_fail(LOOM_EIO, "input %s: read failed: %s", path, strerror(errno));
    fclose(fp);
    return st;
}

/* Sizes of the train and val splits (val = the rounded tail fraction). */
static loom_status split_sizes(size_t total, const char *val_path, double val_fraction, size_t *n_train,
                               size_t *n_val) {
    if (total == 0) return loom_fail(LOOM_EDATA, "the inputs hold no bytes: nothing to tokenize");
    *n_val = 0;
    if (val_path) {
        if (!(val_fraction >= 0 && val_fraction < 1))
            return loom_fail(LOOM_EUSAGE, "val fraction %g must be in [0, 1)", val_fraction);
        *n_val = (size_t)llround((double)total * val_fraction);
        if (*n_val == 0)
            return loom_fail(LOOM_EDATA, "%s: val split is empty (%zu tokens x val fraction %g)", val_path,
                             total, val_fraction);
    }
    *n_train = total - *n_val;
    if (*n_train == 0)
        return loom_fail(LOOM_EDATA, "train split is empty (%zu tokens x val fraction %g)", total,
                         val_fraction);
    return LOOM_OK;
}

/* Canonical "realdir/name" of a path whose file may not exist yet; 0 when
 * its directory cannot be resolved. */
static int canonical_path(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    char *dir = !slash ? strdup(".") : slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    if (!dir) return 0;
    char *real = realpath(dir, NULL);
    free(dir);
    if (!real) return 0;
    int ok = snprintf(out, cap, "%s/%s", strcmp(real, "/") == 0 ? "" : real, base) < (int)cap;
    free(real);
    return ok;
}

/* Whether paths a and b name one file: the same inode when both exist, else
 * the same canonical name (one may exist: a link to it is then missed, but
 * nothing is lost - writes go through tmp + rename). */
static int same_file(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return 1;
    struct stat sa, sb;
    int ha = stat(a, &sa) == 0, hb = stat(b, &sb) == 0;
    if (ha && hb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    return canonical_path(a, ca, sizeof ca) && canonical_path(b, cb, sizeof cb) && strcmp(ca, cb) == 0;
}

/* Whether writing `out` (through out.tmp.PID) would touch the file at `other`. */
static int write_touches(const char *out, const char *other) {
    char *tmp = tmp_path(out);
    int hit = same_file(out, other) || (tmp && same_file(tmp, other));
    free(tmp);
    return hit;
}

/* Refuse outputs that name an input, each other, or each other's PATH.tmp.PID:
 * the val shard would overwrite the train shard, or an input be replaced. */
static loom_status check_outputs(const char *const *inputs, int n_inputs, const char *train_path,
                                 const char *val_path) {
    if (!train_path || !train_path[0]) return loom_fail(LOOM_EUSAGE, "the train shard needs a file name");
    if (val_path && !val_path[0]) return loom_fail(LOOM_EUSAGE, "the val shard needs a file name (or none)");
    if (val_path && (write_touches(train_path, val_path) || write_touches(val_path, train_path)))
        return loom_fail(LOOM_EUSAGE,
                         "train shard %s and val shard %s are the same file (or one is the other's .tmp); "
                         "the val split would overwrite the train split",
                         train_path, val_path);
    const char *outs[2] = {train_path, val_path}, *what[2] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
        if (!outs[k]) continue;
        for (int i = 0; i < n_inputs; i++)
            if (write_touches(outs[k], inputs[i]))
                return loom_fail(LOOM_EUSAGE, "%s shard %s would overwrite input %s", what[k], outs[k],
                                 inputs[i]);
    }
    return LOOM_OK;
}

/* Write both splits to tmp files, then commit both (or neither). */
static loom_status write_splits(token_src train, size_t n_train, size_t n_val, const char *train_path,
                                const char *val_path) {
    token_src val = {.u8 = train.u8 ? train.u8 + n_train : NULL,
                     .u32 = train.u32 ? train.u32 + n_train : NULL};
    LOOM_TRY(shard_write_tmp(train_path, &train, n_train));
    if (val_path) {
        loom_status st = shard_write_tmp(val_path, &val, n_val);
        if (st != LOOM_OK) {
            shard_finish_tmp(train_path, 0);
            return st;
        }
    }
    loom_status st = shard_finish_tmp(train_path, 1);
    if (val_path) {
        if (st == LOOM_OK) st = shard_finish_tmp(val_path, 1);
        else shard_finish_tmp(val_path, 0);
    }
    return st;
}

loom_status loom_data_build_bytes(const char *const *inputs, int n_inputs, const char *train_path,
                                  const char *val_path, double val_fraction, size_t *n_train, size_t *n_val) {
    byte_buf b = {0};
    size_t nt = 0, nv = 0;
    loom_status st = check_outputs(inputs, n_inputs, train_path, val_path);
    for (int i = 0; i < n_inputs && st == LOOM_OK; i++) st = read_append(inputs[i], &b);
    if (st == LOOM_OK) st = split_sizes(b.len, val_path, val_fraction, &nt, &nv);
    if (st == LOOM_OK) st = write_splits((token_src){.u8 = b.p}, nt, nv, train_path, val_path);
    free(b.p);
    if (st != LOOM_OK) return st;
    if (n_train) *n_train = nt;
    if (n_val) *n_val = nv;
    return LOOM_OK;
}

loom_status loom_data_build_encoded(const char *const *inputs, int n_inputs, const char *train_path,
                                    const char *val_path, double val_fraction, loom_data_encode_fn encode,
                                    void *ctx, size_t *n_train, size_t *n_val) {
    loom_ids ids = {0};
    size_t nt = 0, nv = 0;
    loom_status st = check_outputs(inputs, n_inputs, train_path, val_path);
    for (int i = 0; i < n_inputs && st == LOOM_OK; i++) {
        byte_buf b = {0};
        st = read_append(inputs[i], &b);
        if (st == LOOM_OK) st = encode(ctx, (const char *)b.p, b.len, &ids);
        free(b.p);
    }
    if (st == LOOM_OK) st = split_sizes(ids.n, val_path, val_fraction, &nt, &nv);
    if (st == LOOM_OK) st = write_splits((token_src){.u32 = ids.v}, nt, nv, train_path, val_path);
    loom_ids_free(&ids);
    if (st != LOOM_OK) return st;
    if (n_train) *n_train = nt;
    if (n_val) *n_val = nv;
    return LOOM_OK;
}

void loom_ids_free(loom_ids *ids) {
    free(ids->v);
    *ids = (loom_ids){0};
}

loom_status loom_ids_reserve(loom_ids *ids, size_t need) {
    if (need <= ids->cap) return LOOM_OK;
    size_t nc = ids->cap ? ids->cap : 256;
    while (nc < need) nc *= 2;
    uint32_t *p = realloc(ids->v, nc * sizeof *p);
    if (!p) return loom_fail(LOOM_EOS, "out of memory for %zu token ids", need);
    ids->v = p;
    ids->cap = nc;
    return LOOM_OK;
}

loom_status loom_ids_push(loom_ids *ids, uint32_t id) {
    LOOM_TRY(loom_ids_reserve(ids, ids->n + 1));
    ids->v[ids->n++] = id;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------ */
/* Batches                                                                  */
/* ------------------------------------------------------------------------ */

/* inputs = tokens[pos .. pos+T), targets = tokens[pos+1 .. pos+T]. */
static void copy_window(const loom_tokens *t, size_t pos, int T, int32_t *inputs, int32_t *targets) {
    for (int i = 0; i < T; i++) {
        inputs[i] = (int32_t)loom_tokens_get(t, pos + (size_t)i);
        targets[i] = (int32_t)loom_tokens_get(t, pos + (size_t)i + 1);
    }
}

void loom_data_sample(const loom_tokens *t, uint64_t seed, int64_t step, int64_t global_batch, int64_t first,
                      int n, int T, int32_t *inputs, int32_t *targets) {
    if (t->n <= (size_t)T) { /* a caller skipped loom_data_check_len: no data to give */
        memset(inputs, 0, (size_t)n * (size_t)T * sizeof *inputs);
        memset(targets, 0, (size_t)n * (size_t)T * sizeof *targets);
        return;
    }
    loom_rng_key key = loom_rng_key_make(seed, "data");
    uint64_t span = t->n - (size_t)T; /* start positions 0 .. n-T-1 */
    for (int j = 0; j < n; j++) {
        uint64_t g = (uint64_t)step * (uint64_t)global_batch + (uint64_t)(first + j);
        size_t pos = (size_t)(loom_rng_u64(key, g) % span);
        copy_window(t, pos, T, inputs + (size_t)j * T, targets + (size_t)j * T);
    }
}

void loom_data_sequential(const loom_tokens *t, int64_t first, int n, int T, int32_t *inputs,
                          int32_t *targets) {
    size_t nseq = t->n > 0 ? (t->n - 1) / (size_t)T : 0;
    if (nseq == 0) {
        memset(inputs, 0, (size_t)n * (size_t)T * sizeof *inputs);
        memset(targets, 0, (size_t)n * (size_t)T * sizeof *targets);
        return;
    }
    for (int j = 0; j < n; j++) {
        size_t s = (size_t)(first + j) % nseq;
        copy_window(t, s * (size_t)T, T, inputs + (size_t)j * T, targets + (size_t)j * T);
    }
}

loom_status loom_data_check_len(const loom_tokens *t, size_t need, const char *why) {
    if (t->n < need)
        return loom_fail(LOOM_EDATA, "file %s: %zu tokens, but %s needs at least %zu", t->path, t->n,
                         why ? why : "this run", need);
    return LOOM_OK;
}
