/* ckpt_read.c - checkpoints as files, with no run state and no
 * communication (local; every mesh axis, since a reader takes whatever
 * shards meet what it wants): the file helpers the writer shares (atomic
 * text, fsync, the step_N listing); verifying a checkpoint - its manifest's
 * own SHA-256, the checks of ckpt_manifest.c, every rank file's SHA-256;
 * resolving --resume DIR to the newest step_N that verifies (DIR/latest is
 * only a hint); and the shard reader resume and export use, which takes a
 * shard only when the rank file's own description of that key (tensor,
 * kind, elements, runs) and its step agree with the manifest. Export reads
 * whole checkpoints with ckpt_read_whole. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/log.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_manifest.h"

const char *const ckpt_kind_names[K_COUNT] = {"param", "exp_avg", "exp_avg_sq"};

/* ---- files ---------------------------------------------------------------- */

loom_status ckpt_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return loom_fail(LOOM_EIO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return loom_fail(LOOM_EIO, "%s: fsync failed: %s", path, strerror(err));
    return LOOM_OK;
}

loom_status ckpt_write_text(const char *path, const char *text) {
    char tmp[CKPT_PATH];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return loom_fail(LOOM_ECANTCREAT, "%s: cannot create: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int err = errno;
    if (fclose(f) != 0) bad = 1;
    if (bad) {
        remove(tmp);
        return loom_fail(LOOM_EIO, "%s: write failed: %s", tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        remove(tmp);
        return loom_fail(LOOM_ECANTCREAT, "cannot rename %s to %s: %s", tmp, path, strerror(err));
    }
    return LOOM_OK;
}

loom_status ckpt_read_text(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return loom_fail(LOOM_EOS, "out of memory reading %s", path);
    if (bad) {
        free(buf);
        return loom_fail(LOOM_EIO, "%s: read failed", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return LOOM_OK;
}

void ckpt_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[CKPT_PATH];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(dir);
}

int ckpt_list_steps(const char *dir, int *steps, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int st, len = 0;
        if (sscanf(e->d_name, "step_%d%n", &st, &len) != 1 || e->d_name[len] != '\0' || st < 0) continue;
        if (n < cap) {
            steps[n++] = st;
            continue;
        }
        int low = 0; /* full: keep the newest `cap` */
        for (int i = 1; i < n; i++)
            if (steps[i] < steps[low]) low = i;
        if (st > steps[low]) steps[low] = st;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

/* ---- verify and resolve --------------------------------------------------- */

loom_status ckpt_manifest_open(const char *dir, cJSON **out) {
    char path[CKPT_PATH];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text;
    size_t len;
    LOOM_TRY(ckpt_read_text(path, &text, &len));
    loom_status st = ckpt_manifest_verify_hash(text, len, path);
    if (st == LOOM_OK) st = ckpt_manifest_parse(text, path, out);
    free(text);
    return st;
}

loom_status ckpt_verify(const char *dir, cJSON **out) {
    cJSON *man;
    LOOM_TRY(ckpt_manifest_open(dir, &man));
    loom_status st = LOOM_OK;
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(man, "files")) {
        char path[CKPT_PATH], hex[65];
        snprintf(path, sizeof path, "%s/%s", dir, jstr(f, "file"));
        if ((st = loom_sha256_file(path, hex)) != LOOM_OK) break;
        if (strcmp(hex, jstr(f, "sha256")) != 0) {
            st = loom_fail(LOOM_EDATA, "%s: SHA-256 %s does not match the manifest's %s", path, hex,
                           jstr(f, "sha256"));
            break;
        }
    }
    if (st == LOOM_OK && out) *out = man;
    else cJSON_Delete(man);
    return st;
}

/* The step DIR/latest names ("step_N"), or -1. */
static int latest_step(const char *dir) {
    char path[CKPT_PATH], *text;
    snprintf(path, sizeof path, "%s/latest", dir);
    if (ckpt_read_text(path, &text, NULL) != LOOM_OK) {
        loom_clear_error();
        return -1;
    }
    int step = -1, len = 0;
    if (sscanf(text, "step_%d%n", &step, &len) != 1 || (text[len] && text[len] != '\n')) step = -1;
    free(text);
    return step;
}

loom_status loom_ckpt_resolve(const char *arg, char *out, size_t cap) {
    char path[CKPT_DIR];
    snprintf(path, sizeof path, "%s/manifest.json", arg);
    if (access(path, F_OK) == 0) { /* a step directory named directly */
        LOOM_TRY(ckpt_verify(arg, NULL));
        snprintf(out, cap, "%s", arg);
        return LOOM_OK;
    }
    /* the newest step_N that verifies; latest is only a hint (a kill between
     * publishing a step and replacing latest leaves it behind) */
    const int hint = latest_step(arg);
    int steps[4096];
    int n = ckpt_list_steps(arg, steps, 4096);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/step_%d", arg, steps[i]);
        if (ckpt_verify(path, NULL) == LOOM_OK) {
            if (hint >= 0 && hint != steps[i])
                loom_warn("%s: latest names step_%d, but step_%d is the newest complete checkpoint: "
                          "taking step_%d",
                          arg, hint, steps[i], steps[i]);
            snprintf(out, cap, "%s", path);
            return LOOM_OK;
        }
        loom_warn("%s: skipping %s: %s", arg, path, loom_errmsg());
    }
    return loom_fail(LOOM_ENOINPUT,
                     "%s: no complete checkpoint (a step_N directory whose manifest and files match "
                     "their SHA-256)",
                     arg);
}

/* ---- the rank files' own account of their shards -------------------------- */

void ckpt_runs_hash(loom_sha256 *h, int64_t start, int64_t len, int64_t stride, int64_t count) {
    char b[96];
    int n =
        snprintf(b, sizeof b, "%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ";", start, len, stride, count);
    loom_sha256_update(h, b, (size_t)n);
}

void ckpt_shard_desc(char *out, size_t cap, const char *tensor, const char *kind, int64_t numel, int64_t lo,
                     int64_t hi, loom_sha256 *runs) {
    unsigned char d[32];
    loom_sha256_final(runs, d);
    char hex[17];
    for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(out, cap, "%s %s %" PRId64 " %" PRId64 " %" PRId64 " %s", tensor, kind, numel, lo, hi, hex);
}

/* ---- reading shards ------------------------------------------------------- */

void ckpt_reader_close(ckpt_reader *rd) {
    for (int i = 0; i < rd->n_open; i++) loom_st_close(rd->open[i].f);
    rd->n_open = 0;
}

static int num_is(const char *meta, double want) {
    char b[32];
    snprintf(b, sizeof b, "%.0f", want);
    return meta && strcmp(meta, b) == 0;
}

static loom_status reader_file(ckpt_reader *rd, const char *name, loom_st_file **out) {
    for (int i = 0; i < rd->n_open; i++)
        if (strcmp(rd->open[i].name, name) == 0) {
            *out = rd->open[i].f;
            return LOOM_OK;
        }
    if (rd->n_open == 256) ckpt_reader_close(rd); /* many files (a large world saved): start over */
    const cJSON *f, *entry = NULL;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(rd->man, "files"))
        if (strcmp(jstr(f, "file"), name) == 0) entry = f;
    char path[CKPT_PATH], hex[65];
    snprintf(path, sizeof path, "%s/%s", rd->dir, name);
    if (!entry)
        return loom_fail(LOOM_EDATA, "%s: a shard names file %s the manifest does not list", rd->dir, name);
    if (!rd->verified) {
        LOOM_TRY(loom_sha256_file(path, hex));
        if (strcmp(hex, jstr(entry, "sha256")) != 0)
            return loom_fail(LOOM_EDATA, "%s: SHA-256 does not match the manifest", path);
    }
    LOOM_TRY(loom_st_open(path, out));
    const cJSON *step = cJSON_GetObjectItem(rd->man, "step"),
                *ot = cJSON_GetObjectItem(rd->man, "optimizer_steps");
    const char *ms = loom_st_metadata(*out, CKPT_META_STEP), *mo = loom_st_metadata(*out, CKPT_META_OPT);
    if (!num_is(ms, step->valuedouble) || !num_is(mo, ot->valuedouble)) {
        loom_status st =
            loom_fail(LOOM_EDATA,
                      "%s: written at step %s (optimizer step %s), the manifest says step %.0f "
                      "(optimizer step %.0f)",
                      path, ms ? ms : "(none)", mo ? mo : "(none)", step->valuedouble, ot->valuedouble);
        loom_st_close(*out);
        return st;
    }
    rd->open[rd->n_open].name = name;
    rd->open[rd->n_open++].f = *out;
    return LOOM_OK;
}

/* The tensor of shard sh in its file, after the file's description of its
 * key matched the manifest's. */
static loom_status shard_tensor(ckpt_reader *rd, const cJSON *sh, const char *name, int kind,
                                loom_st_file **f, const loom_st_tensor **t) {
    LOOM_TRY(reader_file(rd, jstr(sh, "file"), f));
    const char *key = jstr(sh, "key");
    *t = loom_st_find(*f, key);
    if (!*t || (*t)->dtype != LOOM_ST_F32 || (*t)->ndim != 1)
        return loom_fail(LOOM_EDATA, "%s/%s: no 1-D F32 tensor %s for %s %s", rd->dir, jstr(sh, "file"), key,
                         ckpt_kind_names[kind], name);
    const cJSON *rg = cJSON_GetObjectItem(sh, "range"), *r;
    loom_sha256 h;
    loom_sha256_init(&h);
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(sh, "runs")) {
        int64_t v[4];
        for (int i = 0; i < 4; i++) v[i] = (int64_t)cJSON_GetArrayItem(r, i)->valuedouble;
        ckpt_runs_hash(&h, v[0], v[1], v[2], v[3]);
    }
    char want[512];
    ckpt_shard_desc(want, sizeof want, name, ckpt_kind_names[kind],
                    (int64_t)cJSON_GetObjectItem(sh, "numel")->valuedouble,
                    (int64_t)cJSON_GetArrayItem(rg, 0)->valuedouble,
                    (int64_t)cJSON_GetArrayItem(rg, 1)->valuedouble, &h);
    const char *have = loom_st_metadata(*f, key);
    if (!have || strcmp(have, want) != 0 ||
        (int64_t)(*t)->numel != (int64_t)cJSON_GetObjectItem(sh, "numel")->valuedouble)
        return loom_fail(LOOM_EDATA,
                         "%s/%s: key %s holds \"%s\", the manifest maps it to \"%s\" (a manifest that does "
                         "not belong to these files)",
                         rd->dir, jstr(sh, "file"), key, have ? have : "(nothing)", want);
    return LOOM_OK;
}

loom_status ckpt_fill_tensor(ckpt_reader *rd, const char *name, int kind, int64_t numel, int64_t lo,
                             int64_t hi, float *buf, unsigned char *have) {
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItem(rd->man, "shards")) {
        if (strcmp(jstr(sh, "tensor"), name) != 0 || strcmp(jstr(sh, "kind"), ckpt_kind_names[kind]) != 0)
            continue;
        const cJSON *rg = cJSON_GetObjectItem(sh, "range");
        double a = cJSON_GetArrayItem(rg, 0)->valuedouble, b = cJSON_GetArrayItem(rg, 1)->valuedouble;
        if (b <= (double)lo || a >= (double)hi) continue;
        loom_st_file *f;
        const loom_st_tensor *t;
        LOOM_TRY(shard_tensor(rd, sh, name, kind, &f, &t));
        const float *src = loom_st_data(f, t);
        size_t k = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(sh, "runs")) {
            int64_t start = (int64_t)cJSON_GetArrayItem(r, 0)->valuedouble;
            int64_t len = (int64_t)cJSON_GetArrayItem(r, 1)->valuedouble;
            int64_t stride = (int64_t)cJSON_GetArrayItem(r, 2)->valuedouble;
            int64_t count = (int64_t)cJSON_GetArrayItem(r, 3)->valuedouble;
            for (int64_t c = 0; c < count; c++)
                for (int64_t j = 0; j < len; j++) {
                    int64_t g = start + c * stride + j;
                    if (k >= t->numel || g >= numel)
                        return loom_fail(LOOM_EDATA,
                                         "%s: shard %s of %s %s: runs exceed its %zu elements or the "
                                         "tensor's %lld",
                                         rd->dir, jstr(sh, "key"), ckpt_kind_names[kind], name, t->numel,
                                         (long long)numel);
                    float x;
                    memcpy(&x, (const char *)src + k * sizeof x, sizeof x);
                    k++;
                    buf[g] = x;
                    have[g] = 1;
                }
        }
    }
    return LOOM_OK;
}

int64_t ckpt_tensor_numel(const cJSON *man, const char *name) {
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(man, "tensors"), name);
    const cJSON *sh = cJSON_GetObjectItem(t, "shape"), *d;
    if (!cJSON_IsArray(sh)) return -1;
    int64_t n = 1;
    cJSON_ArrayForEach(d, sh) n *= (int64_t)d->valuedouble; /* validated: below 2^40 in all */
    return n;
}

loom_status ckpt_check_tensors(const cJSON *man, const char *dir, const ckpt_spec *spec, int n) {
    const cJSON *tensors = cJSON_GetObjectItem(man, "tensors");
    if (cJSON_GetArraySize(tensors) != n) {
        const cJSON *t;
        cJSON_ArrayForEach(t, tensors) {
            int found = 0;
            for (int i = 0; i < n && !found; i++) found = strcmp(spec[i].name, t->string) == 0;
            if (!found)
                return loom_fail(LOOM_EDATA,
                                 "%s/manifest.json lists tensor %s, which the model does not have", dir,
                                 t->string);
        }
    }
    for (int i = 0; i < n; i++) {
        const cJSON *sh = cJSON_GetObjectItem(cJSON_GetObjectItem(tensors, spec[i].name), "shape");
        int nd = cJSON_GetArraySize(sh);
        int same = cJSON_IsArray(sh) && nd == spec[i].ndim;
        for (int d = 0; same && d < nd; d++)
            same = cJSON_GetArrayItem(sh, d)->valuedouble == (double)spec[i].shape[d];
        if (!same) {
            char *text = sh ? cJSON_PrintUnformatted(sh) : NULL;
            loom_status st =
                loom_fail(LOOM_EDATA, "%s/manifest.json: tensor %s has shape %s, the model's is [%lld%s%lld]",
                          dir, spec[i].name, text ? text : "(none)", (long long)spec[i].shape[0],
                          spec[i].ndim > 1 ? ", " : "", spec[i].ndim > 1 ? (long long)spec[i].shape[1] : 0LL);
            free(text);
            return st;
        }
    }
    return LOOM_OK;
}

/* ---- a whole checkpoint ------------------------------------------------------ */

void ckpt_whole_free(ckpt_whole *w) {
    for (int i = 0; w->t && i < w->n; i++)
        for (int k = 0; k < K_COUNT; k++) free(w->t[i].val[k]);
    free(w->t);
    cJSON_Delete(w->man);
    memset(w, 0, sizeof *w);
}

static loom_status read_all(ckpt_whole *w, unsigned kinds) {
    ckpt_reader rd = {.dir = w->dir, .man = w->man, .verified = 1}; /* resolve verified every file */
    const cJSON *t;
    loom_status st = LOOM_OK;
    int i = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(w->man, "tensors")) {
        const cJSON *sh = cJSON_GetObjectItem(t, "shape");
        w->t[i].name = t->string;
        w->t[i].ndim = cJSON_GetArraySize(sh);
        w->t[i].shape[1] = 1;
        for (int d = 0; d < w->t[i].ndim; d++)
            w->t[i].shape[d] = (int64_t)cJSON_GetArrayItem(sh, d)->valuedouble;
        const int64_t numel = w->t[i].numel = ckpt_tensor_numel(w->man, t->string);
        unsigned char *have = calloc((size_t)(numel ? numel : 1), 1);
        for (int k = 0; k < K_COUNT && st == LOOM_OK; k++) {
            if (!(kinds & (1u << k))) continue;
            float *v = w->t[i].val[k] = malloc((size_t)(numel ? numel : 1) * sizeof(float));
            if (!v || !have) {
                st = loom_fail(LOOM_EOS, "out of memory for %s", t->string);
                break;
            }
            memset(have, 0, (size_t)numel);
            st = ckpt_fill_tensor(&rd, t->string, k, numel, 0, numel, v, have);
            for (int64_t g = 0; g < numel && st == LOOM_OK; g++)
                if (!have[g])
                    st = loom_fail(LOOM_EDATA, "%s: no shard holds %s element %lld of %s", w->dir,
                                   ckpt_kind_names[k], (long long)g, t->string);
        }
        free(have);
        if (st != LOOM_OK) break;
        i++;
    }
    ckpt_reader_close(&rd);
    return st;
}

loom_status ckpt_read_whole(const char *dir, const ckpt_spec *spec, int n, unsigned kinds, ckpt_whole *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->dir, sizeof out->dir, "%s", dir);
    loom_status st = ckpt_manifest_open(out->dir, &out->man);
    if (st == LOOM_OK && n > 0) st = ckpt_check_tensors(out->man, out->dir, spec, n);
    if (st == LOOM_OK) {
        out->step = (int)cJSON_GetObjectItem(out->man, "step")->valuedouble;
        out->optimizer_steps = (int)cJSON_GetObjectItem(out->man, "optimizer_steps")->valuedouble;
        out->n = cJSON_GetArraySize(cJSON_GetObjectItem(out->man, "tensors"));
        out->t = calloc((size_t)(out->n ? out->n : 1), sizeof *out->t);
        st = out->t ? read_all(out, kinds) : loom_fail(LOOM_EOS, "out of memory");
    }
    if (st != LOOM_OK) ckpt_whole_free(out);
    return st;
}
