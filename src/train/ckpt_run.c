/* ckpt_run.c - the run a checkpoint directory belongs to (docs/checkpoints.md,
 * "One directory, one run"). A run's identity is what decides its states
 * whatever the layout: the model's sizes, the token shard (its size and the
 * SHA-256 of its first MiB), the seed, and the steps, batch, sequence
 * length, learning-rate schedule, AdamW settings and NaN policy. Every
 * manifest carries it ("run", with "id": the SHA-256 of its text) and
 * --save-dir holds it as run.json. A fresh run into a directory that
 * already holds checkpoints is refused, naming the first difference when
 * they are another run's (--overwrite deletes them first); a resumed run
 * must have the identity of the checkpoint it continues. Rank 0 keeps the
 * newest step of --save-dir known to verify, so DIR/latest always ends on
 * it. Nothing here is collective except loom_ckpt_begin. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/log.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_manifest.h"

#define DATA_HEAD (1 << 20) /* bytes of the token shard hashed for its identity */

/* ---- the identity ------------------------------------------------------------- */

static void num(cJSON *o, const char *k, double v) { cJSON_AddNumberToObject(o, k, v); }

static loom_status data_identity(const char *path, cJSON *o) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "--data %s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(DATA_HEAD);
    size_t n = buf ? fread(buf, 1, DATA_HEAD, f) : 0;
    int bad = !buf || ferror(f) || fseek(f, 0, SEEK_END) != 0;
    long size = bad ? -1 : ftell(f);
    fclose(f);
    if (bad || size < 0) {
        free(buf);
        return loom_fail(LOOM_EIO, "--data %s: cannot read it to identify the run", path);
    }
    char hex[65];
    loom_sha256_hex(buf, n, hex);
    free(buf);
    num(o, "bytes", (double)size);
    cJSON_AddStringToObject(o, "head_sha256", hex);
    return LOOM_OK;
}

static cJSON *make_identity(const loom_train_config *c, const loom_model_config *mc) {
    cJSON *id = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(id, "model");
    loom_train_model_shape_json(m, mc); /* as the metrics header writes it */
    num(m, "n_expert", mc->n_expert);
    num(m, "top_k", mc->top_k);
    num(m, "moe_every", mc->moe_every);
    num(m, "expert_hidden", mc->expert_hidden);
    num(m, "norm_topk", mc->norm_topk);
    num(m, "aux_coef", mc->aux_coef);
    num(m, "z_coef", mc->z_coef);
    num(m, "capacity_factor", mc->capacity_factor);
    num(m, "bias_rate", mc->bias_rate);
    cJSON *hf = mc->family == LOOM_FAMILY_LLAMA ? loom_model_config_hf_json(mc) : NULL;
    if (hf) cJSON_AddItemToObject(m, "hf_config", hf); /* loom export writes it as config.json */
    cJSON *t = cJSON_AddObjectToObject(id, "train");
    num(t, "steps", c->steps);
    num(t, "batch", c->batch);
    num(t, "seq", c->seq);
    num(t, "lr", c->lr);
    num(t, "min_lr_frac", c->min_lr_frac);
    num(t, "warmup", c->warmup);
    num(t, "weight_decay", c->weight_decay);
    num(t, "beta1", c->beta1);
    num(t, "beta2", c->beta2);
    num(t, "eps", c->eps);
    num(t, "grad_clip", c->grad_clip);
    cJSON_AddStringToObject(t, "nan_policy", loom_nan_policy_names[c->nan_policy]);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddStringToObject(id, "seed", seed);
    cJSON_AddObjectToObject(id, "data");
    return id;
}

loom_status loom_ckpt_run_create(const loom_train_config *c, const loom_model_config *mc,
                                 loom_ckpt_run **out) {
    *out = NULL;
    if (!c->save_dir[0] && !c->resume[0]) return LOOM_OK;
    loom_ckpt_run *r = calloc(1, sizeof *r);
    if (!r) return loom_fail(LOOM_EOS, "out of memory");
    r->newest = -1;
    r->identity = make_identity(c, mc);
    loom_status st = data_identity(c->data, cJSON_GetObjectItem(r->identity, "data"));
    char *text = st == LOOM_OK ? cJSON_PrintUnformatted(r->identity) : NULL;
    if (st == LOOM_OK && !text) st = loom_fail(LOOM_EOS, "out of memory");
    if (text) loom_sha256_hex(text, strlen(text), r->id);
    free(text);
    if (st != LOOM_OK) {
        loom_ckpt_run_free(r);
        return st;
    }
    *out = r;
    return LOOM_OK;
}

void loom_ckpt_run_free(loom_ckpt_run *r) {
    if (!r) return;
    cJSON_Delete(r->identity);
    free(r);
}

cJSON *ckpt_run_json(const loom_ckpt_run *r) {
    cJSON *o = cJSON_Duplicate(r->identity, 1);
    cJSON_AddStringToObject(o, "id", r->id);
    return o;
}

/* Identity keys and the flag that sets each; NULL section: top level. */
static const struct {
    const char *sec, *key, *flag;
} FIELDS[] = {
    {"model", "n_layer", "--model"},
    {"model", "n_head", "--model"},
    {"model", "n_embd", "--model"},
    {"model", "vocab_size", "--model"},
    {"model", "n_positions", "--model"},
    {"model", "n_expert", "--model"},
    {"model", "top_k", "--model"},
    {"model", "moe_every", "--model"},
    {"model", "expert_hidden", "--model"},
    {"model", "norm_topk", "--model"},
    {"model", "aux_coef", "--model"},
    {"model", "z_coef", "--model"},
    {"model", "capacity_factor", "--model"},
    {"model", "bias_rate", "--model"},
    {"train", "steps", "--steps"},
    {"train", "batch", "--batch"},
    {"train", "seq", "--seq"},
    {"train", "lr", "--lr"},
    {"train", "min_lr_frac", "--min-lr-frac"},
    {"train", "warmup", "--warmup"},
    {"train", "weight_decay", "--weight-decay"},
    {"train", "beta1", "--beta1"},
    {"train", "beta2", "--beta2"},
    {"train", "eps", "--eps"},
    {"train", "grad_clip", "--grad-clip"},
    {"train", "nan_policy", "--nan-policy"},
    {NULL, "seed", "--seed"},
    {"data", "bytes", "--data (its size)"},
    {"data", "head_sha256", "--data (the SHA-256 of its first MiB)"},
};

/* The shortest text that reads back as the same float32. */
static void value_text(const cJSON *v, char *out, size_t cap) {
    if (cJSON_IsNumber(v))
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(out, cap, "%.*g", digits, (double)(float)v->valuedouble);
            if ((float)strtod(out, NULL) == (float)v->valuedouble) break;
        }
    else if (cJSON_IsString(v)) snprintf(out, cap, "%s", v->valuestring);
    else snprintf(out, cap, "(none)");
}

int ckpt_identity_diff(const cJSON *theirs, const loom_ckpt_run *mine, char *msg, size_t cap) {
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) {
        const cJSON *a = FIELDS[i].sec ? cJSON_GetObjectItem(theirs, FIELDS[i].sec) : theirs;
        const cJSON *b = FIELDS[i].sec ? cJSON_GetObjectItem(mine->identity, FIELDS[i].sec) : mine->identity;
        a = cJSON_GetObjectItem(a, FIELDS[i].key);
        b = cJSON_GetObjectItem(b, FIELDS[i].key);
        /* numbers as float32, what they are in the config: cJSON prints 15 digits */
        int same =
            (cJSON_IsNumber(a) && cJSON_IsNumber(b) && (float)a->valuedouble == (float)b->valuedouble) ||
            (cJSON_IsString(a) && cJSON_IsString(b) && strcmp(a->valuestring, b->valuestring) == 0);
        if (same) continue;
        char va[80], vb[80];
        value_text(a, va, sizeof va);
        value_text(b, vb, sizeof vb);
        snprintf(msg, cap, "%s = %s there, %s in this run (%s)", FIELDS[i].key, va, vb, FIELDS[i].flag);
        return 1;
    }
    return 0;
}

/* ---- --save-dir ------------------------------------------------------------------ */

/* The identity recorded in dir: run.json, else the newest manifest that
 * opens (*theirs owned by the caller; NULL if none). */
static cJSON *recorded_identity(const char *dir) {
    char path[CKPT_PATH], *text;
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (ckpt_read_text(path, &text, NULL) == LOOM_OK) {
        cJSON *o = cJSON_Parse(text);
        free(text);
        if (cJSON_IsObject(o)) return o;
        cJSON_Delete(o);
    }
    loom_clear_error();
    int steps[4096];
    int n = ckpt_list_steps(dir, steps, 4096);
    for (int i = 0; i < n; i++) {
        cJSON *man;
        snprintf(path, sizeof path, "%s/step_%d", dir, steps[i]);
        if (ckpt_manifest_open(path, &man) == LOOM_OK) {
            cJSON *o = cJSON_DetachItemFromObject(man, "run");
            cJSON_Delete(man);
            return o;
        }
        loom_clear_error();
    }
    return NULL;
}

/* dir holds checkpoints (a published step_N); *newest the highest (-1). A
 * directory with only latest or run.json (a run killed before its first
 * save) holds no state to lose. */
static int holds_checkpoints(const char *dir, int *newest) {
    int steps[4096];
    int n = ckpt_list_steps(dir, steps, 4096);
    *newest = n ? steps[0] : -1;
    return n > 0;
}

/* --resume ARG reads inside dir (ARG is dir or one of its step_N). */
static int resume_reads(const char *resume, const char *dir) {
    char a[PATH_MAX], b[PATH_MAX], parent[PATH_MAX];
    if (!resume[0] || !realpath(dir, b)) return 0;
    if (realpath(resume, a) && strcmp(a, b) == 0) return 1;
    snprintf(parent, sizeof parent, "%s/..", resume);
    return realpath(parent, a) && strcmp(a, b) == 0;
}

loom_status loom_ckpt_prepare(const loom_train_config *c, const loom_ckpt_run *run) {
    if (!c->save_dir[0]) return LOOM_OK;
    const char *dir = c->save_dir;
    mkdir(dir, 0755); /* errors surface in the check */
    struct stat sb;
    const char *why = NULL;
    if (stat(dir, &sb) != 0) why = strerror(errno);
    else if (!S_ISDIR(sb.st_mode)) why = "not a directory";
    else if (access(dir, W_OK) != 0) why = strerror(errno);
    if (why) return loom_fail(LOOM_ECANTCREAT, "--save-dir %s: not a writable directory: %s", dir, why);
    if (c->overwrite && resume_reads(c->resume, dir))
        return loom_fail(LOOM_EUSAGE,
                         "--overwrite would delete the checkpoints of --save-dir %s that --resume %s reads",
                         dir, c->resume);
    int newest;
    if (c->overwrite || !holds_checkpoints(dir, &newest)) return LOOM_OK;
    cJSON *theirs = recorded_identity(dir);
    char diff[512] = "";
    int other = !theirs || ckpt_identity_diff(theirs, run, diff, sizeof diff);
    cJSON_Delete(theirs);
    if (!other && c->resume[0]) return LOOM_OK; /* continuing this run */
    if (!other)
        return loom_fail(
            LOOM_EUSAGE,
            "--save-dir %s already holds this run's checkpoints (newest step_%d): continue it with "
            "--resume %s, or give --overwrite to delete them and start over",
            dir, newest, dir);
    return loom_fail(
        LOOM_EUSAGE,
        "--save-dir %s holds the checkpoints of another run (%s): use another --save-dir, or give "
        "--overwrite to delete them and start over",
        dir, theirs ? diff : "no readable run.json or manifest says which");
}

/* Rank 0: delete what a checkpoint directory holds (--overwrite). */
static void remove_checkpoints(const char *dir) {
    int steps[4096];
    int n = ckpt_list_steps(dir, steps, 4096);
    char path[CKPT_PATH];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/step_%d", dir, steps[i]);
        ckpt_remove_tree(path);
    }
    const char *files[] = {"latest", "latest.tmp", "run.json", "run.json.tmp"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    loom_info("--overwrite: removed %d checkpoint(s) from %s", n, dir);
}

/* Rank 0: the newest step of dir that verifies and is this run's (-1). */
static int newest_verified(const char *dir, const loom_ckpt_run *run) {
    int steps[4096];
    int n = ckpt_list_steps(dir, steps, 4096);
    for (int i = 0; i < n; i++) {
        char path[CKPT_DIR], diff[512];
        cJSON *man;
        snprintf(path, sizeof path, "%s/step_%d", dir, steps[i]);
        if (ckpt_verify(path, &man) != LOOM_OK) {
            loom_clear_error();
            continue;
        }
        int other = ckpt_identity_diff(cJSON_GetObjectItem(man, "run"), run, diff, sizeof diff);
        cJSON_Delete(man);
        if (!other) return steps[i];
    }
    return -1;
}

loom_status ckpt_set_latest(const char *dir, int step) {
    char path[CKPT_PATH], name[32];
    snprintf(path, sizeof path, "%s/latest", dir);
    snprintf(name, sizeof name, "step_%d\n", step);
    char *text = NULL;
    int same = ckpt_read_text(path, &text, NULL) == LOOM_OK && strcmp(text, name) == 0;
    free(text);
    loom_clear_error();
    if (same) return LOOM_OK;
    LOOM_TRY(ckpt_write_text(path, name));
    return ckpt_fsync_path(dir);
}

/* Rank 0: a kill while a damaged step_N was set aside (ckpt_save.c) can
 * leave step_N.damaged behind without step_N; remove such leftovers. */
static void remove_set_aside(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[CKPT_PATH];
    while ((e = readdir(d))) {
        int st, len = 0;
        if (sscanf(e->d_name, "step_%d.damaged%n", &st, &len) != 1 || e->d_name[len] != '\0') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ckpt_remove_tree(path);
    }
    closedir(d);
}

loom_status loom_ckpt_begin(loom_train_run_state *s) {
    const loom_train_config *c = s->cfg;
    loom_status st = LOOM_OK;
    loom_ckpt_run *run = s->ckpt;
    if (c->save_dir[0] && s->mesh->rank == 0) {
        const char *dir = c->save_dir;
        if (c->overwrite) remove_checkpoints(dir);
        remove_set_aside(dir);
        char path[CKPT_PATH];
        snprintf(path, sizeof path, "%s/run.json", dir);
        char *had = NULL, diff[512];
        cJSON *theirs = ckpt_read_text(path, &had, NULL) == LOOM_OK ? cJSON_Parse(had) : NULL;
        loom_clear_error();
        free(had);
        int same = theirs && !ckpt_identity_diff(theirs, run, diff, sizeof diff);
        cJSON_Delete(theirs);
        if (!same) { /* absent, or another run's left without checkpoints (prepare allowed it) */
            cJSON *o = ckpt_run_json(run);
            char *text = o ? cJSON_Print(o) : NULL;
            cJSON_Delete(o);
            st = text ? ckpt_write_text(path, text) : loom_fail(LOOM_EOS, "out of memory");
            free(text);
        }
        /* what resume verified just now, when it is the newest here; else a scan */
        int steps[4096];
        char newest[CKPT_DIR];
        if (ckpt_list_steps(dir, steps, 4096) > 0) {
            snprintf(newest, sizeof newest, "%s/step_%d", dir, steps[0]);
            run->newest =
                run->resumed[0] && resume_reads(run->resumed, newest) ? steps[0] : newest_verified(dir, run);
        }
        if (st == LOOM_OK && run->newest >= 0) st = ckpt_set_latest(dir, run->newest);
    }
    return loom_comm_agree(s->mesh->world, st);
}
