/* test_init_hash.c - the initial parameters are the same numbers whatever the
 * layout and whatever the init code's speed-ups.
 *
 * For two small GPT-2 shapes (one with a vocabulary tp does not divide, so
 * wte has padding rows), every layout in {tp 1, 2, 4} x {one stage, two
 * pipeline stages} x {the whole buffer in one call, odd-sized runs as ZeRO
 * shards fill it} fills its local parameters with loom_gpt_init_range; the
 * local elements are put back at their global places (through
 * loom_param_global_index), every global element must be written, replicated
 * copies must agree bit for bit, and the FNV-1a 64 hash of the global tensors
 * (in the whole model's table order) must equal the hash recorded with the
 * init code as it was before it was vectorised and threaded (commit 3d16566,
 * one scalar loom_rng_normal per element). The same hash is also recomputed
 * here from loom_rng_normal element by element, so a change of the generator
 * itself would show as a mismatch of both.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "loom/model.h"
#include "loom/rng.h"
#include "model/internal.h"

typedef struct {
    loom_model_config cfg;
    uint64_t seed;
    uint64_t want; /* hash recorded before the change */
} shape;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x00000100000001b3ull;
    }
    return h;
}

/* A model part's table (no activations): what loom_gpt_init_range needs. */
static loom_gpt *make_part(loom_device *dev, const loom_model_config *cfg, int tp, int tp_rank, int l0,
                           int l1) {
    loom_gpt *m = calloc(1, sizeof *m);
    m->cfg = *cfg;
    m->part = loom_model_part_whole(dev, cfg);
    m->dev = dev;
    m->part.tp.size = tp;
    m->part.tp.rank = tp_rank;
    m->part.layer_begin = l0;
    m->part.layer_end = l1;
    m->part.has_embed = l0 == 0;
    m->part.has_head = l1 == cfg->n_layer;
    m->params = calloc((size_t)loom_gpt_max_params(&m->cfg, &m->part), sizeof *m->params);
    m->num_params = loom_gpt_build_table(m);
    return m;
}

static void free_part(loom_gpt *m) {
    free(m->params);
    free(m);
}

/* The reference: element g of every tensor straight from loom_rng_normal. */
static uint64_t reference_hash(const shape *s) {
    loom_param *tab;
    int n;
    size_t total;
    if (loom_param_table_whole(&s->cfg, &tab, &n, &total) != LOOM_OK) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int k = 0; k < n; k++) {
        const loom_param *p = &tab[k];
        loom_rng_key key = loom_rng_key_make(s->seed, p->name);
        size_t ne = (size_t)(p->shape[0] * p->shape[1]);
        for (size_t g = 0; g < ne; g++) {
            float v = p->init == LOOM_INIT_NORMAL ? p->init_std * loom_rng_normal(key, g)
                      : p->init == LOOM_INIT_ONES ? 1.0f
                                                  : 0.0f;
            h = fnv(h, &v, sizeof v);
        }
    }
    free(tab);
    return h;
}

/* Fill every part of one layout, assemble the global tensors, hash them. */
static uint64_t layout_hash(loom_device *dev, const shape *s, int tp, int pp, size_t run) {
    loom_param *tab;
    int n;
    size_t total;
    if (loom_param_table_whole(&s->cfg, &tab, &n, &total) != LOOM_OK) return 0;
    float **glob = calloc((size_t)n, sizeof *glob);
    unsigned char **seen = calloc((size_t)n, sizeof *seen);
    for (int k = 0; k < n; k++) {
        size_t ne = (size_t)(tab[k].shape[0] * tab[k].shape[1]);
        glob[k] = malloc(ne * sizeof(float));
        seen[k] = calloc(ne, 1);
    }
    int L = s->cfg.n_layer, bad = 0;
    for (int stage = 0; stage < pp; stage++) {
        int l0 = L * stage / pp, l1 = L * (stage + 1) / pp;
        for (int r = 0; r < tp; r++) {
            loom_gpt *m = make_part(dev, &s->cfg, tp, r, l0, l1);
            float *local = malloc(m->num_params * sizeof(float));
            size_t step = run ? run : m->num_params;
            for (size_t lo = 0; lo < m->num_params; lo += step)
                loom_gpt_init_range(m, s->seed, lo, lo + step > m->num_params ? m->num_params - lo : step,
                                    local + lo);
            for (int i = 0; i < m->n_params; i++) {
                const loom_param *p = &m->params[i];
                int k = 0;
                while (k < n && strcmp(tab[k].name, p->name)) k++;
                for (size_t e = 0; e < p->numel; e++) {
                    int64_t g = loom_param_global_index(p, r, e);
                    float v = local[p->offset + e];
                    if (g < 0) {
                        if (v != 0.0f) bad++; /* padding is zero */
                        continue;
                    }
                    if (seen[k][g] && memcmp(&glob[k][g], &v, sizeof v)) bad++;
                    glob[k][g] = v;
                    seen[k][g] = 1;
                }
            }
            free(local);
            free_part(m);
        }
    }
    uint64_t h = 0xcbf29ce484222325ull;
    size_t unseen = 0;
    for (int k = 0; k < n; k++) {
        size_t ne = (size_t)(tab[k].shape[0] * tab[k].shape[1]);
        for (size_t g = 0; g < ne; g++) unseen += !seen[k][g];
        h = fnv(h, glob[k], ne * sizeof(float));
        free(glob[k]);
        free(seen[k]);
    }
    CHECK(bad == 0 && unseen == 0, "%s tp=%d pp=%d run=%zu: %d disagreeing, %zu unwritten elements",
          s->cfg.name, tp, pp, run, bad, unseen);
    free(glob);
    free(seen);
    free(tab);
    return h;
}

int main(int argc, char **argv) {
    /* `model_init_hash gpt2-small`: GPT-2 124M at seed 1337, tp 1 and 4 (by
     * hand; not in ctest: slow before the init was threaded) */
    loom_device *dev = test_cpu_device(0, 0); /* the init on every CPU */
    if (argc > 1) {
        shape big = {.seed = 1337, .want = 0x5dce01615b11cbcbull};
        if (loom_model_config_builtin(argv[1], &big.cfg) != LOOM_OK) return 64;
        CHECK(layout_hash(dev, &big, 1, 1, 0) == big.want, "%s tp=1: hash differs", argv[1]);
        CHECK(layout_hash(dev, &big, 4, 1, 0) == big.want, "%s tp=4: hash differs", argv[1]);
        printf("%s: hash 0x%016llx\n", argv[1], (unsigned long long)reference_hash(&big));
        loom_device_free(dev);
        return check_done();
    }
    const shape shapes[] = {
        {{.name = "small-padded",
          .n_layer = 3,
          .n_head = 4,
          .n_embd = 64,
          .vocab_size = 1001,
          .n_positions = 32},
         1337,
         0x50729c60466e2df8ull},
        {{.name = "wide-vocab",
          .n_layer = 2,
          .n_head = 4,
          .n_embd = 128,
          .vocab_size = 50257,
          .n_positions = 256},
         7,
         0x2685e36ce2884788ull},
    };
    const int tps[] = {1, 2, 4};
    const size_t runs[] = {0, 100003};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        uint64_t ref = reference_hash(s);
        printf("%s: reference hash 0x%016llx (recorded 0x%016llx)\n", s->cfg.name, (unsigned long long)ref,
               (unsigned long long)s->want);
        CHECK(ref == s->want, "%s: loom_rng_normal hash 0x%016llx != recorded 0x%016llx", s->cfg.name,
              (unsigned long long)ref, (unsigned long long)s->want);
        for (size_t t = 0; t < 3; t++)
            for (int pp = 1; pp <= 2; pp++)
                for (size_t r = 0; r < 2; r++) {
                    uint64_t h = layout_hash(dev, s, tps[t], pp, runs[r]);
                    CHECK(h == s->want, "%s tp=%d pp=%d run=%zu: hash 0x%016llx != recorded 0x%016llx",
                          s->cfg.name, tps[t], pp, runs[r], (unsigned long long)h,
                          (unsigned long long)s->want);
                }
    }
    loom_device_free(dev);
    return check_done();
}
