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
#include <unistd.h>

#include "loom/edp.h"
#include "loom/log.h"
#include "loom/moe.h"
#include "loom/safetensors.h"
#include "loom/sha256.h"
#include "train/ckpt_internal.h"

/* ---- load ------------------------------------------------------------------ */

/* Load one local tensor's elements of one kind: the targets are local
 * element indices [a, b) of p (flat f = p->offset + i), written to dst[i - a]. */
typedef struct {
    size_t a, b;
    float *dst;
} local_span;

static loom_status load_param(ckpt_reader *rd, const loom_gpt *m, const loom_param *p, int kind,
                              const local_span *sp, int n_sp, float *scratch, unsigned char *have) {
    const int tr = m->part.tp.rank;
    int64_t numel = ckpt_tensor_numel(rd->man, p->name);
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
    LOOM_TRY(ckpt_fill_tensor(rd, p->name, kind, numel, lo, hi, scratch, have));
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
static loom_status load_part_state(ckpt_reader *rd, const loom_train_run_state *s, int part,
                                   const ckpt_state *cs, float *scratch, unsigned char *have) {
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
static loom_status load_part(ckpt_reader *rd, const loom_train_run_state *s, int part, float *scratch,
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

/* The resumed run must be the saved one (its identity: model, data, seed,
 * hyper-parameters), with steps left; then the manifest's tensors must be
 * the model's, checked before anything is allocated for them. */
static loom_status check_compatible(const loom_train_run_state *s, const cJSON *man, const char *dir,
                                    const ckpt_spec *spec, int n) {
    char diff[512];
    if (ckpt_identity_diff(cJSON_GetObjectItem(man, "run"), s->ckpt, diff, sizeof diff))
        return loom_fail(LOOM_EUSAGE,
                         "--resume %s: the checkpoint is of another run: %s; resume with the same settings",
                         dir, diff);
    int step = (int)cJSON_GetObjectItem(man, "step")->valuedouble;
    if (step >= s->cfg->steps)
        return loom_fail(LOOM_EUSAGE, "--resume %s: the checkpoint is at step %d, nothing left of --steps %d",
                         dir, step, s->cfg->steps);
    return ckpt_check_tensors(man, dir, spec, n);
}

/* The model's tensors as a reader expects them (*spec: malloc'd, pointing into *table). */
static loom_status model_spec(const loom_model_config *mc, loom_param **table, ckpt_spec **spec, int *n) {
    size_t total;
    LOOM_TRY(loom_param_table_whole(mc, table, n, &total));
    *spec = calloc((size_t)(*n ? *n : 1), sizeof **spec);
    if (!*spec) {
        free(*table);
        return loom_fail(LOOM_EOS, "out of memory");
    }
    for (int i = 0; i < *n; i++)
        (*spec)[i] =
            (ckpt_spec){(*table)[i].name, (*table)[i].ndim, {(*table)[i].shape[0], (*table)[i].shape[1]}};
    return LOOM_OK;
}

/* Rank 0: --resume DIR took the newest step that verifies; DIR/latest now names it. */
static void repair_latest(const char *arg, const char *dir) {
    char path[CKPT_DIR];
    snprintf(path, sizeof path, "%s/manifest.json", arg);
    if (access(path, F_OK) == 0) return; /* a step directory was named */
    const char *base = strrchr(dir, '/');
    int step;
    if (!base || sscanf(base + 1, "step_%d", &step) != 1) return;
    if (ckpt_set_latest(arg, step) != LOOM_OK) {
        loom_warn("%s/latest could not be pointed at step_%d: %s", arg, step, loom_errmsg());
        loom_clear_error();
    }
}

loom_status loom_ckpt_load(loom_train_run_state *s, int *step) {
    loom_comm *world = s->mesh->world;
    char dir[CKPT_DIR] = {0};
    loom_status st = LOOM_OK;
    double t0 = loom_comm_wtime();
    if (s->mesh->rank == 0) {
        st = loom_ckpt_resolve(s->cfg->resume, dir, sizeof dir);
        if (st == LOOM_OK) {
            repair_latest(s->cfg->resume, dir);
            snprintf(s->ckpt->resumed, sizeof s->ckpt->resumed, "%s", dir);
        }
    }
    LOOM_TRY(loom_comm_agree(world, st));
    LOOM_TRY(loom_comm_bcast(world, dir, sizeof dir, 0));
    cJSON *man = NULL;
    loom_param *table = NULL;
    ckpt_spec *spec = NULL;
    int n = 0;
    st = model_spec(&s->parts[0]->cfg, &table, &spec, &n);
    if (st == LOOM_OK) st = ckpt_manifest_open(dir, &man);
    if (st == LOOM_OK) st = check_compatible(s, man, dir, spec, n);
    st = loom_comm_agree(world, st);
    /* one tensor's scratch at a time, sized by the model's largest tensor */
    int64_t biggest = 1;
    for (int i = 0; i < n; i++)
        if (spec[i].shape[0] * spec[i].shape[1] > biggest) biggest = spec[i].shape[0] * spec[i].shape[1];
    free(spec);
    free(table);
    if (st != LOOM_OK) {
        cJSON_Delete(man);
        return st;
    }
    float *scratch = malloc((size_t)biggest * sizeof *scratch);
    unsigned char *have = malloc((size_t)biggest);
    ckpt_reader rd = {.dir = dir, .man = man, .verified = s->mesh->rank == 0};
    st = scratch && have ? LOOM_OK
                         : loom_fail(LOOM_EOS, "out of memory for a %lld-element tensor", (long long)biggest);
    for (int i = 0; i < s->n_parts && st == LOOM_OK; i++) st = load_part(&rd, s, i, scratch, have);
    if (st == LOOM_OK) st = load_buffers(s, man, dir);
    ckpt_reader_close(&rd);
    free(scratch);
    free(have);
    *step = (int)cJSON_GetObjectItem(man, "step")->valuedouble;
    const int t = (int)cJSON_GetObjectItem(man, "optimizer_steps")->valuedouble;
    if (st == LOOM_OK) loom_dp_set_steps_taken(s->dp, t);
    if (st == LOOM_OK) loom_edp_set_steps_taken(s->edp, t);
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

/* The model a manifest's run identity describes, checked as any config. */
static loom_status manifest_model(const cJSON *man, const char *dir, loom_model_config *mc) {
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(man, "run"), "model");
    const cJSON *hf = cJSON_GetObjectItem(m, "hf_config"); /* the Llama family's, as saved */
    if (hf) {
        char what[CKPT_DIR + 64];
        snprintf(what, sizeof what, "%s/manifest.json: run.model.hf_config", dir);
        LOOM_TRY(loom_model_config_from_hf_json(what, hf, mc));
        return loom_moe_config_check(mc);
    }
    memset(mc, 0, sizeof *mc);
    snprintf(mc->name, sizeof mc->name, "checkpoint");
    struct {
        const char *key;
        int *i;
        float *f;
    } keys[] = {{"n_layer", &mc->n_layer, NULL},
                {"n_head", &mc->n_head, NULL},
                {"n_embd", &mc->n_embd, NULL},
                {"vocab_size", &mc->vocab_size, NULL},
                {"n_positions", &mc->n_positions, NULL},
                {"n_expert", &mc->n_expert, NULL},
                {"top_k", &mc->top_k, NULL},
                {"moe_every", &mc->moe_every, NULL},
                {"expert_hidden", &mc->expert_hidden, NULL},
                {"norm_topk", &mc->norm_topk, NULL},
                {"aux_coef", NULL, &mc->aux_coef},
                {"z_coef", NULL, &mc->z_coef},
                {"capacity_factor", NULL, &mc->capacity_factor},
                {"bias_rate", NULL, &mc->bias_rate}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(m, keys[i].key);
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= -1e9 && v->valuedouble <= 1e9))
            return loom_fail(LOOM_EDATA, "%s/manifest.json: run.model has no number %s", dir, keys[i].key);
        if (keys[i].i) *keys[i].i = (int)v->valuedouble;
        else *keys[i].f = (float)v->valuedouble;
    }
    LOOM_TRY(loom_model_config_check(mc));
    return loom_moe_config_check(mc);
}

loom_status loom_ckpt_export(const char *arg, const char *out) {
    char dir[CKPT_DIR];
    LOOM_TRY(loom_ckpt_resolve(arg, dir, sizeof dir));
    cJSON *man;
    LOOM_TRY(ckpt_manifest_open(dir, &man));
    loom_model_config mc;
    loom_param *table = NULL;
    ckpt_spec *spec = NULL;
    int n = 0;
    ckpt_whole whole = {0};
    loom_status st = manifest_model(man, dir, &mc);
    if (st == LOOM_OK) st = model_spec(&mc, &table, &spec, &n);
    if (st == LOOM_OK) st = ckpt_read_whole(dir, spec, n, 1u << K_PARAM, &whole);
    loom_st_writer *w = NULL;
    if (st == LOOM_OK) st = loom_st_writer_create(out, &w);
    if (st == LOOM_OK) st = loom_st_writer_metadata(w, "format", "pt");
    char v[32];
    snprintf(v, sizeof v, "%d", whole.step);
    if (st == LOOM_OK) st = loom_st_writer_metadata(w, "step", v);
    for (int i = 0; i < whole.n && st == LOOM_OK; i++)
        st = loom_st_writer_add(w, whole.t[i].name, LOOM_ST_F32, whole.t[i].ndim, whole.t[i].shape,
                                whole.t[i].val[K_PARAM]);
    if (w) {
        if (st == LOOM_OK) st = loom_st_writer_finish(w);
        else loom_st_writer_abort(w);
    }
    if (st == LOOM_OK)
        st = write_hf_config(out, cJSON_GetObjectItem(cJSON_GetObjectItem(man, "run"), "model"));
    ckpt_whole_free(&whole);
    free(spec);
    free(table);
    cJSON_Delete(man);
    return st;
}
