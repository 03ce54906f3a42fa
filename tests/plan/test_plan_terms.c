/* test_plan_terms.c - terms of the planner's cost model against hand counts
 * (include/loom/plan.h, docs/planning.md), pure:
 *  - DP traffic counts a head tied to the embedding once at pp = 1: the
 *    all-reduce of a dp-only layout moves 2 bytes x the model's parameters
 *    (2 Psi), the same matrix memory counts once;
 *  - sequence parallelism moves TP's bytes: on GPU stacks its backward
 *    re-gathers hide behind the input-gradient GEMMs, so its exposed time
 *    equals TP's all-reduces'; loom's own stack (fp32) gathers before it
 *    computes and pays them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "loom/plan.h"

static loom_plan_cluster preset(const char *name) {
    loom_plan_cluster c;
    loom_status st = loom_plan_cluster_load(name, &c);
    CHECK(st == LOOM_OK, "%s preset: %s", name, loom_errmsg());
    return c;
}

static loom_plan_result eval_layout(const loom_plan_model *m, const loom_plan_cluster *c,
                                    const loom_plan_job *j, const char *layout) {
    loom_plan_layout l;
    loom_plan_result r;
    memset(&r, 0, sizeof r);
    CHECK(loom_plan_layout_parse(layout, j, &l) == LOOM_OK, "parse %s: %s", layout, loom_errmsg());
    CHECK(loom_plan_evaluate(m, c, j, &l, 1, &r) == LOOM_OK, "evaluate %s: %s", layout, loom_errmsg());
    CHECK(r.feasible, "%s feasible (%s)", layout, r.reason);
    return r;
}

/* Tied head at pp = 1 (the bug of issue 34: 2.41 Psi instead of 2 Psi). */
static void test_tied_head_dp_bytes(void) {
    const char *models[] = {"gpt2-small", "gpt2-xl"};
    loom_plan_cluster c = preset("dgx-h100");
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        loom_plan_model m;
        CHECK(loom_plan_model_builtin(models[i], &m) == LOOM_OK && m.tied, "%s is tied", models[i]);
        /* every parameter on every rank; the all-reduce after the backward */
        loom_plan_job j = {.batch = 8, .seq = 1024, .bf16 = 1, .gpus = 8, .no_dp_overlap = 1};
        const loom_plan_result r = eval_layout(&m, &c, &j, "dp=8,mbs=1,m=1");
        const double P = loom_plan_model_params(&m, NULL);
        /* 2 bytes per parameter; the planner also charges the (empty)
         * expert group's latency */
        const double want = loom_plan_coll_time(&c, LOOM_COLL_ALLREDUCE, 8, 0, 2 * P) +
                            loom_plan_coll_time(&c, LOOM_COLL_ALLREDUCE, 8, 0, 0);
        CHECK(fabs(r.t_dp / want - 1) < 1e-9, "%s: DP all-reduce %.6g s == 2 bytes x %.4g params: %.6g s",
              models[i], r.t_dp, P, want);
        const double state = r.mem_params + r.mem_grads + r.mem_opt;
        CHECK(fabs(state / (16 * P) - 1) < 1e-9, "%s: model state %.4g GB == 16 x params %.4g GB", models[i],
              state / 1e9, 16 * P / 1e9);
    }
}

/* SP's exposed time equals TP's on GPU stacks; loom's fp32 stack pays its
 * two blocking backward re-gathers per layer (5/4 of TP's). */
static void test_sp_equals_tp(void) {
    loom_plan_cluster c = preset("dgx-h100");
    loom_plan_model m;
    loom_plan_model_builtin("llama3-8b", &m);
    loom_plan_job j = {.batch = 8, .seq = 8192, .bf16 = 1, .gpus = 8, .flash = 1};
    const loom_plan_result tp = eval_layout(&m, &c, &j, "dp=2,tp=4,pp=1,mbs=1,m=4,recompute=full,sp=0");
    const loom_plan_result sp = eval_layout(&m, &c, &j, "dp=2,tp=4,pp=1,mbs=1,m=4,recompute=full,sp=1");
    CHECK(fabs(sp.t_tp / tp.t_tp - 1) < 1e-9, "bf16: SP exposed %.6g s == TP's %.6g s", sp.t_tp, tp.t_tp);
    loom_plan_model g;
    loom_plan_model_builtin("gpt2-small", &g);
    loom_plan_job jf = {.batch = 16, .seq = 1024, .bf16 = 0, .gpus = 2};
    const loom_plan_result tf = eval_layout(&g, &c, &jf, "dp=1,tp=2,mbs=4,m=4,recompute=none,sp=0");
    const loom_plan_result sf = eval_layout(&g, &c, &jf, "dp=1,tp=2,mbs=4,m=4,recompute=none,sp=1");
    CHECK(fabs(sf.t_tp / tf.t_tp - 1.25) < 1e-9, "fp32 (loom): SP %.6g s == 5/4 x TP's %.6g s", sf.t_tp,
          tf.t_tp);
}

int main(void) {
    test_tied_head_dp_bytes();
    test_sp_equals_tp();
    return check_done();
}
