/* model.h - the GPT-2 model: config, parameter table, forward and backward.
 *
 * The parameter table drives everything that touches parameters - init,
 * optimizer, gradient sync, checkpoints, parity checks - by name, never by
 * magic index. Names and shapes are Hugging Face GPT-2's (linear weights
 * stored [in, out] as its Conv1D does), so a table row *is* a safetensors
 * entry. Every element is initialised from the counter RNG keyed by
 * (seed, name, global element index) (invariant 1).
 *
 * Memory: four arenas, one per lifetime class - params, grads, activations
 * (planned for the largest micro-batch B x T given at creation) and scratch
 * for the backward pass. Forward and backward never allocate. This file is
 * local compute only: no collectives.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "loom/arena.h"
#include "loom/status.h"

typedef struct loom_model_config {
    char name[64];
    int n_layer, n_head, n_embd, vocab_size, n_positions;
} loom_model_config;

/* Built-in names: tiny, mini, gpt2-small (alias gpt2), gpt2-medium,
 * gpt2-large, gpt2-xl. LOOM_EUSAGE for an unknown name, listing the known. */
loom_status loom_model_config_builtin(const char *name, loom_model_config *cfg);
/* A Hugging Face GPT-2 config.json (n_layer, n_head, n_embd, vocab_size,
 * n_positions; other known HF keys are checked where they change the
 * architecture). LOOM_ENOINPUT / LOOM_ECONFIG with the key named. */
loom_status loom_model_config_load(const char *path, loom_model_config *cfg);
/* NAME or FILE.json (anything containing '/' or ending in .json is a file). */
loom_status loom_model_config_resolve(const char *name_or_path, loom_model_config *cfg);
/* Sizes positive, n_head divides n_embd. */
loom_status loom_model_config_check(const loom_model_config *cfg);

typedef enum { LOOM_INIT_NORMAL, LOOM_INIT_ZEROS, LOOM_INIT_ONES } loom_init_kind;

#define LOOM_PARAM_NAME_MAX 64

typedef struct loom_param {
    char name[LOOM_PARAM_NAME_MAX]; /* "h.3.mlp.c_fc.weight" */
    int ndim;
    int64_t shape[2];               /* global shape */
    size_t numel;
    size_t offset;                  /* floats from the start of the params (and grads) buffer */
    int decay;                      /* weight decay applies (ndim >= 2) */
    loom_init_kind init;
    float init_std;
} loom_param;

/* Per-layer views into the parameter buffer (or the gradient buffer). */
typedef struct loom_gpt_layer_w {
    float *ln1_w, *ln1_b;   /* (C) */
    float *qkv_w, *qkv_b;   /* (C, 3C), (3C) */
    float *proj_w, *proj_b; /* (C, C), (C) */
    float *ln2_w, *ln2_b;   /* (C) */
    float *fc_w, *fc_b;     /* (C, 4C), (4C) */
    float *fcp_w, *fcp_b;   /* (4C, C), (C) */
} loom_gpt_layer_w;

typedef struct loom_gpt_weights {
    float *wte;           /* (V, C) */
    float *wpe;           /* (maxT, C) */
    loom_gpt_layer_w *h;  /* n_layer entries */
    float *lnf_w, *lnf_b; /* (C) */
} loom_gpt_weights;

typedef struct loom_gpt_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C) (B,T) (B,T) */
    float *qkv;                       /* (B,T,3C) */
    float *atty;                      /* (B,T,C) */
    float *att;                       /* (B,NH,T,T) */
    float *res2;                      /* (B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C) (B,T) (B,T) */
    float *fch, *fch_gelu;            /* (B,T,4C) */
    float *res3;                      /* (B,T,C) residual after the MLP */
} loom_gpt_layer_acts;

typedef struct loom_gpt {
    loom_model_config cfg;
    int B, T; /* planned micro-batch */
    int n_params;
    loom_param *params;
    size_t num_params; /* floats */
    float *param_mem, *grad_mem;
    loom_gpt_weights w, g; /* views into param_mem and grad_mem */
    /* activations (B, T planned) */
    int32_t *inputs, *targets;  /* (B,T) copies of the current batch */
    float *encoded;             /* (B,T,C) */
    loom_gpt_layer_acts *acts;  /* n_layer */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C) (B,T) (B,T) */
    float *logits;              /* (B,T,V) probabilities after forward */
    float *losses;              /* (B,T) */
    /* backward scratch */
    float *dres, *dc, *d3c, *d4c_a, *d4c_b; /* (B,T,C) (B,T,C) (B,T,3C) (B,T,4C) x2 */
    float *att_scratch;
    int cur_B, cur_T;           /* shape of the last forward */
    int have_targets;
    loom_arena a_params, a_grads, a_acts;
} loom_gpt;

/* Build the table and plan + allocate memory for micro-batches up to B x T.
 * LOOM_EUSAGE if T > n_positions; LOOM_EOS if memory cannot be had. */
loom_status loom_gpt_create(const loom_model_config *cfg, int B, int T, loom_gpt **out);
void loom_gpt_free(loom_gpt *m);
/* Every parameter element from the counter RNG: normal(0, 0.02) for weights,
 * 0.02/sqrt(2*n_layer) for the residual projections (attn.c_proj, mlp.c_proj),
 * zeros for biases, ones for LayerNorm weights. */
void loom_gpt_init_params(loom_gpt *m, uint64_t seed);
const loom_param *loom_gpt_find_param(const loom_gpt *m, const char *name);
/* Bytes per lifetime class, for reports. */
size_t loom_gpt_activation_bytes(const loom_gpt *m);

/* Forward on inputs (B,T); with targets (may be NULL) also the per-token
 * losses and their sum in *loss_sum (may be NULL). B, T at most the planned. */
void loom_gpt_forward(loom_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                      double *loss_sum);
/* Backward of sum(losses) * dloss into the gradient buffer (accumulates, so
 * micro-batches add up; zero with loom_gpt_zero_grad). Needs a forward with
 * targets just before. */
void loom_gpt_backward(loom_gpt *m, float dloss);
void loom_gpt_zero_grad(loom_gpt *m);

/* Model FLOPs per token for a forward+backward at sequence length T
 * (6 x matmul parameters incl. the LM head + 12 L C T for attention). */
double loom_gpt_flops_per_token(const loom_model_config *cfg, int T);

#endif
