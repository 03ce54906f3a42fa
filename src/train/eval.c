/* eval.c - `loom eval`: mean loss of given parameters on a shard read
 * sequentially. Collective over the world: each batch of `batch` sequences is
 * split evenly over the ranks and the loss sums are all-reduced. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/data.h"
#include "loom/hf_dir.h"
#include "loom/train.h"

static loom_status eval_check(const loom_eval_config *c, int world, const loom_model_config *mc) {
    if (c->batch < 1 || c->seq < 1 || c->batches < 1)
        return loom_fail(LOOM_EUSAGE, "--batch %d, --seq %d and --batches %d must all be >= 1", c->batch,
                         c->seq, c->batches);
    if (c->batch % world) return loom_fail(LOOM_EUSAGE, "%d ranks do not divide --batch %d", world, c->batch);
    if (c->seq > mc->n_positions)
        return loom_fail(LOOM_EUSAGE, "--seq %d exceeds n_positions=%d of model %s", c->seq, mc->n_positions,
                         mc->name);
    /* tokens read: batch x batches x seq, + 1 for the last target */
    size_t need;
    if (__builtin_mul_overflow((size_t)c->batch, (size_t)c->batches, &need) ||
        __builtin_mul_overflow(need, (size_t)c->seq, &need) || need == SIZE_MAX)
        return loom_fail(LOOM_EUSAGE, "--batch %d x --batches %d x --seq %d tokens is more than %zu",
                         c->batch, c->batches, c->seq, (size_t)SIZE_MAX);
    if (!loom_hf_params_path(c->load_params, c->model)[0])
        return loom_fail(LOOM_EUSAGE, "--load-params FILE is required (or --model DIR with its weights)");
    if (!c->data[0]) return loom_fail(LOOM_EUSAGE, "--data PATH is required");
    return LOOM_OK;
}

loom_status loom_eval_run(const loom_eval_config *c, loom_device *dev, loom_comm *world, double *mean_loss) {
    const int world_size = loom_comm_size(world), rank = loom_comm_rank(world);
    loom_model_config mc;
    loom_status st = loom_model_config_resolve(c->model, &mc);
    if (st == LOOM_OK) st = eval_check(c, world_size, &mc);
    LOOM_TRY(loom_comm_agree(world, st));

    loom_tokens tok;
    const int Bl = c->batch / world_size, T = c->seq;
    st = loom_tokens_open(c->data, &tok);
    int have_tok = st == LOOM_OK;
    if (st == LOOM_OK) {
        char why[96];
        snprintf(why, sizeof why, "--batch %d x --batches %d x --seq %d", c->batch, c->batches, T);
        st = loom_data_check_len(&tok, (size_t)c->batch * (size_t)c->batches * (size_t)T + 1, why);
    }
    if (st == LOOM_OK) st = loom_tokens_check_vocab(&tok, mc.vocab_size);
    loom_gpt *m = NULL;
    loom_model_part part = loom_model_part_whole(dev, &mc);
    /* the language-model loss alone: no MoE router losses (those are training terms) */
    loom_gpt_opts opts = {.B = Bl, .T = T, .n_slots = 1, .loss_lm_only = 1};
    if (st == LOOM_OK) st = loom_gpt_create(&mc, &part, &opts, &m);
    if (st == LOOM_OK)
        st = loom_params_load(&m, 1, NULL, NULL, loom_hf_params_path(c->load_params, c->model));
    int32_t *in = malloc((size_t)Bl * T * sizeof *in), *tg = malloc((size_t)Bl * T * sizeof *tg);
    if (st == LOOM_OK && (!in || !tg)) st = loom_fail(LOOM_EOS, "out of memory for the batch");
    st = loom_comm_agree(world, st);

    double sum = 0;
    for (int b = 0; b < c->batches && st == LOOM_OK; b++) {
        double s = 0;
        loom_data_sequential(&tok, (int64_t)b * c->batch + (int64_t)rank * Bl, Bl, T, in, tg);
        st = loom_gpt_forward(m, 0, in, tg, &s);
        sum += s;
    }
    if (st == LOOM_OK) st = loom_comm_allreduce(world, &sum, 1, LOOM_F64, LOOM_SUM);
    double mean = sum / ((double)c->batch * c->batches * T);
    if (st == LOOM_OK && !isfinite(mean)) { /* every rank holds the same sum; rank 0 says it */
        loom_status bad = LOOM_OK;
        if (rank == 0)
            bad = loom_fail(LOOM_EDATA,
                            "non-finite loss %s: parameters %s on %s (--batch %d x --batches %d x --seq %d)",
                            isnan(mean) ? "nan"
                            : mean > 0  ? "inf"
                                        : "-inf",
                            loom_hf_params_path(c->load_params, c->model), c->data, c->batch, c->batches, T);
        st = loom_comm_agree(world, bad);
    }
    if (st == LOOM_OK) *mean_loss = mean;
    free(in);
    free(tg);
    loom_gpt_free(m);
    if (have_tok) loom_tokens_close(&tok);
    return st;
}
