/* test_partition.c - the stage partitioner: layout checks and their
 * messages; the balanced split against a brute-force search over every
 * split of small models (least max stage cost, then least sum of squares);
 * hand-checked splits; --stage-layers (parsed into the layout, checked by
 * the layout validator) and its messages. Pure.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "loom/pipeline.h"

static void test_check(void) {
    CHECK(loom_layout_check_stages(8, 4, 2) == LOOM_OK, "8 layers on 8 stages: %s", loom_errmsg());
    CHECK(loom_layout_check_stages(6, 4, 2) == LOOM_EUSAGE, "6 layers on 8 stages accepted");
    CHECK(strstr(loom_errmsg(), "pp=4 x v=2 = 8 virtual stages but the model has 6 layers") != NULL,
          "msg '%s'", loom_errmsg());
    CHECK(loom_layout_check_stages(0, 1, 1) == LOOM_EUSAGE && strstr(loom_errmsg(), "the model has 0 layers"),
          "0 layers");
    CHECK(loom_layout_check_stages(8, 0, 1) == LOOM_EUSAGE && strstr(loom_errmsg(), "pp=0 x v=1"), "pp 0: %s",
          loom_errmsg());
    int counts[8];
    CHECK(loom_partition_balance(8, 2, 2, -1, 0, counts) == LOOM_EUSAGE &&
              strstr(loom_errmsg(), "embedding cost -1"),
          "negative cost: %s", loom_errmsg());
    CHECK(loom_partition_balance(8, 2, 2, 0, NAN, counts) == LOOM_EUSAGE, "NaN head cost accepted");
}

/* Brute force: the least (max cost, sum of squared costs) over every split of
 * n blocks into S runs of at least one. */
static void best_split(int n, int S, double e, double h, int *cnt, int s, int left, double *best_max,
                       double *best_sq) {
    if (s == S - 1) {
        cnt[s] = left;
        double mx = 0, sq = 0;
        for (int i = 0; i < S; i++) {
            const double c = loom_partition_stage_cost(cnt, S, i, e, h);
            mx = c > mx ? c : mx;
            sq += c * c;
        }
        if (mx < *best_max - 1e-9 || (fabs(mx - *best_max) < 1e-9 && sq < *best_sq - 1e-9))
            *best_max = mx, *best_sq = sq;
        return;
    }
    for (int k = 1; k <= left - (S - 1 - s); k++) {
        cnt[s] = k;
        best_split(n, S, e, h, cnt, s + 1, left - k, best_max, best_sq);
    }
    (void)n;
}

static void test_balance_vs_brute_force(void) {
    const double costs[][2] = {{0, 0}, {1, 1}, {0.5, 2.5}, {3, 0}, {0, 5.5}, {2, 2}};
    for (size_t ci = 0; ci < sizeof costs / sizeof costs[0]; ci++)
        for (int pp = 1; pp <= 4; pp++)
            for (int v = 1; v <= 2; v++)
                for (int n = pp * v; n <= 12; n++) {
                    const int S = pp * v;
                    const double e = costs[ci][0], h = costs[ci][1];
                    int counts[8], cnt[8];
                    if (loom_partition_balance(n, pp, v, e, h, counts) != LOOM_OK) {
                        CHECK(0, "n=%d S=%d: %s", n, S, loom_errmsg());
                        continue;
                    }
                    double mx = 0, sq = 0, bmax = INFINITY, bsq = INFINITY;
                    int sum = 0, ok = 1;
                    for (int s = 0; s < S; s++) {
                        const double c = loom_partition_stage_cost(counts, S, s, e, h);
                        mx = c > mx ? c : mx;
                        sq += c * c;
                        sum += counts[s];
                        ok &= counts[s] >= 1;
                    }
                    best_split(n, S, e, h, cnt, 0, n, &bmax, &bsq);
                    CHECK(ok && sum == n, "n=%d S=%d: counts do not cover the layers", n, S);
                    CHECK(fabs(mx - bmax) < 1e-9 && fabs(sq - bsq) < 1e-9,
                          "n=%d pp=%d v=%d e=%g h=%g: max %g sq %g, best %g %g", n, pp, v, e, h, mx, sq, bmax,
                          bsq);
                }
}

static void expect_split(int n, int pp, int v, double e, double h, const char *want) {
    int counts[64];
    char got[256] = "";
    size_t len = 0;
    if (loom_partition_balance(n, pp, v, e, h, counts) != LOOM_OK) {
        CHECK(0, "balance: %s", loom_errmsg());
        return;
    }
    for (int s = 0; s < pp * v; s++)
        len += (size_t)snprintf(got + len, sizeof got - len, "%s%d", s ? "," : "", counts[s]);
    CHECK(strcmp(got, want) == 0, "n=%d pp=%d v=%d e=%g h=%g: %s, want %s", n, pp, v, e, h, got, want);
}

static void test_balance_examples(void) {
    expect_split(12, 4, 1, 0, 0, "3,3,3,3");
    expect_split(10, 4, 1, 0, 0, "3,3,2,2"); /* earlier stages take the extra blocks */
    expect_split(12, 2, 2, 0, 2, "4,4,3,1"); /* head worth 2 blocks: costs 4,4,3,3 */
    expect_split(12, 4, 1, 2, 2, "2,4,4,2"); /* costs 4,4,4,4 */
    expect_split(8, 4, 2, 10, 10, "1,1,1,1,1,1,1,1");
    /* GPT-2 small: 12 blocks; its LM head (V=50257 x C=768) costs about 5.5 blocks */
    expect_split(12, 4, 1, 0, 5.5, "4,4,3,1");
    expect_split(48, 8, 1, 0, 0, "6,6,6,6,6,6,6,6");
}

/* --stage-layers as the simulator takes it: parsed where the flag enters,
 * then matched to the model and pp x v by the validator. */
static loom_status stage_layers(const char *in, int n_layer, int pp, int v, int *counts) {
    loom_layout l;
    loom_layout_default(&l);
    l.pp = pp;
    l.virtual_stages = v;
    l.micro_batches = pp;
    l.schedule = v > 1 ? LOOM_SCHED_INTERLEAVED : LOOM_SCHED_1F1B;
    LOOM_TRY(loom_layout_parse_stage_layers(in, &l));
    const loom_layout_model m = {.name = "test", .n_layer = n_layer};
    const loom_layout_job j = {.purpose = LOOM_LAYOUT_FOR_SIM};
    LOOM_TRY(loom_layout_validate(&l, &m, &j));
    memcpy(counts, l.stage_layers, (size_t)l.n_stage_layers * sizeof *counts);
    return LOOM_OK;
}

static void test_parse(void) {
    int counts[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    CHECK(stage_layers("3,3,2,2", 10, 4, 1, counts) == LOOM_OK, "parse: %s", loom_errmsg());
    CHECK(counts[0] == 3 && counts[1] == 3 && counts[2] == 2 && counts[3] == 2, "parsed counts");
    CHECK(stage_layers(" 1, 2 ,3,4 ", 10, 2, 2, counts) == LOOM_OK && counts[3] == 4, "spaces: %s",
          loom_errmsg());
    loom_layout l;
    loom_layout_default(&l);
    CHECK(loom_layout_parse_stage_layers("1,2", &l) == LOOM_OK && l.n_stage_layers == 2, "two entries");
    CHECK(loom_layout_parse_stage_layers("", &l) == LOOM_OK && l.n_stage_layers == 0, "'' clears the list");
    const struct {
        const char *in;
        int n, pp, v;
        const char *msg;
    } bad[] = {
        {"3,3,2,1", 8, 4, 1, "--stage-layers sums to 9, model has 8 layers"},
        {"3,3,2", 8, 4, 1, "--stage-layers has 3 entries, need pp=4 x v=1 = 4"},
        {"1,1,1,1,1,1,1,1,1", 9, 4, 2, "--stage-layers has 9 entries, need pp=4 x v=2 = 8"},
        {"3,0,3,2", 8, 4, 1,
         "--stage-layers entry 1 (virtual stage 1) is 0: every virtual stage needs at least one layer"},
        {"3,x,3,2", 8, 4, 1, "--stage-layers: 'x' is not a positive integer"},
        {"3,-1,3,2", 8, 4, 1, "--stage-layers: '-1' is not a positive integer"},
        {"3,,3,2", 8, 4, 1, "--stage-layers: '' is not a positive integer"},
        {"3,3,2,2,", 10, 4, 1, "--stage-layers: '' is not a positive integer"},
        {",", 8, 4, 1, "--stage-layers: '' is not a positive integer"},
        {"3 3,2", 8, 4, 1, "--stage-layers: '3 3' is not a positive integer"},
        {"99999999999,1", 8, 2, 1, "'99999999999' is not a positive integer"},
        {"1,1,1,1,1,1", 6, 4, 2, "pp=4 x v=2 = 8 virtual stages but the model has 6 layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int before[8] = {7, 7, 7, 7, 7, 7, 7, 7}, c[8];
        memcpy(c, before, sizeof c);
        CHECK(stage_layers(bad[i].in, bad[i].n, bad[i].pp, bad[i].v, c) == LOOM_EUSAGE, "'%s' accepted",
              bad[i].in);
        CHECK(strstr(loom_errmsg(), bad[i].msg) != NULL, "'%s': message '%s' lacks '%s'", bad[i].in,
              loom_errmsg(), bad[i].msg);
        CHECK(memcmp(c, before, sizeof c) == 0, "'%s' changed the counts", bad[i].in);
    }
    char many[2 * LOOM_LAYOUT_MAX_STAGE_LAYERS + 8] = "1";
    for (int i = 1; i <= LOOM_LAYOUT_MAX_STAGE_LAYERS; i++) strcat(many, ",1");
    loom_layout_default(&l);
    CHECK(loom_layout_parse_stage_layers(many, &l) == LOOM_EUSAGE &&
              strstr(loom_errmsg(), "more than 512 entries") && l.n_stage_layers == 0,
          "513 entries: %s", loom_errmsg());
}

int main(void) {
    test_check();
    test_balance_vs_brute_force();
    test_balance_examples();
    test_parse();
    return check_done();
}
