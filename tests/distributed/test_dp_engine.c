/* test_dp_engine.c - the data-parallel engine (dp.h) on a real MPI job,
 * driven directly (no trainer).
 *
 *   loomrun -np N test_dp_engine
 *
 * For every stage (--zero 0..3), 1 and 2 micro-batches per step, and buckets
 * of one unit or of several, the N ranks of the dp group train a 3-block
 * model for 3 steps, each on its slice of a fixed global batch; every rank
 * also trains the same model alone on the whole batch with no engine
 * (train.h's loom_adamw_step) and checks, after every step:
 *   - every parameter tensor, read where the engine keeps it
 *     (loom_dp_param_runs: at ZeRO-3 each rank's slices, summed over the dp
 *     group), within 1e-5 norm-wise relative of the reference, and the
 *     gradient norm within 1e-6;
 *   - the dp traffic of the step, per op (calls and bytes), equals dp.h's
 *     theory, padding included (N = 3 pads every bucket);
 *   - memory by lifetime class equals dp.h's formulas, and the engine's
 *     reduction counters (all started in the backward, except padded
 *     zero-1 buckets).
 * The model is created as the trainer creates it (no full gradient buffer
 * at ZeRO-2/3, no full parameter buffer at ZeRO-3) and its starting
 * parameters are written through loom_dp_param_runs. The expected sizes are
 * rebuilt here from the model's unit ranges. Also: freeing the engine gives
 * the model its own buffers back (where it has them). With comm_bf16, on a
 * fresh mesh: the engine reserves the dp group's wire buffers when it is made
 * (counted with the gradients: exactly the group's wire bytes) and no step
 * allocates another. Collective over the world (every rank is one dp rank).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "loom/dp.h"
#include "loom/kernels.h"
#include "loom/train.h"

enum { B_GLOBAL = 24, T = 8, STEPS = 3 };
static const float LR = 1e-3f, CLIP = 0.05f;
static const loom_adamw_hparams HP = {0.9f, 0.95f, 1e-8f, 0.1f};

static loom_model_config model_config(void) {
    loom_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "dp-test");
    c.n_layer = 3; /* odd: the two rotating buffers both get used, unevenly */
    c.n_head = 2;
    c.n_embd = 32;
    c.vocab_size = 64;
    c.n_positions = 16;
    return c;
}

/* The global batch of step s: (B_GLOBAL, T) inputs and next-token targets. */
static void make_batch(int s, int32_t *in, int32_t *tg, int V) {
    uint32_t x = 12345u + 977u * (uint32_t)s;
    int32_t seq[T + 1];
    for (int b = 0; b < B_GLOBAL; b++) {
        for (int t = 0; t <= T; t++) {
            x = x * 1664525u + 1013904223u;
            seq[t] = (int32_t)((x >> 8) % (uint32_t)V);
        }
        memcpy(in + b * T, seq, T * sizeof(int32_t));
        memcpy(tg + b * T, seq + 1, T * sizeof(int32_t));
    }
}

/* dp.h's buckets: floats of each, in backward order, and whether it holds the outer unit. */
static int buckets_of(const loom_gpt *m, int zero, double mb, size_t *n, int *outer) {
    const double cap = zero == 3 ? 0 : mb * 1024 * 1024 / sizeof(float);
    int nb = 0;
    size_t cur = 0;
    int has_outer = 0;
    for (int i = 0; i <= m->L_l; i++) {
        int unit = i < m->L_l ? m->part.layer_end - 1 - i : LOOM_UNIT_OUTER;
        size_t lo, cnt;
        loom_gpt_unit_range(m, unit, &lo, &cnt);
        cur += cnt;
        has_outer |= unit == LOOM_UNIT_OUTER;
        if ((double)cur >= cap || i == m->L_l) {
            n[nb] = cur;
            outer[nb++] = has_outer;
            cur = 0;
            has_outer = 0;
        }
    }
    return nb;
}

typedef struct expect {
    loom_dp_memory mem;
    uint64_t calls[LOOM_OP_COUNT], bytes[LOOM_OP_COUNT];
    int reductions, overlapped;
} expect;

static void theory(const loom_gpt *m, int zero, int N, int K, double mb, expect *x) {
    size_t n[64], S = 0, P = 0, slots[3] = {0, 0, 0}, scratch = 0, psi = m->num_params;
    int outer[64], nb = buckets_of(m, zero, mb, n, outer), padded = 0;
    const size_t Nl = zero ? (size_t)N : 1, F = sizeof(float);
    for (int b = 0; b < nb; b++) {
        size_t s = (n[b] + Nl - 1) / Nl, p = s * Nl;
        int k = outer[b] ? 2 : b % 2;
        S += s;
        P += p;
        if (p > slots[k]) slots[k] = p;
        if (zero == 1 && p != n[b]) {
            padded++;
            if (p > scratch) scratch = p;
        }
    }
    memset(x, 0, sizeof *x);
    x->mem.optimizer = 2 * S * F;
    x->mem.params = (zero == 3 ? S + slots[0] + slots[1] + slots[2] : psi) * F;
    x->mem.grads = (zero >= 2 ? S + slots[0] + slots[1] + slots[2] : psi + scratch) * F;
    x->mem.activations = loom_gpt_activation_bytes(m);
    if (N == 1) return;
    if (zero == 0) {
        x->calls[LOOM_OP_ALLREDUCE] = (uint64_t)nb;
        x->bytes[LOOM_OP_ALLREDUCE] = psi * F;
        x->reductions = x->overlapped = nb;
        return;
    }
    int krs = zero >= 2 ? K : 1;
    x->calls[LOOM_OP_ALLREDUCE] = 1; /* the norm's two partial sums */
    x->bytes[LOOM_OP_ALLREDUCE] = 16;
    x->calls[LOOM_OP_REDUCE_SCATTER] = (uint64_t)(nb * krs);
    x->bytes[LOOM_OP_REDUCE_SCATTER] = P * F * (uint64_t)krs;
    x->calls[LOOM_OP_ALLGATHER] = (uint64_t)(zero == 3 ? 2 * nb * K : nb);
    x->bytes[LOOM_OP_ALLGATHER] = P * F * (uint64_t)(zero == 3 ? 2 * K : 1);
    x->reductions = nb * krs;
    x->overlapped = x->reductions - padded;
}

/* One rank alone on the whole batch, no engine: the reference step. */
static double ref_step(loom_gpt *r, loom_adamw *opt, const int32_t *in, const int32_t *tg) {
    loom_gpt_zero_grad(r);
    loom_gpt_forward(r, 0, in, tg, NULL);
    loom_gpt_backward(r, 0, NULL, 1.0f / (B_GLOBAL * T));
    double sq[2];
    loom_gpt *parts[1] = {r};
    loom_dp_sumsq_parts(parts, 1, NULL, sq);
    double norm = sqrt(sq[0] + sq[1]);
    if (norm > CLIP) loom_scale(r->dev, r->grad_mem, r->num_params, CLIP / (float)(norm + 1e-6));
    loom_adamw_step(opt, &HP, LR);
    return norm;
}

static void run_case(loom_device *dev, const loom_mesh *mesh, int zero, int K, double mb) {
    const loom_model_config mc = model_config();
    const int N = mesh->world_size, r = mesh->rank, Bl = B_GLOBAL / N, Bm = Bl / K;
    char label[96];
    snprintf(label, sizeof label, "N=%d zero=%d K=%d bucket=%gMB", N, zero, K, mb);
    loom_model_part part = loom_model_part_whole(dev, &mc);
    loom_gpt_opts ro = {.B = B_GLOBAL, .T = T, .n_slots = 1}, eo = {.B = Bm,
                                                                    .T = T,
                                                                    .n_slots = 1,
                                                                    .external_params = zero >= 3,
                                                                    .external_grads = zero >= 2};
    loom_gpt *ref = NULL, *m = NULL;
    loom_adamw opt;
    loom_dp_engine *e = NULL;
    CHECK(loom_gpt_create(&mc, &part, &ro, &ref) == LOOM_OK, "%s: reference: %s", label, loom_errmsg());
    CHECK(loom_gpt_create(&mc, &part, &eo, &m) == LOOM_OK, "%s: model: %s", label, loom_errmsg());
    CHECK(loom_adamw_create(&opt, ref) == LOOM_OK, "%s: optimizer", label);
    loom_dp_config cfg = {.zero = zero, .bucket_mb = mb};
    loom_status st = loom_dp_engine_create(&m, 1, mesh, &cfg, &HP, &e);
    CHECK(st == LOOM_OK, "%s: engine: %s", label, loom_errmsg());
    if (st != LOOM_OK) return;
    loom_gpt_init_params(ref, 7);
    int n_runs = 0;
    const loom_param_run *runs = loom_dp_param_runs(e, 0, &n_runs);
    for (int k = 0; k < n_runs; k++)
        memcpy(runs[k].data, ref->param_mem + runs[k].lo, runs[k].n * sizeof(float));
    expect x;
    theory(m, zero, N, K, mb, &x);
    loom_dp_memory mem;
    loom_dp_memory_bytes(e, &mem);
    CHECK(mem.params == x.mem.params && mem.grads == x.mem.grads && mem.optimizer == x.mem.optimizer &&
              mem.activations == x.mem.activations,
          "%s: memory params/grads/optimizer %zu/%zu/%zu, formulas %zu/%zu/%zu", label, mem.params, mem.grads,
          mem.optimizer, x.mem.params, x.mem.grads, x.mem.optimizer);
    int32_t *in = malloc(B_GLOBAL * T * sizeof *in), *tg = malloc(B_GLOBAL * T * sizeof *tg);
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        make_batch(s, in, tg, mc.vocab_size);
        double want_norm = ref_step(ref, &opt, in, tg), norm = 0;
        loom_comm_reset_stats(mesh->dp);
        st = loom_dp_begin_step(e);
        for (int k = 0; k < K && st == LOOM_OK; k++) {
            const size_t first = (size_t)(r * Bl + k * Bm) * T;
            loom_dp_set_last_micro(e, k == K - 1);
            st = loom_gpt_forward(m, 0, in + first, tg + first, NULL);
            if (st == LOOM_OK) st = loom_gpt_backward(m, 0, NULL, 1.0f / (B_GLOBAL * T));
        }
        if (st == LOOM_OK) st = loom_dp_finish_grads(e);
        if (st == LOOM_OK) st = loom_dp_grad_norm(e, &norm);
        float scale = norm > CLIP ? CLIP / (float)(norm + 1e-6) : 1.0f;
        if (st == LOOM_OK) st = loom_dp_step(e, LR, scale);
        loom_dp_timing t;
        loom_dp_get_timing(e, &t);
        const loom_comm_stats cs = *loom_comm_get_stats(mesh->dp);
        CHECK(st == LOOM_OK, "%s step %d: %s", label, s, loom_errmsg());
        if (st != LOOM_OK) break;
        CHECK(fabs(norm - want_norm) <= 1e-6 * want_norm, "%s step %d: norm %.9g, reference %.9g", label, s,
              norm, want_norm);
        for (int op = 0; op < LOOM_OP_COUNT; op++)
            CHECK(cs.calls[op] == x.calls[op] && cs.bytes[op] == x.bytes[op],
                  "%s step %d: dp %s %llu calls %llu bytes, theory %llu / %llu", label, s,
                  loom_comm_op_name((loom_comm_op)op), (unsigned long long)cs.calls[op],
                  (unsigned long long)cs.bytes[op], (unsigned long long)x.calls[op],
                  (unsigned long long)x.bytes[op]);
        CHECK(t.reductions == x.reductions && t.overlapped == x.overlapped,
              "%s step %d: %d reductions (%d in the backward), expected %d (%d)", label, s, t.reductions,
              t.overlapped, x.reductions, x.overlapped);
        for (int i = 0; i < m->n_params; i++) {
            const loom_param *p = &m->params[i];
            double dn[2] = {0, 0}; /* squared difference, squared reference */
            for (int k = 0; k < n_runs; k++) {
                size_t lo = p->offset > runs[k].lo ? p->offset : runs[k].lo;
                size_t hi = p->offset + p->numel < runs[k].lo + runs[k].n ? p->offset + p->numel
                                                                          : runs[k].lo + runs[k].n;
                for (size_t j = lo; j < hi; j++) {
                    double a = runs[k].data[j - runs[k].lo], b = ref->param_mem[j];
                    dn[0] += (a - b) * (a - b);
                    dn[1] += b * b;
                }
            }
            if (loom_dp_params_sharded(e))
                CHECK(loom_comm_allreduce(mesh->dp, dn, 2, LOOM_F64, LOOM_SUM) == LOOM_OK,
                      "%s: allreduce: %s", label, loom_errmsg());
            double err = sqrt(dn[0]) / (sqrt(dn[1]) > 1e-30 ? sqrt(dn[1]) : 1e-30);
            if (err > worst) worst = err;
            CHECK(err <= 1e-5, "%s step %d: %s rel err %.2e", label, s, p->name, err);
        }
    }
    if (r == 0) printf("%s: worst parameter rel err %.2e\n", label, worst);
    loom_dp_engine_free(e);
    /* the model's own buffers again */
    const loom_param *q = loom_gpt_find_param(m, "h.1.attn.c_attn.weight");
    CHECK((!m->param_mem || m->w.h[1].qkv_w == m->param_mem + q->offset) &&
              (!m->grad_mem || m->g.h[1].qkv_w == m->grad_mem + q->offset) && !m->hooks.pre_forward,
          "%s: engine_free left the model bound elsewhere", label);
    free(in);
    free(tg);
    loom_adamw_free(&opt);
    loom_gpt_free(m);
    loom_gpt_free(ref);
}

/* comm_bf16 at one stage: the wire buffers are reserved up front and
 * counted, and two steps allocate none (on a fresh mesh, so the dp group's
 * wire buffers are this engine's alone). */
static void check_wire_reserved(loom_device *dev, loom_comm *world, int zero, int K, double mb) {
    const loom_model_config mc = model_config();
    loom_layout l;
    loom_layout_default(&l);
    l.dp = loom_comm_size(world);
    loom_mesh *mesh = NULL;
    loom_gpt *m = NULL;
    loom_dp_engine *e = NULL;
    const int N = l.dp, r = loom_comm_rank(world), Bl = B_GLOBAL / N, Bm = Bl / K;
    loom_model_part part = loom_model_part_whole(dev, &mc);
    loom_gpt_opts o = {
        .B = Bm, .T = T, .n_slots = 1, .external_params = zero >= 3, .external_grads = zero >= 2};
    loom_dp_config cfg = {.zero = zero, .bucket_mb = mb, .comm_bf16 = 1};
    CHECK(loom_mesh_create(world, &l, dev, &mesh) == LOOM_OK, "mesh: %s", loom_errmsg());
    CHECK(mesh && loom_gpt_create(&mc, &part, &o, &m) == LOOM_OK, "model: %s", loom_errmsg());
    CHECK(m && loom_dp_engine_create(&m, 1, mesh, &cfg, &HP, &e) == LOOM_OK, "bf16 engine: %s",
          loom_errmsg());
    if (e) {
        expect x;
        theory(m, zero, N, K, mb, &x);
        loom_dp_memory mem;
        loom_dp_memory_bytes(e, &mem);
        const size_t wire = loom_comm_wire_bytes(mesh->dp);
        CHECK(mem.grads == x.mem.grads + wire && (N == 1) == (wire == 0),
              "zero %d K %d bucket %g: grads %zu bytes, fp32 formula %zu + %zu wire", zero, K, mb, mem.grads,
              x.mem.grads, wire);
        int32_t *in = malloc(B_GLOBAL * T * sizeof *in), *tg = malloc(B_GLOBAL * T * sizeof *tg);
        loom_status st = LOOM_OK;
        for (int s = 0; s < 2 && st == LOOM_OK; s++) {
            make_batch(s, in, tg, mc.vocab_size);
            double norm = 0;
            st = loom_dp_begin_step(e);
            for (int k = 0; k < K && st == LOOM_OK; k++) {
                const size_t first = (size_t)(r * Bl + k * Bm) * T;
                loom_dp_set_last_micro(e, k == K - 1);
                st = loom_gpt_forward(m, 0, in + first, tg + first, NULL);
                if (st == LOOM_OK) st = loom_gpt_backward(m, 0, NULL, 1.0f / (B_GLOBAL * T));
            }
            if (st == LOOM_OK) st = loom_dp_finish_grads(e);
            if (st == LOOM_OK) st = loom_dp_grad_norm(e, &norm);
            if (st == LOOM_OK) st = loom_dp_step(e, LR, 1.0f);
        }
        CHECK(st == LOOM_OK, "zero %d K %d bucket %g bf16 steps: %s", zero, K, mb, loom_errmsg());
        CHECK(loom_comm_wire_grown(mesh->dp) == 0,
              "zero %d K %d bucket %g: %zu wire buffers allocated in a step", zero, K, mb,
              loom_comm_wire_grown(mesh->dp));
        free(in), free(tg);
    }
    loom_dp_engine_free(e);
    loom_gpt_free(m);
    loom_mesh_free(mesh);
}

static void check_refusals(loom_device *dev, const loom_mesh *mesh) {
    const loom_model_config mc = model_config();
    loom_model_part part = loom_model_part_whole(dev, &mc);
    loom_gpt_opts o = {.B = 1, .T = T, .n_slots = 1, .split_backward = 1};
    loom_gpt *m = NULL;
    loom_dp_engine *e = NULL;
    if (loom_gpt_create(&mc, &part, &o, &m) != LOOM_OK) return;
    loom_dp_config cfg = {.zero = 4};
    loom_status st = loom_dp_engine_create(&m, 1, mesh, &cfg, &HP, &e);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "--zero 4"), "zero 4: status %d (%s)", (int)st,
          loom_errmsg());
    CHECK(!m->hooks.pre_backward, "a refused engine left hooks on the model");
    for (int z = 0; z <= 3; z++) { /* every stage works with a split backward */
        cfg.zero = z;
        e = NULL;
        CHECK(loom_dp_engine_create(&m, 1, mesh, &cfg, &HP, &e) == LOOM_OK, "zero %d, split backward: %s", z,
              loom_errmsg());
        CHECK(!e || (m->hooks.pre_weight && m->hooks.post_input), "zero %d: split hooks missing", z);
        loom_dp_engine_free(e);
    }
    loom_gpt_free(m);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_errmsg());
        return 1;
    }
    loom_layout l;
    loom_layout_default(&l);
    l.dp = loom_comm_size(world);
    loom_mesh *mesh = NULL;
    loom_device *dev = test_cpu_device(1, 0);
    CHECK(loom_mesh_create(world, &l, dev, &mesh) == LOOM_OK, "mesh: %s", loom_errmsg());
    if (mesh) {
        for (int zero = 0; zero <= 3; zero++)
            for (int K = 1; K <= 2; K++)
                for (int b = 0; b < 2; b++) run_case(dev, mesh, zero, K, b ? 0.06 : 0.0);
        check_refusals(dev, mesh);
        loom_mesh_free(mesh);
        for (int zero = 0; zero <= 3; zero++)
            for (int b = 0; b < 2; b++) check_wire_reserved(dev, world, zero, 2, b ? 0.06 : 0.0);
    }
    loom_device_free(dev);
    int failed = check_failed_;
    loom_comm_allreduce(world, &failed, 1, LOOM_I32, LOOM_SUM);
    int local = check_done();
    loom_comm_finalize(world);
    return failed || local ? 1 : 0;
}
