/* test_schedules.c - the pure half of pipeline parallelism: schedule names
 * and checks with their messages; every schedule over p = 1..8, m = 1..4p,
 * v = 1..3 passes the validator, with counts, peers, tags and peak live
 * activations checked here independently; hand-written lists for small
 * cases; and corrupted lists (swapped, dropped, duplicated, misaddressed,
 * deadlocked) rejected with a message naming the problem. No MPI.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/pipeline.h"

static const loom_sched_kind KINDS[] = {LOOM_SCHED_GPIPE,    LOOM_SCHED_1F1B, LOOM_SCHED_INTERLEAVED,
                                        LOOM_SCHED_ZB,       LOOM_SCHED_ZBH2, LOOM_SCHED_ZBV,
                                        LOOM_SCHED_DUALPIPEV};
#define N_KINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

/* ---- names and checks ------------------------------------------------------ */

static void test_parse_and_check(void) {
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zb", "zbh2", "zbv", "dualpipev"};
    for (int k = 0; k < N_KINDS; k++) {
        loom_sched_kind got = LOOM_SCHED_COUNT;
        CHECK(loom_schedule_parse(names[k], &got) == LOOM_OK && got == KINDS[k], "parse %s", names[k]);
        CHECK(strcmp(loom_schedule_name(KINDS[k]), names[k]) == 0, "name of %d", k);
    }
    loom_sched_kind got = LOOM_SCHED_1F1B;
    CHECK(loom_schedule_parse("1F1B-x", &got) == LOOM_EUSAGE, "unknown name accepted");
    CHECK(strstr(loom_errmsg(),
                 "unknown schedule '1F1B-x' (gpipe, 1f1b, interleaved, zb, zbh2, zbv, dualpipev)") != NULL,
          "msg '%s'", loom_errmsg());
    CHECK(got == LOOM_SCHED_1F1B, "failed parse changed the output");

    const struct {
        loom_sched_kind k;
        int p, m, v;
        const char *msg;
    } bad[] = {
        {LOOM_SCHED_INTERLEAVED, 4, 6, 2, "interleaved needs --micro-batches divisible by pp=4, got 6"},
        {LOOM_SCHED_INTERLEAVED, 4, 2, 2, "interleaved needs --micro-batches divisible by pp=4, got 2"},
        {LOOM_SCHED_1F1B, 4, 8, 2,
         "--virtual-stages 2: v > 1 only with interleaved, zbv or dualpipev (schedule 1f1b)"},
        {LOOM_SCHED_GPIPE, 4, 8, 3, "v > 1 only with interleaved, zbv or dualpipev (schedule gpipe)"},
        {LOOM_SCHED_ZB, 4, 8, 2, "v > 1 only with interleaved, zbv or dualpipev (schedule zb)"},
        {LOOM_SCHED_ZBH2, 4, 8, 2, "v > 1 only with interleaved, zbv or dualpipev (schedule zbh2)"},
        {LOOM_SCHED_ZBV, 4, 8, 1, "--virtual-stages 1: zbv places exactly 2 chunks per rank (a V)"},
        {LOOM_SCHED_DUALPIPEV, 4, 8, 3, "--virtual-stages 3: dualpipev places exactly 2 chunks per rank"},
        {LOOM_SCHED_1F1B, 0, 8, 1, "--pp 0: must be in 1..1024"},
        {LOOM_SCHED_1F1B, 4, 0, 1, "--micro-batches 0: must be in 1..65536"},
        {LOOM_SCHED_INTERLEAVED, 4, 8, 0, "--virtual-stages 0: must be in 1..64"},
        {LOOM_SCHED_INTERLEAVED, 1024, 65536, 64, "more than 4194304"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_schedule *s = (loom_schedule *)&got; /* must be reset to NULL */
        loom_status st = loom_schedule_build(bad[i].k, bad[i].p, bad[i].m, bad[i].v, &s);
        CHECK(st == LOOM_EUSAGE && s == NULL, "case %zu accepted", i);
        CHECK(strstr(loom_errmsg(), bad[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, loom_errmsg(),
              bad[i].msg);
    }
    CHECK(loom_schedule_check(LOOM_SCHED_INTERLEAVED, 4, 12, 3) == LOOM_OK, "interleaved 4x12x3: %s",
          loom_errmsg());
    CHECK(loom_schedule_check(LOOM_SCHED_1F1B, 8, 3, 1) == LOOM_OK, "1f1b m < p is allowed");
}

/* ---- the grid ---------------------------------------------------------------- */

static int count_kind(const loom_pp_action *a, int n, loom_pp_kind k) {
    int c = 0;
    for (int i = 0; i < n; i++) c += a[i].kind == k;
    return c;
}

/* For the list-scheduled kinds: the policy's limit (an upper bound). */
static int expected_peak(loom_sched_kind k, int p, int m, int v, int r) {
    int x;
    switch (k) {
    case LOOM_SCHED_ZBH2: return 2 * p - 1;
    case LOOM_SCHED_ZBV: return 2 * p;
    case LOOM_SCHED_DUALPIPEV: return 2 * p + 2;
    case LOOM_SCHED_GPIPE: return m;
    case LOOM_SCHED_1F1B: return p - r < m ? p - r : m;
    case LOOM_SCHED_ZB: return p < m ? p : m;
    default: x = 2 * (p - r - 1) + (v - 1) * p + 1; return x < m * v ? x : m * v;
    }
}

/* Independent of the validator: per rank, m*v of each computation, the
 * messages a stage must exchange, peers that own the neighbouring stages, and
 * every tag below the limit used by exactly one SEND and one RECV of the same
 * (sender, receiver) pair, as MPI matches them. */
static void check_lists(const loom_schedule *s, const char *what) {
    const int p = s->pp, m = s->micro_batches, v = s->virtual_stages, S = p * v;
    const int lim = loom_pp_tag_limit(s);
    CHECK(lim == 2 * m * (S - 1), "%s: tag limit %d", what, lim);
    long *send_key = malloc(((size_t)lim + 1) * sizeof *send_key),
         *recv_key = malloc(((size_t)lim + 1) * sizeof *recv_key);
    for (int t = 0; t < lim; t++) send_key[t] = recv_key[t] = -1;
    for (int r = 0; r < p; r++) {
        int n;
        const loom_pp_action *a = loom_schedule_rank(s, r, &n);
        /* the rank holds stage 0 / stage S-1: ranks 0 and p-1, or rank 0 twice in a V */
        const int first = r == 0, last = r == (s->vshape ? 0 : p - 1);
        const int act_in = m * v - (first ? m : 0), act_out = m * v - (last ? m : 0);
        CHECK(count_kind(a, n, LOOM_PP_F) == m * v, "%s rank %d: %d F", what, r, count_kind(a, n, LOOM_PP_F));
        CHECK(count_kind(a, n, LOOM_PP_B) == m * v, "%s rank %d: B count", what, r);
        CHECK(count_kind(a, n, LOOM_PP_W) == (s->split_backward ? m * v : 0), "%s rank %d: W count", what, r);
        CHECK(count_kind(a, n, LOOM_PP_OPT_STEP) == 1 && a[n - 1].kind == LOOM_PP_OPT_STEP, "%s rank %d: OPT",
              what, r);
        CHECK(count_kind(a, n, LOOM_PP_RECV_ACT) == act_in && count_kind(a, n, LOOM_PP_SEND_GRAD) == act_in,
              "%s rank %d: act in / grad out", what, r);
        CHECK(count_kind(a, n, LOOM_PP_SEND_ACT) == act_out && count_kind(a, n, LOOM_PP_RECV_GRAD) == act_out,
              "%s rank %d: act out / grad in", what, r);
        for (int i = 0; i < n; i++) {
            const int t = loom_pp_tag(s, r, &a[i]);
            const int is_msg = a[i].kind >= LOOM_PP_SEND_ACT && a[i].kind <= LOOM_PP_RECV_GRAD;
            CHECK(is_msg ? (t >= 0 && t < lim) : t == -1, "%s rank %d action %d: tag %d (limit %d)", what, r,
                  i, t, lim);
            if (!is_msg || t < 0 || t >= lim) continue;
            const int st = loom_pp_vstage(s, r, a[i].chunk);
            const int send = a[i].kind == LOOM_PP_SEND_ACT || a[i].kind == LOOM_PP_SEND_GRAD;
            const int to = a[i].kind == LOOM_PP_SEND_ACT || a[i].kind == LOOM_PP_RECV_GRAD ? st + 1 : st - 1;
            CHECK(to >= 0 && to < S && a[i].peer == loom_pp_owner(s, to), "%s rank %d action %d: peer %d",
                  what, r, i, a[i].peer);
            long *slot = send ? &send_key[t] : &recv_key[t];
            CHECK(*slot == -1, "%s tag %d used twice", what, t);
            *slot = send ? (long)r * p + a[i].peer : (long)a[i].peer * p + r; /* sender * p + receiver */
        }
    }
    for (int t = 0; t < lim; t++)
        CHECK(send_key[t] >= 0 && send_key[t] == recv_key[t], "%s tag %d: send pair %ld, recv pair %ld", what,
              t, send_key[t], recv_key[t]);
    free(send_key);
    free(recv_key);
}

static void test_grid(void) {
    int built = 0;
    for (int ki = 0; ki < N_KINDS; ki++) {
        const loom_sched_kind k = KINDS[ki];
        const int listed = k == LOOM_SCHED_ZBH2 || k == LOOM_SCHED_ZBV || k == LOOM_SCHED_DUALPIPEV;
        for (int p = 1; p <= 8; p++)
            for (int m = 1; m <= 4 * p; m++)
                for (int v = 1; v <= 3; v++) {
                    if (loom_schedule_vshape(k) ? v != 2 : v > 1 && k != LOOM_SCHED_INTERLEAVED) continue;
                    if (k == LOOM_SCHED_INTERLEAVED && m % p) continue;
                    char what[96];
                    snprintf(what, sizeof what, "%s p=%d m=%d v=%d", loom_schedule_name(k), p, m, v);
                    loom_schedule *s = NULL;
                    loom_status st = loom_schedule_build(k, p, m, v, &s);
                    CHECK(st == LOOM_OK, "%s: build: %s", what, loom_errmsg());
                    if (st != LOOM_OK) continue;
                    built++;
                    CHECK(loom_schedule_validate(s) == LOOM_OK, "%s: %s", what, loom_errmsg());
                    check_lists(s, what);
                    for (int r = 0; r < p; r++) {
                        const int got = loom_schedule_peak_live(s, r), want = expected_peak(k, p, m, v, r);
                        CHECK(listed ? got <= want : got == want, "%s rank %d: peak %d, want %s%d", what, r,
                              got, listed ? "<= " : "", want);
                    }
                    /* ZB-H2 holds 2p-1 sets on rank 0 once m allows: its warm-up covers the round trip */
                    if (k == LOOM_SCHED_ZBH2)
                        CHECK(loom_schedule_peak_live(s, 0) == (m < 2 * p - 1 ? m : 2 * p - 1),
                              "%s rank 0: peak %d", what, loom_schedule_peak_live(s, 0));
                    loom_schedule_free(s);
                }
    }
    /* gpipe 1f1b zb zbh2 zbv dualpipev: sum over p of 4p values of m; interleaved: 4 values of m x 3 v
     * per p */
    CHECK(built == 6 * 144 + 8 * 4 * 3, "built %d schedules", built);
}

/* ---- hand-written lists ------------------------------------------------------- */

/* The computations of rank r, as "F0 F1 B0 ...". */
static void compute_order(const loom_schedule *s, int r, char *buf, size_t cap) {
    int n;
    const loom_pp_action *a = loom_schedule_rank(s, r, &n);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        if (a[i].kind > LOOM_PP_W) continue;
        char lab[32];
        loom_pp_action_format(&a[i], s->virtual_stages, lab, sizeof lab);
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? " " : "", lab);
    }
}

static void expect_order(loom_sched_kind k, int p, int m, int v, int r, const char *want) {
    loom_schedule *s = NULL;
    if (loom_schedule_build(k, p, m, v, &s) != LOOM_OK) {
        CHECK(0, "build %s: %s", loom_schedule_name(k), loom_errmsg());
        return;
    }
    char got[2048];
    compute_order(s, r, got, sizeof got);
    CHECK(strcmp(got, want) == 0, "%s p=%d m=%d v=%d rank %d:\n  got  %s\n  want %s", loom_schedule_name(k),
          p, m, v, r, got, want);
    loom_schedule_free(s);
}

static void test_hand_written(void) {
    expect_order(LOOM_SCHED_GPIPE, 4, 4, 1, 2, "F0 F1 F2 F3 B0 B1 B2 B3");
    expect_order(LOOM_SCHED_1F1B, 4, 8, 1, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
    expect_order(LOOM_SCHED_1F1B, 4, 8, 1, 2, "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
    expect_order(LOOM_SCHED_1F1B, 4, 8, 1, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
    expect_order(LOOM_SCHED_1F1B, 4, 2, 1, 0, "F0 F1 B0 B1");
    /* ZB-H1: rank r defers r weight gradients */
    expect_order(LOOM_SCHED_ZB, 4, 8, 1, 0,
                 "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
    expect_order(LOOM_SCHED_ZB, 4, 8, 1, 1,
                 "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
    expect_order(LOOM_SCHED_ZB, 4, 8, 1, 3,
                 "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
    /* ZB-H2: rank r warms up with 2(p-r)-1 forwards (the first micro-batch's
     * round trip), then B first, F while fewer than 2p-1 sets live, else W */
    expect_order(LOOM_SCHED_ZBH2, 4, 8, 1, 0,
                 "F0 F1 F2 F3 F4 F5 F6 B0 W0 B1 F7 B2 W1 B3 W2 B4 W3 B5 W4 B6 W5 W6 B7 W7");
    expect_order(LOOM_SCHED_ZBH2, 4, 8, 1, 2,
                 "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 W0 B5 F7 B6 W1 W2 B7 W3 W4 W5 W6 W7");
    /* ZB-V pp=2: stages 0 1 2 3 on ranks 0 1 1 0; rank 0 runs chunk 0 until
     * micro-batch 0 comes back for its chunk 1 (the last stage) */
    expect_order(LOOM_SCHED_ZBV, 2, 4, 2, 0,
                 "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B0.0 B1.1 W0.0 F3.0 B1.0 W1.1 F2.1 B2.1 W1.0 W2.1 B2.0 "
                 "W2.0 F3.1 B3.1 W3.1 B3.0 W3.0");
    /* DualPipeV: an F of one chunk paired with the B (and W) of the other */
    expect_order(LOOM_SCHED_DUALPIPEV, 2, 4, 2, 1,
                 "F0.0 F0.1 F1.0 F1.1 F2.0 B0.1 F2.1 B0.0 W0.0 F3.0 B1.1 W1.1 F3.1 B1.0 W1.0 B2.1 B2.0 B3.1 "
                 "B3.0 W0.1 W2.1 W2.0 W3.1 W3.0");
    /* interleaved pp=2 m=4 v=2: groups of 2 micro-batches, chunk 0 then 1;
     * rank 0 warms up with 2*(2-0-1) + 1*2 = 4 forwards, rank 1 with 2 */
    expect_order(LOOM_SCHED_INTERLEAVED, 2, 4, 2, 0,
                 "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
    expect_order(LOOM_SCHED_INTERLEAVED, 2, 4, 2, 1,
                 "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

/* The whole list of 1f1b pp=2 m=2, messages included. */
static void test_message_placement(void) {
    loom_schedule *s = NULL;
    if (loom_schedule_build(LOOM_SCHED_1F1B, 2, 2, 1, &s) != LOOM_OK) {
        CHECK(0, "build: %s", loom_errmsg());
        return;
    }
    const loom_pp_action r0[] = {
        {LOOM_PP_F, 0, 0, -1},        {LOOM_PP_SEND_ACT, 0, 0, 1},  {LOOM_PP_F, 1, 0, -1},
        {LOOM_PP_SEND_ACT, 1, 0, 1},  {LOOM_PP_RECV_GRAD, 0, 0, 1}, {LOOM_PP_B, 0, 0, -1},
        {LOOM_PP_RECV_GRAD, 1, 0, 1}, {LOOM_PP_B, 1, 0, -1},        {LOOM_PP_OPT_STEP, -1, -1, -1}};
    const loom_pp_action r1[] = {
        {LOOM_PP_RECV_ACT, 0, 0, 0},  {LOOM_PP_F, 0, 0, -1},        {LOOM_PP_B, 0, 0, -1},
        {LOOM_PP_SEND_GRAD, 0, 0, 0}, {LOOM_PP_RECV_ACT, 1, 0, 0},  {LOOM_PP_F, 1, 0, -1},
        {LOOM_PP_B, 1, 0, -1},        {LOOM_PP_SEND_GRAD, 1, 0, 0}, {LOOM_PP_OPT_STEP, -1, -1, -1}};
    int n0, n1;
    const loom_pp_action *a0 = loom_schedule_rank(s, 0, &n0), *a1 = loom_schedule_rank(s, 1, &n1);
    CHECK(n0 == 9 && memcmp(a0, r0, sizeof r0) == 0, "rank 0 list differs (%d actions)", n0);
    CHECK(n1 == 9 && memcmp(a1, r1, sizeof r1) == 0, "rank 1 list differs (%d actions)", n1);
    char buf[96];
    loom_pp_action_format(&a0[4], 1, buf, sizeof buf);
    CHECK(strcmp(buf, "RECV_GRAD mb 0 chunk 0 from rank 1") == 0, "format '%s'", buf);
    loom_pp_action_format(&a1[3], 1, buf, sizeof buf);
    CHECK(strcmp(buf, "SEND_GRAD mb 0 chunk 0 -> rank 0") == 0, "format '%s'", buf);
    loom_schedule_free(s);

    /* pp=1, v=2: the activation goes from chunk 0 to chunk 1 of the same rank,
     * a message to self */
    CHECK(loom_schedule_build(LOOM_SCHED_INTERLEAVED, 1, 2, 2, &s) == LOOM_OK, "pp=1 v=2: %s", loom_errmsg());
    if (s) {
        int n;
        const loom_pp_action *a = loom_schedule_rank(s, 0, &n);
        CHECK(a[1].kind == LOOM_PP_SEND_ACT && a[1].peer == 0, "pp=1 v=2 sends to itself");
        loom_schedule_free(s);
    }
}

/* ---- corrupted lists --------------------------------------------------------- */

/* A deep copy of s with room for `extra` more actions, to edit. */
static loom_schedule *clone(const loom_schedule *s, int extra) {
    loom_schedule *c = malloc(sizeof *c);
    *c = *s;
    c->offset = malloc((size_t)(s->pp + 1) * sizeof *c->offset);
    c->actions = malloc((size_t)(s->n_total + extra) * sizeof *c->actions);
    memcpy(c->offset, s->offset, (size_t)(s->pp + 1) * sizeof *c->offset);
    memcpy(c->actions, s->actions, (size_t)s->n_total * sizeof *c->actions);
    return c;
}

static loom_schedule *fresh(loom_sched_kind k, int p, int m, int v) {
    loom_schedule *s = NULL;
    if (loom_schedule_build(k, p, m, v, &s) != LOOM_OK) return NULL;
    loom_schedule *c = clone(s, 8);
    loom_schedule_free(s);
    return c;
}

static loom_pp_action *at(loom_schedule *s, int r, int i) { return &s->actions[s->offset[r] + i]; }

/* Index in rank r's list of (kind, mb, chunk), or -1. */
static int find(const loom_schedule *s, int r, loom_pp_kind k, int mb, int chunk) {
    int n;
    const loom_pp_action *a = loom_schedule_rank(s, r, &n);
    for (int i = 0; i < n; i++)
        if (a[i].kind == k && a[i].mb == mb && a[i].chunk == chunk) return i;
    return -1;
}

static void remove_at(loom_schedule *s, int r, int i) {
    const int f = s->offset[r] + i;
    memmove(&s->actions[f], &s->actions[f + 1], (size_t)(s->n_total - f - 1) * sizeof *s->actions);
    for (int q = r + 1; q <= s->pp; q++) s->offset[q]--;
    s->n_total--;
}

static void insert_at(loom_schedule *s, int r, int i, loom_pp_action a) {
    const int f = s->offset[r] + i;
    memmove(&s->actions[f + 1], &s->actions[f], (size_t)(s->n_total - f) * sizeof *s->actions);
    s->actions[f] = a;
    for (int q = r + 1; q <= s->pp; q++) s->offset[q]++;
    s->n_total++;
}

/* Move len actions starting at i of rank r so they start at j (< i). */
static void move_block(loom_schedule *s, int r, int i, int len, int j) {
    for (int k = 0; k < len; k++) {
        loom_pp_action a = *at(s, r, i + k);
        remove_at(s, r, i + k);
        insert_at(s, r, j + k, a);
    }
}

static void expect_reject(loom_schedule *s, const char *what, const char *msg) {
    if (!s) {
        CHECK(0, "%s: could not build", what);
        return;
    }
    loom_status st = loom_schedule_validate(s);
    CHECK(st == LOOM_EDATA, "%s: accepted (status %d)", what, (int)st);
    CHECK(strstr(loom_errmsg(), msg) != NULL, "%s: message '%s' lacks '%s'", what, loom_errmsg(), msg);
    free(s->offset);
    free(s->actions);
    free(s);
}

static void test_rejects(void) {
    loom_schedule *s;

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    remove_at(s, 1, find(s, 1, LOOM_PP_RECV_ACT, 2, 0));
    expect_reject(s, "dropped RECV_ACT",
                  "rank 1 action 6 (F2): its input was not received (no RECV_ACT right before it)");

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    remove_at(s, 2, find(s, 2, LOOM_PP_RECV_GRAD, 5, 0));
    expect_reject(s, "dropped RECV_GRAD", "(B5): its output gradient was not received");

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    remove_at(s, 0, find(s, 0, LOOM_PP_SEND_ACT, 1, 0));
    expect_reject(s, "dropped SEND_ACT", "rank 0 action 2 (F1): its output is not sent on");

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    {
        const int i = find(s, 2, LOOM_PP_RECV_ACT, 3, 0);
        loom_pp_action t = *at(s, 2, i);
        *at(s, 2, i) = *at(s, 2, i + 1);
        *at(s, 2, i + 1) = t;
    }
    expect_reject(s, "swapped RECV_ACT and F", "(F3): its input was not received");

    /* a cycle: rank 0 runs B0 before sending F1's output, rank 1 wants F1's
     * input before it sends B0's gradient */
    s = fresh(LOOM_SCHED_1F1B, 2, 2, 1);
    move_block(s, 0, find(s, 0, LOOM_PP_RECV_GRAD, 0, 0), 2, find(s, 0, LOOM_PP_F, 1, 0));
    move_block(s, 1, find(s, 1, LOOM_PP_RECV_ACT, 1, 0), 2, find(s, 1, LOOM_PP_B, 0, 0));
    expect_reject(s, "swapped groups (B cycle)",
                  "deadlock: rank 0 waits at action 2 (RECV_GRAD mb 0 chunk 0 from rank 1); "
                  "rank 1 waits at action 2 (RECV_ACT mb 1 chunk 0 from rank 0)");

    /* interleaved: rank 0 wants chunk 1's input before it ran chunk 0 */
    s = fresh(LOOM_SCHED_INTERLEAVED, 2, 2, 2);
    move_block(s, 0, find(s, 0, LOOM_PP_RECV_ACT, 0, 1), 3, 0);
    expect_reject(s, "chunk 1 before chunk 0",
                  "deadlock: rank 0 waits at action 0 (RECV_ACT mb 0 chunk 1 from rank 1); "
                  "rank 1 waits at action 0 (RECV_ACT mb 0 chunk 0 from rank 0)");

    s = fresh(LOOM_SCHED_GPIPE, 1, 2, 1);
    insert_at(s, 0, 1, (loom_pp_action){LOOM_PP_F, 0, 0, -1});
    expect_reject(s, "duplicated F", "rank 0 action 1 (F0): a second F of micro-batch 0 stage 0");

    s = fresh(LOOM_SCHED_GPIPE, 1, 1, 1);
    {
        loom_pp_action t = *at(s, 0, 0);
        *at(s, 0, 0) = *at(s, 0, 1);
        *at(s, 0, 1) = t;
    }
    expect_reject(s, "B before F", "rank 0 action 0 (B0): runs before its F");

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    at(s, 1, find(s, 1, LOOM_PP_SEND_ACT, 0, 0))->peer = 3;
    expect_reject(s, "wrong peer", "peer must be rank 2, the owner of stage 2");

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    at(s, 3, find(s, 3, LOOM_PP_F, 6, 0))->mb = 8;
    expect_reject(s, "mb out of range", "micro-batch 8 out of range 0..7");

    s = fresh(LOOM_SCHED_1F1B, 4, 8, 1);
    at(s, 3, 0)->kind = (loom_pp_kind)42;
    expect_reject(s, "unknown kind", "rank 3 action 0: unknown kind 42");

    s = fresh(LOOM_SCHED_1F1B, 2, 2, 1);
    remove_at(s, 1, s->offset[2] - s->offset[1] - 1);
    expect_reject(s, "no OPT_STEP", "rank 1: the list does not end with OPT_STEP");

    s = fresh(LOOM_SCHED_1F1B, 2, 2, 1);
    insert_at(s, 0, 0, (loom_pp_action){LOOM_PP_OPT_STEP, -1, -1, -1});
    expect_reject(s, "OPT_STEP first", "rank 0 action 0 (OPT_STEP): OPT_STEP must be the last action");

    s = fresh(LOOM_SCHED_1F1B, 2, 2, 1);
    insert_at(s, 1, find(s, 1, LOOM_PP_B, 0, 0) + 2, (loom_pp_action){LOOM_PP_W, 0, 0, -1});
    expect_reject(s, "W without split", "W in a schedule that does not split the backward");

    s = fresh(LOOM_SCHED_ZB, 4, 8, 1);
    remove_at(s, 2, find(s, 2, LOOM_PP_W, 5, 0));
    expect_reject(s, "dropped W", "micro-batch 5 stage 2 (rank 2 chunk 0) never runs W");

    s = fresh(LOOM_SCHED_ZB, 4, 8, 1);
    {
        const int w = find(s, 3, LOOM_PP_W, 0, 0), b = find(s, 3, LOOM_PP_B, 0, 0);
        move_block(s, 3, w, 1, b);
    }
    expect_reject(s, "W before its B", "rank 3 action 2 (W0): runs before its B");

    s = fresh(LOOM_SCHED_1F1B, 3, 3, 1);
    remove_at(s, 2, find(s, 2, LOOM_PP_B, 1, 0));
    remove_at(s, 2, find(s, 2, LOOM_PP_SEND_GRAD, 1, 0));
    expect_reject(s, "dropped B and its send",
                  "deadlock: rank 0 waits at action 8 (RECV_GRAD mb 1 chunk 0 from rank 1); "
                  "rank 1 waits at action 12 (RECV_GRAD mb 1 chunk 0 from rank 2)");

    /* not everything unusual is wrong: 1f1b with no warm-up on rank 0 still runs */
    s = fresh(LOOM_SCHED_1F1B, 2, 2, 1);
    move_block(s, 0, find(s, 0, LOOM_PP_RECV_GRAD, 0, 0), 2, find(s, 0, LOOM_PP_F, 1, 0));
    CHECK(loom_schedule_validate(s) == LOOM_OK, "no warm-up on rank 0: %s", loom_errmsg());
    free(s->offset);
    free(s->actions);
    free(s);
}

int main(void) {
    test_parse_and_check();
    test_grid();
    test_hand_written();
    test_message_placement();
    test_rejects();
    return check_done();
}
