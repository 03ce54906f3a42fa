/* loss.c - row-wise softmax with cross-entropy, forward and backward.
 *
 * Each row of logits is shifted by its maximum before exp (so logits of any
 * size stay finite), exponentiated with the inline kern_expf and normalized.
 * The loss is computed as log(sum) - (logit[target] - max) rather than
 * -log(prob[target]), which keeps its precision when the probability is tiny.
 * A target < 0 marks an ignored position: its loss is 0 and its gradient row
 * is 0. Rows are independent and are shared out over threads.
 */
#include "kern_internal.h"

/* One row: probs (V) from logits (V) (may alias); returns the loss. */
static float xent_fwd_row(float *probs, const float *logits, int32_t target, int V) {
    float mx = kern_max(logits, V);
    float zt = target >= 0 ? logits[target] - mx : 0.0f; /* read before probs overwrites */
    for (int j = 0; j < V; j++) probs[j] = kern_expf(logits[j] - mx);
    float sum = kern_sum(probs, V);
    kern_scale_row(probs, V, 1.0f / sum);
    return target >= 0 ? logf(sum) - zt : 0.0f;
}

void loom_softmax_xent_fwd(float *losses, float *probs, const float *logits,
                           const int32_t *targets, int N, int V) {
    /* losses (N), probs (N,V), logits (N,V), targets (N) */
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++)
        losses[i] = xent_fwd_row(probs + (size_t)i * V, logits + (size_t)i * V, targets[i], V);
}

void loom_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets,
                           float dloss, int N, int V) {
    /* dlogits (N,V) written (may alias probs), probs (N,V), targets (N) */
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *d = dlogits + (size_t)i * V;      /* (V) */
        const float *p = probs + (size_t)i * V;  /* (V) */
        int32_t t = targets[i];
        if (t < 0) {
            memset(d, 0, (size_t)V * sizeof *d);
            continue;
        }
        for (int j = 0; j < V; j++) d[j] = p[j] * dloss;
        d[t] -= dloss;
    }
}
