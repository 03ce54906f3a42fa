/* vocab.c - vocabulary-parallel token embedding and softmax cross-entropy.
 *
 * Each rank holds a contiguous slice [v0, v0 + V_l) of the vocabulary. The
 * embedding looks up only its own tokens (zeros for the others, summed over
 * the TP group by the caller). The cross-entropy never gathers the logits:
 * the caller all-reduces the row maxima (MAX), then the sums of exponentials
 * and the target logits (SUM) between the three phases here, as Megatron's
 * vocab-parallel cross-entropy does. Padding columns beyond V_valid never
 * enter a max or a sum, so padding cannot change the loss.
 */
#include <math.h>

#include "kern_vec.h"

#define EMB_COLS 64

void loom_cpu_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                    int C) {
    /* out (N,C), tok (N), wte_l (V_l,C) */
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * C;
        int r = tok[i] - v0;
        if (r >= 0 && r < V_l) memcpy(o, wte_l + (size_t)r * C, (size_t)C * sizeof(float));
        else memset(o, 0, (size_t)C * sizeof(float));
    }
}

void loom_cpu_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l, int N,
                    int C) {
    /* threads own disjoint column slices: two tokens may share a row */
    int nth = loom_kernels_get_threads();
    int cols = nth > 1 ? EMB_COLS : C, ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols, nc = C - c0 < cols ? C - c0 : cols;
        for (int i = 0; i < N; i++) {
            int r = tok[i] - v0;
            if (r >= 0 && r < V_l) kern_add_row(dwte_l + (size_t)r * C + c0, dout + (size_t)i * C + c0, nc);
        }
    }
}

void loom_cpu_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C) {
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < n; i++)
        kern_add_row(out + (size_t)i * C, wpe + (size_t)((row0 + i) % T) * C, C);
}

void loom_cpu_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C) {
    int nth = loom_kernels_get_threads();
    int cols = nth > 1 ? EMB_COLS : C, ntask = (C + cols - 1) / cols;
    KERN_PARALLEL_FOR(nth)
    for (int task = 0; task < ntask; task++) {
        int c0 = task * cols, nc = C - c0 < cols ? C - c0 : cols;
        for (int i = 0; i < n; i++)
            kern_add_row(dwpe + (size_t)((row0 + i) % T) * C + c0, dout + (size_t)i * C + c0, nc);
    }
}

void loom_cpu_vxent_max(float *rowmax, const float *logits, int N, int V_l, int V_valid) {
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++)
        rowmax[i] = V_valid > 0 ? kern_max(logits + (size_t)i * V_l, V_valid) : -INFINITY;
}

void loom_cpu_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                    const int32_t *targets, int v0, int N, int V_l, int V_valid) {
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * V_l; /* (V_l) */
        int t = targets[i] - v0;
        tgt[i] = targets[i] >= 0 && t >= 0 && t < V_valid ? z[t] - gmax[i] : 0.0f;
        kv_exp_shift(z, V_valid, gmax[i]);
        for (int j = V_valid; j < V_l; j++) z[j] = 0.0f;
        rowsum[i] = kern_sum(z, V_valid);
    }
}

/* max, exp and finish for one rank holding the whole vocabulary, a row at a
 * time: the row (V_l floats, 196 KiB for GPT-2) comes from memory once for
 * its maximum and stays in cache for the exponentials, their sum and the
 * scaling, where the three phases stream all the logits three times. The
 * same operations in the same order as those phases with v0 = 0, so the
 * same floats (kernels_vocab checks it bit for bit). */
void loom_cpu_vxent_local(float *losses, float *logits, const int32_t *targets, int N, int V_l,
                          int V_valid) {
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * V_l;
        float mx = V_valid > 0 ? kern_max(z, V_valid) : -INFINITY;
        int t = targets[i];
        float tgt = t >= 0 && t < V_valid ? z[t] - mx : 0.0f;
        kv_exp_shift(z, V_valid, mx);
        for (int j = V_valid; j < V_l; j++) z[j] = 0.0f;
        float sum = kern_sum(z, V_valid);
        losses[i] = t >= 0 ? logf(sum) - tgt : 0.0f;
        kern_scale_row(z, V_l, 1.0f / sum);
    }
}

void loom_cpu_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                       const int32_t *targets, int N, int V_l) {
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        losses[i] = targets[i] >= 0 ? logf(gsum[i]) - gtgt[i] : 0.0f;
        kern_scale_row(probs + (size_t)i * V_l, V_l, 1.0f / gsum[i]);
    }
}

void loom_cpu_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss, int v0,
                    int N, int V_l) {
    int nth = loom_kernels_get_threads();
    KERN_PARALLEL_FOR(nth)
    for (int i = 0; i < N; i++) {
        float *d = dlogits + (size_t)i * V_l;
        const float *p = probs + (size_t)i * V_l;
        if (targets[i] < 0) {
            memset(d, 0, (size_t)V_l * sizeof(float));
            continue;
        }
        for (int j = 0; j < V_l; j++) d[j] = p[j] * dloss;
        int t = targets[i] - v0;
        if (t >= 0 && t < V_l) d[t] -= dloss;
    }
}
