/* zero3.c - ZeRO-3 (FSDP) parameters: each rank keeps only its slice of
 * every unit (the shard, dp.h's layout with one bucket per unit); a unit is
 * all-gathered into a gather buffer just before its forward and again just
 * before its backward, the model's views are bound to that buffer, and the
 * buffer is given back once the unit has run. While a unit runs, the gather
 * of the next unit of the same pass is already in flight (prefetch). Buffers:
 * one for the outer unit (it is used from the first forward step to the
 * head, and from the head back to the embedding) and two that alternate
 * between blocks. Axis: dp. Collective over dp: every function but
 * loom_dp_z3_release (local).
 */

#include "loom/device.h"
#include "distributed/dp_internal.h"

#define F sizeof(float)

/* Start gathering bucket bi into its buffer, which must be free. */
static loom_status start_gather(dp_part *p, int bi) {
    loom_dp_engine *e = p->e;
    dp_bucket *b = &p->buckets[bi];
    int owner = p->gather_owner[b->slot];
    if (owner >= 0 && owner != bi)
        return loom_fail(LOOM_EINTERNAL, "ZeRO-3: gather buffer %d still holds bucket %d when %d needs it",
                         b->slot, owner, bi);
    float *dst = p->gather[b->slot];
    p->gather_owner[b->slot] = bi;
    b->ag_t0 = loom_comm_wtime();
    if (e->N == 1) {
        loom_tensor_copy(p->m->dev, dst, p->pshard + b->so, b->S);
        b->pstate = DP_READY;
        return LOOM_OK;
    }
    loom_status st = loom_comm_iallgather(e->dp, p->pshard + b->so, dst, b->S * F, &b->ag);
    if (st != LOOM_OK) {
        p->gather_owner[b->slot] = -1;
        return st;
    }
    b->pstate = DP_GATHERING;
    return LOOM_OK;
}

loom_status loom_dp_z3_test(dp_part *p, dp_bucket *b) {
    if (!b->ag) return LOOM_OK;
    int done = 0;
    loom_status st = loom_comm_test(b->ag, &done);
    if (!done) return LOOM_OK;
    b->ag = NULL; /* released by test */
    LOOM_TRY(st);
    b->pstate = DP_READY;
    (void)p;
    return LOOM_OK;
}

static loom_status wait_gather(dp_bucket *b) {
    if (b->pstate != DP_GATHERING) return LOOM_OK;
    loom_req *r = b->ag;
    b->ag = NULL;
    LOOM_TRY(loom_comm_wait(r));
    b->pstate = DP_READY;
    return LOOM_OK;
}

/* The unit after units[ui] in this pass: the forward runs outer, blocks
 * 0..L-1 (units[] is blocks L-1..0, outer: one step back); the backward
 * runs outer, blocks L-1..0 (outer -> units[0], then one step on, stopping
 * before the outer unit). -1 at the end. */
static int next_unit(const dp_part *p, int ui, int backward) {
    const int L = p->m->L_l;
    if (!backward) return ui - 1;
    if (ui >= L) return L > 0 ? 0 : -1; /* the outer unit */
    return ui + 1 < L ? ui + 1 : -1;
}

/* Before a unit's forward (backward = 0) or backward: its parameters
 * gathered and bound, the next unit's gather started if its buffer is free
 * (a decision that depends only on the hook order, so every rank makes the
 * same one). */
loom_status loom_dp_z3_use(dp_part *p, int unit, int backward) {
    loom_dp_engine *e = p->e;
    int ui = loom_dp_unit_index(p, unit);
    if (ui < 0) return LOOM_OK;
    int bi = p->units[ui].bucket;
    dp_bucket *b = &p->buckets[bi];
    double t0 = loom_comm_wtime();
    if (b->pstate == DP_NONE) LOOM_TRY(start_gather(p, bi));
    LOOM_TRY(wait_gather(b));
    e->timing.gather_s += loom_comm_wtime() - t0;
    for (int i = b->u_begin; i < b->u_end; i++) {
        const dp_unit *u = &p->units[i];
        loom_gpt_bind_unit(p->m, u->unit, p->gather[b->slot] + (u->lo - b->lo), NULL);
    }
    int nu = next_unit(p, ui, backward);
    if (nu >= 0) {
        int nb = p->units[nu].bucket;
        if (p->buckets[nb].pstate == DP_NONE && p->gather_owner[p->buckets[nb].slot] < 0)
            LOOM_TRY(start_gather(p, nb));
    }
    return LOOM_OK;
}

void loom_dp_z3_release(dp_part *p, int unit) {
    int ui = loom_dp_unit_index(p, unit);
    if (ui < 0) return;
    int bi = p->units[ui].bucket;
    dp_bucket *b = &p->buckets[bi];
    if (b->pstate != DP_READY) return;
    b->pstate = DP_NONE;
    if (p->gather_owner[b->slot] == bi) p->gather_owner[b->slot] = -1;
}

/* After the backward: no gather outlives the step (the parameters change). */
loom_status loom_dp_z3_wait_all(dp_part *p) {
    for (int k = 0; k < p->n_buckets; k++) {
        dp_bucket *b = &p->buckets[k];
        LOOM_TRY(wait_gather(b));
        b->pstate = DP_NONE;
    }
    for (int s = 0; s < DP_SLOTS; s++) p->gather_owner[s] = -1;
    return LOOM_OK;
}
