/* layout.h - the parallel layout of a job, typed, and its one validator.
 *
 * A loom_layout is everything that says how a job is cut over its ranks and
 * how each rank computes: the degrees of the mesh axes (dp, tp, pp, cp, and
 * ep inside dp x cp) and their order, the ZeRO stage, sequence parallelism,
 * the context-parallel attention, the pipeline schedule with its virtual
 * stages, micro-batches and blocks per stage, gradient accumulation,
 * activation recompute and the compute and communication precisions. Every
 * field is an integer or an enum: strings are parsed once, where they enter
 * (the CLI's flags and --config keys, `loom plan --layout`, `loom sim`'s
 * flags), with the name tables below.
 *
 * loom_layout_validate holds every rule a layout must meet - divisibility by
 * the model (heads, MLP width, experts, layers), by the batch and sequence,
 * what each schedule accepts, what the backend cannot do yet - for each use
 * of a layout: training, inference (generate, serve), the planner (for every
 * candidate it weighs) and the schedule simulator. Each rule is written once;
 * the sections that lower modules also need as preconditions (the mesh, the
 * schedule generators, the partitioner, the model's tensor-parallel cut) are
 * exported below and called by them. Messages name the flag and both numbers
 * ("tp=3 does not divide n_head=8 of model tiny"). Pure: no communication, so
 * every rank that validates the same layout fails the same way, before the
 * first collective.
 */
#ifndef LOOM_LAYOUT_H
#define LOOM_LAYOUT_H

#include "loom/status.h"

/* ---- the vocabulary ------------------------------------------------------ */

/* Mesh axes (layout.order names them innermost first). EP is not an axis:
 * its groups are formed inside dp x cp (mesh.h). */
typedef enum { LOOM_AXIS_TP, LOOM_AXIS_CP, LOOM_AXIS_DP, LOOM_AXIS_PP, LOOM_AXIS_COUNT } loom_axis;

/* Context-parallel attention (cp.h): K/V around a ring, or all-to-all to heads. */
typedef enum { LOOM_CP_RING = 0, LOOM_CP_ULYSSES = 1, LOOM_CP_IMPL_COUNT } loom_cp_impl;

/* Pipeline schedules (pipeline.h). */
typedef enum loom_sched_kind {
    LOOM_SCHED_GPIPE,
    LOOM_SCHED_1F1B,
    LOOM_SCHED_INTERLEAVED,
    LOOM_SCHED_ZB,
    LOOM_SCHED_ZBH2,
    LOOM_SCHED_ZBV,
    LOOM_SCHED_DUALPIPEV,
    LOOM_SCHED_COUNT
} loom_sched_kind;

/* Activation recompute (loom_gpt_opts.recompute): none, the attention
 * probabilities, or each block from its input. */
typedef enum loom_recompute_mode {
    LOOM_RECOMPUTE_NONE = 0,
    LOOM_RECOMPUTE_SELECTIVE = 1,
    LOOM_RECOMPUTE_FULL = 2,
    LOOM_RECOMPUTE_COUNT
} loom_recompute_mode;

/* GEMM precision (bf16: bf16 operands, fp32 accumulation), and the wire
 * format of the DP gradient reductions and TP activation collectives. */
typedef enum { LOOM_PRECISION_FP32, LOOM_PRECISION_BF16, LOOM_PRECISION_COUNT } loom_precision;

/* The words of each enum, indexed by its value, NULL-terminated: what the
 * CLI accepts and what logs and files print. */
extern const char *const loom_axis_names[];      /* tp cp dp pp */
extern const char *const loom_cp_impl_names[];   /* ring ulysses */
extern const char *const loom_schedule_names[];  /* gpipe 1f1b interleaved zb zbh2 zbv dualpipev */
extern const char *const loom_recompute_names[]; /* none selective full */
extern const char *const loom_precision_names[]; /* fp32 bf16 */

const char *loom_axis_name(loom_axis a);           /* "tp", ...; "?" out of range */
const char *loom_cp_impl_name(loom_cp_impl impl);  /* "ring", "ulysses" */
const char *loom_schedule_name(loom_sched_kind k); /* "gpipe", ...; "?" out of range */
/* Name -> kind; LOOM_EUSAGE "unknown schedule 'x' (gpipe, 1f1b, interleaved, zb, zbh2, zbv,
 * dualpipev)". */
loom_status loom_schedule_parse(const char *name, loom_sched_kind *out);
/* 1 if the schedule splits B and W (zb, zbh2, zbv, dualpipev). */
int loom_schedule_splits_backward(loom_sched_kind k);
/* 1 if the schedule places its two chunks per rank in a V (zbv, dualpipev):
 * chunk 0 runs down the ranks, chunk 1 back up, so rank 0 holds the first
 * and the last virtual stage (pipeline.h, loom_pp_vstage). */
int loom_schedule_vshape(loom_sched_kind k);

/* Limits that keep every schedule list small and every tag an int. */
#define LOOM_PP_MAX_PP 1024
#define LOOM_PP_MAX_V 64
#define LOOM_PP_MAX_MB 65536
#define LOOM_PP_MAX_WORK (1 << 22) /* pp * m * v */
/* --stage-layers entries a layout holds (a 1 KiB list has at most 512). */
#define LOOM_LAYOUT_MAX_STAGE_LAYERS 512
/* Pipeline stages of an inference job (infer.c). */
#define LOOM_INFER_MAX_STAGES 256

/* ---- the layout ---------------------------------------------------------- */

typedef struct loom_layout {
    int dp, tp, pp, cp, ep;           /* degrees; world = dp * tp * pp * cp, ep divides dp * cp */
    loom_axis order[LOOM_AXIS_COUNT]; /* innermost first */
    int zero;                         /* ZeRO stage 0..3 over dp (x cp) */
    int sp;                           /* Megatron sequence parallelism inside the TP group */
    loom_cp_impl cp_impl;
    loom_sched_kind schedule; /* with pp > 1 or virtual_stages > 1 */
    int virtual_stages;       /* model chunks per pp rank (interleaved) */
    int micro_batches;        /* pipeline micro-batches per step per dp rank; <= 0: pp */
    int grad_accum;           /* micro-batches per step per dp rank without a pipeline */
    int micro_batch_size;     /* sequences per micro-batch; 0: what the batch gives (planner) */
    int n_stage_layers;       /* 0: blocks balanced by cost */
    int stage_layers[LOOM_LAYOUT_MAX_STAGE_LAYERS]; /* blocks per virtual stage */
    loom_recompute_mode recompute;
    loom_precision precision, comm_precision;
} loom_layout;

/* Every degree 1, order tp,cp,dp,pp, zero 0, no sp, ring, 1f1b, one virtual
 * stage, micro-batches = pp, no accumulation, balanced stages, no
 * recompute, fp32 compute and communication. */
void loom_layout_default(loom_layout *l);
/* The CLI's default for a V schedule (zbv, dualpipev) given without
 * --virtual-stages: 2 chunks per rank (v 1 -> 2); other layouts unchanged. */
void loom_layout_vshape_default(loom_layout *l);
/* Degree of an axis. */
int loom_layout_degree(const loom_layout *l, loom_axis a);
/* Parse "tp,cp,dp,pp" (each axis exactly once) into l->order. LOOM_EUSAGE on error. */
loom_status loom_layout_parse_order(const char *s, loom_layout *l);
/* Parse --stage-layers "3,3,2,2" (blocks per virtual stage, each >= 1) into
 * l->stage_layers; "" clears it. That the list matches the model and pp x v
 * is the validator's. LOOM_EUSAGE naming the entry; l unchanged on error. */
loom_status loom_layout_parse_stage_layers(const char *list, loom_layout *l);
/* A pipeline runs (pp > 1 or more than one virtual stage). */
int loom_layout_pipelined(const loom_layout *l);
/* Pipeline micro-batches per step per dp rank: micro_batches, or pp when <= 0. */
int loom_layout_micro_batches(const loom_layout *l);

/* ---- the validator ------------------------------------------------------- */

/* What the rules need to know of a model (model.h's loom_model_shape, or
 * the planner's shapes). */
typedef struct loom_layout_model {
    const char *name;
    int n_layer, n_head;
    int ffn;         /* MLP hidden size (an expert's for MoE) */
    int n_positions; /* longest sequence (training) */
    int n_expert;    /* 0: dense */
    int n_kv_head;   /* key/value heads (grouped-query attention); 0: n_head */
} loom_layout_model;

typedef enum loom_layout_purpose {
    LOOM_LAYOUT_FOR_TRAIN,      /* loom train */
    LOOM_LAYOUT_FOR_INFER,      /* loom generate / serve: tp x pp (x dp replicas) */
    LOOM_LAYOUT_FOR_PLAN_TRAIN, /* a training layout the planner weighs */
    LOOM_LAYOUT_FOR_PLAN_SERVE, /* a serving layout the planner weighs */
    LOOM_LAYOUT_FOR_SIM,        /* loom sim: one pipeline (pp, micro-batches, v, stages) */
} loom_layout_purpose;

/* The device a training job computes and communicates on (device.h,
 * docs/backends.md): what its groups cannot do yet is refused up front. */
typedef struct loom_layout_device {
    const char *name; /* --device */
    const char *comm; /* its groups' implementation as LOOM_DEVICE_COMM spells it: mpi, staged, nccl */
    int native_comm;  /* they are the backend's own library (NCCL): no tags, one op at a time */
} loom_layout_device;

typedef struct loom_layout_job {
    loom_layout_purpose purpose;
    int world;                        /* ranks (the planner: devices); unused for SIM */
    int batch;                        /* global sequences per step (train, plan train) */
    int seq;                          /* tokens per sequence (train, plan) */
    const loom_layout_device *device; /* train: the device; NULL: MPI groups */
} loom_layout_job;

/* Every rule the layout must meet for job j on model m (SIM: m->n_layer
 * 0 when the simulator has no model; m may then be NULL). LOOM_EUSAGE with
 * the first broken rule named. */
loom_status loom_layout_validate(const loom_layout *l, const loom_layout_model *m, const loom_layout_job *j);

/* Sections of the validator that lower modules call as preconditions. */

/* Degrees >= 1, a valid order, dp * tp * pp * cp = world_size, ep divides
 * dp * cp ("dp=2 x tp=2 x pp=1 x cp=1 = 4 ranks, but the job has 8"). */
loom_status loom_layout_check(const loom_layout *l, int world_size);
/* Tensor parallelism on model m: tp divides n_head and ffn; with sp, tp
 * divides the sequence length T. */
loom_status loom_layout_check_tp(const loom_layout_model *m, int tp, int sp, int T);
/* The (pp, micro-batches, v) a schedule accepts: "interleaved needs
 * --micro-batches divisible by pp=4, got 6", "--virtual-stages 2: v > 1
 * only with interleaved (schedule 1f1b)". */
loom_status loom_layout_check_schedule(loom_sched_kind k, int pp, int m, int v);
/* pp x v virtual stages of at least one block each, of n_layer blocks. */
loom_status loom_layout_check_stages(int n_layer, int pp, int v);
/* What the device's groups cannot do yet (train): with NCCL groups, the
 * pipeline (pp > 1) and the CP ring, whose sends and receives must
 * progress together. NULL: nothing refused. */
loom_status loom_layout_check_device(const loom_layout *l, const loom_layout_device *d);

#endif
