/* safetensors.c - reader and writer for the safetensors format.
 *
 * Implements include/loom/safetensors.h. The reader maps the file, parses the
 * JSON header with cJSON and validates every entry before anyone sees it:
 * types of all fields, known dtype, shape product against the byte count,
 * offsets inside the data section, unique names, and (as the format requires)
 * tensors that tile the data section with no overlap, hole or trailing bytes.
 * Any violation is LOOM_EDATA naming the file and the tensor. The writer
 * builds the header by hand (tensors in the order added, padded with spaces
 * to a multiple of 8 bytes), writes PATH.tmp, fsyncs and renames it over PATH,
 * so PATH is either the old file or the complete new one. Local I/O only:
 * nothing here is collective.
 */
#include "loom/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define ST_METADATA_KEY "__metadata__"
#define ST_MAX_INT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    [LOOM_ST_F32] = {"F32", 4}, [LOOM_ST_F16] = {"F16", 2}, [LOOM_ST_BF16] = {"BF16", 2},
    [LOOM_ST_F64] = {"F64", 8}, [LOOM_ST_I32] = {"I32", 4}, [LOOM_ST_I64] = {"I64", 8},
    [LOOM_ST_U16] = {"U16", 2}, [LOOM_ST_U8] = {"U8", 1},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

const char *loom_st_dtype_name(loom_st_dtype t) {
    return (int)t >= 0 && (int)t < ST_NDTYPES ? st_dtypes[t].name : "?";
}

size_t loom_st_dtype_size(loom_st_dtype t) {
    return (int)t >= 0 && (int)t < ST_NDTYPES ? st_dtypes[t].size : 0;
}

static int st_dtype_parse(const char *s, loom_st_dtype *out) {
    for (int i = 0; i < ST_NDTYPES; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (loom_st_dtype)i;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Reader                                                                   */
/* ------------------------------------------------------------------------ */

struct loom_st_file {
    char *path;
    unsigned char *map; /* the whole file, read-only */
    size_t size;
    size_t data_start; /* 8 + header length */
    cJSON *root;       /* owns the tensor names and metadata strings */
    const cJSON *meta; /* the "__metadata__" object, or NULL */
    int n;
    loom_st_tensor *tensors;  /* n, in header order */
    loom_st_tensor **by_name; /* n, sorted by name for loom_st_find */
};

static loom_status st_map_file(loom_st_file *f) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loom_fail(LOOM_ENOINPUT, "file %s: cannot open: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return loom_fail(LOOM_ENOINPUT, "file %s: not a readable regular file", f->path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        close(fd);
        return loom_fail(LOOM_EDATA, "file %s: %zu bytes, too short for the 8-byte header length", f->path,
                         f->size);
    }
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) return loom_fail(LOOM_EIO, "file %s: cannot map: %s", f->path, strerror(err));
    f->map = m;
    return LOOM_OK;
}

/* A JSON number that is a non-negative integer below 2^53, as uint64. */
static int st_json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d < ST_MAX_INT) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static loom_status st_parse_shape(const loom_st_file *f, const char *name, const cJSON *shape,
                                  loom_st_tensor *t) {
    if (!cJSON_IsArray(shape))
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: \"shape\" is missing or not an array", f->path,
                         name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > LOOM_ST_MAX_DIMS)
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: %d dimensions, at most %d supported", f->path, name,
                         ndim, LOOM_ST_MAX_DIMS);
    t->ndim = 0;
    t->numel = 1;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        uint64_t v;
        if (!st_json_uint(d, &v))
            return loom_fail(LOOM_EDATA, "file %s: tensor %s: shape entry %d is not a non-negative integer",
                             f->path, name, t->ndim);
        if (v != 0 && t->numel > SIZE_MAX / 8 / v)
            return loom_fail(LOOM_EDATA, "file %s: tensor %s: shape product overflows", f->path, name);
        t->numel *= (size_t)v;
        t->shape[t->ndim++] = (int64_t)v;
    }
    return LOOM_OK;
}

static loom_status st_parse_offsets(const loom_st_file *f, const char *name, const cJSON *offs,
                                    uint64_t *begin, uint64_t *end) {
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: \"data_offsets\" is missing or not [begin, end]",
                         f->path, name);
    const cJSON *b = cJSON_GetArrayItem(offs, 0), *e = cJSON_GetArrayItem(offs, 1);
    if ((cJSON_IsNumber(b) && b->valuedouble < 0) || (cJSON_IsNumber(e) && e->valuedouble < 0))
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: negative data_offsets point into the header",
                         f->path, name);
    if (!st_json_uint(b, begin) || !st_json_uint(e, end))
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: data_offsets are not non-negative integers",
                         f->path, name);
    size_t data_len = f->size - f->data_start;
    if (*begin > *end)
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: data_offsets [%llu, %llu] are reversed", f->path,
                         name, (unsigned long long)*begin, (unsigned long long)*end);
    if (*end > data_len)
        return loom_fail(
            LOOM_EDATA,
            "file %s: tensor %s: data_offsets [%llu, %llu] run past the end of the %zu data bytes", f->path,
            name, (unsigned long long)*begin, (unsigned long long)*end, data_len);
    return LOOM_OK;
}

static loom_status st_parse_tensor(const loom_st_file *f, const cJSON *item, loom_st_tensor *t) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: entry is not a JSON object", f->path, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype))
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: \"dtype\" is missing or not a string", f->path,
                         name);
    if (!st_dtype_parse(dtype->valuestring, &t->dtype))
        return loom_fail(LOOM_EDATA, "file %s: tensor %s: unknown dtype \"%s\"", f->path, name,
                         dtype->valuestring);
    LOOM_TRY(st_parse_shape(f, name, cJSON_GetObjectItemCaseSensitive(item, "shape"), t));
    uint64_t begin = 0, end = 0;
    LOOM_TRY(st_parse_offsets(f, name, cJSON_GetObjectItemCaseSensitive(item, "data_offsets"), &begin, &end));
    size_t need = t->numel * st_dtypes[t->dtype].size;
    if (end - begin != need)
        return loom_fail(
            LOOM_EDATA, "file %s: tensor %s: %zu elements of %s need %zu bytes but data_offsets give %llu",
            f->path, name, t->numel, st_dtypes[t->dtype].name, need, (unsigned long long)(end - begin));
    t->name = item->string;
    t->offset = f->data_start + (size_t)begin;
    t->nbytes = need;
    return LOOM_OK;
}

static loom_status st_parse_metadata(loom_st_file *f, const cJSON *item) {
    if (f->meta) return loom_fail(LOOM_EDATA, "file %s: \"%s\" appears twice", f->path, ST_METADATA_KEY);
    if (!cJSON_IsObject(item))
        return loom_fail(LOOM_EDATA, "file %s: \"%s\" is not a JSON object", f->path, ST_METADATA_KEY);
    const cJSON *v;
    cJSON_ArrayForEach(v, item) {
        if (!cJSON_IsString(v))
            return loom_fail(LOOM_EDATA, "file %s: metadata %s is not a string", f->path, v->string);
    }
    f->meta = item;
    return LOOM_OK;
}

/* Parse the JSON header; the 8 length bytes are known to exist. */
static loom_status st_parse_json(loom_st_file *f) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)f->map[i] << (8 * i);
    if (hlen > f->size - 8)
        return loom_fail(LOOM_EDATA, "file %s: header length %llu exceeds the %zu bytes after it", f->path,
                         (unsigned long long)hlen, f->size - 8);
    const char *hdr = (const char *)f->map + 8;
    f->data_start = 8 + (size_t)hlen;
    if (memchr(hdr, '\0', (size_t)hlen))
        return loom_fail(LOOM_EDATA, "file %s: header contains a NUL byte", f->path);
    const char *end = NULL;
    f->root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!f->root)
        return loom_fail(LOOM_EDATA, "file %s: header is not valid JSON (error near byte %zu of %llu)",
                         f->path, end ? (size_t)(end - hdr) : 0, (unsigned long long)hlen);
    for (; end < hdr + hlen; end++) {
        if (!strchr(" \t\r\n", *end))
            return loom_fail(LOOM_EDATA, "file %s: junk after the JSON header at byte %zu", f->path,
                             (size_t)(end - hdr));
    }
    if (!cJSON_IsObject(f->root))
        return loom_fail(LOOM_EDATA, "file %s: header is not a JSON object", f->path);
    return LOOM_OK;
}

static loom_status st_parse_entries(loom_st_file *f) {
    int n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, f->root) n += strcmp(item->string, ST_METADATA_KEY) != 0;
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    f->by_name = calloc(n ? (size_t)n : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) return loom_fail(LOOM_EOS, "file %s: out of memory", f->path);
    cJSON_ArrayForEach(item, f->root) {
        if (strcmp(item->string, ST_METADATA_KEY) == 0) {
            LOOM_TRY(st_parse_metadata(f, item));
            continue;
        }
        LOOM_TRY(st_parse_tensor(f, item, &f->tensors[f->n]));
        f->by_name[f->n] = &f->tensors[f->n];
        f->n++;
    }
    return LOOM_OK;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp((*(loom_st_tensor *const *)a)->name, (*(loom_st_tensor *const *)b)->name);
}

static int st_cmp_offset(const void *a, const void *b) {
    const loom_st_tensor *x = *(loom_st_tensor *const *)a, *y = *(loom_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Names unique; data tiled by the tensors without overlap, hole or tail. */
static loom_status st_check_layout(loom_st_file *f) {
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, st_cmp_name);
    for (int i = 1; i < f->n; i++) {
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            return loom_fail(LOOM_EDATA, "file %s: tensor %s appears twice", f->path, f->by_name[i]->name);
    }
    loom_st_tensor **order = malloc((f->n ? (size_t)f->n : 1) * sizeof *order);
    if (!order) return loom_fail(LOOM_EOS, "file %s: out of memory", f->path);
    memcpy(order, f->by_name, (size_t)f->n * sizeof *order);
    qsort(order, (size_t)f->n, sizeof *order, st_cmp_offset);
    loom_status st = LOOM_OK;
    size_t at = f->data_start;
    const loom_st_tensor *prev = NULL;
    for (int i = 0; i < f->n && st == LOOM_OK; i++) {
        const loom_st_tensor *t = order[i];
        if (t->offset < at)
            st = loom_fail(LOOM_EDATA, "file %s: tensor %s overlaps tensor %s", f->path, t->name, prev->name);
        else if (t->offset > at)
            st = loom_fail(LOOM_EDATA,
                           "file %s: tensor %s: %zu unused data bytes before it (the data must "
                           "be contiguous)",
                           f->path, t->name, t->offset - at);
        at = t->offset + t->nbytes;
        prev = t;
    }
    if (st == LOOM_OK && at != f->size)
        st = loom_fail(LOOM_EDATA, "file %s: %zu data bytes after the last tensor are not in the header",
                       f->path, f->size - at);
    free(order);
    return st;
}

loom_status loom_st_open(const char *path, loom_st_file **out) {
    *out = NULL;
    loom_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return loom_fail(LOOM_EOS, "file %s: out of memory", path);
    }
    loom_status st = st_map_file(f);
    if (st == LOOM_OK) st = st_parse_json(f);
    if (st == LOOM_OK) st = st_parse_entries(f);
    if (st == LOOM_OK) st = st_check_layout(f);
    if (st != LOOM_OK) {
        loom_st_close(f);
        return st;
    }
    *out = f;
    return LOOM_OK;
}

void loom_st_close(loom_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    cJSON_Delete(f->root);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

int loom_st_count(const loom_st_file *f) { return f->n; }

const loom_st_tensor *loom_st_at(const loom_st_file *f, int i) {
    return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const loom_st_tensor *loom_st_find(const loom_st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *loom_st_metadata(const loom_st_file *f, const char *key) {
    const cJSON *v = f->meta ? cJSON_GetObjectItemCaseSensitive(f->meta, key) : NULL;
    return v ? v->valuestring : NULL;
}

const void *loom_st_data(const loom_st_file *f, const loom_st_tensor *t) { return f->map + t->offset; }

/* IEEE binary16 bits to float, exactly (subnormals, infinities, NaN payloads). */
static float st_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | man << 13;
    } else if (exp != 0) {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    } else {
        float v = (float)man * 5.9604644775390625e-08f; /* man * 2^-24, exact */
        return sign ? -v : v;
    }
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

loom_status loom_st_read_f32(const loom_st_file *f, const loom_st_tensor *t, float *dst) {
    const unsigned char *src = f->map + t->offset;
    switch (t->dtype) {
    case LOOM_ST_F32: memcpy(dst, src, t->nbytes); return LOOM_OK;
    case LOOM_ST_F16:
    case LOOM_ST_BF16:
        for (size_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            if (t->dtype == LOOM_ST_F16) {
                dst[i] = st_half_to_float(h);
            } else {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&dst[i], &bits, 4);
            }
        }
        return LOOM_OK;
    case LOOM_ST_F64:
        for (size_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
        }
        return LOOM_OK;
    default:
        return loom_fail(LOOM_EDATA, "file %s: tensor %s has dtype %s, not a float type", f->path, t->name,
                         st_dtypes[t->dtype].name);
    }
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct st_entry {
    char *name;
    loom_st_dtype dtype;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    size_t nbytes;
    const void *data;
} st_entry;

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct loom_st_writer {
    char *path;
    st_entry *items;
    int n, cap;
    st_meta *meta;
    int n_meta, cap_meta;
};

loom_status loom_st_writer_create(const char *path, loom_st_writer **out) {
    *out = NULL;
    if (!path || !*path) return loom_fail(LOOM_EINTERNAL, "safetensors writer: empty output path");
    loom_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return loom_fail(LOOM_EOS, "file %s: out of memory", path);
    }
    *out = w;
    return LOOM_OK;
}

void loom_st_writer_abort(loom_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i].name);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->items);
    free(w->meta);
    free(w->path);
    free(w);
}

/* arr (*cap elements of `size` bytes) grown so index n fits; NULL when out of
 * memory, arr then still valid. */
static void *st_grow(void *arr, int *cap, int n, size_t size) {
    if (n < *cap) return arr;
    int ncap = *cap ? 2 * *cap : 16;
    void *p = realloc(arr, (size_t)ncap * size);
    if (p) *cap = ncap;
    return p;
}

/* Validate a tensor to add; sets e->nbytes. */
static loom_status st_check_entry(const loom_st_writer *w, const char *name, loom_st_dtype t, int ndim,
                                  const int64_t *shape, const void *data, st_entry *e) {
    if (!name || strcmp(name, ST_METADATA_KEY) == 0)
        return loom_fail(LOOM_EINTERNAL, "file %s: invalid tensor name %s", w->path, name ? name : "(null)");
    for (int i = 0; i < w->n; i++) {
        if (strcmp(w->items[i].name, name) == 0)
            return loom_fail(LOOM_EINTERNAL, "file %s: tensor %s added twice", w->path, name);
    }
    if ((int)t < 0 || (int)t >= ST_NDTYPES)
        return loom_fail(LOOM_EINTERNAL, "file %s: tensor %s: invalid dtype %d", w->path, name, (int)t);
    if (ndim < 0 || ndim > LOOM_ST_MAX_DIMS)
        return loom_fail(LOOM_EINTERNAL, "file %s: tensor %s: %d dimensions (at most %d)", w->path, name,
                         ndim, LOOM_ST_MAX_DIMS);
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && numel > SIZE_MAX / 8 / (uint64_t)shape[i]))
            return loom_fail(LOOM_EINTERNAL, "file %s: tensor %s: invalid dimension %lld", w->path, name,
                             (long long)shape[i]);
        numel *= (size_t)shape[i];
        e->shape[i] = shape[i];
    }
    e->nbytes = numel * st_dtypes[t].size;
    if (e->nbytes && !data) return loom_fail(LOOM_EINTERNAL, "file %s: tensor %s: NULL data", w->path, name);
    e->dtype = t;
    e->ndim = ndim;
    e->data = data;
    return LOOM_OK;
}

loom_status loom_st_writer_add(loom_st_writer *w, const char *name, loom_st_dtype t, int ndim,
                               const int64_t *shape, const void *data) {
    st_entry e = {0};
    LOOM_TRY(st_check_entry(w, name, t, ndim, shape, data, &e));
    st_entry *items = st_grow(w->items, &w->cap, w->n, sizeof *items);
    if (items) w->items = items;
    if (!items || !(e.name = strdup(name))) return loom_fail(LOOM_EOS, "file %s: out of memory", w->path);
    w->items[w->n++] = e;
    return LOOM_OK;
}

loom_status loom_st_writer_metadata(loom_st_writer *w, const char *key, const char *value) {
    if (!key || !value) return loom_fail(LOOM_EINTERNAL, "file %s: NULL metadata key or value", w->path);
    char *v = strdup(value);
    if (!v) return loom_fail(LOOM_EOS, "file %s: out of memory", w->path);
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return LOOM_OK;
        }
    }
    st_meta *meta = st_grow(w->meta, &w->cap_meta, w->n_meta, sizeof *meta);
    if (meta) w->meta = meta;
    char *k = meta ? strdup(key) : NULL;
    if (!k) {
        free(v);
        return loom_fail(LOOM_EOS, "file %s: out of memory", w->path);
    }
    w->meta[w->n_meta++] = (st_meta){k, v};
    return LOOM_OK;
}

/* A growable string; `oom` sticks once an allocation fails. */
typedef struct st_buf {
    char *p;
    size_t len, cap;
    int oom;
} st_buf;

static void sb_reserve(st_buf *b, size_t extra) {
    if (b->oom || b->len + extra + 1 <= b->cap) return;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra + 1) ncap *= 2;
    char *p = realloc(b->p, ncap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = ncap;
}

__attribute__((format(printf, 2, 3))) static void sb_printf(st_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    sb_reserve(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A JSON string literal: quotes, backslashes and control bytes escaped. */
static void sb_json_string(st_buf *b, const char *s) {
    sb_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') sb_printf(b, "\\%c", *c);
        else if (*c == '\n') sb_printf(b, "\\n");
        else if (*c == '\t') sb_printf(b, "\\t");
        else if (*c < 0x20) sb_printf(b, "\\u%04x", *c);
        else sb_printf(b, "%c", *c);
    }
    sb_printf(b, "\"");
}

/* The JSON header, padded with spaces to a multiple of 8 bytes. */
static loom_status st_build_header(const loom_st_writer *w, st_buf *b) {
    sb_printf(b, "{");
    if (w->n_meta) {
        sb_printf(b, "\"%s\":{", ST_METADATA_KEY);
        for (int i = 0; i < w->n_meta; i++) {
            sb_printf(b, "%s", i ? "," : "");
            sb_json_string(b, w->meta[i].key);
            sb_printf(b, ":");
            sb_json_string(b, w->meta[i].value);
        }
        sb_printf(b, "}");
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_entry *e = &w->items[i];
        sb_printf(b, "%s", (i || w->n_meta) ? "," : "");
        sb_json_string(b, e->name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", st_dtypes[e->dtype].name);
        for (int d = 0; d < e->ndim; d++) sb_printf(b, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        sb_printf(b, "],\"data_offsets\":[%zu,%zu]}", off, off + e->nbytes);
        off += e->nbytes;
    }
    sb_printf(b, "}");
    while (!b->oom && b->len % 8) sb_printf(b, " ");
    return b->oom ? loom_fail(LOOM_EOS, "file %s: out of memory building the header", w->path) : LOOM_OK;
}

/* Write length, header and data to the open tmp file; 0 on a write error. */
static int st_write_body(FILE *fp, const loom_st_writer *w, const st_buf *hdr) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr->len >> (8 * i));
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(hdr->p, 1, hdr->len, fp) != hdr->len) return 0;
    for (int i = 0; i < w->n; i++) {
        const st_entry *e = &w->items[i];
        if (e->nbytes && fwrite(e->data, 1, e->nbytes, fp) != e->nbytes) return 0;
    }
    return fflush(fp) == 0 && fsync(fileno(fp)) == 0;
}

/* Make PATH.tmp complete and durable, then rename it over PATH. */
static loom_status st_write_file(const loom_st_writer *w, const st_buf *hdr) {
    size_t plen = strlen(w->path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return loom_fail(LOOM_EOS, "file %s: out of memory", w->path);
    memcpy(tmp, w->path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    loom_status st = LOOM_OK;
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        st = loom_fail(LOOM_ECANTCREAT, "file %s: cannot create %s: %s", w->path, tmp, strerror(errno));
        free(tmp);
        return st;
    }
    int ok = st_write_body(fp, w, hdr);
    int err = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (!ok) st = loom_fail(LOOM_EIO, "file %s: writing %s failed: %s", w->path, tmp, strerror(err));
    else if (rename(tmp, w->path) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "file %s: cannot rename %s over it: %s", w->path, tmp,
                       strerror(errno));
    if (st != LOOM_OK) unlink(tmp);
    free(tmp);
    return st;
}

loom_status loom_st_writer_finish(loom_st_writer *w) {
    st_buf hdr = {0};
    loom_status st = st_build_header(w, &hdr);
    if (st == LOOM_OK) st = st_write_file(w, &hdr);
    free(hdr.p);
    loom_st_writer_abort(w);
    return st;
}
