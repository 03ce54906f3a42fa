/* partition.c - which transformer blocks each virtual stage holds (pp axis;
 * pure, not collective).
 *
 * The model is n_layer blocks of cost 1, the embedding (cost e) in front of
 * virtual stage 0 and the LM head (cost h) after stage S-1. A partition gives
 * each of the S = pp*v stages a run of at least one consecutive block.
 * loom_partition_balance hands out blocks one at a time, each to the stage
 * that is cheapest so far (the earliest on a tie): for costs that grow by 1
 * per block this greedy split has the least maximum stage cost and, among
 * those, the least sum of squared costs. (The user's own split,
 * --stage-layers, is a field of the layout: layout.h.)
 */
#include <math.h>
#include <stdlib.h>

#include "loom/pipeline.h"

double loom_partition_stage_cost(const int *counts, int n_stages, int s, double cost_embed,
                                 double cost_head) {
    return counts[s] + (s == 0 ? cost_embed : 0.0) + (s == n_stages - 1 ? cost_head : 0.0);
}

/* A binary min-heap of stages keyed by (cost, index). */
typedef struct heap {
    int *idx, n;
    const double *cost;
} heap;

static int heap_less(const heap *h, int a, int b) {
    const double ca = h->cost[h->idx[a]], cb = h->cost[h->idx[b]];
    return ca < cb || (ca == cb && h->idx[a] < h->idx[b]);
}

static void heap_swap(heap *h, int a, int b) {
    const int t = h->idx[a];
    h->idx[a] = h->idx[b];
    h->idx[b] = t;
}

static void heap_down(heap *h, int i) {
    for (;;) {
        int l = 2 * i + 1, best = i;
        if (l < h->n && heap_less(h, l, best)) best = l;
        if (l + 1 < h->n && heap_less(h, l + 1, best)) best = l + 1;
        if (best == i) return;
        heap_swap(h, i, best);
        i = best;
    }
}

loom_status loom_partition_balance(int n_layer, int pp, int v, double cost_embed, double cost_head,
                                   int *counts) {
    LOOM_TRY(loom_layout_check_stages(n_layer, pp, v));
    if (!(isfinite(cost_embed) && cost_embed >= 0) || !(isfinite(cost_head) && cost_head >= 0))
        return loom_fail(LOOM_EUSAGE, "embedding cost %g and head cost %g must be finite numbers >= 0",
                         cost_embed, cost_head);
    const int S = pp * v;
    double *cost = malloc((size_t)S * sizeof *cost);
    int *idx = malloc((size_t)S * sizeof *idx);
    if (!cost || !idx) {
        free(cost);
        free(idx);
        return loom_fail(LOOM_EOS, "out of memory partitioning %d layers into %d stages", n_layer, S);
    }
    for (int s = 0; s < S; s++) {
        counts[s] = 1;
        cost[s] = loom_partition_stage_cost(counts, S, s, cost_embed, cost_head);
        idx[s] = s;
    }
    heap h = {idx, S, cost};
    for (int i = S / 2 - 1; i >= 0; i--) heap_down(&h, i);
    for (int left = n_layer - S; left > 0; left--) {
        const int s = h.idx[0];
        counts[s]++;
        cost[s] += 1.0;
        heap_down(&h, 0);
    }
    free(cost);
    free(idx);
    return LOOM_OK;
}
