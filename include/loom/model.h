/* model.h - the GPT-2 model: config, sharded parameter table, and the
 * forward / backward of one model part.
 *
 * A model part is what one rank computes: transformer blocks
 * [layer_begin, layer_end), plus the token/position embedding if it is the
 * first pipeline stage and ln_f + the tied LM head if it is the last, with
 * every matrix cut by tensor parallelism (attention by heads, MLP by columns
 * then rows, the vocabulary by rows of wte). One device is the part with all
 * layers, both ends and tp = 1: the same code.
 *
 * The parameter table drives everything that touches parameters - init,
 * optimizer, gradient sync, ZeRO, checkpoints, parity checks - by name,
 * never by magic index. Names and global shapes are Hugging Face GPT-2's
 * (linear weights stored [in, out] as its Conv1D does); each row also says
 * how this rank's local tensor maps into the global one, so every element is
 * initialised from the counter RNG keyed by (seed, name, global index)
 * whatever the layout (invariant 1).
 *
 * Memory: params and grads are flat buffers in parameter-table order, which
 * groups them in units: unit -1 is the "outer" parameters (wte, wpe, ln_f),
 * unit l is block l. Activations live in slots, one per micro-batch in
 * flight (pipeline schedules keep several alive); backward scratch is shared.
 * Everything is planned and allocated at creation; forward and backward do
 * not allocate.
 *
 * Collectives: forward and backward are collective over the TP group (the
 * regions of tp.h). Hooks let data-parallel strategies act per unit
 * (gather parameters before use, start gradient reductions once a unit's
 * gradients are complete).
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "loom/arena.h"
#include "loom/cp.h"
#include "loom/layout.h"
#include "loom/kernels.h"
#include "loom/tp.h"
#include "loom/status.h"

/* The families of tensor names and layouts (docs/families.md). */
typedef enum {
    LOOM_FAMILY_GPT2 = 0,  /* GPT-2's names, Conv1D weights [in, out], learned positions, tied head */
    LOOM_FAMILY_LLAMA = 1, /* Llama's names (model.layers.<l>...), nn.Linear weights [out, in] */
} loom_family;
typedef enum { LOOM_NORM_LAYER = 0, LOOM_NORM_RMS = 1 } loom_norm_kind;
typedef enum { LOOM_MLP_GELU = 0, LOOM_MLP_SWIGLU = 1 } loom_mlp_kind;

typedef struct loom_model_config {
    char name[256];
    int n_layer, n_head, n_embd, vocab_size, n_positions;
    /* The block's parts, as data; every zero is GPT-2's (LayerNorm with bias,
     * GELU MLP of 4 n_embd, learned positions, every bias, tied head). */
    int family;       /* loom_family */
    char arch[32];    /* config.json's model_type ("gpt2", "llama", "mistral", "qwen2", ...); "" = gpt2 */
    int norm;         /* loom_norm_kind */
    float norm_eps;   /* RMSNorm's epsilon (LayerNorm's is 1e-5) */
    int mlp;          /* loom_mlp_kind: GELU (c_fc, c_proj) or SwiGLU (gate, up, down) */
    int ffn;          /* the dense MLP's hidden size; 0: 4 n_embd */
    int n_kv_head;    /* key/value heads (grouped-query attention); 0: n_head */
    int rope;         /* 1: rotary positions (no wpe) */
    float rope_theta; /* RoPE base */
    /* Llama 3 frequency scaling (rope_scaling {"rope_type": "llama3"}); factor 0: none */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_max;
    int qkv_bias, o_bias; /* the Llama family's attention biases (q/k/v; o_proj) */
    int untied;           /* a separate lm_head (tie_word_embeddings false) */
    int window;           /* sliding-window attention: keys at most this many positions back; 0: none */
    float init_std;       /* the Llama family's initializer_range; 0: 0.02 */
    char dir[256];        /* the Hugging Face directory it was read from, "" if none */
    /* Mixture of experts (include/loom/moe.h); n_expert = 0: every block dense. */
    int n_expert, top_k, moe_every, expert_hidden, norm_topk;
    int shared_hidden; /* Qwen2-MoE: a shared SwiGLU expert this wide, scaled by a sigmoid gate; 0: none */
    float aux_coef, z_coef, capacity_factor; /* capacity_factor 0: dropless */
    float bias_rate; /* aux-loss-free balancing (DeepSeek-V3): selection-bias step, 0 = off */
} loom_model_config;

/* Built-in names: tiny, mini, gpt2-small (alias gpt2), gpt2-medium,
 * gpt2-large, gpt2-xl, the MoE ones (moe.h) and the tiny Llama-family ones
 * (tiny-llama, ...). LOOM_EUSAGE for an unknown name, listing the known. */
loom_status loom_model_config_builtin(const char *name, loom_model_config *cfg);
/* A Hugging Face config.json, dispatched on "model_type": gpt2 (or none:
 * n_layer, n_head, n_embd, vocab_size, n_positions), llama, mistral, qwen2
 * (config_hf.c). Keys that do not change the math are ignored; keys that
 * do are checked, and an unknown key or model_type is refused by name.
 * LOOM_ENOINPUT / LOOM_ECONFIG with the key named. */
loom_status loom_model_config_load(const char *path, loom_model_config *cfg);
/* NAME, FILE.json (anything containing '/' or ending in .json is a file)
 * or a Hugging Face directory (its config.json; cfg->dir names it, so its
 * weights can be loaded: loom_params_load). */
loom_status loom_model_config_resolve(const char *name_or_path, loom_model_config *cfg);
/* Write cfg as a Hugging Face config.json at path (written to path.tmp,
 * then renamed): model_type gpt2, llama, mistral or qwen2 with the keys
 * transformers reads. LOOM_EOS when it cannot be written. */
loom_status loom_model_config_write_hf(const loom_model_config *cfg, const char *path);
/* The same config.json as a new cJSON object (the caller owns it); NULL
 * when out of memory or for a GPT-2 MoE model (no Hugging Face class). */
struct cJSON *loom_model_config_hf_json(const loom_model_config *cfg);
/* The inverse: a Llama-family config from a Hugging Face config.json object
 * (its model_type picks the architecture), as loom_model_config_load reads
 * one; path names it in messages. */
loom_status loom_model_config_from_hf_json(const char *path, const struct cJSON *root,
                                           loom_model_config *cfg);
/* Sizes positive and bounded, n_head divides n_embd, the parts consistent. */
loom_status loom_model_config_check(const loom_model_config *cfg);
/* Derived sizes: key/value heads, head size, the dense MLP's hidden size. */
int loom_model_kv_heads(const loom_model_config *cfg);
int loom_model_head_size(const loom_model_config *cfg);
int loom_model_ffn(const loom_model_config *cfg);
/* The token embedding's tensor name ("wte.weight" or
 * "model.embed_tokens.weight"); with a tied head the LM head is it too. */
const char *loom_model_embed_name(const loom_model_config *cfg);
/* The Llama family's rotary inverse frequencies (HS/2 floats at out), with
 * Llama 3's scaling when the config has it, computed in float32 as
 * Hugging Face computes them. */
void loom_model_rope_freqs(const loom_model_config *cfg, float *out);
/* What the layout rules need of the model (layout.h): layers, heads, the
 * MLP's (MoE: an expert's) hidden size, n_positions, experts. The name
 * points into cfg. */
loom_layout_model loom_model_shape(const loom_model_config *cfg);

/* How this rank's part is cut, and where it runs. */
typedef struct loom_model_part {
    loom_device *dev; /* every tensor and kernel of the part (device.h); tp.dev and cp.dev are it too */
    loom_tp tp;       /* tensor (+ sequence) parallel group */
    loom_cp cp;       /* context-parallel group; T is then the local rows */
    int layer_begin, layer_end; /* blocks [begin, end) */
    int has_embed, has_head;    /* first / last pipeline stage */
    loom_comm *ep;              /* expert-parallel group; NULL: every expert local (moe.h) */
} loom_model_part;
/* The whole model on device dev. */
loom_model_part loom_model_part_whole(loom_device *dev, const loom_model_config *cfg);

typedef enum { LOOM_INIT_NORMAL, LOOM_INIT_ZEROS, LOOM_INIT_ONES } loom_init_kind;

#define LOOM_PARAM_NAME_MAX 64
#define LOOM_UNIT_OUTER (-1)

typedef struct loom_param {
    char name[LOOM_PARAM_NAME_MAX]; /* "h.3.mlp.c_fc.weight" */
    int ndim;
    int64_t shape[2];    /* global shape (1-D: shape[1] = 1) */
    int64_t lshape[2];   /* this rank's local shape */
    size_t numel;        /* local elements */
    size_t offset;       /* floats from the start of the flat params (and grads) buffer */
    int split_dim;       /* -1: replicated over tp; 0: rows split; 1: columns split */
    int split_parts;     /* the split axis is this many equal parts, each split over tp (3 for QKV) */
    int split_rep;       /* tp ranks holding the same slice (key/value heads when tp exceeds them), else 1 */
    int64_t split_valid; /* rows beyond this global extent are padding (vocab), else = shape */
    int sp_partial;      /* replicated, but its gradient is partial per tp rank under SP */
    int unit;            /* LOOM_UNIT_OUTER or the block index */
    int decay;           /* weight decay applies (ndim >= 2) */
    loom_init_kind init;
    float init_std;
} loom_param;

/* Global flat index of local element `i` of p on tp rank `tp_rank`, or -1
 * for padding that has no global element. */
int64_t loom_param_global_index(const loom_param *p, int tp_rank, size_t i);

/* Views of one block's weights (or gradients), local shapes. GPT-2's are
 * Conv1D [in, out]; the Llama family's nn.Linear [out, in], with q|k|v and
 * gate|up each packed as one matrix (their tensors are adjacent in the
 * flat buffer), and NULL where the family has no bias. QKV_l = C_l +
 * 2 KV_l (GPT-2: 3 C_l); FC_l = H_l (GELU) or 2 H_l (SwiGLU: gate | up). */
typedef struct loom_gpt_layer_w {
    float *ln1_w, *ln1_b;   /* (C) */
    float *qkv_w, *qkv_b;   /* (C, QKV_l) or (QKV_l, C), (QKV_l) */
    float *proj_w, *proj_b; /* (C_l, C) or (C, C_l), (C) */
    float *ln2_w, *ln2_b;   /* (C) */
    float *fc_w, *fc_b;     /* (C, FC_l) or (FC_l, C), (FC_l) */
    float *fcp_w, *fcp_b;   /* (H_l, C) or (C, H_l), (C) */
} loom_gpt_layer_w;

typedef struct loom_gpt_weights {
    float *wte;           /* (V_l, C) rows [tp_rank V_l, ...) of the padded vocab */
    float *wpe;           /* (maxT, C); NULL with rotary positions */
    float *lnf_w, *lnf_b; /* (C); lnf_b NULL for RMSNorm */
    float *lm_head;       /* (V_l, C) the LM head: wte when tied */
    loom_gpt_layer_w *h;  /* indexed by local block (l - layer_begin) */
} loom_gpt_weights;

/* What one block keeps from forward for backward, per slot. Nx = N/tp rows
 * with SP, so under SP every tensor here shrinks with tp: the sequence-
 * sharded ones by Nx, the rest by C_l / NH_l. The column-parallel matmuls
 * (c_attn, c_fc, and the LM head) need all N rows of the LayerNorm output;
 * as in Megatron only this rank's rows (ln1, ln2, lnf) are kept and the
 * backward's weight half all-gathers them again into one shared (N,C)
 * scratch, one at a time. The input-gradient half does not need them.
 * Without SP (Nx = N) ln1, res2, ln2, res3 - (N,C) each - are replicated over
 * tp and do not shrink: that is the memory SP exists to save. fch_gelu could
 * be recomputed from fch, but it already shrinks with tp (4C_l columns). */
typedef struct loom_gpt_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (Nx,C) (Nx) (Nx) */
    float *qkv;                       /* (N,QKV_l), after rotary positions */
    float *atty;                      /* (N,C_l) */
    float *lse;                       /* (B,NH_l,T) attention log-sum-exp per row */
    float *res2;                      /* (Nx,C) */
    float *ln2, *ln2_mean, *ln2_rstd; /* (Nx,C) (Nx) (Nx) */
    float *fch, *fch_gelu;            /* (N,FC_l) (N,H_l): the MLP's first product and activation */
    float *res3;                      /* (Nx,C) */
} loom_gpt_layer_acts;

/* Output gradients kept between the input-gradient (B) and weight-gradient
 * (W) halves of the backward pass, per block. A slot's own (split backward)
 * under SP is `sharded`: the row-parallel output gradients dfcp and dproj
 * are kept as this rank's (Nx,C) rows and re-gathered by W, so they shrink
 * with tp too; the shared one of a full backward keeps them gathered. */
typedef struct loom_gpt_dsave {
    float *dfcp;  /* (N,C) or (Nx,C) sharded: d(mlp c_proj out) */
    float *dfch;  /* (N,FC_l) d(c_fc out) */
    float *dln2;  /* (Nx,C)   d(ln_2 out) */
    float *dproj; /* (N,C) or (Nx,C) sharded: d(attn c_proj out) */
    float *dqkv;  /* (N,QKV_l) d(c_attn out) */
    float *dln1;  /* (Nx,C)   d(ln_1 out) */
    int sharded;
} loom_gpt_dsave;

typedef struct loom_gpt_slot {
    int32_t *inputs, *targets;        /* (B,T) */
    float *x;                         /* (Nx,C) input of the first block: embedding output or received */
    loom_gpt_layer_acts *acts;        /* per local block */
    float *lnf, *lnf_mean, *lnf_rstd; /* (Nx,C) (Nx) (Nx) */
    float *logits;                    /* (N,V_l) softmax probabilities after forward, dlogits after B */
    float *losses;                    /* (N) */
    float *dx;                        /* (Nx,C) gradient of x (sent to the previous stage) */
    float *dlnf;                      /* (Nx,C) saved for W */
    loom_gpt_dsave *ds;               /* per local block (split backward), else NULL */
    int have_targets;
    int dlogits_kept;    /* forward left dlogits kept for the backward (loom_gpt_expect_backward) */
    float dlogits_dloss; /* ... for this dloss */
} loom_gpt_slot;

typedef struct loom_gpt loom_gpt;

/* Per-unit callbacks for data-parallel strategies; any may be NULL. */
typedef struct loom_gpt_hooks {
    void *ctx;
    loom_status (*pre_forward)(void *ctx, loom_gpt *m, int unit);
    loom_status (*post_forward)(void *ctx, loom_gpt *m, int unit);
    loom_status (*pre_backward)(void *ctx, loom_gpt *m, int unit);
    /* the unit's gradients are complete for this backward */
    loom_status (*post_backward)(void *ctx, loom_gpt *m, int unit);
    /* Split backward only (opts.split_backward): after the unit's input
     * gradients (B; its parameters are not needed again in this backward)
     * and before its weight gradients (W; the gradient storage is). A split
     * backward fires pre_backward, post_input in B and pre_weight,
     * post_backward in W. */
    loom_status (*post_input)(void *ctx, loom_gpt *m, int unit);
    loom_status (*pre_weight)(void *ctx, loom_gpt *m, int unit);
    /* Unsplit backward of a part with the head: the head's contribution to
     * the wte gradient is complete (fired before the rest of the head's
     * backward; wte then receives only the token embedding's rows). */
    loom_status (*post_head_wte)(void *ctx, loom_gpt *m);
    /* The token embedding's backward: rows (N,C), the gradient of the
     * embedding output summed over tp, for token ids (N). Set *taken to
     * keep them out of the wte gradient (the hook then owns adding them,
     * e.g. after summing them over dp); else they are added as usual. */
    loom_status (*embed_rows)(void *ctx, loom_gpt *m, const int32_t *ids, const float *rows, int *taken);
} loom_gpt_hooks;

typedef struct loom_gpt_opts {
    int B, T;           /* micro-batch planned for (the largest that will run) */
    int n_slots;        /* micro-batches in flight (default 1) */
    int split_backward; /* keep B and W apart (zero-bubble schedules) */
    /* The part allocates no flat parameter (gradient) buffer: param_mem
     * (grad_mem) is NULL and the caller binds storage per unit with
     * loom_gpt_bind_unit before the unit runs - ZeRO-3 (ZeRO-2/3) keep only
     * shards plus a few unit-sized buffers. */
    int external_params, external_grads;
    /* Activation recompute (LOOM_RECOMPUTE_*): FULL keeps only each block's
     * output (the next block's input) and recomputes the block's forward in
     * backward (with split_backward: in B and again in W, which needs the
     * block's activations after other blocks' recomputes took the one work
     * set); SELECTIVE keeps everything but the attention probabilities
     * (B,NH_l,T,T), recomputed from qkv just before attention's backward.
     * Recomputed values are bit-identical, so results do not change. */
    int recompute;
    /* MoE routing groups (moe.h): route each micro-batch as this many groups,
     * group g = the tokens context-parallel rank g of that many would hold
     * (cp.h's split), in its order - a run without CP then routes, drops and
     * balances exactly as a --cp run does. 0 or 1: the micro-batch is one
     * group. */
    int moe_route_cp;
    /* Forward's loss_sum is the language-model loss only, without the MoE
     * router losses (aux, z) that training adds (evaluation); backward is
     * unchanged. */
    int loss_lm_only;
    /* Inference (loom_gpt_forward_kv): no gradients and no backward; one
     * set of block activations serves every block, each block's output
     * overwriting its input; B x T is the most rows of one forward (new
     * tokens of several sequences), not bounded by n_positions; no head
     * buffers (the caller runs its own head on the rows it needs); MoE
     * blocks route dropless, every token to its top_k experts (capacity is
     * a training budget). Not with SP, CP, recompute or a split backward. */
    int forward_only;
} loom_gpt_opts;

/* Inference: the rows of one forward are the new tokens of n sequences,
 * consecutive and in this order, each appended to its sequence's key/value
 * cache. The cache of local block li and sequence slot s is
 * k + ((size_t)li * max_seqs + s) * max_len * C_l floats, (max_len, C_l) with
 * position p at row p (and v alike). */
typedef struct loom_gpt_kv {
    int n;            /* sequences in this forward */
    const int *seq;   /* (n) their cache slots, distinct, < max_seqs */
    const int *pos;   /* (n) positions already cached (the first new row's position) */
    const int *n_new; /* (n) new rows of each, >= 1 */
    float *k, *v;     /* (L_l, max_seqs, max_len, C_l) device memory */
    int max_seqs, max_len;
    float *scratch; /* loom_attention_kv_scratch_floats(rows, max_len) floats */
} loom_gpt_kv;

struct loom_gpt {
    loom_model_config cfg;
    loom_model_part part;
    loom_device *dev; /* part.dev: where every kernel of the part runs */
    loom_gpt_opts opts;
    int B, T, N, Nx;            /* N = B*T rows; Nx = N / tp with SP, else N */
    int C, C_l, NH_l, V_l, L_l; /* local sizes; L_l local blocks */
    int HS, NKV_l, KV_l, QKV_l; /* head size; key/value heads and width; q|k|v width */
    int H_l, FC_l;              /* the MLP's hidden width, its first product's width */
    loom_att_heads heads;       /* this rank's attention heads (NH_l, NKV_l, HS, window) */
    int32_t *pos;               /* (N) rotary position of each row (device memory), NULL without RoPE */
    int32_t *pos_host;          /* (N) host staging for an inference forward's positions */
    float *inv_freq;            /* (HS/2) rotary frequencies (device memory) */
    int vocab_start;            /* first global vocab row of wte on this rank */
    int n_params;
    loom_param *params;
    size_t num_params;           /* floats in the flat buffers */
    float *param_mem, *grad_mem; /* NULL with opts.external_params / external_grads */
    loom_gpt_weights w, g;       /* views into param_mem and grad_mem */
    loom_gpt_slot *slots;
    /* scratch shared by all slots and blocks. Per slot and not per block,
     * these do not shrink with tp: inputs, targets, losses (N each) of a
     * slot; dfull (SP: the one gathered (N,C) copy - forward's col_in and
     * row_out rows, backward's re-gathers), dlnfull (N,C), xmax, xsum and
     * scratch_ds's dfcp, dproj (N,C) here. */
    float *dres, *dfull, *d4c, *datty, *dlnfull, *dlnf; /* (Nx,C) (N,C) (N,H_l) (N,C_l) (N,C) (Nx,C) */
    float *xmax, *xsum;        /* (N), (2N): sums then target logits, one all-reduce */
    float *rep_scratch;        /* (tp * the largest split_rep > 1 slice) or NULL: loom_tp_grad_replica_sum */
    int V_valid_l;             /* real (unpadded) vocab rows on this rank */
    loom_gpt_dsave scratch_ds; /* dsave used when not splitting */
    /* recompute FULL: one block's activations (all but res3) shared by every
     * block and slot (SELECTIVE keeps no extra: attention backward always
     * recomputes its probabilities from q, k, v and the saved lse) */
    loom_gpt_layer_acts work;
    loom_gpt_hooks hooks;
    loom_arena a_params, a_grads, a_acts;
    struct loom_moe *moe; /* the MoE blocks' router/expert state (moe.h); NULL if dense */
    int expect_backward;  /* loom_gpt_expect_backward: for the next forward only */
    float expect_dloss;
};

/* Build the table for this part and plan + allocate memory.
 * LOOM_EUSAGE for sizes the part cannot run (T > n_positions, tp not
 * dividing n_head, ...); LOOM_EOS when memory cannot be had. Local. */
loom_status loom_gpt_create(const loom_model_config *cfg, const loom_model_part *part,
                            const loom_gpt_opts *opts, loom_gpt **out);
void loom_gpt_free(loom_gpt *m);
/* Every local element from the counter RNG at its global index: normal(0,
 * 0.02) for weights, 0.02/sqrt(2 n_layer) for the residual projections
 * (attn.c_proj, mlp.c_proj), zeros for biases and vocab padding, ones for
 * LayerNorm weights. */
void loom_gpt_init_params(loom_gpt *m, uint64_t seed);
/* The same values for the flat range [lo, lo + n) of the part's layout,
 * written to dst[0..n) (padding between tensors is zero): how a rank that
 * keeps only a shard initialises it without ever holding the whole part. */
void loom_gpt_init_range(const loom_gpt *m, uint64_t seed, size_t lo, size_t n, float *dst);
const loom_param *loom_gpt_find_param(const loom_gpt *m, const char *name);
/* out (N,C) = the part's norm of x (LayerNorm: mean, rstd written; RMSNorm:
 * rstd; b NULL), as its blocks and head compute it (src/model/parts.c). */
void loom_part_norm_fwd(const loom_gpt *m, float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, int N);
/* 1 when p's gradient on this part must stay out of the gradient norm: the
 * tied embedding's copy on a part without the embedding (its other half is
 * counted where the embedding lives), or a replicated key/value slice on any
 * tp rank but the first of its split_rep replicas (each slice counted once). */
int loom_param_norm_skip(const loom_gpt *m, const loom_param *p);
/* Float range [*offset, *offset + *count) of a unit in the flat buffers. */
void loom_gpt_unit_range(const loom_gpt *m, int unit, size_t *offset, size_t *count);
/* Point a unit's weight views (params) and gradient views (grads) at other
 * storage laid out like its range of the flat buffers (either may be NULL to
 * keep). ZeRO-3 keeps parameters sharded and binds gathered copies. */
void loom_gpt_bind_unit(loom_gpt *m, int unit, float *params, float *grads);
size_t loom_gpt_activation_bytes(const loom_gpt *m);

/* Forward of micro-batch `slot`. The first stage reads inputs (B,T); later
 * stages read the slot's x buffer (filled by the caller through
 * loom_gpt_input(m, slot)). The last stage with targets computes the losses
 * and adds their sum to *loss_sum (may be NULL). B x T as planned. */
loom_status loom_gpt_forward(loom_gpt *m, int slot, const int32_t *inputs, const int32_t *targets,
                             double *loss_sum);
/* Inference forward (a part made with opts.forward_only) of the R <= B*T
 * rows in loom_gpt_input(m, 0) through the part's blocks - the same block
 * forward as training, attention reading and extending the caches of kv
 * (R = the sum of kv->n_new) - leaving the output rows at loom_gpt_output(m,
 * 0). Collective over tp, and over ep for MoE blocks (every rank of the EP
 * group calls it, each with its own rows). The caller's checks bound R, the
 * positions and the slots; LOOM_EINTERNAL when the part is not forward_only. */
loom_status loom_gpt_forward_kv(loom_gpt *m, int R, const loom_gpt_kv *kv);
/* The slot's input buffer (Nx,C) for stages after the first. */
float *loom_gpt_input(loom_gpt *m, int slot);
/* The slot's output (Nx,C) for stages before the last. */
const float *loom_gpt_output(const loom_gpt *m, int slot);

/* Backward of micro-batch `slot`: from the loss scaled by dloss per token on
 * the last stage, else from dy (Nx,C), the gradient of the output. Gradients
 * accumulate into grad_mem (zero with loom_gpt_zero_grad). The input
 * gradient is left in loom_gpt_input_grad(m, slot) on stages after the first. */
loom_status loom_gpt_backward(loom_gpt *m, int slot, const float *dy, float dloss);
/* The two halves of loom_gpt_backward (needs opts.split_backward):
 * input gradients first (what the previous stage waits for), weight
 * gradients later. */
loom_status loom_gpt_backward_input(loom_gpt *m, int slot, const float *dy, float dloss);
loom_status loom_gpt_backward_weight(loom_gpt *m, int slot);
float *loom_gpt_input_grad(loom_gpt *m, int slot);
void loom_gpt_zero_grad(loom_gpt *m);
/* on = 1: the caller promises the parameters stay as they are until on = 0
 * (a step's forwards and backwards, before the optimizer), so in bf16 mode
 * each weight is converted once a step instead of at every use - with a
 * bf16 GEMM provider all of param_mem (or none of it, when the update
 * already wrote its copy: loom_gemm_keep_fill), else the tied wte of the
 * LM head (loom_gemm_keep). No effect on results. */
void loom_gpt_hold_weights(loom_gpt *m, int on);
/* The caller's promise that the next forward (with targets) is followed by
 * the same slot's loom_gpt_backward with this dloss before any other
 * forward or backward: a rank holding the whole vocabulary then computes
 * the loss's gradient in the cross-entropy's own pass over the logits
 * (loom_vxent_local_grad). Same results; the backward fails with
 * LOOM_EINTERNAL if the promise is broken. */
void loom_gpt_expect_backward(loom_gpt *m, float dloss);
/* After the last backward of a step: sum the gradients that sequence
 * parallelism leaves partial per TP rank (norms, wpe). Collective over tp. */
loom_status loom_gpt_finish_grads(loom_gpt *m);
/* The same for the tensors whose flat offset lies in [lo, lo + n), with their
 * gradients in `grads` laid out like the flat buffer from lo (a DP bucket). */
loom_status loom_gpt_sum_sp_partials(loom_gpt *m, float *grads, size_t lo, size_t n);

/* The table of the whole model on one device (tp = 1), without memory:
 * names, global shapes and offsets of a full parameter file. */
loom_status loom_param_table_whole(const loom_model_config *cfg, loom_param **out, int *n, size_t *total);

/* Model FLOPs per token for a forward+backward at sequence length T
 * (6 x matmul parameters incl. the LM head + 12 L C T for attention). */
double loom_gpt_flops_per_token(const loom_model_config *cfg, int T);

#endif
