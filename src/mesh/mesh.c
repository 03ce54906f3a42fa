/* mesh.c - the device mesh: a layout (tp, cp, dp, pp degrees, ep inside
 * dp x cp, and an axis order) mapped to rank coordinates and to one group
 * communicator per axis, plus the groups derived from them (dpcp, ep, the
 * expert-data group edp, the pipeline's two ends). All mesh axes live here,
 * and every group is made by the device's communicator factory
 * (device.h: loom_device_comm_split), which chooses its implementation.
 *
 * Everything is pure (no communication) except loom_mesh_create and
 * loom_mesh_free, which are collective over the world: create validates the
 * layout first, so every rank fails the same way before any split. The rank
 * formula is the one in mesh.h: rank = sum of coord[axis] * stride[axis],
 * strides growing from the innermost axis of l->order outwards.
 */
#include "loom/mesh.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- coordinates ------------------------------------------------------ */

void loom_layout_coords(const loom_layout *l, int rank, int coords[LOOM_AXIS_COUNT]) {
    for (int i = 0; i < LOOM_AXIS_COUNT; i++) {
        loom_axis a = l->order[i];
        int d = loom_layout_degree(l, a);
        coords[a] = rank % d;
        rank /= d;
    }
}

int loom_layout_rank(const loom_layout *l, const int coords[LOOM_AXIS_COUNT]) {
    int rank = 0, stride = 1;
    for (int i = 0; i < LOOM_AXIS_COUNT; i++) {
        loom_axis a = l->order[i];
        rank += coords[a] * stride;
        stride *= loom_layout_degree(l, a);
    }
    return rank;
}

int loom_layout_dpcp_rank(const loom_layout *l, const int coords[LOOM_AXIS_COUNT]) {
    int r = 0, stride = 1;
    for (int i = 0; i < LOOM_AXIS_COUNT; i++) {
        loom_axis a = l->order[i];
        if (a != LOOM_AXIS_DP && a != LOOM_AXIS_CP) continue;
        r += coords[a] * stride;
        stride *= loom_layout_degree(l, a);
    }
    return r;
}

/* ---- groups ----------------------------------------------------------- */

static loom_comm **mesh_slot(loom_mesh *m, loom_axis a) {
    switch (a) {
    case LOOM_AXIS_TP: return &m->tp;
    case LOOM_AXIS_CP: return &m->cp;
    case LOOM_AXIS_DP: return &m->dp;
    case LOOM_AXIS_PP: return &m->pp;
    case LOOM_AXIS_COUNT: break;
    }
    return NULL;
}

loom_comm *loom_mesh_comm(const loom_mesh *m, loom_axis a) {
    loom_comm **slot = mesh_slot((loom_mesh *)m, a);
    return slot ? *slot : NULL;
}

/* The ranks that share every coordinate but those of `vary` form one group;
 * its colour is the lowest world rank in it. */
static int group_color(const loom_mesh *m, loom_axis vary1, loom_axis vary2) {
    int c[LOOM_AXIS_COUNT];
    memcpy(c, m->coords, sizeof c);
    c[vary1] = 0;
    c[vary2] = 0;
    return loom_layout_rank(&m->layout, c);
}

static loom_status mesh_split(loom_mesh *m, loom_device *dev) {
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        LOOM_TRY(loom_device_comm_split(dev, m->world, group_color(m, (loom_axis)a, (loom_axis)a),
                                        m->coords[a], loom_axis_names[a], mesh_slot(m, (loom_axis)a)));
    int dpcp_rank = loom_layout_dpcp_rank(&m->layout, m->coords);
    LOOM_TRY(loom_device_comm_split(dev, m->world, group_color(m, LOOM_AXIS_DP, LOOM_AXIS_CP), dpcp_rank,
                                    "dpcp", &m->dpcp));
    int ep = m->layout.ep, pp = m->layout.pp;
    LOOM_TRY(loom_device_comm_split(dev, m->dpcp, dpcp_rank / ep, dpcp_rank % ep, "ep", &m->ep));
    if (ep > 1) /* the same expert slice in every EP group; same ep everywhere: all split, or none */
        LOOM_TRY(loom_device_comm_split(dev, m->dpcp, m->ep_rank, dpcp_rank, "edp", &m->edp));
    if (pp > 1) { /* the pipeline's two ends; the stages between join none */
        int ends = m->pp_rank == 0 || m->pp_rank == pp - 1;
        LOOM_TRY(loom_device_comm_split(dev, m->pp, ends ? 0 : -1, m->pp_rank, "embed", &m->pp_ends));
    }
    return LOOM_OK;
}

loom_status loom_mesh_create(loom_comm *world, const loom_layout *l, loom_device *dev, loom_mesh **out) {
    *out = NULL;
    LOOM_TRY(loom_layout_check(l, loom_comm_size(world))); /* the validator's mesh section (layout.h) */
    loom_mesh *m = calloc(1, sizeof *m);
    if (!m) return loom_fail(LOOM_EOS, "rank %d: out of memory for the mesh", loom_comm_rank(world));
    m->layout = *l;
    m->world = world;
    m->rank = loom_comm_rank(world);
    m->world_size = loom_comm_size(world);
    loom_layout_coords(l, m->rank, m->coords);
    m->tp_rank = m->coords[LOOM_AXIS_TP];
    m->cp_rank = m->coords[LOOM_AXIS_CP];
    m->dp_rank = m->coords[LOOM_AXIS_DP];
    m->pp_rank = m->coords[LOOM_AXIS_PP];
    m->ep_rank = loom_layout_dpcp_rank(l, m->coords) % l->ep;
    loom_status st = mesh_split(m, dev);
    if (st != LOOM_OK) {
        loom_mesh_free(m);
        return st;
    }
    *out = m;
    return LOOM_OK;
}

void loom_mesh_free(loom_mesh *m) {
    if (!m) return;
    loom_comm_free(m->pp_ends);
    loom_comm_free(m->edp);
    loom_comm_free(m->ep);
    loom_comm_free(m->dpcp);
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) loom_comm_free(*mesh_slot(m, (loom_axis)a));
    free(m);
}

/* "rank" or "ranks" after the number n. */
static const char *ranks_word(long long n) { return n == 1 ? "rank" : "ranks"; }

/* ---- the table -------------------------------------------------------- */

typedef struct text {
    char *buf;
    size_t cap, len; /* len counts what would have been written */
} text;

static void text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->len < t->cap ? t->cap - t->len : 0;
    int n = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n;
}

static void format_header(const loom_layout *l, int world_size, text *t) {
    text_add(t, "mesh: %d %s = tp %d x cp %d x dp %d x pp %d; ep %d inside dp x cp\n", world_size,
             ranks_word(world_size), l->tp, l->cp, l->dp, l->pp, l->ep);
    text_add(t, "order (innermost first): %s,%s,%s,%s\n", loom_axis_name(l->order[0]),
             loom_axis_name(l->order[1]), loom_axis_name(l->order[2]), loom_axis_name(l->order[3]));
}

static void format_row(const loom_layout *l, int rank, text *t) {
    int c[LOOM_AXIS_COUNT];
    loom_layout_coords(l, rank, c);
    text_add(t, "%6d", rank);
    for (int i = 0; i < LOOM_AXIS_COUNT; i++) text_add(t, " %4d", c[l->order[i]]);
    text_add(t, " %4d\n", loom_layout_dpcp_rank(l, c) % l->ep);
}

/* Degrees and order usable for coordinates (checked without touching the
 * error message, which belongs to the caller's last failure). */
static int layout_printable(const loom_layout *l) {
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1 || l->ep < 1) return 0;
    for (int i = 0; i < LOOM_AXIS_COUNT; i++)
        if ((unsigned)l->order[i] >= LOOM_AXIS_COUNT) return 0;
    return 1;
}

size_t loom_mesh_format(const loom_layout *l, int world_size, char *buf, size_t cap) {
    text t = {.buf = buf, .cap = cap, .len = 0};
    if (cap) buf[0] = '\0';
    format_header(l, world_size, &t);
    if (world_size > 64 || !layout_printable(l)) {
        text_add(&t, "(no rank table for this layout of %d %s)\n", world_size, ranks_word(world_size));
    } else {
        text_add(&t, "%6s", "rank");
        for (int i = 0; i < LOOM_AXIS_COUNT; i++) text_add(&t, " %4s", loom_axis_name(l->order[i]));
        text_add(&t, " %4s\n", "ep");
        for (int r = 0; r < world_size; r++) format_row(l, r, &t);
    }
    if (cap == 0) return 0;
    return t.len < cap ? t.len : cap - 1;
}
