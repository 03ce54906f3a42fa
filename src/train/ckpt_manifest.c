/* ckpt_manifest.c - the checks that make a manifest safe to read: its own
 * SHA-256 (so an edit or a damaged byte is caught before anything is
 * believed), then after parsing every run's elements lie inside its
 * tensor, every count is small enough for int64 arithmetic, and every
 * shard names a listed file. Local; the parser is fuzzed by
 * tests/fuzz/fuzz_manifest.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/ckpt.h"
#include "loom/sha256.h"
#include "train/ckpt_manifest.h"

/* ---- the manifest's own hash ------------------------------------------------- */

static const char HASH_KEY[] = "\"" CKPT_HASH_KEY "\"";

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Offset of the 64 hex digits of the one "manifest_sha256" member, or -1. */
static long hash_field(const char *text) {
    const char *p = strstr(text, HASH_KEY);
    if (!p || strstr(p + 1, HASH_KEY)) return -1; /* absent, or not the only one */
    p += sizeof HASH_KEY - 1;
    while (is_space(*p)) p++;
    if (*p++ != ':') return -1;
    while (is_space(*p)) p++;
    if (*p++ != '"' || strspn(p, "0123456789abcdef") < 64 || p[64] != '"') return -1;
    return (long)(p - text);
}

/* SHA-256 of text[0..len) with its 64 digits at `at` read as zeros. */
static void hash_zeroed(const char *text, size_t len, size_t at, char hex[65]) {
    static const char zeros[64] = "0000000000000000000000000000000000000000000000000000000000000000";
    loom_sha256 h;
    unsigned char d[32];
    loom_sha256_init(&h);
    loom_sha256_update(&h, text, at);
    loom_sha256_update(&h, zeros, 64);
    loom_sha256_update(&h, text + at + 64, len - at - 64);
    loom_sha256_final(&h, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

loom_status ckpt_manifest_sign(char *text) {
    long at = hash_field(text);
    if (at < 0)
        return loom_fail(LOOM_EINTERNAL, "a manifest without one \"%s\" member to sign", CKPT_HASH_KEY);
    char hex[65];
    hash_zeroed(text, strlen(text), (size_t)at, hex);
    memcpy(text + at, hex, 64);
    return LOOM_OK;
}

loom_status ckpt_manifest_verify_hash(const char *text, size_t len, const char *what) {
    long at = strlen(text) == len ? hash_field(text) : -1;
    if (at < 0)
        return loom_fail(LOOM_EDATA,
                         "%s: no \"%s\" member (damaged, or written by a loom older than checkpoint "
                         "format %d)",
                         what, CKPT_HASH_KEY, CKPT_VERSION);
    char hex[65];
    hash_zeroed(text, len, (size_t)at, hex);
    if (memcmp(hex, text + at, 64) != 0)
        return loom_fail(LOOM_EDATA,
                         "%s: its own SHA-256 does not match its content (edited or damaged "
                         "after it was written)",
                         what);
    return LOOM_OK;
}

/* ---- the checks after parsing --------------------------------------------- */

static const char *str_of(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A non-negative integer below `max`, as a double (exact). */
static int uint_of(const cJSON *v, double max, double *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double x = v->valuedouble;
    if (!(x >= 0 && x <= max) || x != floor(x)) return 0;
    *out = x;
    return 1;
}

static const char *check_tensors(const cJSON *tensors) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tensors) {
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape"), *d;
        const char *dt = str_of(t, "dtype");
        if (!t->string || !dt || strcmp(dt, "F32") != 0 || !cJSON_IsArray(sh))
            return "a tensor lacks dtype F32 or a shape";
        int nd = cJSON_GetArraySize(sh);
        if (nd < 1 || nd > 2) return "a tensor shape has not 1 or 2 dimensions";
        double n = 1, x;
        cJSON_ArrayForEach(d, sh) {
            if (!uint_of(d, CKPT_MAX_NUMEL, &x)) return "a tensor dimension is not a non-negative integer";
            n *= x;
        }
        if (n > CKPT_MAX_NUMEL) return "a tensor has more than 2^40 elements";
    }
    return NULL;
}

static double numel_of(const cJSON *tensors, const char *name) {
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tensors, name),
                                                       "shape"),
                *d;
    if (!cJSON_IsArray(sh)) return -1;
    double n = 1;
    cJSON_ArrayForEach(d, sh) n *= d->valuedouble;
    return n;
}

static int listed(const cJSON *files, const char *name) {
    const cJSON *f;
    cJSON_ArrayForEach(f, files)
        if (strcmp(str_of(f, "file"), name) == 0) return 1;
    return 0;
}

static const char *check_shard(const cJSON *sh, const cJSON *tensors, const cJSON *files) {
    const char *tensor = str_of(sh, "tensor"), *kind = str_of(sh, "kind"), *file = str_of(sh, "file");
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(sh, "runs"),
                *rg = cJSON_GetObjectItemCaseSensitive(sh, "range");
    if (!tensor || !kind || !file || !str_of(sh, "key") || !cJSON_IsArray(runs) || !cJSON_IsArray(rg) ||
        cJSON_GetArraySize(rg) != 2)
        return "a shard lacks tensor, kind, file, key, range or runs";
    if (strcmp(kind, "param") != 0 && strcmp(kind, "exp_avg") != 0 && strcmp(kind, "exp_avg_sq") != 0)
        return "a shard's kind is not param, exp_avg or exp_avg_sq";
    double numel = numel_of(tensors, tensor), lo, hi, want;
    if (numel < 0) return "a shard names a tensor the manifest does not list";
    if (!listed(files, file)) return "a shard names a file the manifest does not list";
    if (!uint_of(cJSON_GetArrayItem(rg, 0), numel, &lo) || !uint_of(cJSON_GetArrayItem(rg, 1), numel, &hi) ||
        lo > hi)
        return "a shard's range is not inside its tensor";
    if (!uint_of(cJSON_GetObjectItemCaseSensitive(sh, "numel"), numel, &want))
        return "a shard's numel is not inside its tensor";
    double total = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, runs) {
        double v[4];
        if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 4)
            return "a run is not [start, len, stride, count]";
        for (int i = 0; i < 4; i++)
            if (!uint_of(cJSON_GetArrayItem(r, i), CKPT_MAX_NUMEL, &v[i]))
                return "a run holds a value that is not a non-negative integer below 2^40";
        if (v[1] < 1 || v[3] < 1) return "a run has len or count 0";
        if (v[0] < lo || v[0] + (v[3] - 1) * v[2] + v[1] > hi) return "a run leaves its shard's range";
        total += v[1] * v[3];
        if (total > want) return "a shard's runs hold more elements than its numel";
    }
    if (total != want) return "a shard's runs do not add up to its numel";
    return NULL;
}

loom_status ckpt_manifest_parse(const char *text, const char *what, cJSON **out) {
    *out = NULL;
    cJSON *o = cJSON_Parse(text);
    if (!o) return loom_fail(LOOM_EDATA, "%s: not valid JSON", what);
    const char *fmt = str_of(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version"),
                *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(o, "shards");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(o, "tensors");
    const char *why = NULL;
    double x;
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0) why = "format is not " CKPT_FORMAT;
    else if (!cJSON_IsNumber(ver) || ver->valuedouble != CKPT_VERSION)
        why = "version is not " CKPT_VERSION_TEXT " (a loom older than this one wrote it)";
    else if (!uint_of(step, 1e9, &x)) why = "step is not an integer in 0..1e9";
    else if (!cJSON_IsArray(files) || !cJSON_IsArray(shards) || !cJSON_IsObject(tensors))
        why = "files, shards or tensors missing";
    else why = check_tensors(tensors);
    const cJSON *ot = cJSON_GetObjectItemCaseSensitive(o, "optimizer_steps");
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(o, "run");
    const char *id = str_of(run, "id"), *self = str_of(o, CKPT_HASH_KEY);
    if (!why && !uint_of(ot, 1e9, &x)) why = "optimizer_steps is not an integer in 0..1e9";
    if (!why && (!cJSON_IsObject(run) || !id || strlen(id) != 64)) why = "run has no 64-digit id";
    if (!why && (!self || strlen(self) != 64)) why = CKPT_HASH_KEY " is not 64 digits";
    const cJSON *f;
    if (!why)
        cJSON_ArrayForEach(f, files) {
            const char *name = str_of(f, "file"), *h = str_of(f, "sha256");
            if (!name || !h || strlen(h) != 64 || strspn(h, "0123456789abcdef") != 64 || !name[0] ||
                strchr(name, '/') || name[0] == '.') {
                why = "a file entry lacks a plain file name or a 64-digit SHA-256";
                break;
            }
        }
    const cJSON *sh;
    if (!why)
        cJSON_ArrayForEach(sh, shards)
            if ((why = check_shard(sh, tensors, files))) break;
    if (why) {
        cJSON_Delete(o);
        return loom_fail(LOOM_EDATA, "%s: %s", what, why);
    }
    *out = o;
    return LOOM_OK;
}

loom_status loom_ckpt_manifest_check(const char *text) {
    cJSON *o;
    LOOM_TRY(ckpt_manifest_parse(text, "manifest", &o));
    cJSON_Delete(o);
    return LOOM_OK;
}
