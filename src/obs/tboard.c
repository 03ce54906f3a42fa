/* tboard.c - TensorBoard event files (tboard.h): TFRecord framing with
 * CRC-32C, and the few protocol-buffer fields an Event of scalars needs,
 * encoded by hand from the format's public description. Local. */
#include "loom/tboard.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

struct loom_tboard {
    FILE *f;
    char path[1400];
    unsigned char *buf; /* the Summary being built (its Values) */
    size_t len, cap;
    int64_t step;
    int failed; /* out of memory while adding */
};

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ----------------- */

static uint32_t crc32c(const unsigned char *p, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t masked_crc(const unsigned char *p, size_t n) {
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protocol buffer pieces ------------------------------------------------- */

/* A growable byte buffer. 0 when out of memory. */
typedef struct {
    unsigned char *p;
    size_t len, cap;
} bytes;

static int put(bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 1;
}

static int put_varint(bytes *b, uint64_t v) {
    unsigned char x[10];
    int n = 0;
    do {
        x[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return put(b, x, (size_t)n);
}

static int put_le(bytes *b, uint64_t v, int n) {
    unsigned char x[8];
    for (int i = 0; i < n; i++) x[i] = (unsigned char)(v >> (8 * i));
    return put(b, x, (size_t)n);
}

/* key = field << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) */
static int put_key(bytes *b, int field, int wire) { return put_varint(b, (uint64_t)(field << 3 | wire)); }

static int put_bytes_field(bytes *b, int field, const void *p, size_t n) {
    return put_key(b, field, 2) && put_varint(b, n) && put(b, p, n);
}

/* An Event: wall_time, step, then either file_version or the summary. */
static int event(bytes *out, double wall, int64_t step, const char *version, const bytes *summary) {
    uint64_t w;
    memcpy(&w, &wall, 8);
    int ok = put_key(out, 1, 1) && put_le(out, w, 8) && put_key(out, 2, 0) && put_varint(out, (uint64_t)step);
    if (version) ok = ok && put_bytes_field(out, 3, version, strlen(version));
    if (summary)
        ok = ok && put_bytes_field(out, 5, summary->p ? summary->p : (const unsigned char *)"", summary->len);
    return ok;
}

static double now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* One TFRecord around the payload. */
static loom_status write_record(loom_tboard *t, const bytes *payload) {
    unsigned char head[12];
    uint64_t n = payload->len;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(n >> (8 * i));
    uint32_t c = masked_crc(head, 8), d = masked_crc(payload->p, payload->len);
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(d >> (8 * i));
    errno = 0;
    if (fwrite(head, 1, 12, t->f) != 12 || fwrite(payload->p, 1, payload->len, t->f) != payload->len ||
        fwrite(tail, 1, 4, t->f) != 4 || fflush(t->f) != 0)
        return loom_fail(LOOM_EIO, "--tensorboard: writing %s failed: %s", t->path,
                         strerror(errno ? errno : EIO));
    return LOOM_OK;
}

loom_status loom_tboard_open(const char *dir, loom_tboard **out) {
    *out = NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return loom_fail(LOOM_ECANTCREAT, "--tensorboard %s: cannot create the directory: %s", dir,
                         strerror(errno));
    loom_tboard *t = calloc(1, sizeof *t);
    if (!t) return loom_fail(LOOM_EOS, "out of memory for the TensorBoard writer");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%ld.%s.%ld.loom", dir, (long)now(), host,
             (long)getpid());
    t->f = fopen(t->path, "wb");
    if (!t->f) {
        loom_status st = loom_fail(LOOM_ECANTCREAT, "--tensorboard %s: cannot create %s: %s", dir, t->path,
                                   strerror(errno));
        free(t);
        return st;
    }
    bytes b = {0};
    loom_status st = event(&b, now(), 0, "brain.Event:2", NULL) ? write_record(t, &b)
                                                                : loom_fail(LOOM_EOS, "out of memory");
    free(b.p);
    if (st != LOOM_OK) {
        fclose(t->f);
        free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

const char *loom_tboard_path(const loom_tboard *t) { return t->path; }

void loom_tboard_begin(loom_tboard *t, int64_t step) {
    t->len = 0;
    t->step = step;
    t->failed = 0;
}

loom_status loom_tboard_add(loom_tboard *t, const char *tag, float value) {
    bytes v = {0}, s = {t->buf, t->len, t->cap};
    uint32_t bits;
    memcpy(&bits, &value, 4);
    int ok = put_bytes_field(&v, 1, tag, strlen(tag)) && put_key(&v, 2, 5) && put_le(&v, bits, 4) &&
             put_bytes_field(&s, 1, v.p, v.len); /* Summary.value (1): one Value */
    free(v.p);
    t->buf = s.p;
    t->len = s.len;
    t->cap = s.cap;
    if (!ok) {
        t->failed = 1;
        return loom_fail(LOOM_EOS, "out of memory for a TensorBoard event");
    }
    return LOOM_OK;
}

loom_status loom_tboard_end(loom_tboard *t) {
    if (t->failed) return loom_fail(LOOM_EOS, "out of memory for a TensorBoard event");
    bytes summary = {t->buf, t->len, t->cap}, e = {0};
    loom_status st = event(&e, now(), t->step, NULL, &summary) ? write_record(t, &e)
                                                               : loom_fail(LOOM_EOS, "out of memory");
    free(e.p);
    return st;
}

/* Numbers below `node`, tags prefix/key/... */
static loom_status add_tree(loom_tboard *t, const cJSON *node, char *tag, size_t at, size_t cap,
                            const char *const *skip) {
    int i = 0;
    for (const cJSON *c = node->child; c; c = c->next, i++) {
        int skipped = 0;
        for (int k = 0; skip && skip[k] && c->string && at == 0; k++)
            skipped |= strcmp(skip[k], c->string) == 0;
        if (skipped) continue;
        int n = c->string ? snprintf(tag + at, cap - at, "%s%s", at ? "/" : "", c->string)
                          : snprintf(tag + at, cap - at, "%s%d", at ? "/" : "", i);
        if (n < 0 || (size_t)n >= cap - at) continue; /* too deep to name: left out */
        if (cJSON_IsNumber(c)) LOOM_TRY(loom_tboard_add(t, tag, (float)c->valuedouble));
        else if (cJSON_IsObject(c) || cJSON_IsArray(c))
            LOOM_TRY(add_tree(t, c, tag, at + (size_t)n, cap, skip));
    }
    tag[at] = '\0';
    return LOOM_OK;
}

loom_status loom_tboard_add_json(loom_tboard *t, const char *json, const char *const *skip) {
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_fail(LOOM_EDATA, "TensorBoard: a metrics row is not a JSON object");
    }
    char tag[256] = "";
    loom_status st = add_tree(t, root, tag, 0, sizeof tag, skip);
    cJSON_Delete(root);
    return st;
}

loom_status loom_tboard_close(loom_tboard *t) {
    if (!t) return LOOM_OK;
    int bad = ferror(t->f);
    bad |= fclose(t->f) != 0;
    loom_status st = bad ? loom_fail(LOOM_EIO, "--tensorboard: writing %s failed", t->path) : LOOM_OK;
    free(t->buf);
    free(t);
    return st;
}
