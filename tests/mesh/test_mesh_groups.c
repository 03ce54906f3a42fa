/* test_mesh_groups.c - the mesh's communicators on a real MPI job.
 *
 *   loomrun -np 8 test_mesh_groups dp=2 tp=2 pp=2 [cp=..] [ep=..] [order=tp,cp,dp,pp]
 *           [comm=auto|mpi|staged]
 *
 * For every group (tp, cp, dp, pp, dpcp, ep; edp at ep > 1; the pipeline's
 * ends, "embed", at pp > 1) the members are predicted from the pure layout
 * functions alone; an allgather of the world rank over the group must list
 * exactly them in group-rank order, an allreduce must give their sum, and
 * sizes and axis ranks must match. Every group is the CPU device's (made
 * through loom_device_comm_split with comm=, the device's implementation):
 * it carries the device's memory ops. A layout that does not fit the job
 * must fail on every rank alike. Collective over the world.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/device.h"
#include "loom/mesh.h"

static loom_status parse_args(int argc, char **argv, loom_layout *l, loom_device_comm *comm) {
    loom_layout_default(l);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *deg = !strncmp(a, "dp=", 3)   ? &l->dp
                   : !strncmp(a, "tp=", 3) ? &l->tp
                   : !strncmp(a, "pp=", 3) ? &l->pp
                   : !strncmp(a, "cp=", 3) ? &l->cp
                   : !strncmp(a, "ep=", 3) ? &l->ep
                                           : NULL;
        if (deg) *deg = atoi(a + 3);
        else if (!strncmp(a, "order=", 6)) LOOM_TRY(loom_layout_parse_order(a + 6, l));
        else if (!strncmp(a, "comm=", 5)) LOOM_TRY(loom_device_comm_parse(a + 5, "comm", comm));
        else return loom_fail(LOOM_EUSAGE, "unknown argument '%s'", a);
    }
    return LOOM_OK;
}

/* Which group of kind g contains world rank r, and at which index (group
 * -1: none); kinds are the four axes, then dpcp, ep, edp and the ends. */
enum { G_DPCP = LOOM_AXIS_COUNT, G_EP, G_EDP, G_ENDS, G_COUNT };
static const char *const g_names[G_COUNT] = {"tp", "cp", "dp", "pp", "dpcp", "ep", "edp", "embed"};

static void group_of(const loom_layout *l, int r, int g, int *group, int *index) {
    int c[LOOM_AXIS_COUNT];
    loom_layout_coords(l, r, c);
    int dpcp = loom_layout_dpcp_rank(l, c), pp_rank = c[LOOM_AXIS_PP];
    if (g == G_ENDS) { /* the first and last stage of one pipeline */
        *index = pp_rank ? 1 : 0;
        c[LOOM_AXIS_PP] = 0;
        *group = pp_rank == 0 || pp_rank == l->pp - 1 ? loom_layout_rank(l, c) : -1;
        return;
    }
    if (g < LOOM_AXIS_COUNT) {
        *index = c[g];
        c[g] = 0;
    } else {
        *index = g == G_EP ? dpcp % l->ep : g == G_EDP ? dpcp / l->ep : dpcp;
        c[LOOM_AXIS_DP] = c[LOOM_AXIS_CP] = 0;
    }
    *group = loom_layout_rank(l, c) * l->dp * l->cp + (g == G_EP    ? dpcp / l->ep
                                                       : g == G_EDP ? dpcp % l->ep
                                                                    : 0);
}

static loom_comm *mesh_group(const loom_mesh *m, int g) {
    switch (g) {
    case G_DPCP: return m->dpcp;
    case G_EP: return m->ep;
    case G_EDP: return m->edp;
    case G_ENDS: return m->pp_ends;
    default: return loom_mesh_comm(m, (loom_axis)g);
    }
}

static void check_group(const loom_mesh *m, const loom_device *dev, int g) {
    loom_comm *c = mesh_group(m, g);
    int n = m->world_size, mine, my_index, size = 0;
    group_of(&m->layout, m->rank, g, &mine, &my_index);
    if ((g == G_EDP && m->layout.ep == 1) || (g == G_ENDS && (m->layout.pp == 1 || mine < 0))) {
        CHECK(c == NULL, "%s: a group where the layout has none", g_names[g]);
        return;
    }
    CHECK(c != NULL, "%s: no group", g_names[g]);
    if (!c) return;
    /* the device's: its memory ops (MPI on the CPU, or staged over its memory) */
    CHECK(loom_comm_memory(c)->ctx == loom_device_comm_mem(dev)->ctx, "%s: not on the device's memory",
          g_names[g]);
    int32_t *want = calloc((size_t)n, sizeof *want), *got = calloc((size_t)n, sizeof *got);
    int64_t want_sum = 0;
    for (int r = 0; r < n; r++) {
        int group, index;
        group_of(&m->layout, r, g, &group, &index);
        if (group != mine) continue;
        want[index] = r, want_sum += r, size++;
    }
    CHECK(loom_comm_size(c) == size, "%s size %d, expected %d", g_names[g], loom_comm_size(c), size);
    CHECK(loom_comm_rank(c) == my_index, "%s rank %d, expected %d", g_names[g], loom_comm_rank(c), my_index);
    CHECK(strcmp(loom_comm_name(c), g_names[g]) == 0, "group name '%s'", loom_comm_name(c));
    int32_t me = m->rank;
    int64_t sum = m->rank;
    CHECK(loom_comm_allgather(c, &me, got, sizeof me) == LOOM_OK, "allgather: %s", loom_errmsg());
    CHECK(loom_comm_allreduce(c, &sum, 1, LOOM_I64, LOOM_SUM) == LOOM_OK, "allreduce: %s", loom_errmsg());
    CHECK(sum == want_sum, "%s: sum of world ranks %lld, expected %lld", g_names[g], (long long)sum,
          (long long)want_sum);
    int bad = 0;
    for (int i = 0; i < size && size == loom_comm_size(c); i++) bad += got[i] != want[i];
    CHECK(bad == 0, "%s: %d members out of place", g_names[g], bad);
    free(want);
    free(got);
}

static void check_mesh(const loom_mesh *m, const loom_device *dev) {
    int c[LOOM_AXIS_COUNT];
    loom_layout_coords(&m->layout, m->rank, c);
    CHECK(m->tp_rank == c[LOOM_AXIS_TP] && m->cp_rank == c[LOOM_AXIS_CP] && m->dp_rank == c[LOOM_AXIS_DP] &&
              m->pp_rank == c[LOOM_AXIS_PP],
          "axis ranks of rank %d", m->rank);
    CHECK(m->ep_rank == loom_comm_rank(m->ep), "ep_rank %d, group rank %d", m->ep_rank,
          loom_comm_rank(m->ep));
    CHECK(loom_comm_size(m->ep) == m->layout.ep, "ep size %d", loom_comm_size(m->ep));
    for (int g = 0; g < G_COUNT; g++) check_group(m, dev, g);
}

/* A layout for another number of ranks fails on every rank, before any
 * communication, with the numbers in the message. */
static void check_bad_layout(loom_comm *world, loom_device *dev, const loom_layout *good) {
    loom_layout l = *good;
    l.dp *= 3;
    loom_mesh *m = (loom_mesh *)world;
    loom_status st = loom_mesh_create(world, &l, dev, &m);
    CHECK(st == LOOM_EUSAGE && m == NULL, "bad layout accepted");
    CHECK(strstr(loom_errmsg(), "but the job has") != NULL, "message: %s", loom_errmsg());
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_errmsg());
        return 1;
    }
    loom_layout l;
    loom_mesh *m = NULL;
    loom_device *dev = NULL;
    loom_device_opts o = {.name = "cpu", .threads = 1};
    loom_status st = parse_args(argc, argv, &l, &o.comm);
    if (st == LOOM_OK) st = loom_device_create(&o, &dev);
    if (st == LOOM_OK) st = loom_mesh_create(world, &l, dev, &m);
    CHECK(st == LOOM_OK, "mesh: %s", loom_errmsg());
    if (m) {
        if (m->rank == 0) {
            char buf[8192];
            loom_mesh_format(&l, m->world_size, buf, sizeof buf);
            printf("%s(groups: %s)\n", buf, loom_device_comm_name(dev->comm));
        }
        check_mesh(m, dev);
        check_bad_layout(world, dev, &l);
        loom_mesh_free(m);
    }
    loom_device_free(dev);
    int failed = check_failed_;
    loom_comm_allreduce(world, &failed, 1, LOOM_I32, LOOM_SUM);
    int local = check_done();
    loom_comm_finalize(world);
    return failed || local ? 1 : 0;
}
