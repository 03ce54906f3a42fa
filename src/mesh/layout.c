/* layout.c - the typed layout (include/loom/layout.h): the words of its
 * enums, its defaults, and the parsers of the two fields that are lists (the
 * mesh order and --stage-layers). Every axis of the mesh is described here;
 * the rules live in layout_check.c. Pure, not collective.
 */
#include "loom/layout.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *const loom_axis_names[] = {"tp", "cp", "dp", "pp", NULL};
const char *const loom_cp_impl_names[] = {"ring", "ulysses", NULL};
const char *const loom_schedule_names[] = {"gpipe", "1f1b", "interleaved", "zb",
                                           "zbh2",  "zbv",  "dualpipev",   NULL};
const char *const loom_recompute_names[] = {"none", "selective", "full", NULL};
const char *const loom_precision_names[] = {"fp32", "bf16", NULL};

const char *loom_axis_name(loom_axis a) { return (unsigned)a < LOOM_AXIS_COUNT ? loom_axis_names[a] : "?"; }

const char *loom_cp_impl_name(loom_cp_impl impl) { return impl == LOOM_CP_ULYSSES ? "ulysses" : "ring"; }

const char *loom_schedule_name(loom_sched_kind k) {
    return (unsigned)k < LOOM_SCHED_COUNT ? loom_schedule_names[k] : "?";
}

loom_status loom_schedule_parse(const char *name, loom_sched_kind *out) {
    for (int k = 0; k < LOOM_SCHED_COUNT; k++)
        if (name && strcmp(name, loom_schedule_names[k]) == 0) {
            *out = (loom_sched_kind)k;
            return LOOM_OK;
        }
    return loom_fail(LOOM_EUSAGE,
                     "unknown schedule '%s' (gpipe, 1f1b, interleaved, zb, zbh2, zbv, dualpipev)",
                     name ? name : "");
}

int loom_schedule_splits_backward(loom_sched_kind k) {
    return k == LOOM_SCHED_ZB || k == LOOM_SCHED_ZBH2 || k == LOOM_SCHED_ZBV || k == LOOM_SCHED_DUALPIPEV;
}

int loom_schedule_vshape(loom_sched_kind k) { return k == LOOM_SCHED_ZBV || k == LOOM_SCHED_DUALPIPEV; }

void loom_layout_default(loom_layout *l) {
    memset(l, 0, sizeof *l);
    l->dp = l->tp = l->pp = l->cp = l->ep = 1;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) l->order[a] = (loom_axis)a;
    l->cp_impl = LOOM_CP_RING;
    l->schedule = LOOM_SCHED_1F1B;
    l->virtual_stages = 1;
    l->grad_accum = 1;
    l->recompute = LOOM_RECOMPUTE_NONE;
    l->precision = l->comm_precision = LOOM_PRECISION_FP32;
}

void loom_layout_vshape_default(loom_layout *l) {
    if (loom_schedule_vshape(l->schedule) && l->virtual_stages == 1) l->virtual_stages = 2;
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

int loom_layout_pipelined(const loom_layout *l) { return l->pp > 1 || l->virtual_stages > 1; }

int loom_layout_micro_batches(const loom_layout *l) {
    return l->micro_batches > 0 ? l->micro_batches : l->pp;
}

/* ---- the axis order --------------------------------------------------- */

static int axis_from_name(const char *s, size_t n) {
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        if (strlen(loom_axis_names[a]) == n && strncmp(s, loom_axis_names[a], n) == 0) return a;
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
            return loom_fail(LOOM_EUSAGE, "axis %s appears twice in order '%s'", loom_axis_names[a], s);
        if (n < LOOM_AXIS_COUNT) order[n] = (loom_axis)a;
        n++;
        p += len;
        while (*p == ' ') p++;
        if (*p != ',') break;
        p++;
    }
    if (*p != '\0') return loom_fail(LOOM_EUSAGE, "unexpected '%s' in order '%s'", p, s);
    if (n != LOOM_AXIS_COUNT)
        return loom_fail(LOOM_EUSAGE, "order '%s' names %d axes; it must name each of tp, cp, dp, pp once", s,
                         n);
    memcpy(l->order, order, sizeof order);
    return LOOM_OK;
}

/* ---- --stage-layers ----------------------------------------------------- */

/* One entry at *p: a positive integer up to 10^9, then ',' or the end. */
static loom_status stage_entry(const char **pp, int n, long *out) {
    const char *p = *pp;
    while (isspace((unsigned char)*p)) p++;
    const char *tok = p;
    char *end = NULL;
    errno = 0;
    long x = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
    if (end) p = end;
    while (isspace((unsigned char)*p)) p++;
    if (x < 0 || errno || x > 1000000000L || (*p != ',' && *p != '\0')) {
        int len = 0;
        while (tok[len] && tok[len] != ',') len++;
        return loom_fail(LOOM_EUSAGE, "--stage-layers: '%.*s' is not a positive integer", len > 40 ? 40 : len,
                         tok);
    }
    if (x == 0)
        return loom_fail(LOOM_EUSAGE,
                         "--stage-layers entry %d (virtual stage %d) is 0: every virtual stage "
                         "needs at least one layer",
                         n, n);
    *pp = p;
    *out = x;
    return LOOM_OK;
}

loom_status loom_layout_parse_stage_layers(const char *list, loom_layout *l) {
    if (!list[0]) {
        l->n_stage_layers = 0;
        return LOOM_OK;
    }
    int counts[LOOM_LAYOUT_MAX_STAGE_LAYERS], n = 0;
    for (const char *p = list;; p++) {
        long x = 0;
        LOOM_TRY(stage_entry(&p, n, &x));
        if (n == LOOM_LAYOUT_MAX_STAGE_LAYERS)
            return loom_fail(LOOM_EUSAGE, "--stage-layers: more than %d entries",
                             LOOM_LAYOUT_MAX_STAGE_LAYERS);
        counts[n++] = (int)x;
        if (*p == '\0') break;
    }
    memcpy(l->stage_layers, counts, (size_t)n * sizeof counts[0]);
    l->n_stage_layers = n;
    return LOOM_OK;
}
