/* oracle_dump.c - writes what the PyTorch oracle checks (invariant 2).
 *
 * On a small GPT-2 with every parameter random (biases and LayerNorm weights
 * included, so each one matters), random tokens and targets: the initial
 * parameters, logits, mean loss, every gradient, and the parameters after one
 * AdamW step, as one safetensors file. tests/oracle/check_oracle.py recomputes
 * all of it in PyTorch (float64) and compares.
 *
 * usage: oracle_dump OUT.safetensors [n_layer n_head n_embd vocab n_positions B T
 *                                     [n_expert top_k capacity_factor norm_topk moe_every
 *                                      expert_hidden]]
 * With n_expert > 0 the model is MoE (router_aux_loss_coef 0.1, z 0.01 so both
 * losses matter) and the dump also holds each MoE block's per-expert counts
 * (moe.h.<l>.chosen, moe.h.<l>.kept) for the oracle to compare.
 *
 *        oracle_dump OUT.safetensors --hf DIR [B T]
 * reads the model - config and weights - from a Hugging Face directory
 * (tests/oracle/check_hf_oracle.py makes it with transformers and checks the
 * dump against transformers' own model).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/model.h"
#include "loom/moe.h"
#include "loom/rng.h"
#include "loom/safetensors.h"
#include "loom/train.h"

/* The model of --hf DIR, its weights loaded; NULL on failure (printed). */
static loom_gpt *hf_model(loom_device *dev, const char *dir, int B, int T) {
    loom_model_config cfg;
    loom_gpt *m = NULL;
    loom_status st = loom_model_config_resolve(dir, &cfg);
    loom_model_part part = loom_model_part_whole(dev, &cfg);
    loom_gpt_opts opts = {.B = B, .T = T, .n_slots = 1};
    if (st == LOOM_OK) st = loom_gpt_create(&cfg, &part, &opts, &m);
    if (st == LOOM_OK) st = loom_params_load(&m, 1, NULL, NULL, dir);
    if (st == LOOM_OK) return m;
    fprintf(stderr, "oracle_dump: %s\n", loom_errmsg());
    loom_gpt_free(m);
    return NULL;
}

#define MAXP 512

static int arg(int argc, char **argv, int i, int dflt) { return argc > i ? atoi(argv[i]) : dflt; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: oracle_dump OUT.safetensors [L NH C V maxT B T]\n");
        return 64;
    }
    const int hf = argc > 3 && !strcmp(argv[2], "--hf");
    loom_model_config cfg = {.name = "oracle"};
    cfg.n_layer = arg(argc, argv, 2, 2);
    cfg.n_head = arg(argc, argv, 3, 4);
    cfg.n_embd = arg(argc, argv, 4, 32);
    cfg.vocab_size = arg(argc, argv, 5, 67);
    cfg.n_positions = arg(argc, argv, 6, 16);
    const int B = arg(argc, argv, hf ? 4 : 7, 3), T = arg(argc, argv, hf ? 5 : 8, 11);
    cfg.n_expert = arg(argc, argv, 9, 0);
    cfg.top_k = arg(argc, argv, 10, 2);
    cfg.capacity_factor = argc > 11 ? (float)atof(argv[11]) : 0.0f;
    cfg.norm_topk = arg(argc, argv, 12, 1);
    cfg.moe_every = arg(argc, argv, 13, 1);
    cfg.expert_hidden = arg(argc, argv, 14, 0);
    cfg.aux_coef = cfg.n_expert ? 0.1f : 0.0f;
    cfg.z_coef = cfg.n_expert ? 0.01f : 0.0f;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;

    loom_gpt *m;
    loom_device *dev = NULL;
    const loom_device_opts dopts = {.name = "cpu"}; /* a thread per CPU, fp32 */
    if (loom_device_create(&dopts, &dev) != LOOM_OK) {
        fprintf(stderr, "oracle_dump: %s\n", loom_errmsg());
        return 1;
    }
    loom_model_part part = loom_model_part_whole(dev, &cfg);
    loom_gpt_opts opts = {.B = B, .T = T, .n_slots = 1};
    if (hf) {
        if (!(m = hf_model(dev, argv[3], B, T))) return 1;
        cfg = m->cfg;
    } else if (loom_gpt_create(&cfg, &part, &opts, &m) != LOOM_OK) {
        fprintf(stderr, "oracle_dump: %s\n", loom_errmsg());
        return 1;
    } else {
        loom_gpt_init_params(m, 42);
    }
    /* make every parameter matter: jitter all of them (a directory's are random already) */
    for (int i = 0; i < m->n_params && !hf; i++) {
        const loom_param *p = &m->params[i];
        loom_rng_key k = loom_rng_key_make(7, p->name);
        for (size_t j = 0; j < p->numel; j++) m->param_mem[p->offset + j] += 0.1f * loom_rng_normal(k, j);
    }
    int32_t *in = malloc((size_t)B * T * 4), *tg = malloc((size_t)B * T * 4);
    loom_rng_key tk = loom_rng_key_make(3, "tokens");
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(loom_rng_u64(tk, 2 * (uint64_t)i) % (uint64_t)cfg.vocab_size);
        tg[i] = (int32_t)(loom_rng_u64(tk, 2 * (uint64_t)i + 1) % (uint64_t)cfg.vocab_size);
    }
    float *params0 = malloc(m->num_params * sizeof(float));
    memcpy(params0, m->param_mem, m->num_params * sizeof(float));

    double loss_sum = 0;
    loom_gpt_zero_grad(m);
    loom_gpt_forward(m, 0, in, tg, &loss_sum);
    float loss = (float)(loss_sum / (B * T));
    /* logits are overwritten by the softmax: recompute them without targets */
    size_t nlog = (size_t)B * T * cfg.vocab_size;
    float *logits = malloc(nlog * sizeof(float));
    loom_gpt_forward(m, 0, in, NULL, NULL);
    memcpy(logits, m->slots[0].logits, nlog * sizeof(float));
    loom_moe_stats_reset(m);
    loom_gpt_forward(m, 0, in, tg, NULL);
    loom_gpt_backward(m, 0, NULL, 1.0f / (float)(B * T));
    float *grads = malloc(m->num_params * sizeof(float));
    memcpy(grads, m->grad_mem, m->num_params * sizeof(float));
    loom_adamw opt;
    const loom_adamw_hparams hp = {b1, b2, eps, wd};
    if (loom_adamw_create(&opt, m) != LOOM_OK) return 1;
    loom_adamw_step(&opt, &hp, lr);

    loom_st_writer *w;
    if (loom_st_writer_create(argv[1], &w) != LOOM_OK) return 1;
    char v[7][32];
    const char *keys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "B", "T"};
    int vals[] = {cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.n_positions, B, T};
    for (int i = 0; i < 7; i++) {
        snprintf(v[i], sizeof v[i], "%d", vals[i]);
        loom_st_writer_metadata(w, keys[i], v[i]);
    }
    char h[5][32];
    snprintf(h[0], 32, "%.9g", lr);
    snprintf(h[1], 32, "%.9g", b1);
    snprintf(h[2], 32, "%.9g", b2);
    snprintf(h[3], 32, "%.9g", eps);
    snprintf(h[4], 32, "%.9g", wd);
    loom_st_writer_metadata(w, "lr", h[0]);
    loom_st_writer_metadata(w, "beta1", h[1]);
    loom_st_writer_metadata(w, "beta2", h[2]);
    loom_st_writer_metadata(w, "eps", h[3]);
    loom_st_writer_metadata(w, "weight_decay", h[4]);
    int64_t bt[2] = {B, T}, btv[3] = {B, T, cfg.vocab_size}, one[1] = {1};
    loom_st_writer_add(w, "tokens.inputs", LOOM_ST_I32, 2, bt, in);
    loom_st_writer_add(w, "tokens.targets", LOOM_ST_I32, 2, bt, tg);
    loom_st_writer_add(w, "out.logits", LOOM_ST_F32, 3, btv, logits);
    loom_st_writer_add(w, "out.loss", LOOM_ST_F32, 1, one, &loss);
    char mv[8][32], cname[2 * MAXP][48];
    const char *mkeys[] = {"n_expert",  "top_k",    "moe_every", "expert_hidden",
                           "norm_topk", "aux_coef", "z_coef",    "capacity_factor"};
    int n_moe;
    const loom_moe_stats *ms = loom_moe_stats_get(m, &n_moe);
    static int32_t counts[2 * MAXP][1024];
    int64_t E1[1] = {cfg.n_expert};
    if (cfg.n_expert) {
        snprintf(mv[0], 32, "%d", cfg.n_expert);
        snprintf(mv[1], 32, "%d", cfg.top_k);
        snprintf(mv[2], 32, "%d", cfg.moe_every);
        snprintf(mv[3], 32, "%d", cfg.expert_hidden);
        snprintf(mv[4], 32, "%d", cfg.norm_topk);
        snprintf(mv[5], 32, "%.9g", cfg.aux_coef);
        snprintf(mv[6], 32, "%.9g", cfg.z_coef);
        snprintf(mv[7], 32, "%.9g", cfg.capacity_factor);
        for (int i = 0; i < 8; i++) loom_st_writer_metadata(w, mkeys[i], mv[i]);
    }
    for (int b = 0; b < n_moe && b < MAXP; b++)
        for (int h2 = 0; h2 < 2; h2++) {
            const int64_t *src = h2 ? ms[b].kept : ms[b].routed;
            for (int e = 0; e < cfg.n_expert && e < 1024; e++) counts[2 * b + h2][e] = (int32_t)src[e];
            snprintf(cname[2 * b + h2], 48, "moe.h.%d.%s", ms[b].layer, h2 ? "kept" : "chosen");
            loom_st_writer_add(w, cname[2 * b + h2], LOOM_ST_I32, 1, E1, counts[2 * b + h2]);
        }
    static char names[3][MAXP][LOOM_PARAM_NAME_MAX + 8];
    const char *prefix[3] = {"param.", "grad.", "step."};
    const float *src[3] = {params0, grads, m->param_mem};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < m->n_params && i < MAXP; i++) {
            const loom_param *p = &m->params[i];
            snprintf(names[s][i], sizeof names[s][i], "%s%s", prefix[s], p->name);
            loom_st_writer_add(w, names[s][i], LOOM_ST_F32, p->ndim, p->shape, src[s] + p->offset);
        }
    loom_status st = loom_st_writer_finish(w);
    if (st != LOOM_OK) fprintf(stderr, "oracle_dump: %s\n", loom_errmsg());
    else printf("oracle_dump: %d parameters, loss %.6f -> %s\n", m->n_params, loss, argv[1]);
    loom_adamw_free(&opt);
    loom_gpt_free(m);
    loom_device_free(dev);
    free(in);
    free(tg);
    free(params0);
    free(logits);
    free(grads);
    return st == LOOM_OK ? 0 : 1;
}
