/* infer.c - forward-only GPT-2 (dense or MoE) with a KV cache over the
 * training model's parts: the weights are a loom_gpt part (same table, shards
 * and loader as training) made forward_only, whose blocks run the training
 * block forward with attention reading and extending a per-sequence cache
 * (loom_gpt_forward_kv); this file adds the embedding of the new tokens at
 * their positions, the pipeline hand-over and the head on each sequence's
 * last row. See include/loom/infer.h. */
#include "loom/infer.h"

#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/cpu.h" /* loom_attention_kv_scratch_floats */
#include "loom/kernels.h"
#include "loom/pipeline.h"
#include "loom/train.h"

#define PP_TAG 7301

struct loom_infer {
    loom_model_config cfg;
    loom_infer_opts o;
    const loom_mesh *mesh;
    loom_comm *pp; /* NULL with one stage */
    int pp_rank, pp_size;
    loom_gpt *m;
    int C, C_l, NH_l, V_l, L_l, tp;
    int *len;           /* (max_seqs) cached positions per sequence */
    int *pos;           /* (max_seqs) a step's entries' positions before it */
    float *kc, *vc;     /* (L_l, max_seqs, max_len, C_l) */
    float *att_scratch; /* the cached attention's scratch for R rows */
    int32_t *rows_tok;  /* (R) */
    float *last, *lnf, *lnf_mean, *lnf_rstd, *logits_l, *gathered, *logits; /* S rows */
    loom_arena arena;
};

#define F(n) ((size_t)(n) * sizeof(float))

static void *take(loom_arena *a, size_t bytes) {
    if (!a->base) {
        loom_arena_reserve(a, bytes);
        return NULL;
    }
    return loom_arena_alloc(a, bytes);
}

static void layout(loom_infer *f) {
    loom_arena *a = &f->arena;
    const size_t R = (size_t)f->o.max_rows, S = (size_t)f->o.max_seqs, C = (size_t)f->C;
    const size_t cache = (size_t)f->L_l * S * (size_t)f->o.max_len * (size_t)f->m->KV_l; /* KV heads' width */
    f->kc = take(a, F(cache));
    f->vc = take(a, F(cache));
    f->att_scratch = take(a, F(loom_attention_kv_scratch_floats(f->o.dev->threads, (int)R, f->o.max_len)));
    f->rows_tok = take(a, R * sizeof(int32_t));
    f->last = take(a, F(S * C));
    f->lnf = take(a, F(S * C));
    f->lnf_mean = take(a, F(S));
    f->lnf_rstd = take(a, F(S));
    f->logits_l = take(a, F(S * (size_t)f->V_l));
    f->gathered = take(a, F(S * (size_t)f->V_l * (size_t)f->tp));
}

static loom_status check_opts(const loom_model_config *cfg, const loom_mesh *mesh, const loom_infer_opts *o) {
    if (o->max_seqs < 1 || o->max_rows < 1 || o->max_len < 1)
        return loom_fail(LOOM_EUSAGE,
                         "inference: max sequences %d, max rows %d and max length %d must be >= 1",
                         o->max_seqs, o->max_rows, o->max_len);
    if (o->max_len > cfg->n_positions)
        return loom_fail(LOOM_EUSAGE, "inference: max length %d exceeds n_positions=%d of model %s",
                         o->max_len, cfg->n_positions, cfg->name);
    if (!mesh) return LOOM_OK;
    const loom_layout_model shape = loom_model_shape(cfg);
    const loom_layout_job job = {.purpose = LOOM_LAYOUT_FOR_INFER, .world = mesh->world_size};
    return loom_layout_validate(&mesh->layout, &shape, &job);
}

loom_status loom_infer_create(const loom_model_config *cfg, const loom_mesh *mesh, const loom_infer_opts *o,
                              loom_infer **out) {
    *out = NULL;
    LOOM_TRY(loom_model_config_check(cfg));
    LOOM_TRY(check_opts(cfg, mesh, o));
    loom_infer *f = calloc(1, sizeof *f);
    if (!f) return loom_fail(LOOM_EOS, "inference: out of memory");
    f->cfg = *cfg;
    f->o = *o;
    f->mesh = mesh;
    f->pp_size = mesh ? mesh->layout.pp : 1;
    f->pp_rank = mesh ? mesh->pp_rank : 0;
    f->pp = mesh && f->pp_size > 1 ? mesh->pp : NULL;
    loom_model_part part = loom_model_part_whole(o->dev, cfg);
    if (mesh) {
        part.tp = (loom_tp){
            .dev = o->dev, .comm = mesh->tp, .size = mesh->layout.tp, .rank = mesh->tp_rank, .sp = 0};
        part.ep = mesh->layout.ep > 1 ? mesh->ep : NULL;
        int counts[LOOM_INFER_MAX_STAGES], first = 0;
        /* the training planner's balance: a block ~ 24 C^2 + 4 T C, the head 2 V C */
        double C = cfg->n_embd, block = 24.0 * C * C + 4.0 * o->max_len * C;
        loom_status st = loom_partition_balance(cfg->n_layer, f->pp_size, 1, 0.01,
                                                2.0 * cfg->vocab_size * C / block, counts);
        if (st != LOOM_OK) {
            free(f);
            return st;
        }
        for (int s = 0; s < f->pp_rank; s++) first += counts[s];
        part.layer_begin = first;
        part.layer_end = first + counts[f->pp_rank];
        part.has_embed = f->pp_rank == 0;
        part.has_head = f->pp_rank == f->pp_size - 1;
    }
    /* rows of a step through the blocks: the part's one forward-only set */
    loom_gpt_opts go = {.B = 1, .T = o->max_rows, .n_slots = 1, .forward_only = 1};
    loom_status st = loom_gpt_create(cfg, &part, &go, &f->m);
    if (st != LOOM_OK) {
        free(f);
        return st;
    }
    f->C = f->m->C;
    f->C_l = f->m->C_l;
    f->NH_l = f->m->NH_l;
    f->V_l = f->m->V_l;
    f->L_l = f->m->L_l;
    f->tp = part.tp.size;
    loom_device_arena_init(o->dev, &f->arena, "kv cache");
    layout(f);
    st = loom_arena_commit(&f->arena);
    /* host side: sequence lengths and the logits handed to the caller */
    f->len = calloc((size_t)o->max_seqs, sizeof *f->len);
    f->pos = calloc((size_t)o->max_seqs, sizeof *f->pos);
    f->logits = calloc((size_t)o->max_seqs * (size_t)cfg->vocab_size, sizeof *f->logits);
    if (st == LOOM_OK && (!f->len || !f->pos || !f->logits))
        st = loom_fail(LOOM_EOS, "out of memory for the inference logits");
    if (st != LOOM_OK) {
        loom_infer_free(f);
        return st;
    }
    layout(f);
    *out = f;
    return LOOM_OK;
}

void loom_infer_free(loom_infer *f) {
    if (!f) return;
    loom_gpt_free(f->m);
    loom_arena_free(&f->arena);
    free(f->len);
    free(f->pos);
    free(f->logits);
    free(f);
}

loom_status loom_infer_load(loom_infer *f, const char *path) {
    return loom_params_load(&f->m, 1, f->mesh, NULL, path);
}

void loom_infer_init_random(loom_infer *f, uint64_t seed) { loom_gpt_init_params(f->m, seed); }
void loom_infer_reset(loom_infer *f, int s) { f->len[s] = 0; }
int loom_infer_len(const loom_infer *f, int s) { return f->len[s]; }

loom_status loom_infer_share_prefix(loom_infer *f, int dst, int src, int n) {
    const int S = f->o.max_seqs;
    if (dst < 0 || dst >= S || src < 0 || src >= S || n < 0 || n > f->len[src])
        return loom_fail(LOOM_EUSAGE,
                         "inference: sequence %d cannot start as %d positions of sequence %d (%d cached)",
                         dst, n, src, src >= 0 && src < S ? f->len[src] : -1);
    if (src != dst && n > 0)
        for (int l = 0; l < f->L_l; l++) {
            const size_t at_d = ((size_t)l * S + dst) * f->o.max_len * f->C_l,
                         at_s = ((size_t)l * S + src) * f->o.max_len * f->C_l;
            loom_tensor_copy(f->m->dev, f->kc + at_d, f->kc + at_s, (size_t)n * f->C_l);
            loom_tensor_copy(f->m->dev, f->vc + at_d, f->vc + at_s, (size_t)n * f->C_l);
        }
    f->len[dst] = n;
    return LOOM_OK;
}
int loom_infer_last_stage(const loom_infer *f) { return f->m->part.has_head; }
const loom_model_config *loom_infer_config(const loom_infer *f) { return &f->cfg; }
const loom_infer_opts *loom_infer_options(const loom_infer *f) { return &f->o; }
size_t loom_infer_cache_bytes(const loom_infer *f) {
    return 2 * F((size_t)f->L_l * f->o.max_seqs * (size_t)f->o.max_len * f->m->KV_l);
}

/* ln_f and the tied LM head on each entry's last row; logits gathered over
 * the vocabulary shards into f->logits (n, V). */
static loom_status head_step(loom_infer *f, int n, const int *n_new) {
    const int C = f->C, Vl = f->V_l, V = f->cfg.vocab_size;
    const float *x = loom_gpt_output(f->m, 0); /* (R,C) */
    for (int j = 0, r = 0; j < n; j++) {
        r += n_new[j];
        loom_tensor_copy(f->m->dev, f->last + (size_t)j * C, x + (size_t)(r - 1) * C, (size_t)C);
    }
    loom_part_norm_fwd(f->m, f->lnf, f->lnf_mean, f->lnf_rstd, f->last, f->m->w.lnf_w, f->m->w.lnf_b, n);
    loom_matmul_nt_fwd(f->m->dev, f->logits_l, f->lnf, f->m->w.lm_head, n, C, Vl);
    LOOM_TRY(loom_sp_gather_fwd(&f->m->part.tp, f->logits_l, f->gathered, (size_t)n * Vl));
    for (int j = 0; j < n; j++)
        for (int k = 0; k < f->tp; k++) {
            int v0 = k * Vl, cnt = V - v0 < Vl ? V - v0 : Vl;
            if (cnt > 0)
                loom_tensor_download(f->m->dev, f->logits + (size_t)j * V + v0,
                                     f->gathered + ((size_t)k * n + j) * Vl, (size_t)cnt);
        }
    return LOOM_OK;
}

static loom_status check_step(const loom_infer *f, int n, const int *seq, const int *n_new,
                              const int32_t *tokens, int *rows) {
    if (n < 1 || n > f->o.max_seqs)
        return loom_fail(LOOM_EUSAGE, "inference step: %d sequences, between 1 and %d", n, f->o.max_seqs);
    int R = 0;
    for (int j = 0; j < n; j++) {
        if (seq[j] < 0 || seq[j] >= f->o.max_seqs)
            return loom_fail(LOOM_EUSAGE, "inference step: sequence %d outside [0, %d)", seq[j],
                             f->o.max_seqs);
        for (int k = 0; k < j; k++)
            if (seq[k] == seq[j]) return loom_fail(LOOM_EUSAGE, "inference step: sequence %d twice", seq[j]);
        if (n_new[j] < 1 || f->len[seq[j]] + n_new[j] > f->o.max_len)
            return loom_fail(LOOM_EUSAGE,
                             "inference step: sequence %d has %d positions, +%d passes max length %d", seq[j],
                             f->len[seq[j]], n_new[j], f->o.max_len);
        R += n_new[j];
        if (R > f->o.max_rows)
            return loom_fail(LOOM_EUSAGE, "inference step: more than %d new tokens", f->o.max_rows);
    }
    for (int r = 0; r < R; r++)
        if (tokens[r] < 0 || tokens[r] >= f->cfg.vocab_size)
            return loom_fail(LOOM_EUSAGE, "inference step: token %d outside the vocabulary (%d)", tokens[r],
                             f->cfg.vocab_size);
    *rows = R;
    return LOOM_OK;
}

loom_status loom_infer_step(loom_infer *f, int n, const int *seq, const int *n_new, const int32_t *tokens,
                            const float **logits) {
    int R = 0;
    *logits = NULL;
    LOOM_TRY(check_step(f, n, seq, n_new, tokens, &R));
    const int C = f->C;
    float *x = loom_gpt_input(f->m, 0); /* (R,C) */
    if (f->m->part.has_embed) {
        loom_tensor_upload_i32(f->m->dev, f->rows_tok, tokens, (size_t)R);
        loom_embed_fwd(f->m->dev, x, f->rows_tok, f->m->w.wte, f->m->vocab_start, f->V_l, R, C);
        LOOM_TRY(loom_tp_reduce_fwd(&f->m->part.tp, x, (size_t)R * C));
        for (int j = 0, r0 = 0; j < n && !f->cfg.rope; r0 += n_new[j], j++) /* RoPE: in attention */
            loom_pos_fwd(f->m->dev, x + (size_t)r0 * C, f->m->w.wpe, f->len[seq[j]], n_new[j],
                         f->cfg.n_positions, C);
    } else {
        LOOM_TRY(loom_comm_recv(f->pp, x, F((size_t)R * C), f->pp_rank - 1, PP_TAG));
    }
    const loom_gpt_kv kv = {.n = n,
                            .seq = seq,
                            .pos = f->pos,
                            .n_new = n_new,
                            .k = f->kc,
                            .v = f->vc,
                            .max_seqs = f->o.max_seqs,
                            .max_len = f->o.max_len,
                            .scratch = f->att_scratch};
    for (int j = 0; j < n; j++) f->pos[j] = f->len[seq[j]];
    LOOM_TRY(loom_gpt_forward_kv(f->m, R, &kv));
    if (!f->m->part.has_head)
        LOOM_TRY(loom_comm_send(f->pp, loom_gpt_output(f->m, 0), F((size_t)R * C), f->pp_rank + 1, PP_TAG));
    for (int j = 0; j < n; j++) f->len[seq[j]] += n_new[j];
    if (f->m->part.has_head) {
        LOOM_TRY(head_step(f, n, n_new));
        *logits = f->logits;
    }
    return LOOM_OK;
}
