/* hf_dir.c - the weight files of a Hugging Face model directory
 * (include/loom/hf_dir.h): model.safetensors or the shards its index
 * names. Local; no collectives. */
#include "loom/hf_dir.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_MAX_BYTES (64 << 20)

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int exists(const char *dir, const char *name) {
    char *p = join(dir, name);
    int ok = p && access(p, F_OK) == 0;
    free(p);
    return ok;
}

int loom_hf_has_weights(const char *dir) {
    return exists(dir, "model.safetensors") || exists(dir, "model.safetensors.index.json");
}

void loom_hf_files_free(loom_hf_files *f) {
    for (int i = 0; i < f->n; i++) free(f->path[i]);
    free(f->path);
    f->path = NULL;
    f->n = 0;
}

static loom_status add_file(loom_hf_files *f, const char *dir, const char *name) {
    for (int i = 0; i < f->n; i++) /* each file once */
        if (!strcmp(strrchr(f->path[i], '/') + 1, name)) return LOOM_OK;
    if (f->n >= LOOM_HF_MAX_FILES) return loom_fail(LOOM_EDATA, "%s: more than %d weight files", dir, f->n);
    if (!name[0] || strchr(name, '/') || !strcmp(name, ".."))
        return loom_fail(LOOM_EDATA,
                         "%s/model.safetensors.index.json names the file \"%s\", not a file in %s", dir, name,
                         dir);
    char **grown = realloc(f->path, (size_t)(f->n + 1) * sizeof *grown);
    if (!grown) return loom_fail(LOOM_EOS, "out of memory");
    f->path = grown;
    if (!(f->path[f->n] = join(dir, name))) return loom_fail(LOOM_EOS, "out of memory");
    if (access(f->path[f->n], R_OK) != 0) {
        loom_status st = loom_fail(LOOM_ENOINPUT, "%s: the index names %s, which cannot be read: %s", dir,
                                   name, strerror(errno));
        free(f->path[f->n]);
        return st;
    }
    f->n++;
    return LOOM_OK;
}

static char *read_index(const char *path, loom_status *st) {
    FILE *fp = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (fp && n >= 0 && n <= INDEX_MAX_BYTES && fseek(fp, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, fp) == (size_t)n) {
        buf[n] = '\0';
        *st = LOOM_OK;
    } else {
        free(buf);
        buf = NULL;
        *st = loom_fail(fp ? LOOM_EDATA : LOOM_ENOINPUT, "%s: cannot read the index", path);
    }
    if (fp) fclose(fp);
    return buf;
}

static loom_status index_files(const char *dir, loom_hf_files *out) {
    char *path = join(dir, "model.safetensors.index.json");
    if (!path) return loom_fail(LOOM_EOS, "out of memory");
    loom_status st;
    char *text = read_index(path, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (st == LOOM_OK && (!cJSON_IsObject(map) || !map->child))
        st = loom_fail(LOOM_EDATA, "%s: not an index (no \"weight_map\" of tensor names to files)", path);
    for (const cJSON *it = map ? map->child : NULL; st == LOOM_OK && it; it = it->next)
        st = cJSON_IsString(it)
                 ? add_file(out, dir, it->valuestring)
                 : loom_fail(LOOM_EDATA, "%s: \"weight_map\" of \"%s\" is not a file name", path, it->string);
    cJSON_Delete(root);
    free(path);
    return st;
}

loom_status loom_hf_weight_files(const char *dir, loom_hf_files *out) {
    memset(out, 0, sizeof *out);
    loom_status st;
    if (exists(dir, "model.safetensors")) st = add_file(out, dir, "model.safetensors");
    else if (exists(dir, "model.safetensors.index.json")) st = index_files(dir, out);
    else
        st = loom_fail(LOOM_ENOINPUT,
                       "%s: no weights (neither model.safetensors nor model.safetensors.index.json)", dir);
    if (st != LOOM_OK) loom_hf_files_free(out);
    return st;
}

const char *loom_hf_params_path(const char *load_params, const char *model) {
    if (load_params[0]) return load_params;
    struct stat sb;
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode) && loom_hf_has_weights(model)) return model;
    return "";
}

const char *loom_hf_tokenizer_path(const char *tokenizer, const char *model) {
    if (tokenizer[0]) return tokenizer;
    struct stat sb;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
        return model;
    return "";
}
