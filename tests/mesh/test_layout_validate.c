/* test_layout_validate.c - loom_layout_validate (src/mesh/layout_check.c):
 * a table of (layout, model, world, batch, seq, device, purpose) -> OK or the
 * message it must give, with at least one row per rule and per use (train,
 * inference, the planner's training and serving layouts, the simulator),
 * and rows where the uses differ on purpose. Every divisibility message
 * names both numbers. Then the sections other modules call directly. Pure:
 * no MPI.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/layout.h"

/* ---- models --------------------------------------------------------------- */

static const loom_layout_model TINY = {"tiny", 2, 4, 256, 128, 0, 0}; /* loom's tiny */
static const loom_layout_model TINY4 = {"tiny4", 4, 4, 256, 128, 0, 0};
static const loom_layout_model MOE = {"moe", 2, 4, 96, 128, 4, 0};    /* 4 experts of hidden 96 */
static const loom_layout_model ODD_FFN = {"odd", 2, 4, 6, 128, 4, 0}; /* experts of hidden 6 */
static const loom_layout_model NOLAYER = {"empty", 0, 4, 256, 128, 0, 0};
static const loom_layout_model DEEP = {"deep", 300, 4, 256, 128, 0, 0};
static const loom_layout_model LLAMA = {"llama3-70b", 80, 64, 28672, 8192, 0, 0};
static const loom_layout_model FFN100 = {"ffn100", 80, 64, 100, 8192, 0, 0};
static const loom_layout_model MIXTRAL = {"mixtral-8x7b", 32, 32, 14336, 32768, 8, 0};
static const loom_layout_model HUGE = {"huge", 5000, 64, 8192, 8192, 0, 0};

/* ---- devices -------------------------------------------------------------- */

static const loom_layout_device CUDA = {"cuda", "staged", 0};    /* host-staged groups */
static const loom_layout_device CUDA_NCCL = {"cuda", "nccl", 1}; /* the backend's own library */
static const loom_layout_device CPU = {"cpu", "mpi", 0};

/* ---- a layout from "key=value,..." on top of loom_layout_default ----------- */

static int word_index(const char *const *words, const char *v) {
    for (int i = 0; words[i]; i++)
        if (strcmp(words[i], v) == 0) return i;
    return atoi(v); /* a number: out-of-range enums */
}

static void set_key(loom_layout *l, const char *k, const char *v) {
    const struct {
        const char *key;
        int *dst;
    } ints[] = {{"dp", &l->dp},
                {"tp", &l->tp},
                {"pp", &l->pp},
                {"cp", &l->cp},
                {"ep", &l->ep},
                {"zero", &l->zero},
                {"sp", &l->sp},
                {"v", &l->virtual_stages},
                {"m", &l->micro_batches},
                {"accum", &l->grad_accum},
                {"mbs", &l->micro_batch_size}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (strcmp(k, ints[i].key) == 0) {
            *ints[i].dst = atoi(v);
            return;
        }
    if (strcmp(k, "schedule") == 0) l->schedule = (loom_sched_kind)word_index(loom_schedule_names, v);
    else if (strcmp(k, "cp_impl") == 0) l->cp_impl = (loom_cp_impl)word_index(loom_cp_impl_names, v);
    else if (strcmp(k, "recompute") == 0)
        l->recompute = (loom_recompute_mode)word_index(loom_recompute_names, v);
    else if (strcmp(k, "precision") == 0) l->precision = (loom_precision)word_index(loom_precision_names, v);
    else if (strcmp(k, "comm") == 0) l->comm_precision = (loom_precision)word_index(loom_precision_names, v);
    else if (strcmp(k, "order") == 0) { /* "pp.tp.dp.cp", or a number for entry 0 */ char buf[32];
        snprintf(buf, sizeof buf, "%s", v);
        int i = 0;
        for (char *s = strtok(buf, "."); s && i < LOOM_AXIS_COUNT; s = strtok(NULL, "."))
            l->order[i++] = (loom_axis)word_index(loom_axis_names, s);
    } else if (strcmp(k, "stages") == 0) { /* "3.3.2" */
        char buf[64];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *p = buf; *p; p++)
            if (*p == '.') *p = ',';
        CHECK(loom_layout_parse_stage_layers(buf, l) == LOOM_OK, "stages %s: %s", v, loom_errmsg());
    } else {
        CHECK(0, "unknown key %s in a test layout", k);
    }
}

static loom_layout layout_of(const char *text) {
    loom_layout l;
    loom_layout_default(&l);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = '\0';
        set_key(&l, kv, eq + 1);
    }
    return l;
}

/* ---- the table ------------------------------------------------------------ */

enum {
    TRAIN = LOOM_LAYOUT_FOR_TRAIN,
    INFER = LOOM_LAYOUT_FOR_INFER,
    PLAN = LOOM_LAYOUT_FOR_PLAN_TRAIN,
    SERVE = LOOM_LAYOUT_FOR_PLAN_SERVE,
    SIM = LOOM_LAYOUT_FOR_SIM
};

typedef struct row {
    int purpose;
    const loom_layout_model *model;
    int world, batch, seq;
    const loom_layout_device *dev;
    const char *layout;
    const char *want; /* NULL: accepted; else a part of the message */
} row;

static const row ROWS[] = {
    /* accepted */
    {TRAIN, &TINY, 1, 8, 32, NULL, "", NULL},
    {TRAIN, &TINY4, 8, 8, 32, NULL, "dp=2,tp=2,pp=2,sp=1,zero=1,schedule=zb,m=4", NULL},
    {TRAIN, &TINY4, 8, 8, 32, NULL, "tp=2,cp=2,pp=2,schedule=interleaved,v=2,m=4,stages=1.1.1.1", NULL},
    {TRAIN, &MOE, 4, 8, 32, NULL, "dp=2,cp=2,ep=4,cp_impl=ulysses,zero=3,precision=bf16,comm=bf16", NULL},
    {TRAIN, &TINY, 1, 8, 32, NULL, "zero=1", NULL},                        /* the planner refuses it */
    {TRAIN, &TINY, 1, 8, 32, NULL, "pp=1,v=2,schedule=interleaved", NULL}, /* the planner refuses it */
    {TRAIN, &TINY, 1, 8, 32, NULL, "schedule=zb,recompute=full", NULL}, /* no pipeline: no split backward */
    {TRAIN, &TINY, 1, 8, 32, NULL, "pp=1,schedule=gpipe", NULL},        /* no pipeline: no schedule */
    {TRAIN, &TINY, 1, 8, 32, &CUDA, "", NULL},
    {TRAIN, &TINY4, 8, 8, 32, &CUDA, "dp=2,tp=2,pp=2,sp=1,zero=1,schedule=zb,m=4", NULL}, /* staged: all */
    {TRAIN, &TINY, 2, 8, 32, &CUDA, "cp=2,precision=bf16,comm=bf16", NULL},
    {TRAIN, &MOE, 4, 8, 32, &CUDA_NCCL, "dp=2,cp=2,ep=4,cp_impl=ulysses,zero=3,precision=bf16,comm=bf16",
     NULL},
    {TRAIN, &TINY4, 8, 8, 32, &CPU, "dp=2,tp=2,pp=2,sp=1,zero=1,schedule=zb,m=4", NULL},
    /* enums */
    {TRAIN, &TINY, 1, 8, 32, NULL, "schedule=7", "layout schedule 7: out of range"},
    {SIM, NULL, 0, 0, 0, NULL, "recompute=3", "layout recompute 3: out of range"},
    /* precisions */
    {TRAIN, &TINY, 2, 8, 32, NULL, "dp=2,comm=bf16", "--comm-precision bf16 needs --precision bf16"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "comm=bf16,precision=bf16", "--comm-precision bf16 with dp=1 cp=1 tp=1"},
    /* the mesh */
    {TRAIN, &TINY, 1, 8, 32, NULL, "dp=0", "dp=0: degrees must be >= 1"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "ep=-1", "ep=-1: degrees must be >= 1"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "order=tp.tp.dp.pp", "axis order names tp twice"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "order=9.cp.dp.pp", "axis order entry 0 is 9, not an axis"},
    {TRAIN, &TINY, 0, 8, 32, NULL, "", "the job has 0 ranks; it needs at least 1"},
    {TRAIN, &TINY, 4, 8, 32, NULL, "dp=2", "dp=2 x tp=1 x pp=1 x cp=1 = 2 ranks, but the job has 4 ranks"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "dp=2", "= 2 ranks, but the job has 1 rank"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "dp=1", "= 1 rank, but the job has 2 ranks"},
    {TRAIN, &TINY, 8, 8, 32, NULL, "dp=65536,tp=65536", "= more than 2147483647 ranks"},
    {TRAIN, &MOE, 4, 8, 32, NULL, "dp=4,ep=3", "ep=3 must divide dp*cp=4 (dp=4, cp=1)"},
    {PLAN, &MIXTRAL, 1024, 512, 4096, NULL, "dp=128,tp=8,ep=3,m=4", "ep=3 must divide dp*cp=128"},
    /* tensor parallelism */
    {TRAIN, &TINY, 3, 8, 32, NULL, "tp=3", "tp=3 does not divide n_head=4 of model tiny"},
    {TRAIN, &ODD_FFN, 4, 8, 32, NULL, "tp=4", "tp=4 does not divide ffn=6 (the experts' hidden size)"},
    {PLAN, &FFN100, 8, 8, 4096, NULL, "tp=8,m=1", "tp=8 does not divide ffn=100 (the MLP's hidden size)"},
    {TRAIN, &TINY, 2, 8, 15, NULL, "tp=2,sp=1", "--sp needs tp=2 to divide the sequence length --seq 15"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "sp=1", "--sp needs --tp > 1"},
    /* expert parallelism */
    {TRAIN, &TINY, 2, 8, 32, NULL, "dp=2,ep=2", "--ep 2 needs a Mixture-of-Experts model"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "dp=2,ep=2", "model tiny is dense (try tiny-moe)"},
    {TRAIN, &MOE, 3, 6, 32, NULL, "dp=3,ep=3", "--ep 3 does not divide num_local_experts=4 of model moe"},
    /* context parallelism */
    {TRAIN, &TINY, 4, 8, 12, NULL, "cp=4", "--seq 12: cp=4 needs a multiple of 2*cp=8"},
    {TRAIN, &TINY, 3, 8, 12, NULL, "cp=3,cp_impl=ulysses",
     "--cp-impl ulysses: cp=3 must divide the heads per tp rank, n_head=4 / tp=1 = 4"},
    {TRAIN, &TINY, 8, 8, 12, NULL, "tp=4,cp=2,sp=1",
     "--sp with cp=2: tp=4 must divide the 6 local rows (--seq 12"},
    /* the device's groups: NCCL's cannot pair a send with a receive yet */
    {TRAIN, &TINY4, 8, 8, 32, &CUDA_NCCL, "dp=2,tp=2,pp=2,sp=1,zero=1,schedule=zb,m=4",
     "--device cuda with nccl groups (LOOM_DEVICE_COMM=nccl) and pp=2: the pipeline's sends"},
    {TRAIN, &TINY, 2, 8, 32, &CUDA_NCCL, "cp=2", "and cp=2 ring: the ring's send and receive must progress"},
    /* the batch */
    {TRAIN, &TINY, 1, 0, 32, NULL, "", "--batch 0: must be >= 1"},
    {TRAIN, &TINY, 2, 3, 32, NULL, "dp=2", "dp=2 does not divide --batch 3"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "accum=0", "--grad-accum 0: must be >= 1"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "dp=2,accum=3",
     "--grad-accum 3 does not divide the 4 sequences per DP rank (--batch 8 / dp=2)"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "zero=4", "--zero 4: must be 0, 1, 2 or 3"},
    {TRAIN, &TINY, 1, 8, 0, NULL, "", "--seq 0: must be >= 1"},
    {TRAIN, &TINY, 1, 8, 256, NULL, "", "--seq 256 exceeds n_positions=128 of model tiny"},
    {TRAIN, &TINY, 1, 8, 32, NULL, "v=0", "--virtual-stages 0: must be >= 1"},
    /* the pipeline */
    {TRAIN, &DEEP, 1025, 1025, 32, NULL, "pp=1025", "--pp 1025: must be in 1..1024"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,m=70000", "--micro-batches 70000: must be in 1..65536"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,v=65,schedule=interleaved", "--virtual-stages 65: must be in 1..64"},
    {TRAIN, &TINY4, 2, 8, 32, NULL, "pp=2,v=2",
     "--virtual-stages 2: v > 1 only with interleaved, zbv or dualpipev (schedule 1f1b)"},
    {TRAIN, &TINY4, 2, 6, 32, NULL, "pp=2,v=2,schedule=interleaved,m=3",
     "interleaved needs --micro-batches divisible by pp=2, got 3"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,v=2,schedule=interleaved",
     "pp=2 x v=2 = 4 virtual stages but the model has 2 layers"},
    {TRAIN, &NOLAYER, 2, 8, 32, NULL, "pp=2", "the model has 0 layers: need at least 1"},
    {TRAIN, &TINY4, 2, 8, 32, NULL, "pp=2,stages=1.1.2", "--stage-layers has 3 entries, need pp=2 x v=1 = 2"},
    {TRAIN, &TINY4, 2, 8, 32, NULL, "pp=2,stages=2.3", "--stage-layers sums to 5, model has 4 layers"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,accum=2", "--grad-accum 2 with a pipeline: use --micro-batches"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,m=3",
     "--micro-batches 3 does not divide the 8 sequences per DP rank (--batch 8 / dp=1)"},
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,m=0", NULL},                        /* micro-batches 0: pp */
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,schedule=zb,recompute=full", NULL}, /* W recomputes too */
    {TRAIN, &TINY, 2, 8, 32, NULL, "pp=2,schedule=zb,recompute=selective", NULL},
    /* inference */
    {INFER, &TINY, 8, 0, 0, NULL, "dp=2,tp=2,pp=2", NULL},
    {INFER, &TINY, 2, 0, 0, NULL, "tp=2", NULL},
    {INFER, &TINY, 1, 0, 0, NULL, "tp=2", "= 2 ranks, but the job has 1 rank"},
    {INFER, &TINY, 2, 0, 0, NULL, "cp=2", "inference runs tp x pp x ep (x dp replicas); cp=2 must be 1"},
    {INFER, &MOE, 2, 0, 0, NULL, "dp=2,ep=2", NULL},
    {INFER, &TINY, 2, 0, 0, NULL, "dp=2,ep=2", "--ep 2 needs a Mixture-of-Experts model"},
    {INFER, &TINY, 3, 0, 0, NULL, "tp=3", "tp=3 does not divide n_head=4 of model tiny"},
    {INFER, &DEEP, 257, 0, 0, NULL, "pp=257", "inference: pp=257 stages, at most 256"},
    {INFER, &TINY, 4, 0, 0, NULL, "pp=4", "pp=4 x v=1 = 4 virtual stages but the model has 2 layers"},
    {INFER, &TINY, 2, 0, 0, NULL, "pp=2,schedule=zb,recompute=full,sp=1", NULL}, /* training fields unused */
    /* the planner: training layouts */
    {PLAN, &LLAMA, 256, 512, 4096, NULL, "dp=4,tp=8,pp=8,zero=1,sp=1,m=32,mbs=4,recompute=selective", NULL},
    {PLAN, &LLAMA, 1024, 512, 4004, NULL, "dp=32,tp=8,cp=4,m=16",
     "--seq 4004: cp=4 needs a multiple of 2*cp=8"},
    {PLAN, &MIXTRAL, 1024, 512, 4000, NULL, "dp=32,tp=8,cp=3,m=16",
     "= 768 ranks, but the job has 1024 ranks"},
    {PLAN, &LLAMA, 48, 512, 4096, NULL, "dp=16,tp=3,m=32",
     "tp=3 does not divide n_head=64 of model llama3-70b"},
    {PLAN, &LLAMA, 64, 100, 4096, NULL, "dp=8,tp=8,m=12", "dp=8 does not divide --batch 100"},
    {PLAN, &LLAMA, 1024, 512, 4096, NULL, "tp=8,pp=128,m=128",
     "pp=128 x v=1 = 128 virtual stages but the model has 80 layers"},
    {PLAN, &LLAMA, 1024, 512, 4096, NULL, "dp=64,tp=8,pp=2,schedule=interleaved,v=2,m=3,mbs=2",
     "mbs=2 x m=3 = 6, but a dp rank has 8 sequences (--batch 512 / dp=64)"},
    {PLAN, &LLAMA, 1024, 384, 4096, NULL, "dp=64,tp=8,pp=2,schedule=interleaved,v=2,m=3,mbs=2",
     "interleaved needs --micro-batches divisible by pp=2, got 3"},
    {PLAN, &LLAMA, 8, 8, 4096, NULL, "tp=8,zero=1,m=8", "zero=1 needs dp*cp > 1 (dp=1 x cp=1"},
    {PLAN, &LLAMA, 8, 8, 4096, NULL, "tp=8,v=2,schedule=interleaved,m=8", "pp=1: no pipeline schedule"},
    {PLAN, &LLAMA, 8, 8, 4096, NULL, "tp=8,schedule=zb,m=8", "pp=1: no pipeline schedule"},
    {PLAN, &LLAMA, 64, 64, 4096, NULL, "tp=8,pp=8,schedule=zb,recompute=full,m=64",
     NULL}, /* weighed, not refused */
    {PLAN, &LLAMA, 16, 16, 4096, NULL, "dp=2,tp=8,m=8", NULL},
    {PLAN, &LLAMA, 16, 16, 4096, NULL, "dp=2,tp=8,m=3,accum=3",
     "--grad-accum 3 does not divide the 8 sequences per DP rank"},
    {PLAN, &LLAMA, 8, 8, 100000, NULL, "tp=8,m=8", NULL}, /* no n_positions limit: other stacks */
    /* the planner: serving layouts */
    {SERVE, &LLAMA, 16, 64, 2048, NULL, "dp=2,tp=8,m=1", NULL},
    {SERVE, &MIXTRAL, 16, 64, 2048, NULL, "dp=2,tp=8,ep=2,m=1",
     NULL}, /* modelled, though loom serve has no ep */
    {SERVE, &LLAMA, 16, 64, 2048, NULL, "tp=8,cp=2,m=1", "serving layouts use dp, tp, pp, ep only (cp=2"},
    {SERVE, &LLAMA, 16, 64, 2048, NULL, "dp=2,tp=8,zero=1,m=1", "zero=1, m=1: need 1, 0, 1"},
    {SERVE, &LLAMA, 16, 64, 2048, NULL, "dp=2,tp=8,m=4", "m=4: need 1, 0, 1"},
    {SERVE, &HUGE, 2000, 64, 2048, NULL, "pp=2000,m=1", NULL}, /* beyond loom's own pp limit */
    {SERVE, &FFN100, 8, 64, 2048, NULL, "tp=8,m=1", "tp=8 does not divide ffn=100"},
    /* the simulator */
    {SIM, NULL, 0, 0, 0, NULL, "pp=4,m=8,schedule=zb", NULL},
    {SIM, NULL, 0, 0, 0, NULL, "pp=4,m=0", "--micro-batches 0: must be in 1..65536"},
    {SIM, NULL, 0, 0, 0, NULL, "pp=0,m=8", "--pp 0: must be in 1..1024"},
    {SIM, NULL, 0, 0, 0, NULL, "pp=2,m=3,v=2,schedule=zbv,recompute=full", NULL},
    {SIM, NULL, 0, 0, 0, NULL, "pp=4,m=8,stages=2.2.2.2", "--stage-layers needs --layers N"},
    {SIM, &TINY4, 0, 0, 0, NULL, "pp=4,m=8,v=2,schedule=interleaved",
     "8 virtual stages but the model has 4 layers"},
    {SIM, &TINY4, 0, 0, 0, NULL, "pp=4,m=8,stages=1.1.1.1", NULL},
    {SIM, &TINY4, 0, 0, 0, NULL, "pp=4,m=8,stages=1.1.1.2", "--stage-layers sums to 5, model has 4 layers"},
    {SIM, NULL, 0, 0, 0, NULL, "pp=1024,m=65536,v=64,schedule=interleaved", "more than 4194304"},
};

static const char *purpose_name(int p) {
    static const char *names[] = {"train", "infer", "plan", "serve", "sim"};
    return (unsigned)p < 5 ? names[p] : "?";
}

static void test_table(void) {
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        const row *r = &ROWS[i];
        const loom_layout l = layout_of(r->layout);
        const loom_layout_job j = {.purpose = (loom_layout_purpose)r->purpose,
                                   .world = r->world,
                                   .batch = r->batch,
                                   .seq = r->seq,
                                   .device = r->dev};
        loom_clear_error();
        const loom_status st = loom_layout_validate(&l, r->model, &j);
        if (!r->want) {
            CHECK(st == LOOM_OK, "row %zu (%s, %s): refused: %s", i, purpose_name(r->purpose), r->layout,
                  loom_errmsg());
            continue;
        }
        CHECK(st == LOOM_EUSAGE, "row %zu (%s, %s): status %d, want usage ('%s')", i,
              purpose_name(r->purpose), r->layout, (int)st, r->want);
        CHECK(strstr(loom_errmsg(), r->want) != NULL, "row %zu (%s, %s): '%s' lacks '%s'", i,
              purpose_name(r->purpose), r->layout, loom_errmsg(), r->want);
        /* the planner counts a reason that starts with "memory" as a memory rejection */
        CHECK(strncmp(loom_errmsg(), "memory", 6) != 0, "row %zu: a layout rule reads as memory", i);
    }
}

/* ---- the sections other modules call -------------------------------------- */

static void test_sections(void) {
    CHECK(loom_layout_check_tp(&TINY, 0, 0, 1) == LOOM_EUSAGE && strstr(loom_errmsg(), "tp=0: must be >= 1"),
          "tp 0: %s", loom_errmsg());
    CHECK(loom_layout_check_tp(&TINY, 2, 1, 16) == LOOM_OK, "tp 2 sp seq 16: %s", loom_errmsg());
    CHECK(loom_layout_check_schedule(LOOM_SCHED_COUNT, 2, 2, 1) == LOOM_EUSAGE &&
              strstr(loom_errmsg(), "not a schedule"),
          "schedule out of range: %s", loom_errmsg());
    CHECK(loom_layout_check_stages(8, 0, 1) == LOOM_EUSAGE &&
              strstr(loom_errmsg(), "pp=0 x v=1: both must be >= 1"),
          "pp 0: %s", loom_errmsg());
    CHECK(loom_layout_check_stages(8, 1, 65) == LOOM_EUSAGE && strstr(loom_errmsg(), "v <= 64"), "v 65: %s",
          loom_errmsg());
    loom_layout l;
    loom_layout_default(&l);
    CHECK(loom_layout_check_device(&l, NULL) == LOOM_OK, "no device: %s", loom_errmsg());
    CHECK(loom_layout_check_device(&l, &CPU) == LOOM_OK, "cpu: %s", loom_errmsg());
    CHECK(loom_layout_check_device(&l, &CUDA_NCCL) == LOOM_OK, "nccl groups, one rank: %s", loom_errmsg());
}

/* ---- the typed fields' words ---------------------------------------------- */

static void test_names(void) {
    CHECK(strcmp(loom_schedule_name(LOOM_SCHED_ZB), "zb") == 0 &&
              strcmp(loom_schedule_name(LOOM_SCHED_COUNT), "?") == 0,
          "schedule names");
    CHECK(strcmp(loom_cp_impl_name(LOOM_CP_ULYSSES), "ulysses") == 0 &&
              strcmp(loom_cp_impl_names[LOOM_CP_RING], "ring") == 0,
          "cp impl names");
    CHECK(strcmp(loom_recompute_names[LOOM_RECOMPUTE_FULL], "full") == 0 &&
              !loom_recompute_names[LOOM_RECOMPUTE_COUNT],
          "recompute names");
    CHECK(strcmp(loom_precision_names[LOOM_PRECISION_BF16], "bf16") == 0 &&
              !loom_precision_names[LOOM_PRECISION_COUNT],
          "precision names");
    CHECK(strcmp(loom_axis_name(LOOM_AXIS_PP), "pp") == 0 && !loom_axis_names[LOOM_AXIS_COUNT], "axis names");
    loom_sched_kind k = LOOM_SCHED_GPIPE;
    CHECK(loom_schedule_parse("interleaved", &k) == LOOM_OK && k == LOOM_SCHED_INTERLEAVED,
          "parse interleaved");
    loom_layout l;
    loom_layout_default(&l);
    CHECK(l.dp == 1 && l.ep == 1 && l.schedule == LOOM_SCHED_1F1B && l.virtual_stages == 1 &&
              l.grad_accum == 1 && l.micro_batches == 0 && loom_layout_micro_batches(&l) == 1 &&
              !loom_layout_pipelined(&l) && l.recompute == LOOM_RECOMPUTE_NONE &&
              l.precision == LOOM_PRECISION_FP32 && l.order[0] == LOOM_AXIS_TP && l.order[3] == LOOM_AXIS_PP,
          "defaults");
    l.pp = 4;
    CHECK(loom_layout_pipelined(&l) && loom_layout_micro_batches(&l) == 4, "micro-batches default to pp");
}

int main(void) {
    test_table();
    test_sections();
    test_names();
    return check_done();
}
