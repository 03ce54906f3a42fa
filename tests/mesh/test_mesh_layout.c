/* test_mesh_layout.c - the pure half of the mesh: axis orders, layout checks
 * and their messages, rank <-> coordinates for every factorisation of 1..16
 * ranks over the four axes in every order, the worked example of mesh.h, and
 * the printed table. No MPI, not collective.
 */
#include <limits.h>
#include <string.h>

#include "check.h"
#include "loom/mesh.h"

/* ---- orders ----------------------------------------------------------- */

/* the 24 permutations of the four axes, in a fixed order */
static int all_orders(loom_axis out[24][LOOM_AXIS_COUNT]) {
    int k = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++) {
                int d = 6 - a - b - c;
                if (a == b || a == c || b == c || d == a || d == b || d == c) continue;
                const loom_axis o[4] = {(loom_axis)a, (loom_axis)b, (loom_axis)c, (loom_axis)d};
                memcpy(out[k++], o, sizeof o);
            }
    return k;
}

static void test_parse_order(void) {
    loom_axis orders[24][LOOM_AXIS_COUNT];
    CHECK(all_orders(orders) == 24, "24 orders");
    for (int k = 0; k < 24; k++) {
        char s[32];
        snprintf(s, sizeof s, "%s,%s,%s,%s", loom_axis_name(orders[k][0]), loom_axis_name(orders[k][1]),
                 loom_axis_name(orders[k][2]), loom_axis_name(orders[k][3]));
        loom_layout l;
        loom_layout_default(&l);
        CHECK(loom_layout_parse_order(s, &l) == LOOM_OK, "parse '%s': %s", s, loom_errmsg());
        CHECK(memcmp(l.order, orders[k], sizeof l.order) == 0, "parse '%s' gave another order", s);
    }
    const struct {
        const char *in, *msg;
    } bad[] = {
        {"tp,cp,dp", "names 3 axes"},
        {"tp,cp,dp,pp,tp", "axis tp appears twice"},
        {"tp,tp,dp,pp", "axis tp appears twice"},
        {"tp,xx,dp,pp", "unknown axis 'xx'"},
        {"", "unknown axis ''"},
        {"tp,cp,,pp", "unknown axis ''"},
        {"tp cp dp pp", "unexpected 'cp dp pp'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_layout l;
        loom_layout_default(&l);
        loom_status st = loom_layout_parse_order(bad[i].in, &l);
        CHECK(st == LOOM_EUSAGE, "'%s' accepted", bad[i].in);
        CHECK(strstr(loom_errmsg(), bad[i].msg) != NULL, "'%s': message '%s' lacks '%s'", bad[i].in,
              loom_errmsg(), bad[i].msg);
        CHECK(l.order[0] == LOOM_AXIS_TP && l.order[3] == LOOM_AXIS_PP, "'%s' changed the order", bad[i].in);
    }
    loom_layout l;
    CHECK(loom_layout_parse_order(" pp , dp,cp,tp ", &l) == LOOM_OK && l.order[0] == LOOM_AXIS_PP,
          "spaces around names: %s", loom_errmsg());
}

/* ---- coordinates ------------------------------------------------------ */

/* coords <-> rank is a bijection onto 0..N-1, each coordinate in range, and
 * moving one step along an axis moves the rank by that axis' stride: the
 * product of the degrees of the axes inside it. */
static void check_bijection(const loom_layout *l, int N) {
    unsigned char seen[16] = {0};
    int stride[LOOM_AXIS_COUNT], s = 1;
    for (int i = 0; i < LOOM_AXIS_COUNT; i++)
        stride[l->order[i]] = s, s *= loom_layout_degree(l, l->order[i]);
    int bad = 0;
    for (int r = 0; r < N; r++) {
        int c[LOOM_AXIS_COUNT];
        loom_layout_coords(l, r, c);
        for (int a = 0; a < LOOM_AXIS_COUNT; a++)
            bad += c[a] < 0 || c[a] >= loom_layout_degree(l, (loom_axis)a);
        int back = loom_layout_rank(l, c);
        bad += back != r;
        if (back >= 0 && back < N) bad += seen[back]++ != 0;
        for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
            if (c[a] + 1 >= loom_layout_degree(l, (loom_axis)a)) continue;
            c[a]++;
            bad += loom_layout_rank(l, c) != r + stride[a];
            c[a]--;
        }
        bad += loom_layout_dpcp_rank(l, c) >= l->dp * l->cp;
    }
    CHECK(bad == 0, "tp=%d cp=%d dp=%d pp=%d order %s,%s,%s,%s: %d errors", l->tp, l->cp, l->dp, l->pp,
          loom_axis_name(l->order[0]), loom_axis_name(l->order[1]), loom_axis_name(l->order[2]),
          loom_axis_name(l->order[3]), bad);
}

static void test_all_factorisations(void) {
    loom_axis orders[24][LOOM_AXIS_COUNT];
    all_orders(orders);
    int layouts = 0;
    for (int N = 1; N <= 16; N++)
        for (int tp = 1; tp <= N; tp++)
            for (int cp = 1; tp * cp <= N; cp++)
                for (int dp = 1; tp * cp * dp <= N; dp++) {
                    if (N % (tp * cp * dp)) continue;
                    loom_layout l;
                    loom_layout_default(&l);
                    l.tp = tp, l.cp = cp, l.dp = dp, l.pp = N / (tp * cp * dp);
                    for (int k = 0; k < 24; k++) {
                        memcpy(l.order, orders[k], sizeof l.order);
                        CHECK(loom_layout_check(&l, N) == LOOM_OK, "check: %s", loom_errmsg());
                        CHECK(loom_layout_check(&l, N + 1) == LOOM_EUSAGE, "N+1 accepted");
                        check_bijection(&l, N);
                        layouts++;
                    }
                }
    CHECK(layouts > 24 * 100, "only %d layouts tried", layouts);
}

/* the table in mesh.h, verbatim */
static void test_worked_example(void) {
    loom_layout l;
    loom_layout_default(&l);
    l.dp = 2, l.tp = 2, l.pp = 2;
    const int tp[8] = {0, 1, 0, 1, 0, 1, 0, 1}, dp[8] = {0, 0, 1, 1, 0, 0, 1, 1},
              pp[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    for (int r = 0; r < 8; r++) {
        int c[LOOM_AXIS_COUNT];
        loom_layout_coords(&l, r, c);
        CHECK(c[LOOM_AXIS_TP] == tp[r] && c[LOOM_AXIS_DP] == dp[r] && c[LOOM_AXIS_PP] == pp[r] &&
                  c[LOOM_AXIS_CP] == 0,
              "worked example rank %d", r);
    }
    /* dp groups {0,2} {1,3} {4,6} {5,7}: one step of dp is two ranks */
    int c[LOOM_AXIS_COUNT] = {[LOOM_AXIS_TP] = 1, [LOOM_AXIS_DP] = 1, [LOOM_AXIS_PP] = 1};
    CHECK(loom_layout_rank(&l, c) == 7, "tp1 dp1 pp1 is rank 7");
    c[LOOM_AXIS_DP] = 0;
    CHECK(loom_layout_rank(&l, c) == 5, "tp1 dp0 pp1 is rank 5");
}

/* ---- checks ----------------------------------------------------------- */

static void expect_check(const loom_layout *l, int world, const char *msg) {
    loom_status st = loom_layout_check(l, world);
    CHECK(st == LOOM_EUSAGE, "expected failure '%s', got %d", msg, st);
    CHECK(strstr(loom_errmsg(), msg) != NULL, "message '%s' lacks '%s'", loom_errmsg(), msg);
}

static void test_check_messages(void) {
    loom_layout l;
    loom_layout_default(&l);
    l.dp = 2, l.tp = 2;
    expect_check(&l, 8, "dp=2 x tp=2 x pp=1 x cp=1 = 4 ranks, but the job has 8 ranks");
    l.cp = 2, l.ep = 3;
    expect_check(&l, 8, "ep=3 must divide dp*cp=4");
    l.ep = 4;
    CHECK(loom_layout_check(&l, 8) == LOOM_OK, "ep=4 in dp*cp=4: %s", loom_errmsg());
    l.tp = 0;
    expect_check(&l, 8, "tp=0: degrees must be >= 1");
    l.tp = 2, l.pp = -1;
    expect_check(&l, 8, "pp=-1: degrees must be >= 1");
    l.pp = 1, l.ep = 0;
    expect_check(&l, 8, "ep=0: degrees must be >= 1");
    l.ep = 1, l.order[1] = LOOM_AXIS_TP;
    expect_check(&l, 8, "names tp twice");
    loom_layout_default(&l);
    l.dp = l.tp = l.pp = l.cp = INT_MAX;
    expect_check(&l, 8, "more than 2147483647 ranks, but the job has 8 ranks");
    loom_layout_default(&l);
    expect_check(&l, 0, "the job has 0 ranks");
}

static void test_dpcp_rank(void) {
    loom_layout l;
    loom_layout_default(&l);
    l.dp = 3, l.cp = 2, l.tp = 2;
    int c[LOOM_AXIS_COUNT] = {[LOOM_AXIS_TP] = 1, [LOOM_AXIS_CP] = 1, [LOOM_AXIS_DP] = 2};
    CHECK(loom_layout_dpcp_rank(&l, c) == 1 + 2 * 2, "default order: cp_rank + cp * dp_rank");
    CHECK(loom_layout_parse_order("tp,dp,cp,pp", &l) == LOOM_OK, "order");
    CHECK(loom_layout_dpcp_rank(&l, c) == 2 + 3 * 1, "dp inside cp: dp_rank + dp * cp_rank");
}

/* ---- the table -------------------------------------------------------- */

static int count_lines(const char *s) {
    int k = 0;
    for (; *s; s++) k += *s == '\n';
    return k;
}

static void test_format(void) {
    loom_layout l;
    loom_layout_default(&l);
    l.dp = 2, l.tp = 2, l.pp = 2;
    char buf[4096];
    size_t len = loom_mesh_format(&l, 8, buf, sizeof buf);
    CHECK(len == strlen(buf), "returned length %zu, text %zu", len, strlen(buf));
    CHECK(strstr(buf, "8 ranks = tp 2 x cp 1 x dp 2 x pp 2") != NULL, "header:\n%s", buf);
    CHECK(strstr(buf, "order (innermost first): tp,cp,dp,pp") != NULL, "order:\n%s", buf);
    CHECK(strstr(buf, "     5    1    0    0    1    0\n") != NULL, "row of rank 5:\n%s", buf);
    CHECK(count_lines(buf) == 2 + 1 + 8, "%d lines:\n%s", count_lines(buf), buf);
    printf("%s", buf);
    char small[10];
    CHECK(loom_mesh_format(&l, 8, small, sizeof small) == 9 && strlen(small) == 9, "cut to fit");
    l.dp = 128;
    loom_mesh_format(&l, 1024, buf, sizeof buf);
    CHECK(count_lines(buf) == 3 && strstr(buf, "no rank table"), "no table above 64 ranks:\n%s", buf);
}

int main(void) {
    loom_layout l;
    loom_layout_default(&l);
    CHECK(l.dp == 1 && l.tp == 1 && l.pp == 1 && l.cp == 1 && l.ep == 1, "default degrees");
    CHECK(strcmp(loom_axis_name(LOOM_AXIS_CP), "cp") == 0, "axis name");
    test_parse_order();
    test_all_factorisations();
    test_worked_example();
    test_check_messages();
    test_dpcp_rank();
    test_format();
    return check_done();
}
