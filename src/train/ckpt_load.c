/* ckpt_load.c - resume under any layout, and export (every mesh axis: a
 * rank reads whatever shards meet what it holds). Load, collective over
 * the world: rank 0 resolves --resume to a checkpoint whose manifest
 * parses and whose files all match their hashes, and broadcasts it. Every
 * rank then reads, tensor by tensor, only the shards whose global range
 * meets the elements it holds, into a scratch of that one tensor, and
 * keeps its own elements; any missing element is LOOM_EDATA naming it.
 * The files are verified again by each rank that reads them. State in
 * device memory is written through host copies, uploaded when the part is
 * done (ckpt_state.c). Export (one process, files only, whatever device the
 * run had) gathers every parameter into one safetensors file and a Hugging
 * Face config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/edp.h"
#include "loom/log.h"
#include "loom/moe.h"
#include "loom/safetensors.h"
#include "loom/sha256.h"
#include "train/ckpt_internal.h"

/* ---- load ------------------------------------------------------------------ */

typedef struct {
    const char *dir;
    const cJSON *man;
    int verified; /* every file's hash was checked just now (rank 0 in resolve) */
    struct {
        const char *name;
        loom_st_file *f;
    } open[256];
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
    if (!entry)
        return loom_fail(LOOM_EDATA, "%s: a shard names file %s the manifest does not list", rd->dir, name);
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
static loom_status fill_tensor(reader *rd, const char *name, int kind, int64_t numel, int64_t lo, int64_t hi,
                               float *buf, unsigned char *have) {
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItem(rd->man, "shards")) {
        if (strcmp(jstr(sh, "tensor"), name) != 0 || strcmp(jstr(sh, "kind"), ckpt_kind_names[kind]) != 0)
            continue;
        const cJSON *rg = cJSON_GetObjectItem(sh, "range");
        double a = cJSON_GetArrayItem(rg, 0)->valuedouble, b = cJSON_GetArrayItem(rg, 1)->valuedouble;
        if (b <= (double)lo || a >= (double)hi) continue;
        loom_st_file *f;
        LOOM_TRY(reader_file(rd, jstr(sh, "file"), &f));
        const loom_st_tensor *t = loom_st_find(f, jstr(sh, "key"));
        if (!t || t->dtype != LOOM_ST_F32 || t->ndim != 1)
            return loom_fail(LOOM_EDATA, "%s/%s: no 1-D F32 tensor %s for %s %s", rd->dir, jstr(sh, "file"),
                             jstr(sh, "key"), ckpt_kind_names[kind], name);
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
                                         "%s: shard %s of %s %s: runs exceed its %zu "
                                         "elements or the tensor's %lld",
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
typedef struct {
    size_t a, b;
    float *dst;
} local_span;

static loom_status load_param(reader *rd, const loom_gpt *m, const loom_param *p, int kind,
                              const local_span *sp, int n_sp, float *scratch, unsigned char *have) {
    const int tr = m->part.tp.rank;
    int64_t numel = tensor_numel(rd->man, p->name);
    if (numel != p->shape[0] * p->shape[1])
        return loom_fail(LOOM_EDATA, "%s: tensor %s is not in the manifest with shape [%lld, %lld]", rd->dir,
                         p->name, (long long)p->shape[0], (long long)p->shape[1]);
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
                                 ckpt_kind_names[kind], (long long)g, p->name);
            sp[s].dst[i - sp[s].a] = scratch[g];
        }
    return LOOM_OK;
}

/* One part's elements into its state as host memory (cs). */
static loom_status load_part_state(reader *rd, const loom_train_run_state *s, int part, const ckpt_state *cs,
                                   float *scratch, unsigned char *have) {
    const loom_gpt *m = s->parts[part];
    const int nr = cs->nr, no = cs->no;
    const loom_param_run *pr = cs->pr;
    const loom_opt_run *orun = cs->orun;
    local_span *sp = calloc((size_t)(nr + no + 1), sizeof *sp);
    loom_status st = sp ? LOOM_OK : loom_fail(LOOM_EOS, "out of memory");
    for (int k = 0; k < m->n_params && st == LOOM_OK; k++) {
        const loom_param *p = &m->params[k];
        if (cs->en && p->unit == LOOM_UNIT_EXPERTS) { /* the EP engine's storage, whole */
            for (int kind = K_PARAM; kind < K_COUNT && st == LOOM_OK; kind++) {
                local_span one = {0, p->numel, cs->ea[kind] + (p->offset - cs->elo)};
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
    free(sp);
    return st;
}

/* One part: its state opened as host memory, filled, uploaded back when
 * it is a copy (and only when every element was found). */
static loom_status load_part(reader *rd, const loom_train_run_state *s, int part, float *scratch,
                             unsigned char *have) {
    ckpt_state cs;
    LOOM_TRY(ckpt_state_open(s, part, &cs));
    loom_status st = load_part_state(rd, s, part, &cs, scratch, have);
    ckpt_state_close(&cs, st == LOOM_OK);
    return st;
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
                return loom_fail(LOOM_EDATA,
                                 "%s: the manifest has no %s of %d numbers (the model "
                                 "uses aux_free_bias_rate)",
                                 dir, name, E);
            float *h = loom_train_host_view(s->parts[i]->dev, bias, (size_t)E); /* device memory */
            if (!h) return LOOM_EOS;
            for (int e = 0; e < E; e++) h[e] = (float)cJSON_GetArrayItem(a, e)->valuedouble;
            loom_train_host_view_done(s->parts[i]->dev, bias, h, (size_t)E, 1);
        }
    }
    return LOOM_OK;
}

/* Settings that must match for the resumed run to continue the saved one. */
static loom_status check_compatible(const loom_train_run_state *s, const cJSON *man, const char *dir) {
    const loom_train_config *c = s->cfg;
    const loom_model_config *mc = &s->parts[0]->cfg;
    const cJSON *m = cJSON_GetObjectItem(man, "model"), *t = cJSON_GetObjectItem(man, "train");
    const struct {
        const cJSON *o;
        const char *key, *flag;
        double mine;
    } want[] = {
        {m, "n_layer", "--model", mc->n_layer},
        {m, "n_head", "--model", mc->n_head},
        {m, "n_embd", "--model", mc->n_embd},
        {m, "vocab_size", "--model", mc->vocab_size},
        {m, "n_positions", "--model", mc->n_positions},
        {t, "steps", "--steps", c->steps},
        {t, "batch", "--batch", c->batch},
        {t, "seq", "--seq", c->seq},
        {t, "lr", "--lr", c->lr},
        {t, "min_lr_frac", "--min-lr-frac", c->min_lr_frac},
        {t, "warmup", "--warmup", c->warmup},
        {t, "weight_decay", "--weight-decay", c->weight_decay},
        {t, "beta1", "--beta1", c->beta1},
        {t, "beta2", "--beta2", c->beta2},
        {t, "eps", "--eps", c->eps},
        {t, "grad_clip", "--grad-clip", c->grad_clip},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(want[i].o, want[i].key);
        if (!cJSON_IsNumber(v) || (float)v->valuedouble != (float)want[i].mine) /* cJSON prints 15 digits */
            return loom_fail(LOOM_EUSAGE,
                             "--resume %s: the checkpoint has %s = %g, this run %s %g; "
                             "resume with the same value",
                             dir, want[i].key, cJSON_IsNumber(v) ? v->valuedouble : -1.0, want[i].flag,
                             want[i].mine);
    }
    const char *seed = jstr(cJSON_GetObjectItem(man, "rng"), "seed");
    char mine[32];
    snprintf(mine, sizeof mine, "%llu", (unsigned long long)c->seed);
    if (!seed || strcmp(seed, mine) != 0)
        return loom_fail(LOOM_EUSAGE, "--resume %s: the checkpoint has seed %s, this run --seed %s", dir,
                         seed ? seed : "(none)", mine);
    int step = cJSON_GetObjectItem(man, "step")->valueint;
    if (step >= c->steps)
        return loom_fail(LOOM_EUSAGE, "--resume %s: the checkpoint is at step %d, nothing left of --steps %d",
                         dir, step, c->steps);
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
    st = ckpt_manifest_open(dir, &man);
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
    st = scratch && have ? LOOM_OK
                         : loom_fail(LOOM_EOS, "out of memory for a %lld-element tensor", (long long)biggest);
    for (int i = 0; i < s->n_parts && st == LOOM_OK; i++) st = load_part(&rd, s, i, scratch, have);
    if (st == LOOM_OK) st = load_buffers(s, man, dir);
    reader_close(&rd);
    free(scratch);
    free(have);
    *step = cJSON_GetObjectItem(man, "step")->valueint;
    const cJSON *ot = cJSON_GetObjectItem(man, "optimizer_steps");
    if (st == LOOM_OK) loom_dp_set_steps_taken(s->dp, cJSON_IsNumber(ot) ? ot->valueint : *step);
    if (st == LOOM_OK) loom_edp_set_steps_taken(s->edp, cJSON_IsNumber(ot) ? ot->valueint : *step);
    cJSON_Delete(man);
    st = loom_comm_agree(world, st);
    if (st == LOOM_OK && s->mesh->rank == 0)
        loom_info("resumed from %s at step %d (%.3f s)", dir, *step, loom_comm_wtime() - t0);
    return st;
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
    const cJSON *hf = cJSON_GetObjectItem(model, "hf_config"); /* the Llama family's, as saved */
    if (cJSON_IsObject(hf)) {
        char *text = cJSON_Print(hf);
        if (!text) return loom_fail(LOOM_EOS, "out of memory");
        loom_status st = ckpt_write_text(path, text);
        free(text);
        return st;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    const char *keys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(model, keys[i]);
        cJSON_AddNumberToObject(o, keys[i], cJSON_IsNumber(v) ? v->valuedouble : 0);
    }
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    cJSON_AddTrueToObject(o, "tie_word_embeddings");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return loom_fail(LOOM_EOS, "out of memory");
    loom_status st = ckpt_write_text(path, text);
    free(text);
    return st;
}

loom_status loom_ckpt_export(const char *arg, const char *out) {
    char dir[CKPT_DIR];
    LOOM_TRY(loom_ckpt_resolve(arg, dir, sizeof dir));
    cJSON *man;
    LOOM_TRY(ckpt_manifest_open(dir, &man));
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
                st = loom_fail(LOOM_EDATA, "%s: no shard holds param element %lld of %s", dir, (long long)g,
                               t->string);
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
