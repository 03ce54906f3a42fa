/* ckpt_save.c - writing a checkpoint (collective over the world): every
 * rank writes its file (ckpt_shards.c) and its description goes to rank 0
 * in one all-gather; rank 0 writes manifest.json (step, optimizer step
 * count, LR, data cursor, RNG seed, layout, model and training config,
 * tensors, files with hashes, shards), fsyncs the directory, renames
 * step_N.tmp to step_N, fsyncs DIR, then replaces DIR/latest (latest.tmp,
 * fsync, rename, fsync DIR). --keep K removes the oldest step_* directories
 * after that, never the new one. Every failure is agreed on. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/log.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_manifest.h"

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
    cJSON *hf = mc->family == LOOM_FAMILY_LLAMA ? loom_model_config_hf_json(mc) : NULL;
    if (hf) cJSON_AddItemToObject(m, "hf_config", hf); /* loom export writes it as config.json */
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
        for (int d = 0; d < p[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)p[i].shape[d]));
    }
    free(p);
    return LOOM_OK;
}

/* Rank 0: the manifest from every rank's description, then publish. */
static loom_status publish(const loom_train_run_state *s, int step, const char *tmpdir, const char *final,
                           char *const *parts, int world) {
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
    if (st == LOOM_OK) st = ckpt_write_text(path, text);
    free(text);
    if (st == LOOM_OK) st = ckpt_fsync_path(tmpdir);
    if (st == LOOM_OK && rename(tmpdir, final) != 0)
        st = loom_fail(LOOM_ECANTCREAT, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
    const char *dir = s->cfg->save_dir;
    if (st == LOOM_OK) st = ckpt_fsync_path(dir);
    char latest[CKPT_PATH], name[32];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(name, sizeof name, "step_%d\n", step);
    if (st == LOOM_OK) st = ckpt_write_text(latest, name);
    if (st == LOOM_OK) st = ckpt_fsync_path(dir);
    return st;
}

static void apply_keep(const char *dir, int keep, int step) {
    if (keep <= 0) return;
    int steps[4096];
    int n = ckpt_list_steps(dir, steps, 4096);
    for (int i = keep; i < n; i++) {
        if (steps[i] == step) continue;
        char p[CKPT_DIR];
        snprintf(p, sizeof p, "%s/step_%d", dir, steps[i]);
        ckpt_remove_tree(p);
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
    if (why)
        return loom_fail(LOOM_ECANTCREAT, "--save-dir %s: not a writable directory: %s", c->save_dir, why);
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
            ckpt_remove_tree(tmpdir); /* a save of this step that died part way */
            if (mkdir(tmpdir, 0755) != 0)
                st = loom_fail(LOOM_ECANTCREAT, "--save-dir: cannot create %s: %s", tmpdir, strerror(errno));
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
    st = ckpt_write_rank(s, tmpdir, &mine);
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
