/* mesh.c - the device mesh: a layout (tp, cp, dp, pp degrees, ep inside
 * dp x cp, and an axis order) mapped to rank coordinates and to one group
 * communicator per axis. All mesh axes live here.
 *
 * Everything is pure (no communication) except loom_mesh_create and
 * loom_mesh_free, which are collective over the world: create validates the
 * layout first, so every rank fails the same way before any split. The rank
 * formula is the one in mesh.h: rank = sum of coord[axis] * stride[axis],
 * strides growing from the innermost axis of l->order outwards.
 */
#include "loom/mesh.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_axis_names[LOOM_AXIS_COUNT] = {"tp", "cp", "dp", "pp"};

const char *loom_axis_name(loom_axis a) {
    return (unsigned)a < LOOM_AXIS_COUNT ? g_axis_names[a] : "?";
}

void loom_layout_default(loom_layout *l) {
    *l = (loom_layout){.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1,
                       .order = {LOOM_AXIS_TP, LOOM_AXIS_CP, LOOM_AXIS_DP, LOOM_AXIS_PP}};
}

int loom_layout_degree(const loom_layout *l, loom_axis a) {
    switch (a) {
    case LOOM_AXIS_TP: return l->tp;
    case LOOM_AXIS_CP: return l->cp;
    case LOOM_AXIS_DP: return l->dp;
    case LOOM_AXIS_PP: return l->pp;
    case LOOM_AXIS_COUNT: break;
    }
    return 0;
}

/* ---- the axis order --------------------------------------------------- */

static int axis_from_name(const char *s, size_t n) {
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        if (strlen(g_axis_names[a]) == n && strncmp(s, g_axis_names[a], n) == 0) return a;
    return -1;
}

loom_status loom_layout_parse_order(const char *s, loom_layout *l) {
    loom_axis order[LOOM_AXIS_COUNT];
    int seen[LOOM_AXIS_COUNT] = {0}, n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        size_t len = strcspn(p, ", ");
        int a = axis_from_name(p, len);
        if (a < 0)
            return loom_fail(LOOM_EUSAGE, "unknown axis '%.*s' in order '%s' (axes are tp, cp, dp, pp)",
                             (int)len, p, s);
        if (seen[a]++)
            return loom_fail(LOOM_EUSAGE, "axis %s appears twice in order '%s'", g_axis_names[a], s);
        if (n < LOOM_AXIS_COUNT) order[n] = (loom_axis)a;
        n++;
        p += len;
        while (*p == ' ') p++;
        if (*p != ',') break;
        p++;
    }
    if (*p != '\0')
        return loom_fail(LOOM_EUSAGE, "unexpected '%s' in order '%s'", p, s);
    if (n != LOOM_AXIS_COUNT)
        return loom_fail(LOOM_EUSAGE, "order '%s' names %d axes; it must name each of tp, cp, dp, pp once",
                         s, n);
    memcpy(l->order, order, sizeof order);
    return LOOM_OK;
}

/* ---- checks ----------------------------------------------------------- */

static loom_status check_degrees(const loom_layout *l) {
    const struct { const char *name; int v; } d[] = {
        {"dp", l->dp}, {"tp", l->tp}, {"pp", l->pp}, {"cp", l->cp}, {"ep", l->ep}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (d[i].v < 1) return loom_fail(LOOM_EUSAGE, "%s=%d: degrees must be >= 1", d[i].name, d[i].v);
    return LOOM_OK;
}

static loom_status check_order(const loom_layout *l) {
    int seen[LOOM_AXIS_COUNT] = {0};
    for (int i = 0; i < LOOM_AXIS_COUNT; i++) {
        unsigned a = (unsigned)l->order[i];
        if (a >= LOOM_AXIS_COUNT)
            return loom_fail(LOOM_EUSAGE, "axis order entry %d is %u, not an axis", i, a);
        if (seen[a]++)
            return loom_fail(LOOM_EUSAGE, "axis order names %s twice; each of tp, cp, dp, pp must appear once",
                             g_axis_names[a]);
    }
    return LOOM_OK;
}

/* "rank" or "ranks" after the number n. */
static const char *ranks_word(long long n) { return n == 1 ? "rank" : "ranks"; }

loom_status loom_layout_check(const loom_layout *l, int world_size) {
    LOOM_TRY(check_degrees(l));
    LOOM_TRY(check_order(l));
    if (world_size < 1) return loom_fail(LOOM_EUSAGE, "the job has %d ranks; it needs at least 1", world_size);
    /* product clamped just above INT_MAX, so four ints cannot overflow */
    long long ranks = 1;
    const int deg[] = {l->dp, l->tp, l->pp, l->cp};
    for (int i = 0; i < 4; i++) {
        ranks *= deg[i];
        if (ranks > INT_MAX) ranks = (long long)INT_MAX + 1;
    }
    if (ranks != world_size)
        return loom_fail(LOOM_EUSAGE, "dp=%d x tp=%d x pp=%d x cp=%d = %s%lld %s, but the job has %d %s",
                         l->dp, l->tp, l->pp, l->cp, ranks > INT_MAX ? "more than " : "",
                         ranks > INT_MAX ? (long long)INT_MAX : ranks, ranks_word(ranks), world_size,
                         ranks_word(world_size));
    if ((l->dp * l->cp) % l->ep != 0)
        return loom_fail(LOOM_EUSAGE, "ep=%d must divide dp*cp=%d (dp=%d, cp=%d)", l->ep,
                         l->dp * l->cp, l->dp, l->cp);
    return LOOM_OK;
}

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

static loom_status mesh_split(loom_mesh *m) {
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        LOOM_TRY(loom_comm_split(m->world, group_color(m, (loom_axis)a, (loom_axis)a), m->coords[a],
                                 g_axis_names[a], mesh_slot(m, (loom_axis)a)));
    int dpcp_rank = loom_layout_dpcp_rank(&m->layout, m->coords);
    LOOM_TRY(loom_comm_split(m->world, group_color(m, LOOM_AXIS_DP, LOOM_AXIS_CP), dpcp_rank, "dpcp",
                             &m->dpcp));
    int ep = m->layout.ep;
    return loom_comm_split(m->dpcp, dpcp_rank / ep, dpcp_rank % ep, "ep", &m->ep);
}

loom_status loom_mesh_create(loom_comm *world, const loom_layout *l, loom_mesh **out) {
    *out = NULL;
    LOOM_TRY(loom_layout_check(l, loom_comm_size(world)));
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
    loom_status st = mesh_split(m);
    if (st != LOOM_OK) {
        loom_mesh_free(m);
        return st;
    }
    *out = m;
    return LOOM_OK;
}

void loom_mesh_free(loom_mesh *m) {
    if (!m) return;
    loom_comm_free(m->ep);
    loom_comm_free(m->dpcp);
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) loom_comm_free(*mesh_slot(m, (loom_axis)a));
    free(m);
}

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
