/* pp_exec.c - runs one rank's pipeline action list (see pp_exec.h and the
 * convention in pipeline.h). Axis: pp; point-to-point messages over the pp
 * group, tagged with loom_pp_tag so any posting order matches.
 *
 * Receives are posted ahead (convention 3 allows it): per chunk and kind
 * (activations, output gradients) a ring of RECV_AHEAD staging buffers holds
 * the next receives of the action list, posted at the start of the step and
 * again as soon as a RECV action has taken its message out of a buffer. So
 * a neighbour's send finds its receive already posted while this rank
 * computes, and the message moves whenever MPI progresses (the
 * communicator's progress thread), not only once this rank reaches the
 * RECV. A RECV action waits for its message and copies it into the slot's
 * input (or the output-gradient buffer).
 */
#include <stdlib.h>
#include <string.h>

#include "loom/pp_exec.h"

#include "loom/device.h"

#define MAX_PENDING 4 /* sends in flight per slot: its output and its input gradient */
#define RECV_AHEAD 2  /* receives of one chunk and kind posted before their action */

/* The receives of one (chunk, kind) in action-list order: buf[(head + i) %
 * RECV_AHEAD] holds the i-th oldest posted one. */
typedef struct recv_ring {
    loom_pp_kind kind;
    int chunk;
    float *buf[RECV_AHEAD];
    loom_req *req[RECV_AHEAD];
    int action[RECV_AHEAD]; /* the RECV action each buffer was posted for */
    int head, count;
    int scan; /* next action index to look at for posting */
} recv_ring;

typedef struct slot_state {
    int mb; /* micro-batch held, -1 free */
    loom_req *pending[MAX_PENDING];
    int n_pending;
} slot_state;

struct loom_pp_exec {
    const loom_schedule *s;
    int rank, v, n_actions;
    const loom_pp_action *actions;
    loom_gpt **parts;
    loom_device *dev; /* the parts' device: buffers and copies */
    loom_comm *pp;
    slot_state **slots; /* [chunk][slot] */
    int *n_slots;       /* per chunk */
    float *dy;          /* (Nx,C) received output gradient, consumed by the next B */
    int32_t *inputs, *targets;
    int live, peak_live;
    loom_pp_event *events;
    recv_ring *rings; /* [2 * chunk + (kind == RECV_GRAD)] */
    size_t act_bytes; /* one activation (Nx,C) */
};

loom_status loom_pp_exec_create(const loom_schedule *s, int rank, loom_gpt **parts, loom_comm *pp,
                                loom_pp_exec **out) {
    *out = NULL;
    loom_pp_exec *x = calloc(1, sizeof *x);
    if (!x) return loom_fail(LOOM_EOS, "out of memory for the pipeline executor");
    x->s = s;
    x->rank = rank;
    x->v = s->virtual_stages;
    x->actions = loom_schedule_rank(s, rank, &x->n_actions);
    x->parts = parts;
    x->dev = parts[0]->dev;
    x->pp = pp;
    const loom_gpt *m0 = parts[0];
    x->slots = calloc((size_t)x->v, sizeof *x->slots);
    x->n_slots = calloc((size_t)x->v, sizeof *x->n_slots);
    x->act_bytes = (size_t)m0->Nx * m0->C * sizeof(float);
    x->dy = loom_device_alloc(x->dev, x->act_bytes); /* activations are device memory */
    x->inputs = malloc((size_t)m0->N * sizeof(int32_t));
    x->targets = malloc((size_t)m0->N * sizeof(int32_t));
    x->events = calloc((size_t)x->n_actions, sizeof *x->events);
    x->rings = calloc(2 * (size_t)x->v, sizeof *x->rings);
    int ok = x->slots && x->n_slots && x->dy && x->inputs && x->targets && x->events && x->rings;
    for (int r = 0; ok && r < 2 * x->v; r++) { /* staging only where this rank receives */
        recv_ring *g = &x->rings[r];
        g->kind = r % 2 ? LOOM_PP_RECV_GRAD : LOOM_PP_RECV_ACT;
        g->chunk = r / 2;
        int used = 0;
        for (int i = 0; i < x->n_actions; i++)
            used |= x->actions[i].kind == g->kind && x->actions[i].chunk == g->chunk;
        for (int k = 0; used && ok && k < RECV_AHEAD; k++)
            ok = (g->buf[k] = loom_device_alloc(x->dev, x->act_bytes)) != NULL;
    }
    for (int c = 0; ok && c < x->v; c++) {
        x->n_slots[c] = parts[c]->opts.n_slots;
        x->slots[c] = calloc((size_t)x->n_slots[c], sizeof *x->slots[c]);
        ok = x->slots[c] != NULL;
        for (int k = 0; ok && k < x->n_slots[c]; k++) x->slots[c][k].mb = -1;
    }
    if (!ok) {
        loom_pp_exec_free(x);
        return loom_fail(LOOM_EOS, "out of memory for the pipeline executor");
    }
    *out = x;
    return LOOM_OK;
}

void loom_pp_exec_free(loom_pp_exec *x) {
    if (!x) return;
    for (int c = 0; x->slots && c < x->v; c++) free(x->slots[c]);
    free(x->slots);
    free(x->n_slots);
    loom_device_release(x->dev, x->dy, x->act_bytes);
    free(x->inputs);
    free(x->targets);
    free(x->events);
    for (int r = 0; x->rings && r < 2 * x->v; r++) {
        recv_ring *g = &x->rings[r];
        if (g->count) continue; /* a failed step left receives posted: MPI may still write */
        for (int k = 0; k < RECV_AHEAD; k++) loom_device_release(x->dev, g->buf[k], x->act_bytes);
    }
    free(x->rings);
    free(x);
}

/* Post the ring's next receive of the action list into its free buffer. */
static loom_status ring_post(loom_pp_exec *x, recv_ring *g) {
    while (g->count < RECV_AHEAD && g->scan < x->n_actions) {
        const loom_pp_action *a = &x->actions[g->scan++];
        if (a->kind != g->kind || a->chunk != g->chunk) continue;
        int k = (g->head + g->count) % RECV_AHEAD;
        g->action[k] = (int)(a - x->actions);
        LOOM_TRY(loom_comm_irecv(x->pp, g->buf[k], x->act_bytes, a->peer, loom_pp_tag(x->s, x->rank, a),
                                 &g->req[k]));
        g->count++;
    }
    return LOOM_OK;
}

/* RECV action `i`: wait for its message (posted ahead), copy it to dst, and
 * post the ring's next receive into the freed buffer. */
static loom_status ring_take(loom_pp_exec *x, int i, void *dst) {
    const loom_pp_action *a = &x->actions[i];
    recv_ring *g = &x->rings[2 * a->chunk + (a->kind == LOOM_PP_RECV_GRAD)];
    if (!g->count || g->action[g->head] != i)
        return loom_fail(LOOM_EINTERNAL, "pipeline rank %d: receive for action %d was not posted ahead",
                         x->rank, i);
    loom_req *r = g->req[g->head];
    g->req[g->head] = NULL;
    LOOM_TRY(loom_comm_wait(r));
    loom_device_copy(x->dev, dst, g->buf[g->head], x->act_bytes);
    g->head = (g->head + 1) % RECV_AHEAD;
    g->count--;
    return ring_post(x, g);
}

static loom_status wait_slot(slot_state *st) {
    for (int i = 0; i < st->n_pending; i++) LOOM_TRY(loom_comm_wait(st->pending[i]));
    st->n_pending = 0;
    return LOOM_OK;
}

/* The slot holding (mb, chunk), taking a free one (after its sends have
 * completed) if mb has none yet. */
static loom_status slot_of(loom_pp_exec *x, int chunk, int mb, int *out) {
    int free_k = -1;
    for (int k = 0; k < x->n_slots[chunk]; k++) {
        if (x->slots[chunk][k].mb == mb) {
            *out = k;
            return LOOM_OK;
        }
        if (free_k < 0 && x->slots[chunk][k].mb < 0) free_k = k;
    }
    if (free_k < 0)
        return loom_fail(LOOM_EINTERNAL,
                         "pipeline rank %d chunk %d: micro-batch %d needs an activation slot, all "
                         "%d are in use (the schedule's peak was misjudged)",
                         x->rank, chunk, mb, x->n_slots[chunk]);
    LOOM_TRY(wait_slot(&x->slots[chunk][free_k]));
    x->slots[chunk][free_k].mb = mb;
    if (++x->live > x->peak_live) x->peak_live = x->live;
    *out = free_k;
    return LOOM_OK;
}

static void release(loom_pp_exec *x, int chunk, int k) {
    x->slots[chunk][k].mb = -1;
    x->live--;
}

static loom_status post_send(loom_pp_exec *x, slot_state *st, const void *buf, size_t bytes,
                             const loom_pp_action *a) {
    if (st->n_pending == MAX_PENDING) LOOM_TRY(wait_slot(st));
    int tag = loom_pp_tag(x->s, x->rank, a);
    return loom_comm_isend(x->pp, buf, bytes, a->peer, tag, &st->pending[st->n_pending++]);
}

static loom_status run_action(loom_pp_exec *x, int i, const loom_pp_exec_io *io, float dloss,
                              double *loss_sum) {
    const loom_pp_action *a = &x->actions[i];
    const int c = a->chunk, mb = a->mb, m = x->s->micro_batches;
    loom_gpt *part = c >= 0 ? x->parts[c] : NULL;
    const size_t act_bytes = part ? (size_t)part->Nx * part->C * sizeof(float) : 0;
    const int split = x->s->split_backward;
    int k = -1;
    if (a->kind != LOOM_PP_OPT_STEP) LOOM_TRY(slot_of(x, c, mb, &k));
    slot_state *st = k >= 0 ? &x->slots[c][k] : NULL;
    switch (a->kind) {
    case LOOM_PP_RECV_ACT: return ring_take(x, i, loom_gpt_input(part, k));
    case LOOM_PP_F:
        io->batch(io->ctx, mb, part->part.has_embed ? x->inputs : NULL,
                  part->part.has_head ? x->targets : NULL);
        return loom_gpt_forward(part, k, x->inputs, part->part.has_head ? x->targets : NULL, loss_sum);
    case LOOM_PP_SEND_ACT: return post_send(x, st, loom_gpt_output(part, k), act_bytes, a);
    case LOOM_PP_RECV_GRAD: return ring_take(x, i, x->dy);
    case LOOM_PP_B: {
        io->before_backward(io->ctx, mb, mb == m - 1);
        const float *dy = part->part.has_head ? NULL : x->dy;
        if (split) return loom_gpt_backward_input(part, k, dy, dloss);
        LOOM_TRY(loom_gpt_backward(part, k, dy, dloss));
        if (part->part.has_embed) release(x, c, k); /* no SEND_GRAD follows */
        return LOOM_OK;
    }
    case LOOM_PP_SEND_GRAD:
        LOOM_TRY(post_send(x, st, loom_gpt_input_grad(part, k), act_bytes, a));
        if (!split) release(x, c, k); /* its last action; the send finishes before reuse */
        return LOOM_OK;
    case LOOM_PP_W:
        io->before_backward(io->ctx, mb, mb == m - 1);
        LOOM_TRY(loom_gpt_backward_weight(part, k));
        release(x, c, k);
        return LOOM_OK;
    case LOOM_PP_OPT_STEP:
        for (int cc = 0; cc < x->v; cc++)
            for (int kk = 0; kk < x->n_slots[cc]; kk++) LOOM_TRY(wait_slot(&x->slots[cc][kk]));
        return LOOM_OK;
    case LOOM_PP_KIND_COUNT: break;
    }
    return loom_fail(LOOM_EINTERNAL, "pipeline: unknown action kind %d", (int)a->kind);
}

loom_status loom_pp_exec_run(loom_pp_exec *x, const loom_pp_exec_io *io, float dloss, double *loss_sum) {
    x->live = x->peak_live = 0;
    for (int r = 0; r < 2 * x->v; r++) { /* this step's first receives, posted now */
        recv_ring *g = &x->rings[r];
        g->head = g->count = g->scan = 0;
        if (g->buf[0]) LOOM_TRY(ring_post(x, g));
    }
    for (int i = 0; i < x->n_actions; i++) {
        loom_pp_event *e = &x->events[i];
        e->a = x->actions[i];
        e->t0 = loom_comm_wtime();
        LOOM_TRY(run_action(x, i, io, dloss, loss_sum));
        e->t1 = loom_comm_wtime();
    }
    return LOOM_OK;
}

int loom_pp_exec_peak_live(const loom_pp_exec *x) { return x->peak_live; }

const loom_pp_event *loom_pp_exec_events(const loom_pp_exec *x, int *n) {
    *n = x->n_actions;
    return x->events;
}
