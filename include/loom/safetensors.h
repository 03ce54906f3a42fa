/* safetensors.h - read and write the safetensors format.
 *
 * Layout: u64 little-endian header length, a JSON header mapping tensor names
 * to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * end of the header) plus an optional "__metadata__" of string values, then
 * the raw little-endian data. The reader validates every offset against the
 * file size and every shape against its byte count, so a truncated or corrupt
 * file is LOOM_EDATA naming the file and the tensor, never a crash. As the
 * format requires, the tensors must tile the data section exactly (no
 * overlap, hole or trailing bytes) and names must be unique.
 * The writer writes PATH.tmp and renames it over PATH only when complete.
 */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "loom/status.h"

typedef enum {
    LOOM_ST_F32,
    LOOM_ST_F16,
    LOOM_ST_BF16,
    LOOM_ST_F64,
    LOOM_ST_I32,
    LOOM_ST_I64,
    LOOM_ST_U16,
    LOOM_ST_U8
} loom_st_dtype;

#define LOOM_ST_MAX_DIMS 8

typedef struct loom_st_tensor {
    char *name;
    loom_st_dtype dtype;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    size_t numel;
    size_t offset; /* byte offset of the data from the start of the file */
    size_t nbytes;
} loom_st_tensor;

typedef struct loom_st_file loom_st_file;

const char *loom_st_dtype_name(loom_st_dtype t); /* "F32", ... */
size_t loom_st_dtype_size(loom_st_dtype t);

/* Open (mmap) and validate. Missing or unreadable file: LOOM_ENOINPUT;
 * malformed: LOOM_EDATA. *out is NULL on failure. */
loom_status loom_st_open(const char *path, loom_st_file **out);
void loom_st_close(loom_st_file *f);
int loom_st_count(const loom_st_file *f);
const loom_st_tensor *loom_st_at(const loom_st_file *f, int i); /* header order; NULL if out of range */
const loom_st_tensor *loom_st_find(const loom_st_file *f, const char *name); /* NULL if absent */
/* Metadata string value, NULL if absent. */
const char *loom_st_metadata(const loom_st_file *f, const char *key);
/* Copy a tensor's data converted to float32 (from F32, F16, BF16 or F64) into
 * dst[0..numel). F16 and BF16 convert exactly (subnormals, infinities, NaN),
 * F64 rounds to nearest. LOOM_EDATA if the dtype is not a float type. */
loom_status loom_st_read_f32(const loom_st_file *f, const loom_st_tensor *t, float *dst);
/* Raw bytes of a tensor (valid until loom_st_close). */
const void *loom_st_data(const loom_st_file *f, const loom_st_tensor *t);

typedef struct loom_st_writer loom_st_writer;
loom_status loom_st_writer_create(const char *path, loom_st_writer **out);
/* Add a tensor; `data` is referenced, not copied, until finish/abort. Names
 * must be unique and not "__metadata__", ndim <= LOOM_ST_MAX_DIMS, dims >= 0
 * (LOOM_EINTERNAL otherwise; w stays valid). */
loom_status loom_st_writer_add(loom_st_writer *w, const char *name, loom_st_dtype t, int ndim,
                               const int64_t *shape, const void *data);
/* Set a "__metadata__" string (copied; a second call with a key replaces it). */
loom_status loom_st_writer_metadata(loom_st_writer *w, const char *key, const char *value);
/* Write PATH.tmp (header padded with spaces to a multiple of 8 bytes, then
 * the tensors in the order added), fsync, rename to PATH; frees w whatever
 * the outcome. On failure PATH is untouched and PATH.tmp removed:
 * LOOM_ECANTCREAT if PATH.tmp cannot be created or renamed over PATH,
 * LOOM_EIO if writing fails part way. */
loom_status loom_st_writer_finish(loom_st_writer *w);
void loom_st_writer_abort(loom_st_writer *w);

#endif
