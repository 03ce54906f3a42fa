/* ckpt.c - sharded, atomically published checkpoints and resume under any
 * layout.
 *
 * Save (collective over the world). Every rank writes only what it is the
 * one holder of, as 1-D F32 tensors in DIR/step_N.tmp/rank_R.safetensors:
 * its parameter elements (dp/cp coordinate 0, or its own ZeRO-3 slices; tp
 * rank 0 for tensors tp does not cut; the embedding stage for the tied wte)
 * and its AdamW moments (dp coordinate 0, or its own ZeRO-1/2/3 slices; the
 * same tp and wte rule); under expert parallelism the expert tensors from
 * the EP engine's storage, by edp rank 0 (ep.h), under their global names;
 * MoE selection biases inline in the manifest ("buffers"). A shard is (tensor, kind, file, key) plus the
 * global element indices it holds, as runs [start, len, stride, count]:
 * count runs of len elements at start + i * stride of the tensor's
 * row-major global layout. Each rank hashes its file (SHA-256 of the bytes
 * on disk) and its shard list goes to rank 0 in one all-gather; rank 0
 * writes manifest.json (step, optimizer step count, LR, data cursor, RNG
 * seed, layout, model and training config, tensors, files with hashes,
 * shards), fsyncs the directory, renames step_N.tmp to step_N, fsyncs DIR,
 * then replaces DIR/latest (latest.tmp, fsync, rename, fsync DIR). --keep K
 * removes the oldest step_* directories after that, never the new one.
 *
 * Load: rank 0 resolves --resume to a checkpoint whose manifest parses and
 * whose files all match their hashes, and broadcasts it. Every rank then
 * reads, tensor by tensor, only the shards whose global range meets the
 * elements it holds, into a scratch of that one tensor, and keeps its own
 * elements; any missing element is LOOM_EDATA naming it. The files are
 * verified again by each rank that reads them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "loom/ckpt.h"
#include "loom/ep.h"
#include "loom/log.h"
#include "loom/moe.h"
#include "loom/safetensors.h"
#include "loom/sha256.h"
#include "train/ckpt.h"
#include "train/ckpt_manifest.h"

#define CKPT_DIR (LOOM_PATH_MAX + 64)  /* --save-dir plus step_N(.tmp) */
#define CKPT_PATH (CKPT_DIR + 320)     /* such a directory plus a file name */

enum { K_PARAM, K_EXP_AVG, K_EXP_AVG_SQ, K_COUNT };
static const char *const kind_names[K_COUNT] = {"param", "exp_avg", "exp_avg_sq"};

/* ---- runs of global indices ---------------------------------------------- */

typedef struct { int64_t start, len, stride, count; } g_run;

typedef struct {
    g_run *r;
    int n, cap;
    int64_t seg_start, seg_len; /* the contiguous segment being built */
    int64_t lo, hi;             /* global range [lo, hi) */
} run_list;

static int runs_push(run_list *l, int64_t start, int64_t len) {
    if (l->n > 0) {
        g_run *q = &l->r[l->n - 1];
        if (q->len == len && q->count == 1 && start > q->start) {
            q->stride = start - q->start;
            q->count = 2;
            return 0;
        }
        if (q->len == len && q->count > 1 && start == q->start + q->count * q->stride) {
            q->count++;
            return 0;
        }
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        g_run *r = realloc(l->r, (size_t)cap * sizeof *r);
        if (!r) return -1;
        l->r = r;
        l->cap = cap;
    }
    l->r[l->n++] = (g_run){start, len, len, 1};
    return 0;
}

static int runs_add(run_list *l, int64_t g) {
    if (l->seg_len == 0) {
        l->seg_start = g;
        l->seg_len = 1;
        l->lo = l->hi = g;
    } else if (g == l->seg_start + l->seg_len) {
        l->seg_len++;
    } else {
        if (runs_push(l, l->seg_start, l->seg_len)) return -1;
        l->seg_start = g;
        l->seg_len = 1;
    }
    if (g < l->lo) l->lo = g;
    if (g + 1 > l->hi) l->hi = g + 1;
    return 0;
}

static int runs_close(run_list *l) {
    if (l->seg_len && runs_push(l, l->seg_start, l->seg_len)) return -1;
    l->seg_len = 0;
    return 0;
}

/* ---- what this rank writes ------------------------------------------------ */

typedef struct {
    const char *tensor;
    int kind;
    size_t off, n; /* floats in the rank's value buffer */
    run_list runs;
} shard;

typedef struct {
    shard *sh;
    int n, cap;
    float *val;
    size_t nval, capval;
} shard_set;

static shard *set_new(shard_set *s, const char *tensor, int kind) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        shard *n = realloc(s->sh, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        s->sh = n;
        s->cap = cap;
    }
    shard *h = &s->sh[s->n++];
    memset(h, 0, sizeof *h);
    h->tensor = tensor;
    h->kind = kind;
    h->off = s->nval;
    return h;
}

static int set_val(shard_set *s, shard *h, int64_t g, float x) {
    if (s->nval == s->capval) {
        size_t cap = s->capval ? 2 * s->capval : 4096;
        float *v = realloc(s->val, cap * sizeof *v);
        if (!v) return -1;
        s->val = v;
        s->capval = cap;
    }
    s->val[s->nval++] = x;
    h->n++;
    return runs_add(&h->runs, g);
}

static void set_free(shard_set *s) {
    for (int i = 0; i < s->n; i++) free(s->sh[i].runs.r);
    free(s->sh);
    free(s->val);
}

/* The rules of the header comment: the same holder as --save-params. */
static int one_holder(const loom_train_run_state *s, const loom_gpt *m, const loom_param *p,
                      int dp_disjoint) {
    return loom_train_param_holder(m, s->mesh, dp_disjoint, p);
}

/* Expert tensors of an expert-parallel part live in the EP engine (ep.h),
 * replicated over edp: edp rank 0 writes them (tp rank 0 for unsplit ones). */
static size_t ep_state(const loom_train_run_state *s, int part, float *arr[3], size_t *lo) {
    return loom_ep_state(s->ep, part, &arr[K_PARAM], &arr[K_EXP_AVG], &arr[K_EXP_AVG_SQ], lo);
}

static int ep_holder(const loom_train_run_state *s, const loom_gpt *m, const loom_param *p) {
    if (loom_comm_rank(loom_ep_edp(s->ep)) != 0) return 0;
    return p->split_dim >= 0 || m->part.tp.rank == 0;
}

static loom_status collect_experts(const loom_train_run_state *s, int part, shard_set *set) {
    const loom_gpt *m = s->parts[part];
    float *arr[3];
    size_t lo;
    if (!ep_state(s, part, arr, &lo)) return LOOM_OK;
    for (int k = 0; k < m->n_params; k++) {
        const loom_param *p = &m->params[k];
        if (p->unit != LOOM_UNIT_EXPERTS || !ep_holder(s, m, p)) continue;
        for (int kind = K_PARAM; kind < K_COUNT; kind++) {
            shard *h = set_new(set, p->name, kind);
            for (size_t i = 0; h && i < p->numel; i++) {
                int64_t g = loom_param_global_index(p, m->part.tp.rank, i);
                if (g >= 0 && set_val(set, h, g, arr[kind][p->offset - lo + i])) h = NULL;
            }
            if (!h || runs_close(&h->runs))
                return loom_fail(LOOM_EOS, "out of memory collecting this rank's expert shards");
            if (h->n == 0) set->n--;
        }
    }
    return LOOM_OK;
}

static loom_status collect(const loom_train_run_state *s, shard_set *set) {
    const int z3 = loom_dp_params_sharded(s->dp), zopt = loom_dp_opt_sharded(s->dp);
    for (int i = 0; i < s->n_parts; i++) {
        const loom_gpt *m = s->parts[i];
        const int tr = m->part.tp.rank;
        float *ea[3];
        size_t elo;
        const int has_ep = ep_state(s, i, ea, &elo) > 0;
        LOOM_TRY(collect_experts(s, i, set));
        int nr, no = loom_dp_opt_runs(s->dp, i, NULL, 0);
        const loom_param_run *pr = loom_dp_param_runs(s->dp, i, &nr);
        loom_opt_run *orun = calloc((size_t)(no ? no : 1), sizeof *orun);
        if (!orun) return loom_fail(LOOM_EOS, "out of memory");
        loom_dp_opt_runs(s->dp, i, orun, no);
        for (int k = 0; k < m->n_params; k++) {
            const loom_param *p = &m->params[k];
            if (has_ep && p->unit == LOOM_UNIT_EXPERTS) continue; /* collect_experts */
            if (one_holder(s, m, p, z3)) {
                shard *h = set_new(set, p->name, K_PARAM);
                for (int r = 0; h && r < nr; r++) {
                    size_t a = p->offset > pr[r].lo ? p->offset : pr[r].lo;
                    size_t b = p->offset + p->numel, e = pr[r].lo + pr[r].n;
                    for (size_t f = a; f < (b < e ? b : e); f++) {
                        int64_t g = loom_param_global_index(p, tr, f - p->offset);
                        if (g >= 0 && set_val(set, h, g, pr[r].data[f - pr[r].lo])) h = NULL;
                    }
                }
                if (!h || runs_close(&h->runs)) goto oom;
                if (h->n == 0) set->n--;
            }
            if (!one_holder(s, m, p, zopt)) continue;
            for (int kind = K_EXP_AVG; kind <= K_EXP_AVG_SQ; kind++) {
                shard *h = set_new(set, p->name, kind);
                for (int r = 0; h && r < no; r++) {
                    if (orun[r].param != k) continue;
                    const float *src = kind == K_EXP_AVG ? orun[r].m : orun[r].v;
                    for (size_t f = 0; f < orun[r].n; f++) {
                        int64_t g = loom_param_global_index(p, tr, orun[r].lo + f - p->offset);
                        if (g >= 0 && set_val(set, h, g, src[f])) h = NULL;
                    }
                }
                if (!h || runs_close(&h->runs)) goto oom;
                if (h->n == 0) set->n--;
            }
        }
        free(orun);
        continue;
    oom:
        free(orun);
        return loom_fail(LOOM_EOS, "out of memory collecting this rank's checkpoint shards");
    }
    return LOOM_OK;
}

/* ---- files ---------------------------------------------------------------- */

static loom_status fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return loom_fail(LOOM_EIO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return loom_fail(LOOM_EIO, "%s: fsync failed: %s", path, strerror(err));
    return LOOM_OK;
}

static loom_status write_text(const char *path, const char *text) {
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

static void remove_tree(const char *dir) {
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

/* step_N directory names in DIR (published ones only), newest first. */
static int list_steps(const char *dir, int *steps, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int st, len = 0;
        if (sscanf(e->d_name, "step_%d%n", &st, &len) == 1 && e->d_name[len] == '\0' && st >= 0 &&
            n < cap)
            steps[n++] = st;
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

/* ---- save ----------------------------------------------------------------- */

static cJSON *shard_json(const shard *h, const char *file, int idx) {
    cJSON *o = cJSON_CreateObject();
    char key[32];
    snprintf(key, sizeof key, "s%d", idx);
    cJSON_AddStringToObject(o, "tensor", h->tensor);
    cJSON_AddStringToObject(o, "kind", kind_names[h->kind]);
    cJSON_AddStringToObject(o, "file", file);
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddNumberToObject(o, "numel", (double)h->n);
    cJSON *rg = cJSON_AddArrayToObject(o, "range");
    cJSON_AddItemToArray(rg, cJSON_CreateNumber((double)h->runs.lo));
    cJSON_AddItemToArray(rg, cJSON_CreateNumber((double)h->runs.hi));
    cJSON *runs = cJSON_AddArrayToObject(o, "runs");
    for (int i = 0; i < h->runs.n; i++) {
        const g_run *r = &h->runs.r[i];
        double v[4] = {(double)r->start, (double)r->len, (double)r->stride, (double)r->count};
        cJSON_AddItemToArray(runs, cJSON_CreateDoubleArray(v, 4));
    }
    return o;
}

/* Write this rank's file (if it holds anything) and describe it as JSON. */
/* The aux-loss-free selection biases (moe.h), replicated on every rank: the
 * dp/cp/tp coordinate-0 rank of each stage puts them, as numbers, in the
 * manifest's "buffers" (cJSON's 15 digits give every float back exactly). */
#define BIAS_NAME "h.%d.mlp.selection_bias"

static void add_buffers(const loom_train_run_state *s, cJSON *o) {
    if (s->mesh->dp_rank != 0 || s->mesh->cp_rank != 0 || s->parts[0]->part.tp.rank != 0) return;
    cJSON *bufs = NULL;
    for (int i = 0; i < s->n_parts; i++) {
        const int E = s->parts[i]->cfg.n_expert;
        int l, nb;
        loom_moe_stats_get(s->parts[i], &nb);
        for (int b = 0; b < nb; b++) {
            const float *bias = loom_moe_selection_bias(s->parts[i], b, &l);
            if (!bias) continue;
            if (!bufs) bufs = cJSON_AddObjectToObject(o, "buffers");
            char name[64];
            snprintf(name, sizeof name, BIAS_NAME, l);
            cJSON *a = cJSON_AddArrayToObject(bufs, name);
            for (int e = 0; e < E; e++) cJSON_AddItemToArray(a, cJSON_CreateNumber(bias[e]));
        }
    }
}

static loom_status load_buffers(const loom_train_run_state *s, const cJSON *man, const char *dir) {
    const cJSON *bufs = cJSON_GetObjectItem(man, "buffers");
    for (int i = 0; i < s->n_parts; i++) {
        const int E = s->parts[i]->cfg.n_expert;
        int l, nb;
        loom_moe_stats_get(s->parts[i], &nb);
        for (int b = 0; b < nb; b++) {
            float *bias = loom_moe_selection_bias(s->parts[i], b, &l);
            if (!bias) continue;
            char name[64];
            snprintf(name, sizeof name, BIAS_NAME, l);
            const cJSON *a = cJSON_GetObjectItem(bufs, name);
            if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != E)
                return loom_fail(LOOM_EDATA, "%s: the manifest has no %s of %d numbers (the model "
                                 "uses aux_free_bias_rate)", dir, name, E);
            for (int e = 0; e < E; e++) bias[e] = (float)cJSON_GetArrayItem(a, e)->valuedouble;
        }
    }
    return LOOM_OK;
}

static loom_status write_rank(const loom_train_run_state *s, const char *tmpdir, char **json) {
    shard_set set = {0};
    loom_status st = collect(s, &set);
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "shards");
    char file[64], path[CKPT_PATH];
    snprintf(file, sizeof file, "rank_%05d.safetensors", s->mesh->rank);
    snprintf(path, sizeof path, "%s/%s", tmpdir, file);
    if (st == LOOM_OK && set.n > 0) {
        loom_st_writer *w;
        st = loom_st_writer_create(path, &w);
        for (int i = 0; i < set.n && st == LOOM_OK; i++) {
            char key[32];
            snprintf(key, sizeof key, "s%d", i);
            int64_t shape[1] = {(int64_t)set.sh[i].n};
            st = loom_st_writer_add(w, key, LOOM_ST_F32, 1, shape, set.val + set.sh[i].off);
            if (st != LOOM_OK) loom_st_writer_abort(w);
        }
        if (st == LOOM_OK) st = loom_st_writer_finish(w);
        char hex[65];
        if (st == LOOM_OK) st = loom_sha256_file(path, hex);
        struct stat sb;
        if (st == LOOM_OK && stat(path, &sb) != 0)
            st = loom_fail(LOOM_EIO, "%s: stat failed: %s", path, strerror(errno));
        if (st == LOOM_OK) {
            cJSON_AddStringToObject(o, "file", file);
            cJSON_AddStringToObject(o, "sha256", hex);
            cJSON_AddNumberToObject(o, "bytes", (double)sb.st_size);
            for (int i = 0; i < set.n; i++) cJSON_AddItemToArray(arr, shard_json(&set.sh[i], file, i));
        }
    }
    add_buffers(s, o);
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    set_free(&set);
    if (st == LOOM_OK && !*json) st = loom_fail(LOOM_EOS, "out of memory");
    return st;
}

static void add_num(cJSON *o, const char *k, double v) { cJSON_AddNumberToObject(o, k, v); }

static cJSON *manifest_head(const loom_train_run_state *s, int step) {
    const loom_train_config *c = s->cfg;
    const loom_model_config *mc = &s->parts[0]->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", CKPT_FORMAT);
    add_num(o, "version", CKPT_VERSION);
    add_num(o, "step", step);
    add_num(o, "optimizer_steps", loom_dp_steps_taken(s->dp));
    cJSON *lr = cJSON_AddObjectToObject(o, "lr_schedule");
    add_num(lr, "next_step", step);
    add_num(lr, "next_lr", step < c->steps ? loom_lr_at(c, step) : 0.0);
    cJSON *data = cJSON_AddObjectToObject(o, "data_cursor");
    cJSON_AddStringToObject(data, "path", c->data);
    add_num(data, "next_step", step);
    add_num(data, "sequences_consumed", (double)step * c->batch);
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddStringToObject(rng, "kind", "philox4x32-10 counter-based, keyed by (seed, name, index)");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddStringToObject(rng, "seed", seed);
    cJSON *l = cJSON_AddObjectToObject(o, "layout");
    add_num(l, "world", s->mesh->world_size);
    add_num(l, "dp", c->layout.dp);
    add_num(l, "tp", c->layout.tp);
    add_num(l, "pp", c->layout.pp);
    add_num(l, "cp", c->layout.cp);
    add_num(l, "ep", c->layout.ep);
    add_num(l, "sp", c->layout.sp);
    add_num(l, "zero", c->layout.zero);
    cJSON_AddStringToObject(l, "schedule", loom_schedule_name(c->layout.schedule));
    add_num(l, "virtual_stages", c->layout.virtual_stages);
    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(m, "name", mc->name);
    add_num(m, "n_layer", mc->n_layer);
    add_num(m, "n_head", mc->n_head);
    add_num(m, "n_embd", mc->n_embd);
    add_num(m, "vocab_size", mc->vocab_size);
    add_num(m, "n_positions", mc->n_positions);
    cJSON *t = cJSON_AddObjectToObject(o, "train");
    add_num(t, "steps", c->steps);
    add_num(t, "batch", c->batch);
    add_num(t, "seq", c->seq);
    add_num(t, "lr", c->lr);
    add_num(t, "min_lr_frac", c->min_lr_frac);
    add_num(t, "warmup", c->warmup);
    add_num(t, "weight_decay", c->weight_decay);
    add_num(t, "beta1", c->beta1);
    add_num(t, "beta2", c->beta2);
    add_num(t, "eps", c->eps);
    add_num(t, "grad_clip", c->grad_clip);
    return o;
}

static loom_status add_tensors(cJSON *o, const loom_model_config *mc) {
    loom_param *p;
    int n;
    size_t total;
    LOOM_TRY(loom_param_table_whole(mc, &p, &n, &total));
    cJSON *t = cJSON_AddObjectToObject(o, "tensors");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(t, p[i].name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < p[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)p[i].shape[d]));
    }
    free(p);
    return LOOM_OK;
}

/* Rank 0: the manifest from every rank's description, then publish. */
static loom_status publish(const loom_train_run_state *s, int step, const char *tmpdir,
                           const char *final, char *const *parts, int world) {
    cJSON *o = manifest_head(s, step);
    loom_status st = add_tensors(o, &s->parts[0]->cfg);
    cJSON *files = cJSON_AddArrayToObject(o, "files");
    cJSON *shards = cJSON_AddArrayToObject(o, "shards");
    for (int r = 0; r < world && st == LOOM_OK; r++) {
        cJSON *j = cJSON_Parse(parts[r]);
        if (!j) {
            st = loom_fail(LOOM_EINTERNAL, "rank %d's checkpoint description does not parse", r);
            break;
        }
        cJSON *f = cJSON_GetObjectItem(j, "file");
        if (cJSON_IsString(f)) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "file", f->valuestring);
            cJSON_AddStringToObject(e, "sha256", cJSON_GetObjectItem(j, "sha256")->valuestring);
            add_num(e, "bytes", cJSON_GetObjectItem(j, "bytes")->valuedouble);
            add_num(e, "rank", r);
            cJSON_AddItemToArray(files, e);
        }
        cJSON *sa = cJSON_DetachItemFromObject(j, "shards"), *rb = cJSON_GetObjectItem(j, "buffers");
        cJSON *it;
        if (rb && !cJSON_GetObjectItem(o, "buffers")) cJSON_AddObjectToObject(o, "buffers");
        while (rb && rb->child) {
            it = cJSON_DetachItemViaPointer(rb, rb->child);
            if (cJSON_GetObjectItem(cJSON_GetObjectItem(o, "buffers"), it->string)) cJSON_Delete(it);
            else cJSON_AddItemToObject(cJSON_GetObjectItem(o, "buffers"), it->string, it);
        }
        while (sa && (it = cJSON_DetachItemFromArray(sa, 0))) cJSON_AddItemToArray(shards, it);
        cJSON_Delete(sa);
        cJSON_Delete(j);
    }
    char *text = st == LOOM_OK ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (st == LOOM_OK && !text) st = loom_fail(LOOM_EOS, "out of memory");
    char path[CKPT_PATH];
    snprintf(path, sizeof path, "%s/manifest.json", tmpdir);
    if (st == LOOM_OK) st = write_text(path, text);
    free(text);
    if (st == LOOM_OK) st = fsync_path(tmpdir);
    if (st == LOOM_OK && rename(tmpdir, final) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
    const char *dir = s->cfg->save_dir;
    if (st == LOOM_OK) st = fsync_path(dir);
    char latest[CKPT_PATH], name[32];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(name, sizeof name, "step_%d\n", step);
    if (st == LOOM_OK) st = write_text(latest, name);
    if (st == LOOM_OK) st = fsync_path(dir);
    return st;
}

static void apply_keep(const char *dir, int keep, int step) {
    if (keep <= 0) return;
    int steps[4096];
    int n = list_steps(dir, steps, 4096);
    for (int i = keep; i < n; i++) {
        if (steps[i] == step) continue;
        char p[CKPT_DIR];
        snprintf(p, sizeof p, "%s/step_%d", dir, steps[i]);
        remove_tree(p);
    }
}

loom_status loom_ckpt_prepare_dir(const loom_train_config *c) {
    if (!c->save_dir[0]) return LOOM_OK;
    mkdir(c->save_dir, 0755); /* errors surface in the check */
    struct stat sb;
    const char *why = NULL;
    if (stat(c->save_dir, &sb) != 0) why = strerror(errno);
    else if (!S_ISDIR(sb.st_mode)) why = "not a directory";
    else if (access(c->save_dir, W_OK) != 0) why = strerror(errno);
    if (why) return loom_fail(LOOM_ECANTCREAT, "--save-dir %s: not a writable directory: %s", c->save_dir, why);
    return LOOM_OK;
}

loom_status loom_ckpt_save(loom_train_run_state *s, int step) {
    const loom_train_config *c = s->cfg;
    loom_comm *world = s->mesh->world;
    const int rank = s->mesh->rank, W = s->mesh->world_size;
    char tmpdir[CKPT_DIR], final[CKPT_DIR];
    snprintf(tmpdir, sizeof tmpdir, "%s/step_%d.tmp", c->save_dir, step);
    snprintf(final, sizeof final, "%s/step_%d", c->save_dir, step);
    loom_status st = LOOM_OK;
    int exists = 0;
    if (rank == 0) {
        struct stat sb;
        mkdir(c->save_dir, 0755);
        exists = stat(final, &sb) == 0;
        if (!exists) {
            remove_tree(tmpdir); /* a save of this step that died part way */
            if (mkdir(tmpdir, 0755) != 0)
                st = loom_fail(LOOM_ECANTCREAT, "--save-dir: cannot create %s: %s", tmpdir,
                               strerror(errno));
        }
    }
    LOOM_TRY(loom_comm_agree(world, st));
    LOOM_TRY(loom_comm_bcast(world, &exists, sizeof exists, 0));
    if (exists) { /* resumed from it: the same state is already published */
        if (rank == 0) loom_info("checkpoint %s exists; not written again", final);
        return LOOM_OK;
    }
    double t0 = loom_comm_wtime();
    char *mine = NULL;
    st = write_rank(s, tmpdir, &mine);
    st = loom_comm_agree(world, st);
    int64_t len = mine ? (int64_t)strlen(mine) + 1 : 1, maxlen = len;
    char *all = NULL;
    if (st == LOOM_OK) st = loom_comm_allreduce(world, &maxlen, 1, LOOM_I64, LOOM_MAX);
    if (st == LOOM_OK) {
        char *buf = calloc((size_t)maxlen, 1);
        all = calloc((size_t)maxlen * (size_t)W, 1);
        if (buf && all) {
            if (mine) memcpy(buf, mine, (size_t)len);
            st = loom_comm_allgather(world, buf, all, (size_t)maxlen);
        } else {
            st = LOOM_EOS;
        }
        free(buf);
        st = loom_comm_agree(world, st);
    }
    free(mine);
    if (st == LOOM_OK && rank == 0) {
        char **parts = malloc((size_t)W * sizeof *parts);
        if (!parts) st = loom_fail(LOOM_EOS, "out of memory");
        for (int r = 0; r < W && parts; r++) parts[r] = all + (size_t)r * maxlen;
        if (st == LOOM_OK) st = publish(s, step, tmpdir, final, parts, W);
        free(parts);
        if (st == LOOM_OK) apply_keep(c->save_dir, c->keep, step);
        if (st == LOOM_OK)
            loom_info("checkpoint step %d written to %s (%.3f s)", step, final, loom_comm_wtime() - t0);
    }
    free(all);
    return loom_comm_agree(world, st);
}

/* ---- resolve and verify --------------------------------------------------- */

static loom_status read_text(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
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
    return LOOM_OK;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The manifest of checkpoint `dir`, validated (ckpt_manifest.c), not its files. */
static loom_status manifest_open(const char *dir, cJSON **out) {
    char path[CKPT_PATH];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text;
    LOOM_TRY(read_text(path, &text));
    loom_status st = ckpt_manifest_parse(text, path, out);
    free(text);
    return st;
}

static loom_status verify_files(const char *dir, const cJSON *man) {
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(man, "files")) {
        char path[CKPT_PATH], hex[65];
        snprintf(path, sizeof path, "%s/%s", dir, jstr(f, "file"));
        LOOM_TRY(loom_sha256_file(path, hex));
        if (strcmp(hex, jstr(f, "sha256")) != 0)
            return loom_fail(LOOM_EDATA, "%s: SHA-256 %s does not match the manifest's %s", path, hex,
                             jstr(f, "sha256"));
    }
    return LOOM_OK;
}

static loom_status check_dir(const char *dir) {
    cJSON *man;
    LOOM_TRY(manifest_open(dir, &man));
    loom_status st = verify_files(dir, man);
    cJSON_Delete(man);
    return st;
}

loom_status loom_ckpt_resolve(const char *arg, char *out, size_t cap) {
    char path[CKPT_DIR];
    snprintf(path, sizeof path, "%s/manifest.json", arg);
    if (access(path, F_OK) == 0) { /* a step directory named directly */
        LOOM_TRY(check_dir(arg));
        snprintf(out, cap, "%s", arg);
        return LOOM_OK;
    }
    char *latest = NULL;
    snprintf(path, sizeof path, "%s/latest", arg);
    if (read_text(path, &latest) == LOOM_OK) {
        latest[strcspn(latest, "\r\n")] = '\0';
        snprintf(path, sizeof path, "%s/%s", arg, latest);
        int plain = strchr(latest, '/') == NULL;
        free(latest);
        if (plain && check_dir(path) == LOOM_OK) {
            snprintf(out, cap, "%s", path);
            return LOOM_OK;
        }
        loom_warn("%s: %s is not a complete checkpoint (%s); trying older ones", arg, path,
                  loom_errmsg());
    }
    int steps[4096];
    int n = list_steps(arg, steps, 4096);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/step_%d", arg, steps[i]);
        if (check_dir(path) == LOOM_OK) {
            snprintf(out, cap, "%s", path);
            return LOOM_OK;
        }
        loom_warn("%s: skipping %s: %s", arg, path, loom_errmsg());
    }
    return loom_fail(LOOM_ENOINPUT, "%s: no complete checkpoint (a step_N directory with a "
                                    "manifest whose files match their SHA-256)", arg);
}

/* ---- load ------------------------------------------------------------------ */

typedef struct {
    const char *dir;
    const cJSON *man;
    int verified; /* every file's hash was checked just now (rank 0 in resolve) */
    struct { const char *name; loom_st_file *f; } open[256];
    int n_open;
} reader;

static void reader_close(reader *rd) {
    for (int i = 0; i < rd->n_open; i++) loom_st_close(rd->open[i].f);
}

static loom_status reader_file(reader *rd, const char *name, loom_st_file **out) {
    for (int i = 0; i < rd->n_open; i++)
        if (strcmp(rd->open[i].name, name) == 0) {
            *out = rd->open[i].f;
            return LOOM_OK;
        }
    if (rd->n_open == 256) { /* many files (a large world saved): start the cache over */
        reader_close(rd);
        rd->n_open = 0;
    }
    const cJSON *f, *entry = NULL;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(rd->man, "files"))
        if (strcmp(jstr(f, "file"), name) == 0) entry = f;
    char path[CKPT_PATH], hex[65];
    snprintf(path, sizeof path, "%s/%s", rd->dir, name);
    if (!entry) return loom_fail(LOOM_EDATA, "%s: a shard names file %s the manifest does not list", rd->dir, name);
    if (!rd->verified) {
        LOOM_TRY(loom_sha256_file(path, hex));
        if (strcmp(hex, jstr(entry, "sha256")) != 0)
            return loom_fail(LOOM_EDATA, "%s: SHA-256 does not match the manifest", path);
    }
    LOOM_TRY(loom_st_open(path, out));
    rd->open[rd->n_open].name = name;
    rd->open[rd->n_open++].f = *out;
    return LOOM_OK;
}


/* Fill buf/have over [lo, hi) of tensor `name` (numel elements) from every
 * shard of `kind` whose range meets it. */
static loom_status fill_tensor(reader *rd, const char *name, int kind, int64_t numel, int64_t lo,
                               int64_t hi, float *buf, unsigned char *have) {
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItem(rd->man, "shards")) {
        if (strcmp(jstr(sh, "tensor"), name) != 0 || strcmp(jstr(sh, "kind"), kind_names[kind]) != 0)
            continue;
        const cJSON *rg = cJSON_GetObjectItem(sh, "range");
        double a = cJSON_GetArrayItem(rg, 0)->valuedouble, b = cJSON_GetArrayItem(rg, 1)->valuedouble;
        if (b <= (double)lo || a >= (double)hi) continue;
        loom_st_file *f;
        LOOM_TRY(reader_file(rd, jstr(sh, "file"), &f));
        const loom_st_tensor *t = loom_st_find(f, jstr(sh, "key"));
        if (!t || t->dtype != LOOM_ST_F32 || t->ndim != 1)
            return loom_fail(LOOM_EDATA, "%s/%s: no 1-D F32 tensor %s for %s %s", rd->dir,
                             jstr(sh, "file"), jstr(sh, "key"), kind_names[kind], name);
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
                        return loom_fail(LOOM_EDATA, "%s: shard %s of %s %s: runs exceed its %zu "
                                         "elements or the tensor's %lld", rd->dir, jstr(sh, "key"),
                                         kind_names[kind], name, t->numel, (long long)numel);
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

/* Global element count of tensor `name` from the manifest. */
static int64_t tensor_numel(const cJSON *man, const char *name) {
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(man, "tensors"), name);
    const cJSON *sh = cJSON_GetObjectItem(t, "shape"), *d;
    if (!cJSON_IsArray(sh)) return -1;
    int64_t n = 1;
    cJSON_ArrayForEach(d, sh) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e10) return -1;
        n *= (int64_t)d->valuedouble;
    }
    return n;
}

/* Load one local tensor's elements of one kind: the targets are local
 * element indices [a, b) of p (flat f = p->offset + i), written to dst[i - a]. */
typedef struct { size_t a, b; float *dst; } local_span;

static loom_status load_param(reader *rd, const loom_gpt *m, const loom_param *p, int kind,
                              const local_span *sp, int n_sp, float *scratch, unsigned char *have) {
    const int tr = m->part.tp.rank;
    int64_t numel = tensor_numel(rd->man, p->name);
    if (numel != p->shape[0] * p->shape[1])
        return loom_fail(LOOM_EDATA, "%s: tensor %s is not in the manifest with shape [%lld, %lld]",
                         rd->dir, p->name, (long long)p->shape[0], (long long)p->shape[1]);
    int64_t lo = INT64_MAX, hi = 0;
    for (int s = 0; s < n_sp; s++)
        for (size_t i = sp[s].a; i < sp[s].b; i++) {
            int64_t g = loom_param_global_index(p, tr, i);
            if (g < 0) continue;
            if (g < lo) lo = g;
            if (g + 1 > hi) hi = g + 1;
        }
    if (lo >= hi) return LOOM_OK;
    memset(have + lo, 0, (size_t)(hi - lo));
    LOOM_TRY(fill_tensor(rd, p->name, kind, numel, lo, hi, scratch, have));
    for (int s = 0; s < n_sp; s++)
        for (size_t i = sp[s].a; i < sp[s].b; i++) {
            int64_t g = loom_param_global_index(p, tr, i);
            if (g < 0) {
                sp[s].dst[i - sp[s].a] = 0.0f;
                continue;
            }
            if (!have[g])
                return loom_fail(LOOM_EDATA, "%s: no shard holds %s element %lld of %s", rd->dir,
                                 kind_names[kind], (long long)g, p->name);
            sp[s].dst[i - sp[s].a] = scratch[g];
        }
    return LOOM_OK;
}

static loom_status load_part(reader *rd, const loom_train_run_state *s, int part, float *scratch,
                             unsigned char *have) {
    const loom_gpt *m = s->parts[part];
    int nr, no = loom_dp_opt_runs(s->dp, part, NULL, 0);
    const loom_param_run *pr = loom_dp_param_runs(s->dp, part, &nr);
    loom_opt_run *orun = calloc((size_t)(no ? no : 1), sizeof *orun);
    local_span *sp = calloc((size_t)(nr + no + 1), sizeof *sp);
    loom_status st = orun && sp ? LOOM_OK : loom_fail(LOOM_EOS, "out of memory");
    if (orun) loom_dp_opt_runs(s->dp, part, orun, no);
    float *ea[3];
    size_t elo;
    const int has_ep = ep_state(s, part, ea, &elo) > 0;
    for (int k = 0; k < m->n_params && st == LOOM_OK; k++) {
        const loom_param *p = &m->params[k];
        if (has_ep && p->unit == LOOM_UNIT_EXPERTS) { /* the EP engine's storage, whole */
            for (int kind = K_PARAM; kind < K_COUNT && st == LOOM_OK; kind++) {
                local_span one = {0, p->numel, ea[kind] + (p->offset - elo)};
                st = load_param(rd, m, p, kind, &one, 1, scratch, have);
            }
            continue;
        }
        int n = 0;
        for (int r = 0; r < nr; r++) {
            size_t a = p->offset > pr[r].lo ? p->offset : pr[r].lo;
            size_t b = p->offset + p->numel, e = pr[r].lo + pr[r].n;
            if (b > e) b = e;
            if (a < b) sp[n++] = (local_span){a - p->offset, b - p->offset, pr[r].data + (a - pr[r].lo)};
        }
        st = load_param(rd, m, p, K_PARAM, sp, n, scratch, have);
        for (int kind = K_EXP_AVG; kind <= K_EXP_AVG_SQ && st == LOOM_OK; kind++) {
            n = 0;
            for (int r = 0; r < no; r++)
                if (orun[r].param == k)
                    sp[n++] = (local_span){orun[r].lo - p->offset, orun[r].lo - p->offset + orun[r].n,
                                           kind == K_EXP_AVG ? orun[r].m : orun[r].v};
            st = load_param(rd, m, p, kind, sp, n, scratch, have);
        }
    }
    free(orun);
    free(sp);
    return st;
}

/* Settings that must match for the resumed run to continue the saved one. */
static loom_status check_compatible(const loom_train_run_state *s, const cJSON *man, const char *dir) {
    const loom_train_config *c = s->cfg;
    const loom_model_config *mc = &s->parts[0]->cfg;
    const cJSON *m = cJSON_GetObjectItem(man, "model"), *t = cJSON_GetObjectItem(man, "train");
    const struct { const cJSON *o; const char *key, *flag; double mine; } want[] = {
        {m, "n_layer", "--model", mc->n_layer},     {m, "n_head", "--model", mc->n_head},
        {m, "n_embd", "--model", mc->n_embd},       {m, "vocab_size", "--model", mc->vocab_size},
        {m, "n_positions", "--model", mc->n_positions},
        {t, "steps", "--steps", c->steps},          {t, "batch", "--batch", c->batch},
        {t, "seq", "--seq", c->seq},                {t, "lr", "--lr", c->lr},
        {t, "min_lr_frac", "--min-lr-frac", c->min_lr_frac},
        {t, "warmup", "--warmup", c->warmup},       {t, "weight_decay", "--weight-decay", c->weight_decay},
        {t, "beta1", "--beta1", c->beta1},          {t, "beta2", "--beta2", c->beta2},
        {t, "eps", "--eps", c->eps},                {t, "grad_clip", "--grad-clip", c->grad_clip},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(want[i].o, want[i].key);
        if (!cJSON_IsNumber(v) || (float)v->valuedouble != (float)want[i].mine) /* cJSON prints 15 digits */
            return loom_fail(LOOM_EUSAGE, "--resume %s: the checkpoint has %s = %g, this run %s %g; "
                             "resume with the same value", dir, want[i].key,
                             cJSON_IsNumber(v) ? v->valuedouble : -1.0, want[i].flag, want[i].mine);
    }
    const char *seed = jstr(cJSON_GetObjectItem(man, "rng"), "seed");
    char mine[32];
    snprintf(mine, sizeof mine, "%llu", (unsigned long long)c->seed);
    if (!seed || strcmp(seed, mine) != 0)
        return loom_fail(LOOM_EUSAGE, "--resume %s: the checkpoint has seed %s, this run --seed %s",
                         dir, seed ? seed : "(none)", mine);
    int step = cJSON_GetObjectItem(man, "step")->valueint;
    if (step >= c->steps)
        return loom_fail(LOOM_EUSAGE, "--resume %s: the checkpoint is at step %d, nothing left of "
                         "--steps %d", dir, step, c->steps);
    return LOOM_OK;
}

loom_status loom_ckpt_load(loom_train_run_state *s, int *step) {
    loom_comm *world = s->mesh->world;
    char dir[CKPT_DIR] = {0};
    loom_status st = LOOM_OK;
    double t0 = loom_comm_wtime();
    if (s->mesh->rank == 0) st = loom_ckpt_resolve(s->cfg->resume, dir, sizeof dir);
    LOOM_TRY(loom_comm_agree(world, st));
    LOOM_TRY(loom_comm_bcast(world, dir, sizeof dir, 0));
    cJSON *man = NULL;
    st = manifest_open(dir, &man);
    if (st == LOOM_OK) st = check_compatible(s, man, dir);
    st = loom_comm_agree(world, st);
    if (st != LOOM_OK) {
        cJSON_Delete(man);
        return st;
    }
    /* one tensor's scratch at a time, sized by the largest tensor */
    int64_t biggest = 1;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(man, "tensors")) {
        int64_t n = tensor_numel(man, t->string);
        if (n > biggest) biggest = n;
    }
    float *scratch = malloc((size_t)biggest * sizeof *scratch);
    unsigned char *have = malloc((size_t)biggest);
    reader rd = {.dir = dir, .man = man, .verified = s->mesh->rank == 0};
    st = scratch && have ? LOOM_OK : loom_fail(LOOM_EOS, "out of memory for a %lld-element tensor",
                                               (long long)biggest);
    for (int i = 0; i < s->n_parts && st == LOOM_OK; i++) st = load_part(&rd, s, i, scratch, have);
    if (st == LOOM_OK) st = load_buffers(s, man, dir);
    reader_close(&rd);
    free(scratch);
    free(have);
    *step = cJSON_GetObjectItem(man, "step")->valueint;
    const cJSON *ot = cJSON_GetObjectItem(man, "optimizer_steps");
    if (st == LOOM_OK) loom_dp_set_steps_taken(s->dp, cJSON_IsNumber(ot) ? ot->valueint : *step);
    if (st == LOOM_OK) loom_ep_set_steps_taken(s->ep, cJSON_IsNumber(ot) ? ot->valueint : *step);
    cJSON_Delete(man);
    st = loom_comm_agree(world, st);
    if (st == LOOM_OK && s->mesh->rank == 0)
        loom_info("resumed from %s at step %d (%.3f s)", dir, *step, loom_comm_wtime() - t0);
    return st;
}

/* ---- signals ---------------------------------------------------------------- */

static volatile sig_atomic_t caught_signal;
static struct sigaction old_term, old_int;

static void on_signal(int sig) { caught_signal = sig; }

void loom_ckpt_signals(int on) {
    if (on) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESTART; /* system calls inside MPI and I/O carry on */
        sigemptyset(&sa.sa_mask);
        caught_signal = 0;
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
    } else {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
}

loom_status loom_ckpt_after_step(loom_train_run_state *s, int step) {
    const loom_train_config *c = s->cfg;
    if (!c->save_dir[0]) return LOOM_OK;
    int32_t sig = caught_signal;
    LOOM_TRY(loom_comm_allreduce(s->mesh->world, &sig, 1, LOOM_I32, LOOM_MAX));
    const int last = step + 1 == c->steps; /* the end-of-run save follows */
    if (!sig && (last || c->save_every <= 0 || (step + 1) % c->save_every != 0)) return LOOM_OK;
    loom_status st = loom_ckpt_save(s, step + 1);
    s->failed_together = 1; /* agreed inside the save, or the signal below */
    if (st != LOOM_OK) return st;
    if (sig) {
        st = loom_fail(LOOM_EINTERRUPTED, "stopped by signal %d after step %d; checkpoint %s/step_%d "
                       "saved: continue with --resume %s", (int)sig, step + 1, c->save_dir, step + 1,
                       c->save_dir);
        if (s->mesh->rank != 0) loom_clear_error(); /* rank 0 reports */
        return st;
    }
    s->failed_together = 0;
    return LOOM_OK;
}

/* ---- export ----------------------------------------------------------------- */

static loom_status write_hf_config(const char *out, const cJSON *model) {
    char dir[CKPT_PATH];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = '\0';
    else dir[0] = '\0';
    char path[CKPT_PATH + 16];
    snprintf(path, sizeof path, "%sconfig.json", dir);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    const char *keys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(model, keys[i]);
        add_num(o, keys[i], cJSON_IsNumber(v) ? v->valuedouble : 0);
    }
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    add_num(o, "layer_norm_epsilon", 1e-5);
    cJSON_AddTrueToObject(o, "tie_word_embeddings");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return loom_fail(LOOM_EOS, "out of memory");
    loom_status st = write_text(path, text);
    free(text);
    return st;
}

loom_status loom_ckpt_export(const char *arg, const char *out) {
    char dir[CKPT_DIR];
    LOOM_TRY(loom_ckpt_resolve(arg, dir, sizeof dir));
    cJSON *man;
    LOOM_TRY(manifest_open(dir, &man));
    const cJSON *tensors = cJSON_GetObjectItem(man, "tensors"), *t;
    int n = cJSON_GetArraySize(tensors);
    float **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
    reader rd = {.dir = dir, .man = man, .verified = 1}; /* resolve verified every file */
    loom_st_writer *w = NULL;
    loom_status st = bufs ? loom_st_writer_create(out, &w) : loom_fail(LOOM_EOS, "out of memory");
    const cJSON *model = cJSON_GetObjectItem(man, "model");
    if (st == LOOM_OK) st = loom_st_writer_metadata(w, "format", "pt");
    char v[32];
    snprintf(v, sizeof v, "%d", cJSON_GetObjectItem(man, "step")->valueint);
    if (st == LOOM_OK) st = loom_st_writer_metadata(w, "step", v);
    int i = 0;
    cJSON_ArrayForEach(t, tensors) {
        if (st != LOOM_OK) break;
        int64_t numel = tensor_numel(man, t->string), shape[2] = {0, 1};
        const cJSON *sh = cJSON_GetObjectItem(t, "shape");
        int nd = cJSON_GetArraySize(sh);
        if (numel < 0 || nd < 1 || nd > 2) {
            st = loom_fail(LOOM_EDATA, "%s: tensor %s has a bad shape", dir, t->string);
            break;
        }
        for (int d = 0; d < nd; d++) shape[d] = (int64_t)cJSON_GetArrayItem(sh, d)->valuedouble;
        bufs[i] = malloc((size_t)(numel ? numel : 1) * sizeof(float));
        unsigned char *have = calloc((size_t)(numel ? numel : 1), 1);
        if (!bufs[i] || !have) st = loom_fail(LOOM_EOS, "out of memory for %s", t->string);
        if (st == LOOM_OK) st = fill_tensor(&rd, t->string, K_PARAM, numel, 0, numel, bufs[i], have);
        for (int64_t g = 0; g < numel && st == LOOM_OK; g++)
            if (!have[g])
                st = loom_fail(LOOM_EDATA, "%s: no shard holds param element %lld of %s", dir,
                               (long long)g, t->string);
        free(have);
        if (st == LOOM_OK) st = loom_st_writer_add(w, t->string, LOOM_ST_F32, nd, shape, bufs[i]);
        i++;
    }
    if (w) {
        if (st == LOOM_OK) st = loom_st_writer_finish(w);
        else loom_st_writer_abort(w);
    }
    if (st == LOOM_OK) st = write_hf_config(out, model);
    reader_close(&rd);
    for (int k = 0; k < n && bufs; k++) free(bufs[k]);
    free(bufs);
    cJSON_Delete(man);
    return st;
}
