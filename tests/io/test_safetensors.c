/* test_safetensors.c - the safetensors reader and writer.
 *
 * Round trip of every dtype (odd sizes, so offsets are unaligned), a scalar,
 * an empty tensor and escaped names/metadata; the exact on-disk layout; F16
 * and BF16 conversion; every kind of malformed file (each must be LOOM_EDATA
 * naming the file and the tensor, never a crash), truncations at every length
 * and random header corruption; writer misuse; and failed writes that must
 * leave an existing file untouched and no PATH.tmp behind. */
#include "check.h"
#include "loom/safetensors.h"

#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- scratch files ---- */

static const char *scratch; /* check_scratch_dir */

/* Read a whole file (caller frees); NULL if missing. */
static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc(*n ? *n : 1);
    if (fread(p, 1, *n, fp) != *n) CHECK(0, "short read of %s", path);
    fclose(fp);
    return p;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* A file with this header (length given as hlen) and data_len zero bytes. */
static void write_st_raw(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t n = strlen(header), total = 8 + n + data_len;
    unsigned char *b = calloc(1, total);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, header, n);
    check_write_bytes(path, b, total);
    free(b);
}

static void write_st(const char *path, const char *header, size_t data_len) {
    write_st_raw(path, strlen(header), header, data_len);
}

/* ---- round trip ---- */

#define N_F32 6
static const float v_f32[N_F32] = {-1.5f, 0.0f, 3.25f, 1e-30f, -0.0f, 65504.0f};
static const uint16_t v_f16[5] = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x8000}; /* 1 -2 2^-24 inf -0 */
static const uint16_t v_bf16[4] = {0x3f80, 0xc049, 0x0001, 0xff80};        /* 1 -3.140625 tiny -inf */
static const double v_f64[3] = {1.0 / 3.0, -1e300, 5e-324};
static const int32_t v_i32[4] = {-2147483647 - 1, -1, 0, 2147483647};
static const int64_t v_i64[2] = {INT64_MIN, 1234567890123LL};
static const uint16_t v_u16[3] = {0, 1, 65535};
static const uint8_t v_u8[7] = {0, 1, 2, 127, 128, 254, 255};
static const float v_scalar = 42.0f;

static const char *NAME_ESC = "weird \"name\"\\\n\t\x01 é";
static const char *META_ESC = "quote\" backslash\\ newline\n tab\t ctl\x02 utf8 ✓";

static loom_status write_sample(const char *path) {
    loom_st_writer *w;
    LOOM_TRY(loom_st_writer_create(path, &w));
    const int64_t s_f32[2] = {2, 3}, s_f16[1] = {5}, s_bf16[2] = {2, 2}, s_f64[1] = {3}, s_i32[1] = {4},
                  s_i64[1] = {2}, s_u16[3] = {1, 3, 1}, s_u8[1] = {7}, s_empty[2] = {0, 3};
    loom_status st = LOOM_OK;
    if (!st) st = loom_st_writer_add(w, "u8", LOOM_ST_U8, 1, s_u8, v_u8);
    if (!st) st = loom_st_writer_add(w, "f32", LOOM_ST_F32, 2, s_f32, v_f32);
    if (!st) st = loom_st_writer_add(w, "f16", LOOM_ST_F16, 1, s_f16, v_f16);
    if (!st) st = loom_st_writer_add(w, "bf16", LOOM_ST_BF16, 2, s_bf16, v_bf16);
    if (!st) st = loom_st_writer_add(w, "f64", LOOM_ST_F64, 1, s_f64, v_f64);
    if (!st) st = loom_st_writer_add(w, "i32", LOOM_ST_I32, 1, s_i32, v_i32);
    if (!st) st = loom_st_writer_add(w, "i64", LOOM_ST_I64, 1, s_i64, v_i64);
    if (!st) st = loom_st_writer_add(w, "u16", LOOM_ST_U16, 3, s_u16, v_u16);
    if (!st) st = loom_st_writer_add(w, "scalar", LOOM_ST_F32, 0, NULL, &v_scalar);
    if (!st) st = loom_st_writer_add(w, "empty", LOOM_ST_F32, 2, s_empty, NULL);
    if (!st) st = loom_st_writer_add(w, NAME_ESC, LOOM_ST_U8, 1, s_u8, v_u8);
    if (!st) st = loom_st_writer_metadata(w, "format", "pt");
    if (!st) st = loom_st_writer_metadata(w, "note", "replaced below");
    if (!st) st = loom_st_writer_metadata(w, "note", META_ESC);
    if (st) {
        loom_st_writer_abort(w);
        return st;
    }
    return loom_st_writer_finish(w);
}

static void check_tensor(const loom_st_file *f, const char *name, loom_st_dtype dt, int ndim,
                         const int64_t *shape, const void *want, size_t nbytes) {
    const loom_st_tensor *t = loom_st_find(f, name);
    CHECK(t != NULL, "tensor %s not found", name);
    if (!t) return;
    CHECK(strcmp(t->name, name) == 0, "name %s", t->name);
    CHECK(t->dtype == dt, "%s: dtype %s", name, loom_st_dtype_name(t->dtype));
    CHECK(t->ndim == ndim, "%s: ndim %d, expected %d", name, t->ndim, ndim);
    size_t numel = 1;
    for (int d = 0; d < ndim && d < t->ndim; d++) {
        CHECK(t->shape[d] == shape[d], "%s: dim %d is %lld", name, d, (long long)t->shape[d]);
        numel *= (size_t)shape[d];
    }
    CHECK(t->numel == numel && t->nbytes == nbytes, "%s: numel %zu nbytes %zu", name, t->numel, t->nbytes);
    CHECK(nbytes == 0 || memcmp(loom_st_data(f, t), want, nbytes) == 0, "%s: bytes differ", name);
}

static void test_round_trip(void) {
    const char *p = check_scratch_path("sample.safetensors");
    CHECK(write_sample(p) == LOOM_OK, "write: %s", loom_errmsg());
    CHECK(!exists(check_scratch_path("sample.safetensors.tmp")), "no tmp file left");
    loom_st_file *f = NULL;
    CHECK(loom_st_open(p, &f) == LOOM_OK, "open: %s", loom_errmsg());
    if (!f) return;
    CHECK(loom_st_count(f) == 11, "count %d", loom_st_count(f));
    static const char *order[] = {"u8", "f32", "f16", "bf16", "f64", "i32", "i64", "u16", "scalar", "empty"};
    for (int i = 0; i < 10; i++)
        CHECK(strcmp(loom_st_at(f, i)->name, order[i]) == 0, "tensor %d is %s", i, loom_st_at(f, i)->name);
    CHECK(loom_st_at(f, 11) == NULL && loom_st_at(f, -1) == NULL, "at() out of range is NULL");
    for (int i = 1; i < 11; i++)
        CHECK(loom_st_at(f, i)->offset == loom_st_at(f, i - 1)->offset + loom_st_at(f, i - 1)->nbytes,
              "tensor %d follows tensor %d in the data", i, i - 1);
    check_tensor(f, "u8", LOOM_ST_U8, 1, (int64_t[]){7}, v_u8, 7);
    check_tensor(f, "f32", LOOM_ST_F32, 2, (int64_t[]){2, 3}, v_f32, 24);
    check_tensor(f, "f16", LOOM_ST_F16, 1, (int64_t[]){5}, v_f16, 10);
    check_tensor(f, "bf16", LOOM_ST_BF16, 2, (int64_t[]){2, 2}, v_bf16, 8);
    check_tensor(f, "f64", LOOM_ST_F64, 1, (int64_t[]){3}, v_f64, 24);
    check_tensor(f, "i32", LOOM_ST_I32, 1, (int64_t[]){4}, v_i32, 16);
    check_tensor(f, "i64", LOOM_ST_I64, 1, (int64_t[]){2}, v_i64, 16);
    check_tensor(f, "u16", LOOM_ST_U16, 3, (int64_t[]){1, 3, 1}, v_u16, 6);
    check_tensor(f, "scalar", LOOM_ST_F32, 0, NULL, &v_scalar, 4);
    check_tensor(f, "empty", LOOM_ST_F32, 2, (int64_t[]){0, 3}, NULL, 0);
    check_tensor(f, NAME_ESC, LOOM_ST_U8, 1, (int64_t[]){7}, v_u8, 7);
    CHECK(loom_st_find(f, "nope") == NULL, "find of a missing name is NULL");
    CHECK(loom_st_metadata(f, "format") && strcmp(loom_st_metadata(f, "format"), "pt") == 0,
          "metadata format");
    CHECK(loom_st_metadata(f, "note") && strcmp(loom_st_metadata(f, "note"), META_ESC) == 0, "metadata note");
    CHECK(loom_st_metadata(f, "absent") == NULL, "missing metadata is NULL");

    float out[N_F32];
    CHECK(loom_st_read_f32(f, loom_st_find(f, "f32"), out) == LOOM_OK, "read f32");
    CHECK(memcmp(out, v_f32, sizeof out) == 0, "f32 values");
    CHECK(loom_st_read_f32(f, loom_st_find(f, "f64"), out) == LOOM_OK, "read f64");
    for (int i = 0; i < 3; i++) CHECK(out[i] == (float)v_f64[i], "f64[%d] -> %g", i, out[i]);
    CHECK(loom_st_read_f32(f, loom_st_find(f, "i32"), out) == LOOM_EDATA, "read_f32 of I32 is LOOM_EDATA");
    CHECK(strstr(loom_errmsg(), "i32") && strstr(loom_errmsg(), p), "message: %s", loom_errmsg());
    loom_st_close(f);

    /* Layout: u64 length, header padded with spaces to a multiple of 8. */
    size_t n;
    unsigned char *b = read_bytes(p, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    CHECK(hlen % 8 == 0 && 8 + hlen <= n, "header length %llu", (unsigned long long)hlen);
    CHECK(b[8] == '{', "header starts with {");
    size_t last = 8 + hlen - 1;
    while (b[last] == ' ') last--;
    CHECK(b[last] == '}' && 8 + hlen - 1 - last < 8, "header padded with < 8 spaces");
    free(b);
}

static void test_f16_bf16_conversion(void) {
    static const struct {
        uint16_t h;
        float f;
    } f16[] = {{0x3c00, 1.0f},
               {0xc000, -2.0f},
               {0x7bff, 65504.0f},
               {0x0001, 0x1p-24f},
               {0x03ff, 1023 * 0x1p-24f},
               {0x0400, 0x1p-14f},
               {0x3555, 0.333251953125f},
               {0x7c00, INFINITY},
               {0xfc00, -INFINITY},
               {0x8001, -0x1p-24f}};
    static const struct {
        uint16_t h;
        float f;
    } bf16[] = {{0x3f80, 1.0f}, {0xc049, -3.140625f}, {0x7f80, INFINITY}, {0x0080, 0x1p-126f}};
    const int nf = sizeof f16 / sizeof f16[0], nb = sizeof bf16 / sizeof bf16[0];
    uint16_t h[16 + 4];
    for (int i = 0; i < nf; i++) h[i] = f16[i].h;
    h[nf] = 0x7e00;     /* nan */
    h[nf + 1] = 0x8000; /* -0 */
    uint16_t hb[8];
    for (int i = 0; i < nb; i++) hb[i] = bf16[i].h;
    const char *p = check_scratch_path("conv.safetensors");
    loom_st_writer *w;
    CHECK(loom_st_writer_create(p, &w) == LOOM_OK, "create");
    loom_st_writer_add(w, "h", LOOM_ST_F16, 1, (int64_t[]){nf + 2}, h);
    loom_st_writer_add(w, "b", LOOM_ST_BF16, 1, (int64_t[]){nb}, hb);
    CHECK(loom_st_writer_finish(w) == LOOM_OK, "finish: %s", loom_errmsg());
    loom_st_file *f;
    CHECK(loom_st_open(p, &f) == LOOM_OK, "open: %s", loom_errmsg());
    float out[32];
    CHECK(loom_st_read_f32(f, loom_st_find(f, "h"), out) == LOOM_OK, "read f16");
    for (int i = 0; i < nf; i++)
        CHECK(out[i] == f16[i].f, "f16 %04x -> %a, expected %a", f16[i].h, out[i], f16[i].f);
    CHECK(isnan(out[nf]), "f16 7e00 is nan");
    CHECK(out[nf + 1] == 0.0f && signbit(out[nf + 1]), "f16 8000 is -0");
    CHECK(loom_st_read_f32(f, loom_st_find(f, "b"), out) == LOOM_OK, "read bf16");
    for (int i = 0; i < nb; i++) CHECK(out[i] == bf16[i].f, "bf16 %04x -> %a", bf16[i].h, out[i]);
    loom_st_close(f);
}

/* Many tensors: the writer's arrays grow, find() searches all of them. */
static void test_many_tensors(void) {
    enum { N = 300 };
    static int32_t vals[N];
    char name[32];
    const char *p = check_scratch_path("many.safetensors");
    loom_st_writer *w;
    CHECK(loom_st_writer_create(p, &w) == LOOM_OK, "create");
    for (int i = 0; i < N; i++) {
        vals[i] = i * 7 - 1000;
        snprintf(name, sizeof name, "h.%d.w", (i * 131) % N); /* not in sorted order */
        CHECK(loom_st_writer_add(w, name, LOOM_ST_I32, 1, (int64_t[]){1}, &vals[i]) == LOOM_OK, "add %s",
              name);
    }
    CHECK(loom_st_writer_finish(w) == LOOM_OK, "finish: %s", loom_errmsg());
    loom_st_file *f;
    CHECK(loom_st_open(p, &f) == LOOM_OK, "open: %s", loom_errmsg());
    if (!f) return;
    int bad = loom_st_count(f) != N;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "h.%d.w", (i * 131) % N);
        const loom_st_tensor *t = loom_st_find(f, name);
        bad += !t || t != loom_st_at(f, i) || memcmp(loom_st_data(f, t), &vals[i], 4) != 0;
    }
    CHECK(bad == 0, "%d of %d tensors not found or wrong", bad, N);
    loom_st_close(f);
}

/* ---- malformed files ---- */

static void expect_open_fails(const char *label, const char *path, loom_status want, const char *word) {
    loom_st_file *f = (loom_st_file *)1;
    loom_clear_error();
    loom_status st = loom_st_open(path, &f);
    CHECK(st == want, "%s: status %d, expected %d (%s)", label, st, want, loom_errmsg());
    CHECK(f == NULL, "%s: out must be NULL on failure", label);
    CHECK(strstr(loom_errmsg(), path) != NULL, "%s: message does not name the file: %s", label,
          loom_errmsg());
    CHECK(!word || strstr(loom_errmsg(), word), "%s: message does not say '%s': %s", label, word,
          loom_errmsg());
    if (st == LOOM_OK) loom_st_close(f);
}

static const struct {
    const char *label, *header;
    size_t data_len;
    const char *word; /* the tensor (or detail) the message must name */
} bad_headers[] = {
    {"invalid json", "{\"w\":{\"dtype\":\"F32\"", 0, "JSON"},
    {"empty header", "", 0, "JSON"},
    {"root not an object", "[1,2]", 0, "object"},
    {"junk after json", "{} x", 0, "junk"},
    {"entry not an object", "{\"w\":5}", 0, "w"},
    {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "w"},
    {"dtype not a string", "{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "w"},
    {"unknown dtype", "{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "Q7"},
    {"missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "w"},
    {"shape not an array", "{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, "w"},
    {"shape fractional", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "w"},
    {"shape negative", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "w"},
    {"shape string entry", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "w"},
    {"too many dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
     "w"},
    {"shape overflow",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
     "\"data_offsets\":[0,4]}}",
     4, "w"},
    {"missing offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "w"},
    {"offsets too short", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "w"},
    {"offsets strings", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 4, "w"},
    {"offsets huge", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 4, "w"},
    {"shape vs bytes", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "w"},
    {"offsets past end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "w"},
    {"offsets reversed", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "w"},
    {"offsets into header", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "header"},
    {"duplicate names",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, "w"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, "overlaps"},
    {"hole", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "w"},
    {"trailing bytes", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "after"},
    {"metadata not an object", "{\"__metadata__\":5}", 0, "__metadata__"},
    {"metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0, "k"},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "twice"},
};

static void test_malformed(void) {
    const char *p = check_scratch_path("bad.safetensors");
    for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++) {
        write_st(p, bad_headers[i].header, bad_headers[i].data_len);
        expect_open_fails(bad_headers[i].label, p, LOOM_EDATA, bad_headers[i].word);
    }
    check_write_bytes(p, "", 0);
    expect_open_fails("empty file", p, LOOM_EDATA, "short");
    check_write_bytes(p, "\x02\0\0\0\0\0\0", 7);
    expect_open_fails("7-byte file", p, LOOM_EDATA, "short");
    write_st_raw(p, 1000, "{}", 4);
    expect_open_fails("header longer than file", p, LOOM_EDATA, "1000");
    write_st_raw(p, UINT64_MAX, "{}", 4);
    expect_open_fails("header length 2^64-1", p, LOOM_EDATA, "header length");
    check_write_bytes(p, "\x08\0\0\0\0\0\0\0{}\0     ", 16);
    expect_open_fails("NUL in header", p, LOOM_EDATA, "NUL");
    expect_open_fails("missing file", check_scratch_path("does-not-exist.safetensors"), LOOM_ENOINPUT, NULL);
    expect_open_fails("directory", scratch, LOOM_ENOINPUT, NULL);

    write_st(p, "{}      ", 0); /* valid: no tensors, space padding */
    loom_st_file *f;
    CHECK(loom_st_open(p, &f) == LOOM_OK, "empty header object: %s", loom_errmsg());
    if (f) {
        CHECK(loom_st_count(f) == 0 && loom_st_find(f, "w") == NULL, "no tensors");
        CHECK(loom_st_metadata(f, "x") == NULL, "no metadata");
        loom_st_close(f);
    }
}

/* Every truncation of a valid file is LOOM_EDATA; random header damage never
 * crashes (ASan/UBSan builds check the reads). */
static void test_truncation_and_corruption(void) {
    const char *src = check_scratch_path("sample.safetensors"), *p = check_scratch_path("cut.safetensors");
    size_t n;
    unsigned char *b = read_bytes(src, &n);
    if (!b) return;
    int wrong = 0;
    for (size_t len = 0; len < n; len++) {
        check_write_bytes(p, b, len);
        loom_st_file *f;
        loom_status st = loom_st_open(p, &f);
        wrong += st != LOOM_EDATA;
        if (st == LOOM_OK) loom_st_close(f);
    }
    CHECK(wrong == 0, "%d truncations were not LOOM_EDATA", wrong);

    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    unsigned char *m = malloc(n);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int opened = 0;
    static const char alphabet[] = "{}[],:\"0123456789-.e \\x";
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(m, b, n);
        for (int k = 0; k < 1 + iter % 3; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((x >> 33) % (8 + hlen));
            m[at] = (x >> 20) & 1 ? (unsigned char)(x >> 24) : (unsigned char)alphabet[(x >> 24) % 23];
        }
        check_write_bytes(p, m, n);
        loom_st_file *f;
        if (loom_st_open(p, &f) != LOOM_OK) continue;
        opened++;
        float buf[64];
        for (int i = 0; i < loom_st_count(f); i++) {
            const loom_st_tensor *t = loom_st_at(f, i);
            if (t->numel <= 64) loom_st_read_f32(f, t, buf);
        }
        loom_st_close(f);
    }
    CHECK(1, "corruption survived (%d of 3000 still valid)", opened);
    free(m);
    free(b);
}

/* ---- writer ---- */

static void test_writer_misuse(void) {
    const char *p = check_scratch_path("misuse.safetensors");
    loom_st_writer *w;
    CHECK(loom_st_writer_create(p, &w) == LOOM_OK, "create");
    float x[4] = {0};
    CHECK(loom_st_writer_add(w, "a", LOOM_ST_F32, 1, (int64_t[]){4}, x) == LOOM_OK, "add a");
    CHECK(loom_st_writer_add(w, "a", LOOM_ST_F32, 1, (int64_t[]){4}, x) == LOOM_EINTERNAL, "duplicate name");
    CHECK(strstr(loom_errmsg(), "a") != NULL, "message names the tensor: %s", loom_errmsg());
    CHECK(loom_st_writer_add(w, "__metadata__", LOOM_ST_F32, 1, (int64_t[]){4}, x) == LOOM_EINTERNAL,
          "reserved name");
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 4};
    CHECK(loom_st_writer_add(w, "b", LOOM_ST_F32, 9, nine, x) == LOOM_EINTERNAL, "9 dims");
    CHECK(loom_st_writer_add(w, "c", LOOM_ST_F32, 1, (int64_t[]){-1}, x) == LOOM_EINTERNAL, "negative dim");
    CHECK(loom_st_writer_add(w, "d", LOOM_ST_F32, 1, (int64_t[]){4}, NULL) == LOOM_EINTERNAL, "NULL data");
    loom_st_writer_abort(w);
    CHECK(!exists(p) && !exists(check_scratch_path("misuse.safetensors.tmp")), "abort writes nothing");
}

static int file_equals(const char *path, const unsigned char *want, size_t n) {
    size_t m;
    unsigned char *b = read_bytes(path, &m);
    int eq = b && m == n && memcmp(b, want, n) == 0;
    free(b);
    return eq;
}

static loom_status write_one(const char *path, const float *data, int64_t n) {
    loom_st_writer *w;
    LOOM_TRY(loom_st_writer_create(path, &w));
    loom_status st = loom_st_writer_add(w, "x", LOOM_ST_F32, 1, &n, data);
    if (st) {
        loom_st_writer_abort(w);
        return st;
    }
    return loom_st_writer_finish(w);
}

static void test_writer_failures(void) {
    float small[4] = {1, 2, 3, 4};
    const char *nodir = check_scratch_path("no/such/dir/x.safetensors");
    CHECK(write_one(nodir, small, 4) == LOOM_ECANTCREAT, "missing directory: %s", loom_errmsg());
    CHECK(strstr(loom_errmsg(), nodir) != NULL, "message names the path: %s", loom_errmsg());

    /* PATH is a directory: the rename fails, the directory stays. */
    const char *dirpath = check_scratch_path("isdir.safetensors");
    mkdir(dirpath, 0755);
    CHECK(write_one(dirpath, small, 4) == LOOM_ECANTCREAT, "rename over a directory: %s", loom_errmsg());
    struct stat sb;
    CHECK(stat(dirpath, &sb) == 0 && S_ISDIR(sb.st_mode), "the directory is intact");
    CHECK(!exists(check_scratch_path("isdir.safetensors.tmp")), "tmp removed after a failed rename");

    /* An existing file survives a write that fails half way (file size limit). */
    const char *p = check_scratch_path("keep.safetensors");
    CHECK(write_one(p, small, 4) == LOOM_OK, "first write: %s", loom_errmsg());
    size_t n;
    unsigned char *old = read_bytes(p, &n);
    enum { BIG = 1 << 16 };
    float *big = calloc(BIG, sizeof *big);
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    loom_status st = write_one(p, big, BIG);
    setrlimit(RLIMIT_FSIZE, &saved);
    CHECK(st == LOOM_EIO, "write past the file size limit: status %d (%s)", st, loom_errmsg());
    CHECK(old && file_equals(p, old, n), "the existing file is untouched");
    CHECK(!exists(check_scratch_path("keep.safetensors.tmp")), "tmp removed after a failed write");

    /* And a successful write replaces it. */
    CHECK(write_one(p, big, BIG) == LOOM_OK, "second write: %s", loom_errmsg());
    loom_st_file *f;
    CHECK(loom_st_open(p, &f) == LOOM_OK && loom_st_find(f, "x")->numel == BIG, "replaced");
    loom_st_close(f);
    free(big);
    free(old);
}

int main(void) {
    scratch = check_scratch_dir("st");
    if (!scratch) return check_done();
    test_round_trip();
    test_f16_bf16_conversion();
    test_many_tensors();
    test_malformed();
    test_truncation_and_corruption();
    test_writer_misuse();
    test_writer_failures();
    return check_done();
}
