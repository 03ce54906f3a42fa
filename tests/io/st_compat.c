/* st_compat.c - the C side of the safetensors compatibility test
 * (st_compat.py drives it).
 *
 *   st_compat write PATH             write a fixed set of tensors + metadata
 *   st_compat dump PATH DIR [KEY..]  list the tensors ("tensor NAME DTYPE
 *                                    d0,d1,..") and metadata values ("meta KEY
 *                                    VALUE"); write each tensor's raw bytes to
 *                                    DIR/<i>.raw and, for float dtypes, its
 *                                    loom_st_read_f32 output to DIR/<i>.f32
 * Exit status: 0, or the loom_status of the failure. */
#include "loom/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static loom_status write_fixed(const char *path) {
    float wte[15], scalar = 2.5f;
    uint16_t half[8], bhalf[3], u16[3] = {0, 1000, 65535};
    double dbl[4];
    int32_t ids[3] = {-7, 0, 2147483647};
    int64_t big[2] = {-(1LL << 40), (1LL << 62) + 5};
    uint8_t bytes[5] = {0, 1, 128, 254, 255};
    for (int i = 0; i < 15; i++) wte[i] = (float)(i * 37 % 101 - 50) / 8.0f;
    for (int i = 0; i < 8; i++) half[i] = (uint16_t)(i * 0x1357 + 0x0123);
    for (int i = 0; i < 3; i++) bhalf[i] = (uint16_t)(i * 0x2468 + 0x3f00);
    for (int i = 0; i < 4; i++) dbl[i] = (i - 1.5) / 3.0;
    loom_st_writer *w;
    loom_status st = loom_st_writer_create(path, &w);
    if (st) return st;
    if (!st) st = loom_st_writer_add(w, "wte", LOOM_ST_F32, 2, (int64_t[]){5, 3}, wte);
    if (!st) st = loom_st_writer_add(w, "half", LOOM_ST_F16, 2, (int64_t[]){4, 2}, half);
    if (!st) st = loom_st_writer_add(w, "bhalf", LOOM_ST_BF16, 1, (int64_t[]){3}, bhalf);
    if (!st) st = loom_st_writer_add(w, "dbl", LOOM_ST_F64, 2, (int64_t[]){2, 2}, dbl);
    if (!st) st = loom_st_writer_add(w, "ids", LOOM_ST_I32, 1, (int64_t[]){3}, ids);
    if (!st) st = loom_st_writer_add(w, "big", LOOM_ST_I64, 1, (int64_t[]){2}, big);
    if (!st) st = loom_st_writer_add(w, "u16", LOOM_ST_U16, 1, (int64_t[]){3}, u16);
    if (!st) st = loom_st_writer_add(w, "bytes", LOOM_ST_U8, 1, (int64_t[]){5}, bytes);
    if (!st) st = loom_st_writer_add(w, "nothing", LOOM_ST_F32, 1, (int64_t[]){0}, NULL);
    if (!st) st = loom_st_writer_add(w, "scalar", LOOM_ST_F32, 0, NULL, &scalar);
    if (!st) st = loom_st_writer_metadata(w, "format", "pt");
    if (!st) st = loom_st_writer_metadata(w, "source", "loom \"test\"");
    if (st) {
        loom_st_writer_abort(w);
        return st;
    }
    return loom_st_writer_finish(w);
}

static int save(const char *dir, int i, const char *ext, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.%s", dir, i, ext);
    FILE *fp = fopen(path, "wb");
    int ok = fp && (n == 0 || fwrite(p, 1, n, fp) == n);
    if (fp && fclose(fp) != 0) ok = 0;
    return ok;
}

static int is_float(loom_st_dtype t) {
    return t == LOOM_ST_F32 || t == LOOM_ST_F16 || t == LOOM_ST_BF16 || t == LOOM_ST_F64;
}

static loom_status dump(const char *path, const char *dir, char **keys, int n_keys) {
    loom_st_file *f;
    loom_status st = loom_st_open(path, &f);
    if (st) return st;
    for (int i = 0; i < loom_st_count(f) && !st; i++) {
        const loom_st_tensor *t = loom_st_at(f, i);
        printf("tensor %s %s ", t->name, loom_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) printf(d ? ",%lld" : "%lld", (long long)t->shape[d]);
        printf("\n");
        if (!save(dir, i, "raw", loom_st_data(f, t), t->nbytes))
            st = loom_fail(LOOM_EIO, "cannot save %d", i);
        if (st || !is_float(t->dtype)) continue;
        float *x = malloc(t->numel ? t->numel * sizeof *x : 1);
        st = loom_st_read_f32(f, t, x);
        if (!st && !save(dir, i, "f32", x, t->numel * sizeof *x))
            st = loom_fail(LOOM_EIO, "cannot save %d", i);
        free(x);
    }
    for (int k = 0; k < n_keys; k++) {
        const char *v = loom_st_metadata(f, keys[k]);
        printf("meta %s %s\n", keys[k], v ? v : "(absent)");
    }
    loom_st_close(f);
    return st;
}

int main(int argc, char **argv) {
    loom_status st;
    if (argc == 3 && strcmp(argv[1], "write") == 0) st = write_fixed(argv[2]);
    else if (argc >= 4 && strcmp(argv[1], "dump") == 0) st = dump(argv[2], argv[3], argv + 4, argc - 4);
    else {
        fprintf(stderr, "usage: st_compat write PATH | st_compat dump PATH DIR [KEY...]\n");
        return 64;
    }
    if (st) fprintf(stderr, "st_compat: %s\n", loom_errmsg());
    return (int)st;
}
