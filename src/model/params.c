/* params.c - the sharded parameter table of one model part: names, global
 * and local shapes, how tensor parallelism cuts each tensor, and the init of
 * every local element from its global index. Local; no collectives.
 *
 * Cuts (Megatron's): c_attn and c_fc are column-parallel (their biases
 * split alike; c_attn's three q|k|v parts are split separately so each rank
 * owns whole heads), attn.c_proj and mlp.c_proj are row-parallel (biases
 * replicated), wte is split by vocabulary rows (padded to a multiple of tp),
 * LayerNorms and wpe are replicated.
 *
 * The Llama family (nn.Linear [out, in] weights, Hugging Face's names) is
 * cut the same way along its output rows: q_proj, k_proj, v_proj (and their
 * biases) by heads, gate_proj and up_proj by rows, o_proj and down_proj by
 * columns. q|k|v and gate|up are packed - adjacent with no alignment gap -
 * so each pair or triple is one matrix for one GEMM. With more tp ranks
 * than key/value heads each head's k_proj and v_proj rows are replicated
 * on tp / n_kv_head consecutive ranks (split_rep).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/model.h"
#include "loom/moe.h"
#include "loom/rng.h"
#include "model/internal.h"

typedef struct {
    const char *suffix;
    int rows_mult, cols_mult; /* global shape in units of C (cols 0 = 1-D) */
    int split_dim, parts;
    loom_init_kind init;
    int residual_proj; /* std scaled by 1/sqrt(2L) */
    int sp_partial;    /* gradient from this rank's rows only under SP (norms);
                                 row-parallel biases see the gathered gradient: complete */
} block_param;

/* One block, in Hugging Face's order. */
static const block_param BLOCK[] = {
    {"ln_1.weight", 1, 0, -1, 1, LOOM_INIT_ONES, 0, 1},
    {"ln_1.bias", 1, 0, -1, 1, LOOM_INIT_ZEROS, 0, 1},
    {"attn.c_attn.weight", 1, 3, 1, 3, LOOM_INIT_NORMAL, 0, 0},
    {"attn.c_attn.bias", 3, 0, 0, 3, LOOM_INIT_ZEROS, 0, 0},
    {"attn.c_proj.weight", 1, 1, 0, 1, LOOM_INIT_NORMAL, 1, 0},
    {"attn.c_proj.bias", 1, 0, -1, 1, LOOM_INIT_ZEROS, 0, 0},
    {"ln_2.weight", 1, 0, -1, 1, LOOM_INIT_ONES, 0, 1},
    {"ln_2.bias", 1, 0, -1, 1, LOOM_INIT_ZEROS, 0, 1},
    {"mlp.c_fc.weight", 1, 4, 1, 1, LOOM_INIT_NORMAL, 0, 0},
    {"mlp.c_fc.bias", 4, 0, 0, 1, LOOM_INIT_ZEROS, 0, 0},
    {"mlp.c_proj.weight", 4, 1, 0, 1, LOOM_INIT_NORMAL, 1, 0},
    {"mlp.c_proj.bias", 1, 0, -1, 1, LOOM_INIT_ZEROS, 0, 0},
};
#define N_BLOCK (int)(sizeof BLOCK / sizeof BLOCK[0])

/* The Llama family's block: suffix, global shape, cut, init, packed with the next. */
typedef enum { D_C, D_Q, D_KV, D_FFN, D_NONE } dim_kind;
typedef struct {
    const char *suffix;
    dim_kind rows, cols; /* cols D_NONE: 1-D */
    int split_dim;
    loom_init_kind init;
    int sp_partial, packed, bias; /* bias: 1 q/k/v bias, 2 o_proj bias (config switches) */
} llama_param;

static const llama_param LLAMA_BLOCK[] = {
    {"input_layernorm.weight", D_C, D_NONE, -1, LOOM_INIT_ONES, 1, 0, 0},
    {"self_attn.q_proj.weight", D_Q, D_C, 0, LOOM_INIT_NORMAL, 0, 1, 0},
    {"self_attn.k_proj.weight", D_KV, D_C, 0, LOOM_INIT_NORMAL, 0, 1, 0},
    {"self_attn.v_proj.weight", D_KV, D_C, 0, LOOM_INIT_NORMAL, 0, 0, 0},
    {"self_attn.q_proj.bias", D_Q, D_NONE, 0, LOOM_INIT_ZEROS, 0, 1, 1},
    {"self_attn.k_proj.bias", D_KV, D_NONE, 0, LOOM_INIT_ZEROS, 0, 1, 1},
    {"self_attn.v_proj.bias", D_KV, D_NONE, 0, LOOM_INIT_ZEROS, 0, 0, 1},
    {"self_attn.o_proj.weight", D_C, D_Q, 1, LOOM_INIT_NORMAL, 0, 0, 0},
    {"self_attn.o_proj.bias", D_C, D_NONE, -1, LOOM_INIT_ZEROS, 0, 0, 2},
    {"post_attention_layernorm.weight", D_C, D_NONE, -1, LOOM_INIT_ONES, 1, 0, 0},
    {"mlp.gate_proj.weight", D_FFN, D_C, 0, LOOM_INIT_NORMAL, 0, 1, 0},
    {"mlp.up_proj.weight", D_FFN, D_C, 0, LOOM_INIT_NORMAL, 0, 0, 0},
    {"mlp.down_proj.weight", D_C, D_FFN, 1, LOOM_INIT_NORMAL, 0, 0, 0},
};
#define N_LLAMA (int)(sizeof LLAMA_BLOCK / sizeof LLAMA_BLOCK[0])

int loom_gpt_max_params(const loom_model_config *cfg, const loom_model_part *part) {
    /* + Qwen2-MoE's shared expert and gate per block */
    return 5 + (N_LLAMA + 4) * (part->layer_end - part->layer_begin) + loom_moe_extra_params(cfg, part);
}

/* Append one entry; local shape from the global one and the cut (rep tp
 * ranks share each slice); packed: the next tensor follows with no gap. */
static void add_cut(loom_gpt *m, size_t *off, const char *name, int64_t r, int64_t c, int split_dim,
                    int parts, int64_t valid, loom_init_kind init, float std, int sp_partial, int unit,
                    int rep, int packed) {
    const int tp = m->part.tp.size;
    loom_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = c > 0 ? 2 : 1;
    p->shape[0] = r;
    p->shape[1] = c > 0 ? c : 1;
    p->lshape[0] = p->shape[0];
    p->lshape[1] = p->shape[1];
    if (split_dim >= 0) p->lshape[split_dim] = p->shape[split_dim] / (tp / rep); /* wte: the padded rows */
    p->numel = (size_t)(p->lshape[0] * p->lshape[1]);
    p->offset = *off;
    p->split_dim = split_dim;
    p->split_parts = parts;
    p->split_rep = rep;
    p->split_valid = valid;
    p->sp_partial = sp_partial && m->part.tp.sp;
    p->unit = unit;
    p->decay = p->ndim >= 2;
    p->init = init;
    p->init_std = std;
    *off += packed ? p->numel : (p->numel + 15) & ~(size_t)15; /* 64-byte aligned tensors */
}

static void add(loom_gpt *m, size_t *off, const char *name, int64_t r, int64_t c, int split_dim, int parts,
                int64_t valid, loom_init_kind init, float std, int sp_partial, int unit) {
    add_cut(m, off, name, r, c, split_dim, parts, valid, init, std, sp_partial, unit, 1, 0);
}

void loom_gpt_add_param(loom_gpt *m, size_t *off, const char *name, int64_t r, int64_t c, int split_dim,
                        int parts, int64_t valid, loom_init_kind init, float std, int sp_partial, int unit) {
    add(m, off, name, r, c, split_dim, parts, valid, init, std, sp_partial, unit);
}

/* Mixtral's experts of block l (those of this EP rank): w1 (gate) and w3
 * (up) by rows, packed as one [gate | up] matrix like the dense MLP's,
 * w2 (down) by columns. */
/* One SwiGLU MLP of H hidden units of block l, named model.layers.<l>.<what>
 * (with e >= 0: <what>.<e>) + "." + {gate,up,down} + ".weight" (Mixtral:
 * w1, w3, w2): gate and up by rows, packed as one [gate | up] matrix like
 * the dense MLP's, down by columns. */
static void add_swiglu(loom_gpt *m, size_t *off, int l, const char *what, int e, const char *const w[3],
                       int64_t H, float std, int unit) {
    const int64_t C = m->cfg.n_embd;
    char name[LOOM_PARAM_NAME_MAX];
    for (int i = 0; i < 3; i++) {
        if (e >= 0) snprintf(name, sizeof name, "model.layers.%d.%s.%d.%s.weight", l, what, e, w[i]);
        else snprintf(name, sizeof name, "model.layers.%d.%s.%s.weight", l, what, w[i]);
        if (i < 2) add_cut(m, off, name, H, C, 0, 1, H, LOOM_INIT_NORMAL, std, 0, unit, 1, i == 0);
        else add_cut(m, off, name, C, H, 1, 1, H, LOOM_INIT_NORMAL, std, 0, unit, 1, 0);
    }
}

static const char *const MIXTRAL_W[3] = {"w1", "w3", "w2"}, *const PROJ_W[3] = {"gate_proj", "up_proj",
                                                                                "down_proj"};

/* The MoE MLP's module of block l: Mixtral's block_sparse_moe, else mlp. */
static const char *moe_module(const loom_model_config *c) {
    return !strcmp(c->arch, "mixtral") ? "block_sparse_moe" : "mlp";
}

/* The experts of block l on this EP rank. */
static void add_llama_experts(loom_gpt *m, size_t *off, int l, float std) {
    const int P = m->part.ep ? loom_comm_size(m->part.ep) : 1, El = m->cfg.n_expert / P;
    const int e0 = (m->part.ep ? loom_comm_rank(m->part.ep) : 0) * El, unit = P > 1 ? LOOM_UNIT_EXPERTS : l;
    const int mixtral = !strcmp(m->cfg.arch, "mixtral");
    const char *what = mixtral ? "block_sparse_moe.experts" : "mlp.experts";
    for (int e = e0; e < e0 + El; e++)
        add_swiglu(m, off, l, what, e, mixtral ? MIXTRAL_W : PROJ_W, loom_moe_hidden(&m->cfg), std, unit);
}

/* The MoE MLP of block l: its router (replicated), Qwen2-MoE's shared
 * expert and its sigmoid gate, and the experts unless expert parallelism
 * puts them after every block. */
static void add_llama_moe(loom_gpt *m, size_t *off, int l, float std) {
    char name[LOOM_PARAM_NAME_MAX];
    snprintf(name, sizeof name, "model.layers.%d.%s.gate.weight", l, moe_module(&m->cfg));
    add(m, off, name, m->cfg.n_expert, m->cfg.n_embd, -1, 1, m->cfg.n_expert, LOOM_INIT_NORMAL, std, 0, l);
    if (m->cfg.shared_hidden > 0) {
        add_swiglu(m, off, l, "mlp.shared_expert", -1, PROJ_W, m->cfg.shared_hidden, std, l);
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        add(m, off, name, 1, m->cfg.n_embd, -1, 1, 1, LOOM_INIT_NORMAL, std, 0, l);
    }
    if (!(m->part.ep && loom_comm_size(m->part.ep) > 1)) add_llama_experts(m, off, l, std);
}

/* The Llama family: the outer tensors (embed_tokens, norm, lm_head) first,
 * then each block's in LLAMA_BLOCK's order (an MoE block's router and
 * experts in place of its mlp). */
static void build_llama(loom_gpt *m, size_t *off) {
    const loom_model_config *c = &m->cfg;
    const int64_t C = c->n_embd, V = c->vocab_size, tp = m->part.tp.size, HS = loom_model_head_size(c);
    const int64_t V_pad = (V + tp - 1) / tp * tp, kv = loom_model_kv_heads(c);
    const int kv_rep = tp > kv ? (int)(tp / kv) : 1;
    const float std = c->init_std > 0 ? c->init_std : 0.02f;
    if (m->part.has_embed || (m->part.has_head && !c->untied)) {
        add(m, off, "model.embed_tokens.weight", V_pad, C, 0, 1, V, LOOM_INIT_NORMAL, std, 0,
            LOOM_UNIT_OUTER);
        m->params[m->n_params - 1].shape[0] = V; /* the global tensor is unpadded */
    }
    if (m->part.has_head) {
        add(m, off, "model.norm.weight", C, 0, -1, 1, C, LOOM_INIT_ONES, 0, 1, LOOM_UNIT_OUTER);
        if (c->untied) {
            add(m, off, "lm_head.weight", V_pad, C, 0, 1, V, LOOM_INIT_NORMAL, std, 0, LOOM_UNIT_OUTER);
            m->params[m->n_params - 1].shape[0] = V;
        }
    }
    const int64_t extent[] = {C, c->n_head * HS, kv * HS, loom_model_ffn(c), 0};
    char name[LOOM_PARAM_NAME_MAX];
    for (int l = m->part.layer_begin; l < m->part.layer_end; l++)
        for (int k = 0; k < N_LLAMA; k++) {
            const llama_param *b = &LLAMA_BLOCK[k];
            if ((b->bias == 1 && !c->qkv_bias) || (b->bias == 2 && !c->o_bias)) continue;
            if (loom_moe_layer(c, l) && !strncmp(b->suffix, "mlp.", 4)) {
                if (!strcmp(b->suffix, "mlp.down_proj.weight")) add_llama_moe(m, off, l, std);
                continue;
            }
            snprintf(name, sizeof name, "model.layers.%d.%s", l, b->suffix);
            int64_t r = extent[b->rows], cols = extent[b->cols];
            int rep = b->rows == D_KV ? kv_rep : 1;
            add_cut(m, off, name, r, cols, b->split_dim, 1, b->split_dim == 1 ? cols : r, b->init,
                    b->init == LOOM_INIT_NORMAL ? std : 0.0f, b->sp_partial, l, rep, b->packed);
        }
    if (m->part.ep && loom_comm_size(m->part.ep) > 1) /* expert-parallel: the local experts last */
        for (int l = m->part.layer_begin; l < m->part.layer_end; l++)
            if (loom_moe_layer(c, l)) add_llama_experts(m, off, l, std);
}

size_t loom_gpt_build_table(loom_gpt *m) {
    const loom_model_config *c = &m->cfg;
    if (c->family == LOOM_FAMILY_LLAMA) {
        size_t off = 0;
        m->n_params = 0;
        build_llama(m, &off);
        return off;
    }
    const int64_t C = c->n_embd, V = c->vocab_size, tp = m->part.tp.size;
    const int64_t V_pad = (V + tp - 1) / tp * tp;
    const float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    size_t off = 0;
    m->n_params = 0;
    /* wte rows: the padded vocabulary is what gets split; rows >= V are padding */
    if (m->part.has_embed || m->part.has_head) {
        add(m, &off, "wte.weight", V_pad, C, 0, 1, V, LOOM_INIT_NORMAL, std, 0, LOOM_UNIT_OUTER);
        m->params[m->n_params - 1].shape[0] = V; /* the global tensor is unpadded */
    }
    if (m->part.has_embed)
        add(m, &off, "wpe.weight", c->n_positions, C, -1, 1, c->n_positions, LOOM_INIT_NORMAL, std, 1,
            LOOM_UNIT_OUTER);
    if (m->part.has_head) {
        add(m, &off, "ln_f.weight", C, 0, -1, 1, C, LOOM_INIT_ONES, 0, 1, LOOM_UNIT_OUTER);
        add(m, &off, "ln_f.bias", C, 0, -1, 1, C, LOOM_INIT_ZEROS, 0, 1, LOOM_UNIT_OUTER);
    }
    char name[LOOM_PARAM_NAME_MAX];
    for (int l = m->part.layer_begin; l < m->part.layer_end; l++)
        for (int k = 0; k < N_BLOCK; k++) {
            const block_param *b = &BLOCK[k];
            int moe = loom_moe_layer(c, l); /* its MLP rows are the router's and experts' */
            if (moe && !strncmp(b->suffix, "mlp.", 4)) {
                if (!strcmp(b->suffix, "mlp.c_fc.weight")) loom_moe_add_params(m, &off, l, std, res_std);
                continue;
            }
            snprintf(name, sizeof name, "h.%d.%s", l, b->suffix);
            int64_t r = b->rows_mult * C, cols = b->cols_mult * C;
            int64_t valid = b->split_dim == 1 ? cols : r;
            float s = b->init == LOOM_INIT_NORMAL ? (b->residual_proj ? res_std : std) : 0.0f;
            add(m, &off, name, r, cols, b->split_dim, b->parts, valid, b->init, s, b->sp_partial, l);
        }
    if (m->part.ep && loom_comm_size(m->part.ep) > 1) /* expert-parallel: the local experts last */
        for (int l = m->part.layer_begin; l < m->part.layer_end; l++)
            if (loom_moe_layer(c, l)) loom_moe_add_experts(m, &off, l, std, res_std);
    return off;
}

/* The global index of local coordinate x along a split axis of global
 * extent `ext` (padded), local extent `lext`, in `parts` parts. */
static int64_t global_coord(int64_t x, int64_t ext, int64_t lext, int parts, int tp_rank) {
    /* tp_rank: the index of the slice (the rank over split_rep) */
    int64_t lpart = lext / parts, part = x / lpart, xi = x % lpart;
    return part * (ext / parts) + (int64_t)tp_rank * lpart + xi;
}

int64_t loom_param_global_index(const loom_param *p, int tp_rank, size_t i) {
    int64_t r = (int64_t)i / p->lshape[1], c = (int64_t)i % p->lshape[1];
    int64_t gr = r, gc = c;
    /* with one part (the only case with padding) the part index is 0 and the
     * global extent does not enter */
    const int slice = tp_rank / (p->split_rep > 1 ? p->split_rep : 1);
    if (p->split_dim == 0) {
        gr = global_coord(r, p->shape[0], p->lshape[0], p->split_parts, slice);
        if (gr >= p->split_valid) return -1;
    } else if (p->split_dim == 1) {
        gc = global_coord(c, p->shape[1], p->lshape[1], p->split_parts, slice);
    }
    return gr * p->shape[1] + gc;
}

/* Local elements [a, b) of p (a, b relative to p) into dst: contiguous runs
 * of global indices (a row, or one part of a column-split row) go to
 * loom_rng_fill_normal in one call. */
static void init_span(const loom_param *p, int tp_rank, loom_rng_key key, size_t a, size_t b, float *dst) {
    const size_t cols = (size_t)p->lshape[1];
    const size_t seg = p->split_dim == 1 ? cols / (size_t)p->split_parts : cols;
    for (size_t f = a; f < b;) {
        size_t c = f % cols, end = f + (seg - c % seg);
        if (end > b) end = b;
        int64_t g = loom_param_global_index(p, tp_rank, f);
        if (g < 0) memset(dst + (f - a), 0, (end - f) * sizeof *dst);
        else if (p->init == LOOM_INIT_NORMAL)
            loom_rng_fill_normal(key, (uint64_t)g, dst + (f - a), end - f, p->init_std);
        else
            for (size_t i = f; i < end; i++) dst[i - a] = p->init == LOOM_INIT_ONES ? 1.0f : 0.0f;
        f = end;
    }
}

/* Elements per thread task of the init (a few rows of 124M's matrices). */
#define INIT_TASK 16384

static void init_range_host(const loom_gpt *m, uint64_t seed, size_t lo, size_t n, float *dst) {
    const int tp_rank = m->part.tp.rank;
    size_t zeroed = lo; /* [lo, zeroed) written: the tensors are in offset order */
    for (int k = 0; k < m->n_params; k++) {
        const loom_param *p = &m->params[k];
        size_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->numel;
        if (b > lo + n) b = lo + n;
        if (a >= b) continue;
        if (a > zeroed) memset(dst + (zeroed - lo), 0, (a - zeroed) * sizeof *dst); /* alignment gap */
        zeroed = b;
        loom_rng_key key = loom_rng_key_make(seed, p->name);
        size_t ntask = (b - a + INIT_TASK - 1) / INIT_TASK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(m->dev->threads) if (ntask > 1)
#endif
        for (size_t t = 0; t < ntask; t++) {
            size_t s0 = a + t * INIT_TASK, s1 = s0 + INIT_TASK < b ? s0 + INIT_TASK : b;
            init_span(p, tp_rank, key, s0 - p->offset, s1 - p->offset, dst + (s0 - lo));
        }
    }
    if (lo + n > zeroed) memset(dst + (zeroed - lo), 0, (lo + n - zeroed) * sizeof *dst);
}

/* dst is the part's device memory: filled in place when that is host memory,
 * else generated on the host a chunk at a time and uploaded. */
void loom_gpt_init_range(const loom_gpt *m, uint64_t seed, size_t lo, size_t n, float *dst) {
    if (m->dev->be->host_memory) {
        init_range_host(m, seed, lo, n, dst);
        return;
    }
    float chunk[INIT_TASK];
    for (size_t k = 0; k < n; k += INIT_TASK) {
        size_t c = n - k < INIT_TASK ? n - k : INIT_TASK;
        init_range_host(m, seed, lo + k, c, chunk);
        loom_tensor_upload(m->dev, dst + k, chunk, c);
    }
}

void loom_gpt_init_params(loom_gpt *m, uint64_t seed) {
    loom_gpt_init_range(m, seed, 0, m->num_params, m->param_mem);
}

const loom_param *loom_gpt_find_param(const loom_gpt *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

int loom_param_norm_skip(const loom_gpt *m, const loom_param *p) {
    if (p->split_rep > 1 && m->part.tp.rank % p->split_rep != 0) return 1;
    return !m->part.has_embed && strcmp(p->name, loom_model_embed_name(&m->cfg)) == 0;
}

void loom_gpt_unit_range(const loom_gpt *m, int unit, size_t *offset, size_t *count) {
    size_t lo = (size_t)-1, hi = 0;
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *p = &m->params[i];
        if (p->unit != unit) continue;
        if (p->offset < lo) lo = p->offset;
        size_t end = p->offset + ((p->numel + 15) & ~(size_t)15);
        if (end > hi) hi = end;
    }
    *offset = lo == (size_t)-1 ? 0 : lo;
    *count = lo == (size_t)-1 ? 0 : hi - lo;
}

const char *loom_param_block(const loom_model_config *c, const char *name, int *layer) {
    const char *pre = c->family == LOOM_FAMILY_LLAMA ? "model.layers." : "h.";
    size_t n = strlen(pre);
    if (strncmp(name, pre, n) != 0 || !strchr(name + n, '.')) return NULL;
    *layer = atoi(name + n);
    return strchr(name + n, '.') + 1;
}

/* The view an outer tensor binds to (NULL: none). */
static float **outer_view(loom_gpt_weights *w, const char *nm) {
    if (!strcmp(nm, "wte.weight") || !strcmp(nm, "model.embed_tokens.weight")) return &w->wte;
    if (!strcmp(nm, "wpe.weight")) return &w->wpe;
    if (!strcmp(nm, "ln_f.weight") || !strcmp(nm, "model.norm.weight")) return &w->lnf_w;
    if (!strcmp(nm, "ln_f.bias")) return &w->lnf_b;
    if (!strcmp(nm, "lm_head.weight")) return &w->lm_head;
    return NULL;
}

/* The view a block tensor binds to: GPT-2's by name, the Llama family's
 * packed q|k|v, q|k|v biases and gate|up by their first tensor. */
static float **block_view(loom_gpt_layer_w *h, const char *suffix) {
    static const char *LLAMA[] = {"input_layernorm.weight", "self_attn.q_proj.weight",
                                  "self_attn.q_proj.bias",  "self_attn.o_proj.weight",
                                  "self_attn.o_proj.bias",  "post_attention_layernorm.weight",
                                  "mlp.gate_proj.weight",   "mlp.down_proj.weight"};
    float **gpt[N_BLOCK] = {&h->ln1_w, &h->ln1_b, &h->qkv_w, &h->qkv_b, &h->proj_w, &h->proj_b,
                            &h->ln2_w, &h->ln2_b, &h->fc_w,  &h->fc_b,  &h->fcp_w,  &h->fcp_b};
    float **llama[] = {&h->ln1_w,  &h->qkv_w, &h->qkv_b, &h->proj_w,
                       &h->proj_b, &h->ln2_w, &h->fc_w,  &h->fcp_w};
    for (int k = 0; k < N_BLOCK; k++)
        if (!strcmp(suffix, BLOCK[k].suffix)) return gpt[k];
    for (size_t k = 0; k < sizeof LLAMA / sizeof LLAMA[0]; k++)
        if (!strcmp(suffix, LLAMA[k])) return llama[k];
    return NULL;
}

/* Views of one unit into `base` (which holds the unit's range). */
static void bind_views(loom_gpt *m, int unit, float *base, loom_gpt_weights *w) {
    size_t lo, n;
    loom_gpt_unit_range(m, unit, &lo, &n);
    for (int i = 0; i < m->n_params; i++) {
        const loom_param *p = &m->params[i];
        if (p->unit != unit) continue;
        float *v = base + (p->offset - lo), **view;
        int l = unit;
        if (unit == LOOM_UNIT_OUTER) {
            if ((view = outer_view(w, p->name))) *view = v;
            continue;
        }
        const char *suffix = loom_param_block(&m->cfg, p->name, &l);
        if (unit == LOOM_UNIT_EXPERTS) { /* "<block>.mlp.experts...." */
            loom_moe_bind(m, l, suffix, v, w == &m->g);
            continue;
        }
        loom_gpt_layer_w *h = &w->h[unit - m->part.layer_begin];
        if ((view = block_view(h, suffix))) *view = v;
        loom_moe_bind(m, unit, suffix, v, w == &m->g);
    }
    if (unit == LOOM_UNIT_OUTER && !m->cfg.untied) w->lm_head = w->wte; /* the tied head */
}

void loom_gpt_bind_unit(loom_gpt *m, int unit, float *params, float *grads) {
    if (params) bind_views(m, unit, params, &m->w);
    if (grads) bind_views(m, unit, grads, &m->g);
}

void loom_gpt_bind_all(loom_gpt *m) {
    size_t lo, n;
    for (int u = LOOM_UNIT_EXPERTS; u < m->part.layer_end; u++) {
        if (u >= 0 && u < m->part.layer_begin) continue;
        loom_gpt_unit_range(m, u, &lo, &n);
        loom_gpt_bind_unit(m, u, m->param_mem ? m->param_mem + lo : NULL,
                           m->grad_mem ? m->grad_mem + lo : NULL);
    }
    loom_moe_bind_storage(m); /* expert tensors of a part without flat buffers */
}

loom_status loom_param_table_whole(const loom_model_config *cfg, loom_param **out, int *n, size_t *total) {
    loom_gpt tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *cfg;
    tmp.part = loom_model_part_whole(NULL, cfg); /* a table, no memory */
    tmp.params = calloc((size_t)loom_gpt_max_params(cfg, &tmp.part), sizeof *tmp.params);
    if (!tmp.params) return loom_fail(LOOM_EOS, "out of memory for the parameter table");
    *total = loom_gpt_build_table(&tmp);
    *out = tmp.params;
    *n = tmp.n_params;
    return LOOM_OK;
}
