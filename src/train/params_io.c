/* params_io.c - model parameters to and from safetensors, by Hugging Face
 * GPT-2 name, whatever the layout.
 *
 * Save: every rank scatters the elements it is the primary holder of (dp and
 * cp coordinate 0, or each dp rank its own ZeRO-3 slices; tp rank 0 for
 * tensors tensor parallelism does not cut; the first pipeline stage for the
 * tied wte) into a zeroed full-model buffer at their global indices; one all-reduce (sum) over the world assembles the
 * model, since each element has exactly one contributor; rank 0 writes it.
 * Load: rank 0 reads and checks the file, the full model is broadcast, each
 * rank keeps its own elements. Both are collective over the world (mesh NULL:
 * one process, no communication). Save runs after the first step, so its
 * failures are local to the rank that hits them (out of memory, rank 0's
 * write): they return at once and the trainer aborts the job (train.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <sys/stat.h>

#include "loom/device.h"
#include "loom/dp.h"
#include "loom/hf_dir.h"
#include "loom/moe.h"
#include "loom/safetensors.h"
#include "loom/train.h"
#include "train/internal.h"

typedef struct {
    loom_param *p;
    int n;
    size_t total;
    float *full;
} whole_model;

static loom_status whole_open(const loom_gpt *m, whole_model *w) {
    memset(w, 0, sizeof *w);
    LOOM_TRY(loom_param_table_whole(&m->cfg, &w->p, &w->n, &w->total));
    w->full = calloc(w->total ? w->total : 1, sizeof(float));
    if (!w->full) {
        free(w->p);
        return loom_fail(LOOM_EOS, "out of memory for a full copy of the parameters (%zu floats)", w->total);
    }
    return LOOM_OK;
}

static void whole_close(whole_model *w) {
    free(w->p);
    free(w->full);
}

static const loom_param *whole_find(const whole_model *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->p[i].name, name) == 0) return &w->p[i];
    return NULL;
}

int loom_train_param_holder(const loom_gpt *m, const loom_mesh *mesh, int sharded, const loom_param *p) {
    if (mesh && !sharded && (mesh->dp_rank != 0 || mesh->cp_rank != 0)) return 0;
    if (p->split_dim < 0 && m->part.tp.rank != 0) return 0;
    if (p->split_rep > 1 && m->part.tp.rank % p->split_rep != 0) return 0; /* a replica: the first writes */
    return strcmp(p->name, loom_model_embed_name(&m->cfg)) != 0 || m->part.has_embed;
}

/* Whether this rank writes p's elements: loom_train_param_holder, and for
 * experts under expert parallelism the first EP group (each expert once). */
static int is_primary(const loom_gpt *m, const loom_mesh *mesh, int dp_sharded, const loom_param *p) {
    if (p->unit == LOOM_UNIT_EXPERTS)
        return (!mesh || loom_layout_dpcp_rank(&mesh->layout, mesh->coords) < mesh->layout.ep) &&
               (p->split_dim >= 0 || m->part.tp.rank == 0);
    return loom_train_param_holder(m, mesh, dp_sharded, p);
}

/* Where part i's parameters are: the engine's runs, or the whole param_mem. */
static const loom_param_run *part_runs(loom_gpt *m, const loom_dp_engine *dp, int i, loom_param_run *whole,
                                       int *n) {
    if (dp) return loom_dp_param_runs(dp, i, n);
    *whole = (loom_param_run){.data = m->param_mem, .lo = 0, .n = m->num_params};
    *n = 1;
    return whole;
}

/* Visit every element of m's parameters held in `runs` (only those this rank
 * writes to the file when primary_only): fn(w, g, gi, x) with g the tensor
 * in the whole-model table, gi the element's global index in it (-1 for
 * padding) and x the element in the run. */
typedef void (*elem_fn)(whole_model *w, const loom_param *g, int64_t gi, float *x);
static void walk_runs(const loom_gpt *m, const loom_mesh *mesh, int dp_sharded, whole_model *w,
                      const loom_param_run *runs, int n_runs, int primary_only, elem_fn fn) {
    for (int k = 0; k < m->n_params; k++) {
        const loom_param *p = &m->params[k];
        const loom_param *g = whole_find(w, p->name);
        if (!g || (primary_only && !is_primary(m, mesh, dp_sharded, p))) continue;
        for (int r = 0; r < n_runs; r++) {
            size_t a = p->offset > runs[r].lo ? p->offset : runs[r].lo;
            size_t b = p->offset + p->numel, e = runs[r].lo + runs[r].n;
            for (size_t f = a; f < (b < e ? b : e); f++)
                fn(w, g, loom_param_global_index(p, m->part.tp.rank, f - p->offset),
                   runs[r].data + (f - runs[r].lo));
        }
    }
}

/* ---- host views (train/internal.h) ---------------------------------------- */

float *loom_train_host_view(loom_device *dev, float *src, size_t n) {
    if (dev->be->host_memory) return src;
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) {
        loom_fail(LOOM_EOS, "out of memory for a host copy of %zu floats of --device %s memory", n,
                  dev->be->name);
        return NULL;
    }
    loom_tensor_download(dev, h, src, n);
    return h;
}

void loom_train_host_view_done(loom_device *dev, float *src, float *view, size_t n, int upload) {
    if (!view || view == src) return;
    if (upload) loom_tensor_upload(dev, src, view, n);
    free(view);
}

/* The runs as host code can walk them: the runs themselves when dev's
 * memory is host memory, else host copies downloaded from the device (the
 * gaps between tensors too, so an upload puts back what was there). */
static loom_status host_runs(loom_device *dev, const loom_param_run *runs, int n, loom_param_run **out) {
    *out = (loom_param_run *)runs;
    if (dev->be->host_memory) return LOOM_OK;
    loom_param_run *h = calloc((size_t)(n ? n : 1), sizeof *h);
    if (!h) return loom_fail(LOOM_EOS, "out of memory for a host copy of the parameters");
    for (int r = 0; r < n; r++) {
        h[r] = runs[r];
        h[r].data = loom_train_host_view(dev, runs[r].data, runs[r].n);
        if (!h[r].data) {
            while (r-- > 0) free(h[r].data);
            free(h);
            return LOOM_EOS;
        }
    }
    *out = h;
    return LOOM_OK;
}

/* Ends host_runs: uploads the host copies back when `upload`, frees them. */
static void host_runs_done(loom_device *dev, const loom_param_run *runs, loom_param_run *h, int n,
                           int upload) {
    if (h == runs) return;
    for (int r = 0; r < n; r++) loom_train_host_view_done(dev, runs[r].data, h[r].data, runs[r].n, upload);
    free(h);
}

static void put_elem(whole_model *w, const loom_param *g, int64_t gi, float *x) {
    if (gi >= 0) w->full[g->offset + (size_t)gi] = *x;
}

static void get_elem(whole_model *w, const loom_param *g, int64_t gi, float *x) {
    *x = gi >= 0 ? w->full[g->offset + (size_t)gi] : 0.0f;
}

static loom_status write_file(const whole_model *w, const loom_model_config *c, const char *path) {
    loom_st_writer *wr;
    LOOM_TRY(loom_st_writer_create(path, &wr));
    loom_status st = loom_st_writer_metadata(wr, "format", "pt");
    char v[32];
    const struct {
        const char *k;
        int v;
    } meta[] = {
        {"n_layer", c->n_layer},       {"n_head", c->n_head},           {"n_embd", c->n_embd},
        {"vocab_size", c->vocab_size}, {"n_positions", c->n_positions},
    };
    for (size_t i = 0; i < sizeof meta / sizeof meta[0] && st == LOOM_OK; i++) {
        snprintf(v, sizeof v, "%d", meta[i].v);
        st = loom_st_writer_metadata(wr, meta[i].k, v);
    }
    for (int i = 0; i < w->n && st == LOOM_OK; i++)
        st = loom_st_writer_add(wr, w->p[i].name, LOOM_ST_F32, w->p[i].ndim, w->p[i].shape,
                                w->full + w->p[i].offset);
    if (st != LOOM_OK) {
        loom_st_writer_abort(wr);
        return st;
    }
    return loom_st_writer_finish(wr);
}

/* A file, or a Hugging Face directory (path an existing directory or
 * ending in '/'; created if missing): its model.safetensors and
 * config.json, which transformers' from_pretrained loads. */
static loom_status write_dest(const whole_model *w, const loom_model_config *c, const char *path) {
    struct stat sb;
    size_t n = strlen(path);
    if (!(n && path[n - 1] == '/') && !(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return write_file(w, c, path);
    char file[4200];
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return loom_fail(LOOM_EOS, "--save-params %s: cannot create the directory: %s", path,
                         strerror(errno));
    if (snprintf(file, sizeof file, "%s/model.safetensors", path) >= (int)sizeof file)
        return loom_fail(LOOM_EUSAGE, "--save-params %s: path too long", path);
    LOOM_TRY(write_file(w, c, file));
    snprintf(file, sizeof file, "%s/config.json", path);
    return loom_model_config_write_hf(c, file);
}

loom_status loom_params_save(loom_gpt *const *parts, int n_parts, const loom_mesh *mesh,
                             const loom_dp_engine *dp, const char *path) {
    whole_model w;
    loom_status st = whole_open(parts[0], &w); /* local: the trainer aborts the job on failure */
    if (st != LOOM_OK) return st;
    const int sharded = dp && loom_dp_params_sharded(dp);
    for (int i = 0; i < n_parts; i++) { /* each element by its one holder */
        loom_param_run whole;
        int n;
        const loom_param_run *runs = part_runs(parts[i], dp, i, &whole, &n);
        loom_param_run *h;
        st = host_runs(parts[i]->dev, runs, n, &h);
        if (st != LOOM_OK) break;
        walk_runs(parts[i], mesh, sharded, &w, h, n, 1, put_elem);
        host_runs_done(parts[i]->dev, runs, h, n, 0);
    }
    if (st != LOOM_OK) {
        whole_close(&w);
        return st;
    }
    if (mesh && mesh->world_size > 1)
        st = loom_comm_allreduce(mesh->world, w.full, w.total, LOOM_F32, LOOM_SUM);
    if (st == LOOM_OK && (!mesh || mesh->rank == 0)) st = write_dest(&w, &parts[0]->cfg, path);
    whole_close(&w);
    return st;
}

/* Tensors a file may carry that are not parameters of the table: GPT-2's
 * attention masks, the Llama family's rotary buffers (older saves), and a
 * tied head's copy of the embedding. */
static int is_skippable(const loom_model_config *c, const char *name) {
    size_t n = strlen(name);
    const char *gpt2[] = {".attn.bias", ".attn.masked_bias"}, *llama[] = {".rotary_emb.inv_freq"};
    const int llama_family = c->family == LOOM_FAMILY_LLAMA;
    const char **suffixes = llama_family ? llama : gpt2;
    for (size_t i = 0; i < (llama_family ? 1u : 2u); i++) {
        size_t k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) return 1;
    }
    return !c->untied && strcmp(name, "lm_head.weight") == 0;
}

static const char *strip_prefix(const char *name) {
    const char *pre = "transformer.";
    return strncmp(name, pre, strlen(pre)) == 0 ? name + strlen(pre) : name;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static loom_status read_one(whole_model *w, const loom_model_config *c, const loom_st_file *f,
                            const char *path, const loom_st_tensor *t, unsigned char *seen) {
    const char *name = strip_prefix(t->name);
    if (is_skippable(c, name)) return LOOM_OK;
    const loom_param *p = whole_find(w, name);
    if (!p)
        return loom_fail(LOOM_EDATA, "%s: tensor \"%s\" is not a parameter of model %s", path, t->name,
                         c->name);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
        char a[96], b[96];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, p->ndim, p->shape);
        return loom_fail(LOOM_EDATA, "%s: tensor \"%s\" has shape %s, model %s needs %s", path, t->name, a,
                         c->name, b);
    }
    float *dst = w->full + p->offset;
    LOOM_TRY(loom_st_read_f32(f, t, dst));
    size_t numel = (size_t)(p->shape[0] * p->shape[1]);
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(dst[i]))
            return loom_fail(LOOM_EDATA, "%s: tensor \"%s\" element %zu is non-finite (%g)", path, t->name, i,
                             dst[i]);
    seen[p - w->p] = 1;
    return LOOM_OK;
}

static loom_status read_one_file(whole_model *w, const loom_model_config *c, const char *path,
                                 unsigned char *seen) {
    loom_st_file *f;
    LOOM_TRY(loom_st_open(path, &f));
    loom_status st = LOOM_OK;
    for (int i = 0; i < loom_st_count(f) && st == LOOM_OK; i++)
        st = read_one(w, c, f, path, loom_st_at(f, i), seen);
    loom_st_close(f);
    return st;
}

/* One safetensors file, or a Hugging Face directory's (sharded) weights. */
static loom_status read_file_full(whole_model *w, const loom_model_config *c, const char *path) {
    struct stat sb;
    loom_hf_files files = {0, NULL};
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) LOOM_TRY(loom_hf_weight_files(path, &files));
    unsigned char *seen = calloc((size_t)w->n, 1);
    loom_status st = seen ? LOOM_OK : loom_fail(LOOM_EOS, "out of memory");
    if (files.n == 0 && st == LOOM_OK) st = read_one_file(w, c, path, seen);
    for (int i = 0; i < files.n && st == LOOM_OK; i++) st = read_one_file(w, c, files.path[i], seen);
    for (int i = 0; i < w->n && st == LOOM_OK; i++)
        if (!seen[i])
            st = loom_fail(LOOM_EDATA, "%s: missing tensor \"%s\" needed by model %s", path, w->p[i].name,
                           c->name);
    free(seen);
    loom_hf_files_free(&files);
    return st;
}

loom_status loom_params_load(loom_gpt *const *parts, int n_parts, const loom_mesh *mesh,
                             const loom_dp_engine *dp, const char *path) {
    whole_model w;
    loom_status st = whole_open(parts[0], &w);
    int root = !mesh || mesh->rank == 0;
    if (st == LOOM_OK && root) st = read_file_full(&w, &parts[0]->cfg, path);
    if (mesh) st = loom_comm_agree(mesh->world, st);
    if (st == LOOM_OK && mesh && mesh->world_size > 1)
        st = loom_comm_bcast(mesh->world, w.full, w.total * sizeof(float), 0);
    for (int i = 0; i < n_parts && st == LOOM_OK; i++) { /* keep what this rank holds */
        loom_param_run whole;
        int n;
        const loom_param_run *runs = part_runs(parts[i], dp, i, &whole, &n);
        loom_param_run *h;
        st = host_runs(parts[i]->dev, runs, n, &h);
        if (st != LOOM_OK) break;
        walk_runs(parts[i], mesh, 0, &w, h, n, 0, get_elem);
        host_runs_done(parts[i]->dev, runs, h, n, 1);
    }
    whole_close(&w);
    return st;
}
