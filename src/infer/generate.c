/* generate.c - prompts -> continuations over loom_infer: a batched prefill,
 * then one token per unfinished sequence per step; the root samples and
 * broadcasts, so all ranks drive the same steps. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/infer.h"

typedef struct gen_buf {
    int *seq, *n_new, *done, *ones;
    int32_t *tok, *next;
    float *probs, *kv_logits; /* (2V) sampling scratch; (n, V) last decode logits */
    int *iscratch;
} gen_buf;

static void gen_buf_free(gen_buf *b) {
    free(b->seq);
    free(b->n_new);
    free(b->done);
    free(b->ones);
    free(b->tok);
    free(b->next);
    free(b->probs);
    free(b->kv_logits);
    free(b->iscratch);
}

static loom_status gen_check(const loom_infer *f, int n, const loom_ids *prompts, const loom_gen_opts *o) {
    const loom_infer_opts *io = loom_infer_options(f);
    LOOM_TRY(loom_sample_check(&o->sample));
    if (n < 1 || n + (o->check_kv ? 1 : 0) > io->max_seqs)
        return loom_fail(LOOM_EUSAGE, "generate: %d prompts%s, room for %d sequences", n,
                         o->check_kv ? " + 1 for the KV check" : "", io->max_seqs);
    if (o->max_new < 1) return loom_fail(LOOM_EUSAGE, "generate: max new tokens %d must be >= 1", o->max_new);
    for (int j = 0; j < n; j++) {
        if (prompts[j].n == 0) return loom_fail(LOOM_EUSAGE, "generate: prompt %d is empty", j);
        if (prompts[j].n + (size_t)o->max_new > (size_t)io->max_len)
            return loom_fail(LOOM_EUSAGE, "generate: prompt %d has %zu tokens + %d new passes the length %d",
                             j, prompts[j].n, o->max_new, io->max_len);
    }
    return LOOM_OK;
}

/* Sample one token per entry whose logits row is final; broadcast them. */
static loom_status pick(loom_infer *f, loom_comm *world, int root, const float *logits, int n_entries,
                        const int *rows_final, gen_buf *b, loom_gen_opts *o, int step) {
    const int V = loom_infer_config(f)->vocab_size;
    if (logits && (!world || loom_comm_rank(world) == root))
        for (int e = 0; e < n_entries; e++)
            if (rows_final[e])
                b->next[e] = loom_sample(logits + (size_t)e * V, V, &o->sample,
                                         ((uint64_t)b->seq[e] << 32) | (uint64_t)step, b->probs, b->iscratch);
    if (world && loom_comm_size(world) > 1)
        LOOM_TRY(loom_comm_bcast(world, b->next, (size_t)n_entries * sizeof(int32_t), root));
    return LOOM_OK;
}

static int is_stop(const loom_gen_opts *o, int32_t t) {
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop[i] == t) return 1;
    return 0;
}

/* Prefill: entries of as many whole or partial prompts as fit max_rows. */
static loom_status prefill(loom_infer *f, loom_comm *world, int root, int n, const loom_ids *prompts,
                           gen_buf *b, loom_gen_opts *o, loom_ids *outs) {
    const int R = loom_infer_options(f)->max_rows, V = loom_infer_config(f)->vocab_size;
    size_t *pos = calloc((size_t)n, sizeof *pos);
    int *final = calloc((size_t)n, sizeof *final);
    if (!pos || !final) {
        free(pos);
        free(final);
        return loom_fail(LOOM_EOS, "generate: out of memory");
    }
    loom_status st = LOOM_OK;
    for (int j = 0; j < n && st == LOOM_OK;) {
        int ne = 0, rows = 0, jj = j;
        while (jj < n && rows < R) {
            size_t left = prompts[jj].n - pos[jj];
            int take = left < (size_t)(R - rows) ? (int)left : R - rows;
            b->seq[ne] = jj;
            b->n_new[ne] = take;
            memcpy(b->tok + rows, prompts[jj].v + pos[jj], (size_t)take * sizeof(int32_t));
            pos[jj] += (size_t)take;
            final[ne] = pos[jj] == prompts[jj].n;
            rows += take;
            ne++;
            if (pos[jj] < prompts[jj].n) break;
            jj++;
        }
        const float *logits;
        st = loom_infer_step(f, ne, b->seq, b->n_new, b->tok, &logits);
        if (st == LOOM_OK) st = pick(f, world, root, logits, ne, final, b, o, 0);
        for (int e = 0; e < ne && st == LOOM_OK; e++) {
            if (!final[e]) continue;
            int s = b->seq[e];
            if (logits && o->prompt_logits)
                memcpy(o->prompt_logits + (size_t)s * V, logits + (size_t)e * V, sizeof(float) * V);
            st = loom_ids_push(&outs[s], (uint32_t)b->next[e]);
            b->done[s] = is_stop(o, b->next[e]) || o->max_new == 1;
        }
        j = jj < n && pos[jj] == prompts[jj].n ? jj + 1 : jj;
    }
    free(pos);
    free(final);
    return st;
}

/* Recompute each sequence (prompt + new tokens but the last) in one pass in
 * the spare slot n and compare the logits with the cached decode's. */
static loom_status check_kv(loom_infer *f, int n, const loom_ids *prompts, const loom_ids *outs, gen_buf *b,
                            loom_gen_opts *o) {
    const int R = loom_infer_options(f)->max_rows, V = loom_infer_config(f)->vocab_size;
    o->kv_max_diff = 0;
    for (int j = 0; j < n; j++) {
        if (outs[j].n < 2) continue;
        size_t total = prompts[j].n + outs[j].n - 1, done = 0;
        const float *logits = NULL;
        loom_infer_reset(f, n);
        while (done < total) {
            int take = total - done < (size_t)R ? (int)(total - done) : R;
            for (int i = 0; i < take; i++) {
                size_t k = done + (size_t)i;
                b->tok[i] =
                    k < prompts[j].n ? (int32_t)prompts[j].v[k] : (int32_t)outs[j].v[k - prompts[j].n];
            }
            int s = n;
            LOOM_TRY(loom_infer_step(f, 1, &s, &take, b->tok, &logits));
            done += (size_t)take;
        }
        for (int v = 0; logits && v < V; v++) {
            double d = fabs((double)logits[v] - b->kv_logits[(size_t)j * V + v]);
            if (d > o->kv_max_diff || isnan(d)) o->kv_max_diff = d;
        }
    }
    loom_infer_reset(f, n);
    return LOOM_OK;
}

loom_status loom_generate(loom_infer *f, loom_comm *world, int root, int n, const loom_ids *prompts,
                          loom_gen_opts *o, loom_ids *outs) {
    LOOM_TRY(gen_check(f, n, prompts, o));
    const int V = loom_infer_config(f)->vocab_size;
    const size_t R = (size_t)loom_infer_options(f)->max_rows + (size_t)n;
    gen_buf b = {0};
    b.seq = calloc(R, sizeof(int));
    b.n_new = calloc(R, sizeof(int));
    b.done = calloc((size_t)n, sizeof(int));
    b.ones = malloc(R * sizeof(int));
    b.tok = calloc(R, sizeof(int32_t));
    b.next = calloc(R, sizeof(int32_t));
    b.probs = malloc(sizeof(float) * 2 * (size_t)V);
    b.iscratch = malloc(sizeof(int) * (size_t)V);
    b.kv_logits = o->check_kv ? calloc((size_t)n * V, sizeof(float)) : NULL;
    loom_status st = LOOM_OK;
    if (!b.seq || !b.n_new || !b.done || !b.ones || !b.tok || !b.next || !b.probs || !b.iscratch ||
        (o->check_kv && !b.kv_logits))
        st = loom_fail(LOOM_EOS, "generate: out of memory");
    for (size_t i = 0; b.ones && i < R; i++) b.ones[i] = 1;
    for (int j = 0; j < n; j++) loom_infer_reset(f, j);
    if (st == LOOM_OK) st = prefill(f, world, root, n, prompts, &b, o, outs);
    for (int t = 1; st == LOOM_OK && t < o->max_new; t++) {
        int ne = 0;
        for (int j = 0; j < n; j++)
            if (!b.done[j]) {
                b.seq[ne] = j;
                b.n_new[ne] = 1;
                b.tok[ne] = (int32_t)outs[j].v[outs[j].n - 1];
                ne++;
            }
        if (ne == 0) break;
        const float *logits;
        st = loom_infer_step(f, ne, b.seq, b.n_new, b.tok, &logits);
        if (st == LOOM_OK) st = pick(f, world, root, logits, ne, b.ones, &b, o, t);
        for (int e = 0; e < ne && st == LOOM_OK; e++) {
            int s = b.seq[e];
            if (logits && b.kv_logits)
                memcpy(b.kv_logits + (size_t)s * V, logits + (size_t)e * V, sizeof(float) * V);
            st = loom_ids_push(&outs[s], (uint32_t)b.next[e]);
            b.done[s] = is_stop(o, b.next[e]) || (int)outs[s].n >= o->max_new;
        }
    }
    if (st == LOOM_OK && o->check_kv) st = check_kv(f, n, prompts, outs, &b, o);
    gen_buf_free(&b);
    return st;
}
