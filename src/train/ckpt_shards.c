/* ckpt_shards.c - what one rank writes into a checkpoint (every mesh axis:
 * the one-holder rules below; local, not collective): every rank writes
 * only what it is the one holder of, as 1-D F32 tensors in
 * DIR/step_N.tmp/rank_R.safetensors: its parameter elements (dp/cp
 * coordinate 0, or its own ZeRO-3 slices; tp rank 0 for tensors tp does not
 * cut; the embedding stage for the tied wte) and its AdamW moments (dp
 * coordinate 0, or its own ZeRO-1/2/3 slices; the same tp and wte rule);
 * under expert parallelism the expert tensors from the expert engine's storage,
 * by edp rank 0 (edp.h), under their global names; MoE selection biases
 * inline in the manifest ("buffers"). A shard is (tensor, kind, file, key)
 * plus the global element indices it holds, as runs [start, len, stride,
 * count]: count runs of len elements at start + i * stride of the tensor's
 * row-major global layout; the file's metadata repeats, per key, its tensor,
 * kind, elements and a hash of its runs, and the step, so a reader can tell
 * a manifest that does not belong to the file. The rank hashes its file (SHA-256 of the bytes
 * on disk) and describes it and its shards as JSON for the manifest. State
 * in device memory is read through host copies (ckpt_state.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/edp.h"
#include "loom/moe.h"
#include "loom/safetensors.h"
#include "loom/sha256.h"
#include "train/ckpt_internal.h"

/* ---- runs of global indices ---------------------------------------------- */

typedef struct {
    int64_t start, len, stride, count;
} g_run;

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

/* Expert tensors of an expert-parallel part live in the expert engine (edp.h),
 * replicated over edp: edp rank 0 writes them (tp rank 0 for unsplit ones). */
static int ep_holder(const loom_train_run_state *s, const loom_gpt *m, const loom_param *p) {
    if (loom_comm_rank(loom_edp_comm(s->edp)) != 0) return 0;
    return p->split_dim >= 0 || m->part.tp.rank == 0;
}

static loom_status collect_experts(const loom_train_run_state *s, int part, const ckpt_state *cs,
                                   shard_set *set) {
    const loom_gpt *m = s->parts[part];
    float *const *arr = cs->ea;
    const size_t lo = cs->elo;
    if (!cs->en) return LOOM_OK;
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

/* Parameter p's values held in the runs pr (n of them), as one shard. */
static int collect_param(shard_set *set, const loom_param *p, int tr, const loom_param_run *pr, int n) {
    shard *h = set_new(set, p->name, K_PARAM);
    for (int r = 0; h && r < n; r++) {
        size_t a = p->offset > pr[r].lo ? p->offset : pr[r].lo;
        size_t b = p->offset + p->numel, e = pr[r].lo + pr[r].n;
        for (size_t f = a; f < (b < e ? b : e); f++) {
            int64_t g = loom_param_global_index(p, tr, f - p->offset);
            if (g >= 0 && set_val(set, h, g, pr[r].data[f - pr[r].lo])) h = NULL;
        }
    }
    if (!h || runs_close(&h->runs)) return -1;
    if (h->n == 0) set->n--;
    return 0;
}

/* Parameter k's AdamW moment `kind` held in the runs orun (n), as one shard. */
static int collect_moment(shard_set *set, const loom_param *p, int k, int kind, int tr,
                          const loom_opt_run *orun, int n) {
    shard *h = set_new(set, p->name, kind);
    for (int r = 0; h && r < n; r++) {
        if (orun[r].param != k) continue;
        const float *src = kind == K_EXP_AVG ? orun[r].m : orun[r].v;
        for (size_t f = 0; f < orun[r].n; f++) {
            int64_t g = loom_param_global_index(p, tr, orun[r].lo + f - p->offset);
            if (g >= 0 && set_val(set, h, g, src[f])) h = NULL;
        }
    }
    if (!h || runs_close(&h->runs)) return -1;
    if (h->n == 0) set->n--;
    return 0;
}

/* One part's shards, from its state as host memory. */
static loom_status collect_part(const loom_train_run_state *s, int i, const ckpt_state *cs, shard_set *set) {
    const int z3 = loom_dp_params_sharded(s->dp), zopt = loom_dp_opt_sharded(s->dp);
    const loom_gpt *m = s->parts[i];
    const int tr = m->part.tp.rank;
    LOOM_TRY(collect_experts(s, i, cs, set));
    for (int k = 0; k < m->n_params; k++) {
        const loom_param *p = &m->params[k];
        if (cs->en && p->unit == LOOM_UNIT_EXPERTS) continue; /* collect_experts */
        int bad = one_holder(s, m, p, z3) && collect_param(set, p, tr, cs->pr, cs->nr);
        for (int kind = K_EXP_AVG; !bad && kind <= K_EXP_AVG_SQ && one_holder(s, m, p, zopt); kind++)
            bad = collect_moment(set, p, k, kind, tr, cs->orun, cs->no);
        if (bad) return loom_fail(LOOM_EOS, "out of memory collecting this rank's checkpoint shards");
    }
    return LOOM_OK;
}

/* Every part's shards, each part's state through host copies when its
 * device memory is not host memory. */
static loom_status collect(const loom_train_run_state *s, shard_set *set) {
    for (int i = 0; i < s->n_parts; i++) {
        ckpt_state cs;
        LOOM_TRY(ckpt_state_open(s, i, &cs));
        loom_status st = collect_part(s, i, &cs, set);
        ckpt_state_close(&cs, 0);
        LOOM_TRY(st);
    }
    return LOOM_OK;
}

static cJSON *shard_json(const shard *h, const char *file, int idx) {
    cJSON *o = cJSON_CreateObject();
    char key[32];
    snprintf(key, sizeof key, "s%d", idx);
    cJSON_AddStringToObject(o, "tensor", h->tensor);
    cJSON_AddStringToObject(o, "kind", ckpt_kind_names[h->kind]);
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

/* The selection biases (device memory: read through a host view). */
static loom_status add_buffers(const loom_train_run_state *s, cJSON *o) {
    if (s->mesh->dp_rank != 0 || s->mesh->cp_rank != 0 || s->parts[0]->part.tp.rank != 0) return LOOM_OK;
    cJSON *bufs = NULL;
    for (int i = 0; i < s->n_parts; i++) {
        const int E = s->parts[i]->cfg.n_expert;
        int l, nb;
        loom_moe_stats_get(s->parts[i], &nb);
        for (int b = 0; b < nb; b++) {
            float *bias = loom_moe_selection_bias(s->parts[i], b, &l);
            if (!bias) continue;
            float *h = loom_train_host_view(s->parts[i]->dev, bias, (size_t)E);
            if (!h) return LOOM_EOS;
            if (!bufs) bufs = cJSON_AddObjectToObject(o, "buffers");
            char name[64];
            snprintf(name, sizeof name, BIAS_NAME, l);
            cJSON *a = cJSON_AddArrayToObject(bufs, name);
            for (int e = 0; e < E; e++) cJSON_AddItemToArray(a, cJSON_CreateNumber(h[e]));
            loom_train_host_view_done(s->parts[i]->dev, bias, h, (size_t)E, 0);
        }
    }
    return LOOM_OK;
}

/* Write this rank's file (if it holds anything) and describe it as JSON. */
/* The file's own account of shard i and of the step (ckpt_internal.h). */
static loom_status describe(loom_st_writer *w, const shard *h, int i, int step, int opt_steps) {
    loom_sha256 runs;
    loom_sha256_init(&runs);
    for (int k = 0; k < h->runs.n; k++)
        ckpt_runs_hash(&runs, h->runs.r[k].start, h->runs.r[k].len, h->runs.r[k].stride, h->runs.r[k].count);
    char key[32], desc[256];
    snprintf(key, sizeof key, "s%d", i);
    ckpt_shard_desc(desc, sizeof desc, h->tensor, ckpt_kind_names[h->kind], (int64_t)h->n, h->runs.lo,
                    h->runs.hi, &runs);
    LOOM_TRY(loom_st_writer_metadata(w, key, desc));
    if (i > 0) return LOOM_OK;
    snprintf(desc, sizeof desc, "%d", step);
    LOOM_TRY(loom_st_writer_metadata(w, CKPT_META_STEP, desc));
    snprintf(desc, sizeof desc, "%d", opt_steps);
    return loom_st_writer_metadata(w, CKPT_META_OPT, desc);
}

loom_status ckpt_write_rank(const loom_train_run_state *s, const char *tmpdir, int step, char **json) {
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
            if (st == LOOM_OK) st = describe(w, &set.sh[i], i, step, (int)loom_dp_steps_taken(s->dp));
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
    if (st == LOOM_OK) st = add_buffers(s, o);
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    set_free(&set);
    if (st == LOOM_OK && !*json) st = loom_fail(LOOM_EOS, "out of memory");
    return st;
}
