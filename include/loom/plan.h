/* plan.h - `loom plan`: the layout planner. A cost model (per-rank memory,
 * step time = compute + exposed communication per mesh axis + the pipeline
 * bubble replayed by the simulator of sim.h on the schedule lists the
 * executor runs) evaluated over every layout that divides the model and the
 * cluster. Pure: no MPI, no files except the loaders.
 *
 * Units: bytes, seconds, FLOP/s. docs/planning.md states the formulas and
 * their assumptions. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include <stddef.h>

#include "loom/model.h"
#include "loom/pipeline.h"
#include "loom/status.h"

/* A decoder-only transformer shape, dense or MoE (GPT-2, Llama, Mixtral). */
typedef struct loom_plan_model {
    char name[256];
    int layers, hidden, heads, kv_heads, ffn, vocab, max_seq;
    int experts, topk; /* experts 0 (or 1): dense */
    int gated;         /* 1: SwiGLU MLP (three matrices), 0: GELU MLP (two) */
    int tied;          /* LM head shares the embedding */
    int learned_pos;   /* GPT-2's wpe */
    int loom_trains;   /* 1: a loom built-in or GPT-2 config (loom train runs it) */
} loom_plan_model;

/* Built-in names: loom's (tiny, mini, gpt2-small.. gpt2-xl) and shapes loom
 * cannot train yet (llama3-8b, llama2-70b, llama3-70b, llama3-405b, gpt3-175b,
 * mixtral-8x7b, mixtral-8x22b). LOOM_EUSAGE listing them for another name. */
loom_status loom_plan_model_builtin(const char *name, loom_plan_model *m);
/* A config.json or a Hugging Face directory, read by training's reader
 * (loom_model_config_resolve: every model_type loom trains, keys refused
 * there refused here) and turned into the planner's shape.
 * LOOM_ENOINPUT / LOOM_ECONFIG naming the file or key. */
loom_status loom_plan_model_load(const char *path, loom_plan_model *m);
/* NAME or FILE (a '/' or ".json" makes it a file). */
loom_status loom_plan_model_resolve(const char *name_or_path, loom_plan_model *m);
/* Parameter counts: total, and active per token (top-k experts). */
double loom_plan_model_params(const loom_plan_model *m, double *active);

/* One collective measured at one group size (from `loom calibrate`). */
typedef struct loom_plan_coll_point {
    int group;
    double latency;   /* s */
    double bandwidth; /* bytes/s of algorithm bandwidth: size / (time - latency) */
} loom_plan_coll_point;

typedef enum {
    LOOM_COLL_ALLREDUCE,
    LOOM_COLL_ALLGATHER,
    LOOM_COLL_REDUCESCATTER,
    LOOM_COLL_ALLTOALL,
    LOOM_COLL_P2P,
    LOOM_COLL_COUNT
} loom_coll_op;

#define LOOM_PLAN_MAX_POINTS 16

/* The attention kernel a stack runs (docs/planning.md, "Attention"): the
 * s x s scores materialised in HBM (Megatron's fused softmax), or a tiled
 * kernel that keeps none: FlashAttention (v1), FlashAttention-2, -3, the
 * Triton FlashAttention of 2022 (MPT's), cuDNN's fused attention (Transformer
 * Engine), xformers' cutlass kernel. DEFAULT: materialised, or FlashAttention-2
 * where the job says flash (the older --flash-attention). */
typedef enum {
    LOOM_PLAN_ATTN_DEFAULT,
    LOOM_PLAN_ATTN_MATERIALIZED,
    LOOM_PLAN_ATTN_FLASH,
    LOOM_PLAN_ATTN_FLASH2,
    LOOM_PLAN_ATTN_FLASH3,
    LOOM_PLAN_ATTN_TRITON,
    LOOM_PLAN_ATTN_CUDNN,
    LOOM_PLAN_ATTN_XFORMERS,
    LOOM_PLAN_ATTN_COUNT
} loom_plan_attn;
/* "materialized", "flash", "flash2", ... (NULL past the end). */
extern const char *const loom_plan_attn_names[LOOM_PLAN_ATTN_COUNT];

/* Measured attention throughput of one kernel on this GPU (the cluster's
 * "attention_tflops"): causal, by head size (64, 128, 256) and sequence
 * length, forward and backward apart, FLOP/s as the FlashAttention papers
 * count them (causal half of 4 s^2 hd per head forward, 2.5x that backward).
 * have[h] = 0: no measurement at that head size. */
#define LOOM_PLAN_ATTN_SEQS 8
typedef struct loom_plan_attn_table {
    int n_seq;
    double seq[LOOM_PLAN_ATTN_SEQS];
    int have[3];
    double fwd[3][LOOM_PLAN_ATTN_SEQS], bwd[3][LOOM_PLAN_ATTN_SEQS];
} loom_plan_attn_table;

typedef struct loom_plan_cluster {
    char name[1024];
    int gpus_per_node, nodes;
    double memory;               /* bytes per device */
    double reserved;             /* bytes per device the framework keeps (context, buffers) */
    double peak_fp32, peak_bf16; /* FLOP/s per device */
    double hbm_bw;  /* achievable bytes/s per device: hbm_gbps x hbm_eff (element-wise work, decode) */
    double hbm_eff; /* efficiency.hbm: achievable / hbm_gbps (a measured memory-bound kernel; 1 absent) */
    double intra_bw, intra_lat; /* per device, bytes/s and s */
    double inter_bw, inter_lat;
    double gemm_eff; /* achieved / peak in large GEMMs */
    double coll_eff; /* achieved / link bandwidth in collectives */
    double overlap;  /* fraction of the backward DP reductions can hide behind */
    /* cores_per_node: processors the devices of a node time-share (CPU
     * ranks; `loom calibrate` writes it), in units of one device's threads;
     * 0 (absent): every device computes on its own (GPUs). The rates above
     * are per device with all gpus_per_node devices of a node busy. */
    double cores;
    /* sched_slice_us: the OS scheduler's time slice, s (with cores only; a
     * rank woken from a synchronisation waits for a processor in units of
     * it: loom_sim_wake_wait). `loom calibrate` writes the kernel's; absent:
     * EEVDF's default, 0.75 ms x (1 + log2(min(cores, 8))). */
    double slice;
    /* background_runnable: threads of other work runnable on each node on
     * average (the load average less the job's own; with cores only) - they
     * compete for the cores a woken rank needs (serving's waits) */
    double background;
    /* GEMM efficiency by size: n_gemm points (FLOPs of one GEMM, 2*M*N*K;
     * achieved / peak), ascending; interpolated in log(FLOPs), clamped at
     * the ends, times gemm_eff. No points: gemm_eff for every GEMM. */
    double attn_eff; /* flash attention kernel: achieved / peak on causal FLOPs (0: the GEMM curve) */
    double peak_fp8; /* FLOP/s per device of FP8 GEMMs (0: no FP8) */
    double fp8_top;  /* gemm_fp8_top: achieved / FP8 peak of the largest FP8 GEMM (0: the bf16 curve's top) */
    double
        clock_scale; /* the GEMM and attention measurements scaled by it (a GPU they were not measured on) */
    /* the network (docs/planning.md, "Networks"): NICs per node, each one
     * direction's bytes/s; rail-optimised fabric (same-index GPUs of every
     * node on one switch). nics = 0: inter_bw is one device's NIC share */
    int nics;
    double nic_bw;
    int rail;       /* inter_node.rail_optimized (absent: 1) */
    double oversub; /* inter_node.oversubscription: spine bandwidth divisor (absent: 1, non-blocking) */
    loom_plan_attn_table attn[LOOM_PLAN_ATTN_COUNT];
    int n_gemm;
    double gemm_flops[LOOM_PLAN_MAX_POINTS], gemm_curve[LOOM_PLAN_MAX_POINTS];
    /* measured collectives (calibrate): n[op] points by group size; when a
     * group size is measured, its point replaces the link model */
    int n[LOOM_COLL_COUNT];
    loom_plan_coll_point pts[LOOM_COLL_COUNT][LOOM_PLAN_MAX_POINTS];
} loom_plan_cluster;

/* JSON file (docs/planning.md lists the keys; plan/clusters/ has presets) or
 * a preset name (dgx-a100-80gb, dgx-h100): plan/clusters/NAME.json under the
 * source tree or $LOOM_PLAN_DIR. */
loom_status loom_plan_cluster_load(const char *name_or_path, loom_plan_cluster *c);
/* EEVDF's default time slice for a node of `cpus` CPUs, s (Linux >= 6.6,
 * kernel/sched/fair.c: sysctl_sched_base_slice = 0.75 ms times the
 * SCHED_TUNABLESCALING_LOG factor 1 + ilog2(min(cpus, 8))): 0.75 ms at 1
 * CPU, 1.5 ms at 2, 2.25 ms at 4, 3 ms from 8 on. */
double loom_plan_default_slice(double cpus);
/* Time of one collective of `bytes` (the buffer each rank passes: the full
 * vector for all-reduce, the gathered output for all-gather, the input for
 * reduce-scatter and all-to-all) over a group of g ranks whose bandwidth is
 * that of the inter-node link when `inter` (one rank per node: each rank's
 * own NIC share). */
double loom_plan_coll_time(const loom_plan_cluster *c, loom_coll_op op, int g, int inter, double bytes);
/* The same over a group of g ranks with k of them on each node (k = g: one
 * node; docs/planning.md, "Networks"): the bytes that cross node boundaries
 * spread over the NICs of the k ranks, the rest over NVLink, the slower of
 * the two (and the ring's latency over the links it crosses). */
double loom_plan_coll_time_k(const loom_plan_cluster *c, loom_coll_op op, int g, int k, double bytes);
/* Achieved / peak of one GEMM of `flops` (2*M*N*K) on this cluster. */
double loom_plan_gemm_eff(const loom_plan_cluster *c, double flops);

typedef int loom_recompute; /* LOOM_RECOMPUTE_NONE, _SELECTIVE, _FULL (loom/model.h) */

typedef struct loom_plan_job {
    int batch; /* global batch, sequences */
    int seq;   /* sequence length (serve: prompt length) */
    int bf16;  /* 1: bf16 mixed precision, 0: fp32 (loom on CPU) */
    int serve; /* 1: inference */
    int gen;   /* serve: generated tokens per sequence */
    int gpus;  /* devices to use (0: the whole cluster) */
    /* properties of the training stack being modelled (docs/planning.md) */
    int flash;           /* 1: attention never stores the s x s scores (online softmax) */
    int no_dp_overlap;   /* 1: the DP reduction starts after the backward (Megatron-LM 2021) */
    loom_plan_attn attn; /* the attention kernel (DEFAULT: materialised, or flash2 with flash) */
    int fp8;             /* 1: the layers' GEMMs in FP8 (attention and LM head in bf16) */
    int grad_fp32;       /* 1: gradients accumulated and reduced in fp32 (else in the weights' dtype) */
    int dropout;         /* 1: the model applies dropout (GPT: masks kept, their traffic) */
    int elementwise;     /* 0 fused kernels per op, 1 eager PyTorch composites, 2 torch.compile'd */
    int logits_bf16; /* 1: bf16 logits into a fused loss kernel (else fp32: F.cross_entropy(logits.float())) */
    int loss_chunks; /* > 1: the head and loss run over this many chunks of the tokens (0, 1: whole) */
    int fp8_params; /* 1 (with fp8): the weights held in FP8 (Transformer Engine's fp8 params), no bf16 copy */
    double zero3_live;   /* > 0: ZeRO-3 gathers at most this many parameters at once (DeepSpeed's
                        * stage3_max_live_parameters); 0: two whole units (FSDP) */
    int zero3_per_param; /* 1: ZeRO-3 gathers each parameter tensor with its own collective (DeepSpeed);
                          * 0: one collective per unit (FSDP: a block, the embedding, the head) */
    /* search: knobs the user pinned (--fix KEY=VALUE): mask of LOOM_PLAN_FIX_*
     * bits, values in fixed */
    unsigned fix;
    struct loom_plan_layout *fixed;
} loom_plan_job;

enum {
    LOOM_PLAN_FIX_DP = 1u << 0,
    LOOM_PLAN_FIX_TP = 1u << 1,
    LOOM_PLAN_FIX_PP = 1u << 2,
    LOOM_PLAN_FIX_CP = 1u << 3,
    LOOM_PLAN_FIX_EP = 1u << 4,
    LOOM_PLAN_FIX_ZERO = 1u << 5,
    LOOM_PLAN_FIX_SP = 1u << 6,
    LOOM_PLAN_FIX_SCHEDULE = 1u << 7,
    LOOM_PLAN_FIX_MBS = 1u << 8,
    LOOM_PLAN_FIX_M = 1u << 9,
    LOOM_PLAN_FIX_V = 1u << 10,
    LOOM_PLAN_FIX_RECOMPUTE = 1u << 11,
    LOOM_PLAN_FIX_CP_IMPL = 1u << 12,
    LOOM_PLAN_FIX_ORDER = 1u << 13,
    LOOM_PLAN_FIX_ASYNC_TP = 1u << 14
};

/* Axes as in mesh.h: innermost first. */
enum { LOOM_PLAN_TP, LOOM_PLAN_CP, LOOM_PLAN_DP, LOOM_PLAN_PP, LOOM_PLAN_NAXES };

/* How a cp group exchanges keys and values (docs/context-parallel.md):
 * ring (K/V blocks passed on, overlapped with the attention), Ulysses
 * (all-to-all to head shards, blocking), all-gather (K/V gathered before the
 * attention, exposed: Llama 3's). */
typedef enum {
    LOOM_PLAN_CP_RING,
    LOOM_PLAN_CP_ULYSSES,
    LOOM_PLAN_CP_ALLGATHER,
    LOOM_PLAN_CP_IMPL_COUNT
} loom_plan_cp_impl;

/* Recompute modes the planner knows beyond loom's own three (model.h's
 * NONE, SELECTIVE, FULL): op-level selective checkpointing (torchtitan's
 * "selective op": every other matmul's output saved, the rest recomputed)
 * and full checkpointing of every other block ("selective layer", ac_freq 2).
 * loom_plan_layout_validate checks them as SELECTIVE and FULL. */
enum { LOOM_PLAN_RECOMPUTE_OP = 3, LOOM_PLAN_RECOMPUTE_LAYER2 = 4, LOOM_PLAN_RECOMPUTE_COUNT = 5 };

/* Virtual stages a layout can give layer counts for (stages=...). */
#define LOOM_PLAN_MAX_STAGES 128

typedef struct loom_plan_layout {
    int dp, tp, pp, cp, ep;
    loom_plan_cp_impl cp_impl; /* cp > 1 */
    int zero;                  /* 0..3 */
    int sp;                    /* Megatron sequence parallelism (tp > 1) */
    loom_sched_kind sched;
    int mbs;                    /* sequences per micro-batch */
    int m;                      /* micro-batches per step per dp rank (grad accumulation when pp = 1) */
    int v;                      /* virtual stages per pp rank */
    loom_recompute recompute;   /* loom's modes or LOOM_PLAN_RECOMPUTE_OP / _LAYER2 */
    int async_tp;               /* 1: TP collectives overlapped with the GEMMs beside them (async TP) */
    int order[LOOM_PLAN_NAXES]; /* innermost first */
    int n_stages;               /* 0: layers balanced by cost; else pp*v counts in stages[] */
    short stages[LOOM_PLAN_MAX_STAGES]; /* layers per virtual stage (stages=5.6.6.5) */
} loom_plan_layout;

/* "dp=8,tp=4,pp=2,cp=1,ep=1,zero=1,sp=1,schedule=1f1b,mbs=1,m=8,v=1,
 * recompute=selective,order=tp.cp.dp.pp" (order also as tp,cp,dp,pp at the
 * end; async_tp=1; stages=5.6.6.5 the layers of each virtual stage;
 * recompute also op, layer2). Keys not given keep the defaults (all 1, zero
 * 0, sp 0, 1f1b, m=pp, mbs = batch/(dp*m)). LOOM_EUSAGE naming the key. */
loom_status loom_plan_layout_parse(const char *text, const loom_plan_job *job, loom_plan_layout *l);
/* The keys `text` gives, as LOOM_PLAN_FIX_* bits, with their values in *l
 * (--fix). LOOM_EUSAGE naming the key. */
loom_status loom_plan_fix_parse(const char *text, unsigned *mask, loom_plan_layout *l);
/* "dp=8,tp=4,..." (the inverse). */
void loom_plan_layout_format(const loom_plan_layout *l, char *buf, size_t cap);
/* The layout rules (loom_layout_validate, layout.h) for this layout of model
 * m and job j on `devices` devices: the planner's training or serving
 * layouts. LOOM_EUSAGE with the first broken rule as the message (a
 * rejected layout's reason). */
loom_status loom_plan_layout_validate(const loom_plan_model *m, const loom_plan_job *j, int devices,
                                      const loom_plan_layout *l);

#define LOOM_PLAN_TEXT 512

typedef struct loom_plan_result {
    loom_plan_layout l;
    int feasible;
    char reason[LOOM_PLAN_TEXT];   /* why not feasible */
    char failures[LOOM_PLAN_TEXT]; /* named failure modes, "; "-separated */
    /* memory per rank (the most loaded pipeline stage), bytes */
    double mem_params, mem_grads, mem_opt, mem_act, mem_kv, mem_other, mem_total;
    double mem_runtime; /* of mem_other: what the runtime holds outside the allocator (reserved_gb) */
    int in_flight;      /* activation sets alive at once (peak_live of the schedule) */
    /* time per step, s */
    double t_compute;        /* busy compute of the slowest stage (incl. recompute) */
    double t_tp, t_cp, t_ep; /* exposed, inside the pipeline's F/B */
    double t_pp;             /* p2p latency of one message (sim comm) */
    double cp_bytes;         /* CP bytes a rank sends per step (docs/context-parallel.md) */
    double t_dp;             /* exposed DP/ZeRO communication after the pipeline */
    double t_bubble;         /* idle of the pipeline */
    double t_wake;           /* waits for a processor after synchronisations (devices sharing cores) */
    double t_step;
    double bubble; /* fraction, from the simulator (or closed form in the coarse pass) */
    int simulated; /* 1: bubble and makespan from loom_sim_run */
    /* the costs the simulator ran with (per micro-batch, s) */
    double sim_f, sim_b, sim_w, sim_comm, stage_imbalance;
    double
        sim_cores; /* loom_sim_costs.cores: processors per node the pipeline ranks share (0: own devices) */
    int sim_share; /* loom_sim_costs.share: consecutive pipeline ranks per node */
    double sim_slice, sim_span; /* loom_sim_costs.slice, .span (0: no waits for a processor) */
    int sim_replicas, sim_syncs_f, sim_syncs_b; /* loom_sim_costs.replicas, .syncs_f, .syncs_b */
    double head_cost;                           /* the LM head's time in layers (the partitioner's cost) */
    double tokens_per_s_dev, mfu;
    int mfu_capped;     /* the MFU came out above a bound a term cannot beat (failures says which) */
    double model_flops; /* per step, 6*active*tokens + attention (no recompute) */
    /* serve */
    double ttft, tpot;
    int max_seqs;
} loom_plan_result;

/* Evaluate one layout (simulate = 1: bubble from loom_sim_run on the
 * schedule's lists with the stages' costs). An infeasible layout returns
 * LOOM_OK with feasible = 0 and the reason. */
loom_status loom_plan_evaluate(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                               const loom_plan_layout *l, int simulate, loom_plan_result *r);

/* Element-wise HBM bytes (read + written) of one layer for one micro-batch of
 * layout l: returns the forward's; *bwd the backward's, *sel what selective
 * recompute repeats (docs/planning.md, "Element-wise traffic"). */
double loom_plan_elementwise_bytes(const loom_plan_model *m, const loom_plan_job *j,
                                   const loom_plan_layout *l, double *bwd, double *sel);

typedef struct loom_plan_search_stats {
    long considered, feasible, simulated;
    long rejected_divide, rejected_memory, rejected_batch;
    char example_divide[LOOM_PLAN_TEXT], example_memory[LOOM_PLAN_TEXT];
} loom_plan_search_stats;

/* Every layout for j->gpus devices (or all), best first by tokens/s/device
 * (serve: tokens/s/device among those meeting memory). Up to `top` results
 * in out (caller allocates top entries); *n_out how many. */
loom_status loom_plan_search(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                             int top, loom_plan_result *out, int *n_out, loom_plan_search_stats *stats);

/* The seeds' rule of thumb (TP by intra-node links and memory, PP by depth
 * and inter-node bandwidth, DP for the rest, SP/CP for activations, EP for
 * MoE) as one layout, with a line per decision appended to buf. */
void loom_plan_heuristic(const loom_plan_model *m, const loom_plan_cluster *c, const loom_plan_job *j,
                         loom_plan_layout *l, char *buf, size_t cap);

/* The `loom train` command line that runs the layout (notes what loom lacks). */
void loom_plan_train_flags(const loom_plan_model *m, const loom_plan_job *j, const loom_plan_layout *l,
                           char *buf, size_t cap);

#endif
