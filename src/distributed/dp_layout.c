/* dp_layout.c - the data-parallel engine's plan for one model part: its
 * units in backward order, the buckets cut from them, this rank's slice of
 * every bucket (the shard layout of dp.h, padding included), the optimizer
 * segments (one per parameter run inside the slice) and the sizes of every
 * buffer the stage needs. Axis: dp (sizes only). Local; no collectives.
 */
#include <stdlib.h>
#include <string.h>

#include "distributed/dp_internal.h"

static int has_outer(const loom_gpt *m) { return m->part.has_embed || m->part.has_head; }

int loom_dp_unit_index(const dp_part *p, int unit) {
    const loom_gpt *m = p->m;
    if (unit == LOOM_UNIT_OUTER) return has_outer(m) ? p->n_units - 1 : -1;
    if (unit < m->part.layer_begin || unit >= m->part.layer_end) return -1;
    return m->part.layer_end - 1 - unit;
}

/* Units in the order their gradients complete: blocks L-1 .. 0, then outer. */
static loom_status build_units(dp_part *p) {
    const loom_gpt *m = p->m;
    p->n_units = m->L_l + has_outer(m);
    p->units = calloc((size_t)(p->n_units ? p->n_units : 1), sizeof *p->units);
    if (!p->units) return loom_fail(LOOM_EOS, "out of memory for the data-parallel plan");
    for (int i = 0; i < p->n_units; i++) {
        dp_unit *u = &p->units[i];
        u->unit = i < m->L_l ? m->part.layer_end - 1 - i : LOOM_UNIT_OUTER;
        loom_gpt_unit_range(m, u->unit, &u->lo, &u->n);
    }
    return LOOM_OK;
}

/* Does [lo, lo+n) hold a parameter matching the test? */
static int range_has(const loom_gpt *m, size_t lo, size_t n,
                     int (*test)(const loom_gpt *, const loom_param *)) {
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *q = &m->params[i];
        if (q->offset >= lo && q->offset < lo + n && test(m, q)) return 1;
    }
    return 0;
}
static int is_partial(const loom_gpt *m, const loom_param *q) {
    (void)m;
    return q->sp_partial || q->split_rep > 1; /* summed over tp, or over the tp ranks sharing a slice */
}
/* The tied wte whose other half lives on another part (a pipeline's first
 * and last stage): its gradient is completed by the caller after the backward. */
static int is_shared_wte(const loom_gpt *m, const loom_param *q) {
    return !(m->part.has_embed && m->part.has_head) && strcmp(q->name, loom_model_embed_name(&m->cfg)) == 0;
}

/* Early wte (dp_internal.h): decided here, once per part. The rows buffer
 * must stay small next to wte itself, or reducing wte densely is cheaper. */
static void plan_early(const loom_dp_engine *e, dp_part *p) {
    const loom_gpt *m = p->m;
    p->early = 0;
    if (e->cfg.zero != 0 || e->N < 2 || e->no_overlap || !m->part.has_embed || !m->part.has_head ||
        m->opts.split_backward || m->cfg.untied)
        return;
    size_t rows = (size_t)m->opts.B * (size_t)m->opts.T, lo, n;
    if ((size_t)e->N * rows > (size_t)m->V_l / 2) return;
    loom_gpt_unit_range(m, LOOM_UNIT_OUTER, &lo, &n);
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *q = &m->params[i];
        if (strcmp(q->name, loom_model_embed_name(&m->cfg)) != 0 || q->offset != lo) continue;
        p->early = 1;
        p->wte_lo = q->offset;
        p->wte_n = (q->numel + 15) & ~(size_t)15;
        p->rows_max = rows;
    }
}

/* A unit's range as its bucket sees it: the outer unit without an early wte. */
static void unit_span(const dp_part *p, const dp_unit *u, size_t *lo, size_t *n) {
    int cut = p->early && u->unit == LOOM_UNIT_OUTER;
    *lo = u->lo + (cut ? p->wte_n : 0);
    *n = u->n - (cut ? p->wte_n : 0);
}

/* Greedy cut of the backward order: a bucket closes once it reaches the cap
 * (one unit per bucket at cap 0, and always at zero 3). With an early wte,
 * bucket 0 is wte alone. */
static loom_status build_buckets(const loom_dp_engine *e, dp_part *p) {
    const double cap = e->cfg.zero == 3 ? 0.0 : e->cfg.bucket_mb * 1024.0 * 1024.0 / sizeof(float);
    p->buckets = calloc((size_t)p->n_units + 1, sizeof *p->buckets);
    if (!p->buckets) return loom_fail(LOOM_EOS, "out of memory for the data-parallel plan");
    p->n_buckets = 0;
    if (p->early) {
        p->buckets[0] = (dp_bucket){.lo = p->wte_lo, .n = p->wte_n, .outer = 1, .head_wte = 1};
        p->n_buckets = 1;
    }
    for (int i = 0; i < p->n_units;) {
        dp_bucket *b = &p->buckets[p->n_buckets];
        b->u_begin = i;
        unit_span(p, &p->units[i], &b->lo, &b->n);
        b->n = 0;
        do {
            const dp_unit *u = &p->units[i];
            size_t ulo, un;
            unit_span(p, u, &ulo, &un);
            if (b->n && ulo + un != b->lo)
                return loom_fail(LOOM_EINTERNAL, "data-parallel plan: unit %d not adjacent to its bucket",
                                 u->unit);
            if (ulo < b->lo) b->lo = ulo;
            b->n += un;
            p->units[i].bucket = p->n_buckets;
            b->outer |= u->unit == LOOM_UNIT_OUTER;
            i++;
        } while (i < p->n_units && (double)b->n < cap);
        b->u_end = i;
        p->n_buckets++;
    }
    return LOOM_OK;
}

/* Slices (dp.h's padding), flags, slots. */
static void build_slices(const loom_dp_engine *e, dp_part *p) {
    const int zero = e->cfg.zero;
    const size_t N = zero ? (size_t)e->N : 1, r = zero ? (size_t)e->r : 0;
    const int own_partials = zero >= 2 || e->cfg.sum_tp_partials;
    size_t so = 0;
    for (int k = 0; k < DP_SLOTS; k++) p->slot_floats[k] = 0;
    p->scratch_floats = 0;
    for (int bi = 0; bi < p->n_buckets; bi++) {
        dp_bucket *b = &p->buckets[bi];
        b->S = (b->n + N - 1) / N;
        b->P = N * b->S;
        b->so = so;
        so += b->S;
        b->mine_lo = b->lo + r * b->S;
        size_t start = r * b->S;
        b->mine_n = start >= b->n ? 0 : (b->n - start < b->S ? b->n - start : b->S);
        b->has_partial = range_has(p->m, b->lo, b->n, is_partial);
        b->defer = (b->has_partial && !own_partials) || range_has(p->m, b->lo, b->n, is_shared_wte);
        b->slot = b->outer ? DP_SLOT_OUTER : bi % 2;
        if (b->P > p->slot_floats[b->slot]) p->slot_floats[b->slot] = b->P;
        if (zero == 1 && b->P != b->n && b->P > p->scratch_floats) p->scratch_floats = b->P;
    }
    p->S = so;
}

/* One segment per (parameter, bucket) overlap with this rank's slice. */
static loom_status build_segs(const loom_dp_engine *e, dp_part *p) {
    const loom_gpt *m = p->m;
    const int zero = e->cfg.zero;
    p->segs = calloc((size_t)m->n_params * (size_t)(p->n_buckets ? p->n_buckets : 1), sizeof *p->segs);
    if (!p->segs) return loom_fail(LOOM_EOS, "out of memory for the data-parallel plan");
    p->n_segs = 0;
    size_t covered = 0;
    for (int bi = 0; bi < p->n_buckets; bi++) {
        const dp_bucket *b = &p->buckets[bi];
        size_t lo = b->mine_lo, hi = b->mine_lo + b->mine_n;
        for (int i = 0; i < m->n_params; i++) {
            const loom_param *q = &m->params[i];
            size_t a = q->offset > lo ? q->offset : lo;
            size_t z = q->offset + q->numel < hi ? q->offset + q->numel : hi;
            if (a >= z) continue;
            dp_seg *s = &p->segs[p->n_segs++];
            size_t in_slice = a - b->mine_lo;
            s->param = i;
            s->n = z - a;
            s->s_off = b->so + in_slice;
            s->p_off = zero == 3 ? s->s_off : a;
            s->flat = a;
            /* zero 1: the reduced slice lands at the bucket's start */
            s->g_off = zero >= 2 ? s->s_off : b->lo + in_slice;
            s->decay = q->decay;
            s->replicated = q->split_dim < 0;
            s->skip_norm = loom_param_norm_skip(m, q);
            covered += s->n;
        }
    }
    /* segments are disjoint: covering num_params floats, they cover grad_mem */
    p->zero_in_update = zero < 2 && m->grad_mem && covered == m->num_params;
    return LOOM_OK;
}

static void plan_memory(const loom_dp_engine *e, dp_part *p) {
    const int zero = e->cfg.zero;
    const size_t F = sizeof(float), slots = p->slot_floats[0] + p->slot_floats[1] + p->slot_floats[2];
    const size_t flat = p->m->num_params;
    p->mem_opt = 2 * p->S * F;
    p->mem_params = zero == 3 ? (p->S + slots) * F : flat * F;
    p->mem_grads = zero >= 2 ? (p->S + slots) * F : (flat + p->scratch_floats) * F;
    if (p->early) /* the gathered embedding rows and their ids */
        p->mem_grads += (size_t)e->N * p->rows_max * ((size_t)p->m->C + 1) * F;
}

loom_status loom_dp_layout_build(loom_dp_engine *e, dp_part *p) {
    LOOM_TRY(build_units(p));
    plan_early(e, p);
    LOOM_TRY(build_buckets(e, p));
    build_slices(e, p);
    LOOM_TRY(build_segs(e, p));
    plan_memory(e, p);
    return LOOM_OK;
}

void loom_dp_layout_free(dp_part *p) {
    free(p->units);
    free(p->buckets);
    free(p->segs);
    p->units = NULL;
    p->buckets = NULL;
    p->segs = NULL;
}
