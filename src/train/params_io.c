/* params_io.c - model parameters to and from safetensors, by Hugging Face
 * GPT-2 name. Local (rank 0 calls save; the trainer broadcasts after load). */
#include <stdio.h>
#include <string.h>

#include "loom/safetensors.h"
#include "loom/train.h"

loom_status loom_params_save(const loom_gpt *m, const char *path) {
    loom_st_writer *w;
    LOOM_TRY(loom_st_writer_create(path, &w));
    loom_status st = loom_st_writer_metadata(w, "format", "pt");
    char v[32];
    const loom_model_config *c = &m->cfg;
    const struct { const char *k; int v; } meta[] = {
        {"n_layer", c->n_layer}, {"n_head", c->n_head}, {"n_embd", c->n_embd},
        {"vocab_size", c->vocab_size}, {"n_positions", c->n_positions},
    };
    for (size_t i = 0; i < sizeof meta / sizeof meta[0] && st == LOOM_OK; i++) {
        snprintf(v, sizeof v, "%d", meta[i].v);
        st = loom_st_writer_metadata(w, meta[i].k, v);
    }
    for (int i = 0; i < m->n_params && st == LOOM_OK; i++) {
        const loom_param *p = &m->params[i];
        st = loom_st_writer_add(w, p->name, LOOM_ST_F32, p->ndim, p->shape,
                                m->param_mem + p->offset);
    }
    if (st != LOOM_OK) {
        loom_st_writer_abort(w);
        return st;
    }
    return loom_st_writer_finish(w);
}

/* Tensors a GPT-2 file may carry that are not parameters of the table. */
static int is_skippable(const char *name) {
    size_t n = strlen(name);
    const char *suffixes[] = {".attn.bias", ".attn.masked_bias"};
    for (size_t i = 0; i < 2; i++) {
        size_t k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) return 1;
    }
    return strcmp(name, "lm_head.weight") == 0;
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

static loom_status load_one(loom_gpt *m, const loom_st_file *f, const char *path,
                            const loom_st_tensor *t, unsigned char *seen) {
    const char *name = strip_prefix(t->name);
    if (is_skippable(name)) return LOOM_OK;
    const loom_param *p = loom_gpt_find_param(m, name);
    if (!p)
        return loom_fail(LOOM_EDATA, "%s: tensor \"%s\" is not a parameter of model %s", path,
                         t->name, m->cfg.name);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
        char a[96], b[96];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, p->ndim, p->shape);
        return loom_fail(LOOM_EDATA, "%s: tensor \"%s\" has shape %s, model %s needs %s", path,
                         t->name, a, m->cfg.name, b);
    }
    seen[p - m->params] = 1;
    return loom_st_read_f32(f, t, m->param_mem + p->offset);
}

loom_status loom_params_load(loom_gpt *m, const char *path) {
    loom_st_file *f;
    LOOM_TRY(loom_st_open(path, &f));
    unsigned char seen[4 + 12 * 1024 + 2];
    loom_status st = LOOM_OK;
    if ((size_t)m->n_params > sizeof seen)
        st = loom_fail(LOOM_EINTERNAL, "model has too many parameters to load");
    else
        memset(seen, 0, (size_t)m->n_params);
    for (int i = 0; i < loom_st_count(f) && st == LOOM_OK; i++)
        st = load_one(m, f, path, loom_st_at(f, i), seen);
    for (int i = 0; i < m->n_params && st == LOOM_OK; i++)
        if (!seen[i])
            st = loom_fail(LOOM_EDATA, "%s: missing tensor \"%s\" needed by model %s", path,
                           m->params[i].name, m->cfg.name);
    loom_st_close(f);
    return st;
}
