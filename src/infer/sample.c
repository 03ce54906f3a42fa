/* sample.c - the next token from logits: greedy, or temperature with
 * top-k / top-p (nucleus) truncation, drawn from the counter RNG so that a
 * (seed, index) pair picks the same token on every rank and every run. */
#include <math.h>
#include <stdlib.h>

#include "loom/infer.h"
#include "loom/rng.h"

loom_status loom_sample_check(const loom_sample_opts *o) {
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return loom_fail(LOOM_EUSAGE, "temperature %g: must be a finite number >= 0", o->temperature);
    if (o->top_k < 0) return loom_fail(LOOM_EUSAGE, "top-k %d: must be >= 0 (0 = all)", o->top_k);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return loom_fail(LOOM_EUSAGE, "top-p %g: must be in (0, 1]", o->top_p);
    return LOOM_OK;
}

static int argmax(const float *x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* indices by descending value, ties by ascending index */
static _Thread_local const float *sort_keys;
static int by_value_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_keys[i] != sort_keys[j]) return sort_keys[i] > sort_keys[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int loom_sample(const float *logits, int V, const loom_sample_opts *o, uint64_t index, float *scratch,
                int *iscratch) {
    if (o->temperature <= 0 || o->top_k == 1) return argmax(logits, V);
    float *p = scratch; /* (V) probabilities in sorted order */
    int *idx = iscratch;
    for (int i = 0; i < V; i++) idx[i] = i;
    sort_keys = logits;
    qsort(idx, (size_t)V, sizeof *idx, by_value_desc);
    int keep = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    const double mx = logits[idx[0]];
    double sum = 0;
    for (int i = 0; i < keep; i++) {
        p[i] = (float)exp(((double)logits[idx[i]] - mx) / o->temperature);
        sum += p[i];
    }
    if (o->top_p < 1) { /* the smallest prefix whose mass reaches top_p */
        double cum = 0;
        for (int i = 0; i < keep; i++) {
            cum += p[i] / sum;
            if (cum >= o->top_p) {
                keep = i + 1;
                break;
            }
        }
        sum = 0;
        for (int i = 0; i < keep; i++) sum += p[i];
    }
    double u = loom_rng_uniform(loom_rng_key_make(o->seed, "sample"), index) * sum, cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += p[i];
        if (u < cum) return idx[i];
    }
    return idx[keep - 1];
}
