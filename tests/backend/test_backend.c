/* test_backend.c - the backend table and the routing through it.
 *
 * 1. The CPU table has every entry (checked field by field here, and by
 *    loom_backend_missing_entry, which must name each required entry a
 *    table lacks; the entries and the counting table below are generated
 *    from include/loom/kernel_list.h, as the tables themselves are).
 * 2. A device is refused on an incomplete table; "cuda" in a build without
 *    the CUDA backend is LOOM_EUSAGE naming the build option; an unknown
 *    name is LOOM_EUSAGE. The GEMM precision is the device's: an fp32 and a
 *    bf16 device run side by side, each with its own context.
 * 3. Routing: a device on a table whose every entry counts its calls and
 *    forwards to the CPU backend; a tiny GPT-2 is created on it, initialised, run
 *    forward and backward. Each kernel and tensor op must have been called
 *    exactly as often as the model's structure says (per block: 4 matmuls
 *    forward, 8 backward, ...), model memory must come from the table's
 *    allocator, and loss and gradients must be bit-identical to the same run
 *    on the CPU table (so nothing went around the table or was done twice).
 *    The counting table says its memory is not host memory, so parameter
 *    init takes the staged path (generate on the host, upload): the
 *    parameters must be bit-identical to the in-place init.
 *    The same for a tiny MoE: its routing and row ops (softmax_lse,
 *    topk_gate, gather, combine, scatter-add and their backward) go
 *    through the table once per block.
 * 4. Saving and loading parameters (safetensors) on that table goes through
 *    host copies (download, upload): the file must be byte for byte the one
 *    the CPU table writes, and loading it back must restore every parameter.
 * 5. The device's communicator factory: a device on the counting table
 *    (not host memory) makes host-staged groups, whose ops copy through the
 *    table and whose bf16 wire format packs with the table's kernels; a CPU
 *    device makes MPI groups carrying its own memory ops; NCCL groups on a
 *    table without a library of its own are refused naming it; the
 *    validator refuses NCCL groups only where they cannot work (pp > 1, the
 *    CP ring). One rank (loom_comm_init outside mpirun).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu_device.h"
#include "kernels/cpu/cpu_kernels.h"
#include "loom/backend.h"
#include "loom/bf16.h"
#include "loom/comm.h"
#include "loom/device.h"
#include "loom/model.h"
#include "loom/rng.h"
#include "loom/train.h"
#include "model/internal.h"
#include "train/internal.h"

/* The entries that are not kernels, then every kernel of the list. */
/* clang-format off */
#define NON_KERNELS(X)                                                                           \
    X(ctx_create) X(ctx_free) X(alloc) X(free) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d)         \
    X(memset) X(stream_create) X(stream_destroy) X(stream_sync) X(event_create) X(event_destroy) \
    X(event_record) X(stream_wait_event) X(event_sync) X(gemm_keeps_bf16)
/* clang-format on */

enum {
#define E_ENUM(e) E_##e,
    NON_KERNELS(E_ENUM)
#undef E_ENUM
#define LOOM_KERNEL(ret, name, params, args, need) E_##name,
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
        E_COUNT
};
static const char *const entry_name[E_COUNT] = {
#define E_NAME(e) #e,
    NON_KERNELS(E_NAME)
#undef E_NAME
#define LOOM_KERNEL(ret, name, params, args, need) #name,
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
};
static const size_t entry_offset[E_COUNT] = {
#define E_OFF(e) offsetof(loom_backend, e),
    NON_KERNELS(E_OFF)
#undef E_OFF
#define LOOM_KERNEL(ret, name, params, args, need) offsetof(loom_backend, name),
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
};
#define NEEDED_REQUIRED 1
#define NEEDED_OPTIONAL 0
static const int entry_required[E_COUNT] = {
#define E_REQ(e) 1,
    NON_KERNELS(E_REQ)
#undef E_REQ
#define LOOM_KERNEL(ret, name, params, args, need) NEEDED_##need,
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
};
static long n_calls[E_COUNT];

/* ---- the counting table: each entry counts its calls and forwards to the
 * CPU table, with the CPU context the counting device was made with ---- */

static loom_status w_ctx_create(loom_device *dev) {
    n_calls[E_ctx_create]++;
    return loom_backend_cpu.ctx_create(dev);
}
static void w_ctx_free(void *ctx) {
    n_calls[E_ctx_free]++;
    loom_backend_cpu.ctx_free(ctx);
}
static void *w_alloc(void *ctx, size_t bytes) {
    n_calls[E_alloc]++;
    return loom_backend_cpu.alloc(ctx, bytes);
}
static void w_free(void *ctx, void *p, size_t bytes) {
    n_calls[E_free]++;
    loom_backend_cpu.free(ctx, p, bytes);
}
static void w_memcpy_h2d(void *ctx, void *dst, const void *host_src, size_t bytes) {
    n_calls[E_memcpy_h2d]++;
    loom_backend_cpu.memcpy_h2d(ctx, dst, host_src, bytes);
}
static void w_memcpy_d2h(void *ctx, void *host_dst, const void *src, size_t bytes) {
    n_calls[E_memcpy_d2h]++;
    loom_backend_cpu.memcpy_d2h(ctx, host_dst, src, bytes);
}
static void w_memcpy_d2d(void *ctx, void *dst, const void *src, size_t bytes) {
    n_calls[E_memcpy_d2d]++;
    loom_backend_cpu.memcpy_d2d(ctx, dst, src, bytes);
}
static void w_memset(void *ctx, void *dst, int byte, size_t bytes) {
    n_calls[E_memset]++;
    loom_backend_cpu.memset(ctx, dst, byte, bytes);
}
static loom_status w_stream_create(void *ctx, loom_stream **out) {
    n_calls[E_stream_create]++;
    return loom_backend_cpu.stream_create(ctx, out);
}
static void w_stream_destroy(void *ctx, loom_stream *s) {
    n_calls[E_stream_destroy]++;
    loom_backend_cpu.stream_destroy(ctx, s);
}
static void w_stream_sync(void *ctx, loom_stream *s) {
    n_calls[E_stream_sync]++;
    loom_backend_cpu.stream_sync(ctx, s);
}
static loom_status w_event_create(void *ctx, loom_event **out) {
    n_calls[E_event_create]++;
    return loom_backend_cpu.event_create(ctx, out);
}
static void w_event_destroy(void *ctx, loom_event *e) {
    n_calls[E_event_destroy]++;
    loom_backend_cpu.event_destroy(ctx, e);
}
static void w_event_record(void *ctx, loom_event *e, loom_stream *s) {
    n_calls[E_event_record]++;
    loom_backend_cpu.event_record(ctx, e, s);
}
static void w_stream_wait_event(void *ctx, loom_stream *s, loom_event *e) {
    n_calls[E_stream_wait_event]++;
    loom_backend_cpu.stream_wait_event(ctx, s, e);
}
static void w_event_sync(void *ctx, loom_event *e) {
    n_calls[E_event_sync]++;
    loom_backend_cpu.event_sync(ctx, e);
}
static int w_gemm_keeps_bf16(void *ctx) {
    n_calls[E_gemm_keeps_bf16]++;
    return loom_backend_cpu.gemm_keeps_bf16(ctx);
}
/* every kernel of the list: w_<name>, counted, then the CPU's */
#define LOOM_KERNEL(ret, name, params, args, need)                                                           \
    static ret w_##name(void *ctx, LOOM_UNPACK params) {                                                     \
        n_calls[E_##name]++;                                                                                 \
        LOOM_KERNEL_RETURN_##ret loom_backend_cpu.name(ctx, LOOM_UNPACK args);                               \
    }
#include "loom/kernel_list.h"
#undef LOOM_KERNEL

static const loom_backend counting = {.name = "counting",
                                      .host_memory = 0, /* parameter init stages and uploads */
#define W_ENTRY(e) .e = w_##e,
                                      NON_KERNELS(W_ENTRY)
#undef W_ENTRY
#define LOOM_KERNEL(ret, name, params, args, need) .name = w_##name,
#include "loom/kernel_list.h"
#undef LOOM_KERNEL
};

/* The entry at offset off of t, as the bytes of a function pointer. */
static int entry_is_null(const loom_backend *t, size_t off) {
    void (*f)(void);
    memcpy(&f, (const char *)t + off, sizeof f);
    return f == NULL;
}

/* A device on table t (the counting one, the CPU), fp32 unless bf16; NULL
 * after a failed check. */
static loom_device *device_on(const loom_backend *t, int bf16) {
    const loom_device_opts o = {.threads = 1, .bf16 = bf16};
    loom_device *dev = NULL;
    CHECK(loom_device_create_with(t, &o, &dev) == LOOM_OK, "device on %s: %s", t->name, loom_errmsg());
    return dev;
}

/* Every entry is named when left out; a device is refused on an incomplete
 * table; names no build knows are refused. */
static void check_tables(void) {
    for (int e = 0; e < E_COUNT; e++)
        CHECK(!entry_is_null(&loom_backend_cpu, entry_offset[e]), "cpu backend: %s is NULL", entry_name[e]);
    CHECK(loom_backend_cpu.name && strcmp(loom_backend_cpu.name, "cpu") == 0, "cpu backend name");
    CHECK(loom_backend_missing_entry(&loom_backend_cpu) == NULL, "cpu table reported incomplete: %s",
          loom_backend_missing_entry(&loom_backend_cpu));
    for (int e = 0; e < E_COUNT; e++) {
        loom_backend t = counting;
        memset((char *)&t + entry_offset[e], 0, sizeof(void (*)(void)));
        const char *miss = loom_backend_missing_entry(&t);
        if (!entry_required[e]) { /* an optional kernel may be left out */
            CHECK(!miss, "optional %s left out, reported %s missing", entry_name[e], miss ? miss : "");
            continue;
        }
        CHECK(miss && strcmp(miss, entry_name[e]) == 0, "entry %s left out, reported %s", entry_name[e],
              miss ? miss : "(none)");
        const loom_device_opts o = {.threads = 1};
        loom_device *dev = NULL;
        loom_status st = loom_device_create_with(&t, &o, &dev);
        CHECK(st == LOOM_EINTERNAL && strstr(loom_errmsg(), entry_name[e]) && !dev,
              "device with %s NULL: status %d, message %s", entry_name[e], (int)st, loom_errmsg());
    }
    const loom_device_opts tpu = {.name = "tpu"}, cuda = {.name = "cuda"};
    loom_device *dev = NULL;
    loom_status st = loom_device_create(&tpu, &dev);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "tpu") && !dev, "device tpu: %d %s", (int)st,
          loom_errmsg());
    /* cuda: made when built with it and a GPU is there; else refused,
     * saying which of the two is missing */
    st = loom_device_create(&cuda, &dev);
    if (st == LOOM_OK) {
        CHECK(strcmp(dev->be->name, "cuda") == 0, "device cuda is %s", dev->be->name);
        CHECK(loom_backend_missing_entry(dev->be) == NULL, "cuda table incomplete");
        loom_device_free(dev);
    } else {
        CHECK(st == LOOM_EUSAGE && (strstr(loom_errmsg(), "built without the CUDA backend "
                                                          "(configure with -DLOOM_CUDA=ON") ||
                                    strstr(loom_errmsg(), "no CUDA device is visible")),
              "device cuda: %d %s", (int)st, loom_errmsg());
    }
}

/* --precision is the device's: an fp32 and a bf16 device side by side, the
 * same product on each, both made with their own context. */
static void check_precision(void) {
    memset(n_calls, 0, sizeof n_calls);
    loom_device *f32 = device_on(&counting, 0), *b16 = device_on(&counting, 1);
    if (!f32 || !b16) return;
    CHECK(n_calls[E_ctx_create] == 2 && f32->ctx != b16->ctx, "two devices, %ld contexts made",
          n_calls[E_ctx_create]);
    CHECK(!f32->bf16 && b16->bf16 && ((loom_cpu_ctx *)b16->ctx)->bf16 && !((loom_cpu_ctx *)f32->ctx)->bf16,
          "the devices' precisions: fp32 %d, bf16 %d", f32->bf16, b16->bf16);
    enum { N = 5, C = 33, OC = 7 };
    float x[N * C], w[C * OC], a[N * OC], b[N * OC], c[N * OC];
    for (int i = 0; i < N * C; i++) x[i] = 1.0f + 0.001f * (float)i;
    for (int i = 0; i < C * OC; i++) w[i] = 0.5f - 0.0007f * (float)i;
    loom_matmul_fwd(f32, a, x, w, NULL, N, C, OC);
    loom_matmul_fwd(b16, b, x, w, NULL, N, C, OC);
    loom_matmul_fwd(f32, c, x, w, NULL, N, C, OC);
    CHECK(memcmp(a, b, sizeof a) != 0, "the bf16 device's product equals the fp32 one: operands not rounded");
    CHECK(memcmp(a, c, sizeof a) == 0, "the fp32 device's product changed after the bf16 device ran");
    loom_device_free(f32);
    loom_device_free(b16);
    CHECK(n_calls[E_ctx_free] == 2, "%ld contexts freed, want 2", n_calls[E_ctx_free]);
}

typedef struct {
    double loss;
    float *params, *grads; /* malloc'd copies */
    size_t n;
} run_out;

/* Create, init, one forward + backward of a tiny model on dev; expect: 1
 * promises the backward first (loom_gpt_expect_backward), 2 promises it and
 * then breaks the promise (another dloss). */
static int run_model_expect(loom_device *dev, const loom_model_config *cfg, int B, int T, run_out *o,
                            int expect) {
    loom_gpt *m;
    loom_model_part part = loom_model_part_whole(dev, cfg);
    loom_gpt_opts opts = {.B = B, .T = T, .n_slots = 1};
    if (loom_gpt_create(cfg, &part, &opts, &m) != LOOM_OK) {
        CHECK(0, "create: %s", loom_errmsg());
        return 0;
    }
    loom_gpt_init_params(m, 1234);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    loom_rng_key k = loom_rng_key_make(5, "tokens");
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(loom_rng_u64(k, 2 * (uint64_t)i) % (uint64_t)cfg->vocab_size);
        tg[i] = (int32_t)(loom_rng_u64(k, 2 * (uint64_t)i + 1) % (uint64_t)cfg->vocab_size);
    }
    o->n = m->num_params;
    o->params = malloc(o->n * sizeof(float));
    o->grads = malloc(o->n * sizeof(float));
    memcpy(o->params, m->param_mem, o->n * sizeof(float));
    o->loss = 0;
    loom_gpt_zero_grad(m);
    const float dloss = 1.0f / (float)(B * T);
    if (expect) loom_gpt_expect_backward(m, dloss);
    loom_gpt_forward(m, 0, in, tg, &o->loss);
    loom_status st = loom_gpt_backward(m, 0, NULL, expect == 2 ? 2 * dloss : dloss);
    if (expect == 2)
        CHECK(st == LOOM_EINTERNAL && strstr(loom_errmsg(), "loom_gpt_expect_backward"),
              "a broken expect_backward promise: status %d, '%s'", (int)st, loom_errmsg());
    else CHECK(st == LOOM_OK, "backward: %s", loom_errmsg());
    memcpy(o->grads, m->grad_mem, o->n * sizeof(float));
    loom_gpt_free(m);
    free(in);
    free(tg);
    return 1;
}

static int run_model(loom_device *dev, const loom_model_config *cfg, int B, int T, run_out *o) {
    return run_model_expect(dev, cfg, B, T, o, 0);
}

static long calls(const char *name) {
    for (int e = 0; e < E_COUNT; e++)
        if (strcmp(entry_name[e], name) == 0) return n_calls[e];
    return -1;
}

/* The CPU table with the backward promised: the cross-entropy makes the
 * loss's gradient in its own pass (loom_vxent_local_grad), the same loss
 * and gradients as ref; a broken promise is an error, not wrong numbers. */
static void check_expect_backward(loom_device *cpu, const loom_model_config *cfg, int B, int T,
                                  const run_out *ref) {
    run_out fused, broken;
    if (run_model_expect(cpu, cfg, B, T, &fused, 1)) {
        CHECK(fused.loss == ref->loss, "expect_backward: loss %.9g, %.9g without", fused.loss, ref->loss);
        CHECK(memcmp(fused.grads, ref->grads, ref->n * sizeof(float)) == 0,
              "expect_backward: gradients differ from the run without it");
        free(fused.params), free(fused.grads);
    }
    if (run_model_expect(cpu, cfg, B, T, &broken, 2)) free(broken.params), free(broken.grads);
}

static void check_routing(void) {
    loom_model_config cfg = {
        .name = "backend-test", .n_layer = 3, .n_head = 2, .n_embd = 16, .vocab_size = 53, .n_positions = 16};
    const int B = 2, T = 8;
    const long L = cfg.n_layer;
    run_out ref, got;
    loom_device *cpu = test_cpu_device(1, 0), *cnt = device_on(&counting, 0);
    if (!cnt || !run_model(cpu, &cfg, B, T, &ref)) return;
    memset(n_calls, 0, sizeof n_calls);
    if (!run_model(cnt, &cfg, B, T, &got)) return;
    loom_device_free(cnt);
    struct {
        const char *name;
        long want;
    } expect[] = {
        /* memory: the three arenas (params, grads, activations), freed */
        {"alloc", 3},
        {"free", 3},
        /* staged init: one upload per 16384-float chunk; the token ids */
        {"memcpy_h2d", (long)((ref.n + 16383) / 16384) + 2},
        /* forward */
        {"embed_fwd", 1},
        {"pos_fwd", 1},
        {"layernorm_fwd", 2 * L + 1},
        {"matmul_fwd", 4 * L},
        {"attention_part_fwd", L}, /* the view kernel: heads, KV heads and positions as data */
        {"gelu_fwd", L},
        {"tensor_add_bias_residual", 2 * L},
        {"matmul_nt_fwd", 1},
        /* one rank holds the whole vocabulary: the optional fused kernel
         * (the table has it) instead of max, exp and finish */
        {"vxent_local", 1},
        {"vxent_max", 0},
        {"vxent_exp", 0},
        {"vxent_finish", 0},
        {"tensor_sum_acc", 1},
        /* backward: the head, per block 4 matmuls for the input and 4 for the
         * weight half, two LayerNorms each half, the two qkv bias column sums */
        {"vxent_bwd", 1},
        {"matmul_nt_bwd", 2},
        {"layernorm_bwd", 4 * L + 2},
        {"matmul_bwd", 8 * L},
        {"gelu_bwd", L},
        {"attention_part_bwd", L},
        {"tensor_colsum_acc", 2 * L},
        {"embed_bwd", 1},
        {"pos_bwd", 1},
        /* zeroing: grads once, the head's two buffers, six per block */
        {"memset", 1 + 2 + 6 * L},
        /* copies of the TP/SP regions at degree 1 (the identity), per block 4,
         * the head's, the part's input gradient and the embedding's */
        {"memcpy_d2d", 4 * L + 3},
        /* not used by a dense single-device model */
        {"residual_fwd", 0},
        {"residual_bwd", 0},
        {"attention_fwd", 0},
        {"attention_bwd", 0},
        {"adamw_update", 0},
        {"memcpy_d2h", 0},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        CHECK(calls(expect[i].name) == expect[i].want, "%s called %ld times, want %ld", expect[i].name,
              calls(expect[i].name), expect[i].want);
    CHECK(got.loss == ref.loss, "loss %.9g through the counting table, %.9g on cpu", got.loss, ref.loss);
    CHECK(got.n == ref.n && memcmp(got.params, ref.params, ref.n * sizeof(float)) == 0,
          "staged parameter init differs from the in-place init");
    CHECK(got.n == ref.n && memcmp(got.grads, ref.grads, ref.n * sizeof(float)) == 0,
          "gradients through the counting table differ from the cpu run");
    CHECK(ref.loss > 0, "loss %g", ref.loss);
    check_expect_backward(cpu, &cfg, B, T, &ref);
    loom_device_free(cpu);
    free(ref.params);
    free(ref.grads);
    free(got.params);
    free(got.grads);
}

/* A tiny MoE (every block, 4 experts, top 2, capacity 1 so some choices
 * drop, z-loss on) forward + backward through the counting table: the
 * routing and row ops are called once per MoE block each, the routing
 * bookkeeping crosses host and device only by the table's copies, and
 * loss and gradients are bit-identical to the CPU table's. */
static void check_moe_routing(void) {
    loom_model_config cfg = {.name = "backend-moe",
                             .n_layer = 2,
                             .n_head = 2,
                             .n_embd = 16,
                             .vocab_size = 53,
                             .n_positions = 16,
                             .n_expert = 4,
                             .top_k = 2,
                             .moe_every = 1,
                             .expert_hidden = 32,
                             .norm_topk = 1,
                             .aux_coef = 0.01f,
                             .z_coef = 0.001f,
                             .capacity_factor = 1.0f};
    const int B = 2, T = 8;
    const long L = cfg.n_layer;
    run_out ref, got;
    loom_device *cpu = test_cpu_device(1, 0), *cnt = device_on(&counting, 0);
    if (!cnt || !run_model(cpu, &cfg, B, T, &ref)) return;
    memset(n_calls, 0, sizeof n_calls);
    if (!run_model(cnt, &cfg, B, T, &got)) return;
    loom_device_free(cnt);
    loom_device_free(cpu);
    struct {
        const char *name;
        long want;
    } expect[] = {
        /* per MoE block: route, dispatch, combine; and their backward */
        {"tensor_softmax_lse", L},
        {"tensor_topk_gate", L},
        {"tensor_gather_rows", L},
        {"tensor_combine_rows", L},
        {"tensor_combine_rows_bwd", L},
        {"tensor_scatter_add_rows", L},
        {"tensor_topk_gate_bwd", L},
        {"tensor_fill", 0},
        /* the three arenas and the MoE blocks' one device allocation */
        {"alloc", 4},
        {"free", 4},
        /* down per block: the choices, the probabilities (aux loss) */
        {"memcpy_d2h", 2 * L},
        /* up: staged init, token ids, the token groups once, per block the
         * dispatch layout (rows, tokens, counts per group) */
        {"memcpy_h2d", (long)((ref.n + 16383) / 16384) + 2 + 1 + 3 * L},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        CHECK(calls(expect[i].name) == expect[i].want, "moe: %s called %ld times, want %ld", expect[i].name,
              calls(expect[i].name), expect[i].want);
    CHECK(got.loss == ref.loss && ref.loss > 0, "moe: loss %.9g through the counting table, %.9g on cpu",
          got.loss, ref.loss);
    CHECK(got.n == ref.n && memcmp(got.grads, ref.grads, ref.n * sizeof(float)) == 0,
          "moe: gradients through the counting table differ from the cpu run");
    free(ref.params);
    free(ref.grads);
    free(got.params);
    free(got.grads);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = b && len > 0 ? fread(b, 1, (size_t)len, fp) : 0;
    fclose(fp);
    return b;
}

/* Saves from a CPU part and from a part on the counting device (the same
 * parameters, staged init): the same file, the second through one host
 * copy; loading it on the counting device restores every parameter. */
static void check_params_io(void) {
    loom_model_config cfg = {
        .name = "backend-io", .n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 37, .n_positions = 8};
    loom_device *cpu = test_cpu_device(1, 0), *cnt = device_on(&counting, 0);
    loom_model_part part = loom_model_part_whole(cpu, &cfg), cpart = loom_model_part_whole(cnt, &cfg);
    loom_gpt_opts opts = {.B = 1, .T = 4, .n_slots = 1};
    const char *dir = check_scratch_dir("backend");
    if (!dir || !cnt) return;
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/cpu.safetensors", dir);
    snprintf(b, sizeof b, "%s/staged.safetensors", dir);
    loom_gpt *m, *mc, *m2;
    if (loom_gpt_create(&cfg, &part, &opts, &m) != LOOM_OK ||
        loom_gpt_create(&cfg, &cpart, &opts, &mc) != LOOM_OK) {
        CHECK(0, "create: %s", loom_errmsg());
        return;
    }
    loom_gpt_init_params(m, 99);
    loom_gpt_init_params(mc, 99);
    CHECK(loom_params_save(&m, 1, NULL, NULL, a) == LOOM_OK, "cpu save: %s", loom_errmsg());
    memset(n_calls, 0, sizeof n_calls);
    CHECK(loom_params_save(&mc, 1, NULL, NULL, b) == LOOM_OK, "staged save: %s", loom_errmsg());
    CHECK(calls("memcpy_d2h") == 1, "staged save downloads the one run: %ld", calls("memcpy_d2h"));
    size_t na = 0, nb = 0;
    unsigned char *fa = slurp(a, &na), *fb = slurp(b, &nb);
    CHECK(fa && fb && na > 0 && na == nb && memcmp(fa, fb, na) == 0,
          "staged save wrote a different file (%zu vs %zu bytes)", nb, na);
    if (loom_gpt_create(&cfg, &cpart, &opts, &m2) == LOOM_OK) {
        memset(n_calls, 0, sizeof n_calls);
        CHECK(loom_params_load(&m2, 1, NULL, NULL, b) == LOOM_OK, "staged load: %s", loom_errmsg());
        CHECK(calls("memcpy_h2d") == 1 && calls("memcpy_d2h") == 1, "staged load: %ld uploads, %ld downloads",
              calls("memcpy_h2d"), calls("memcpy_d2h"));
        CHECK(memcmp(m2->param_mem, m->param_mem, m->num_params * sizeof(float)) == 0,
              "parameters loaded through host copies differ from the saved ones");
        loom_gpt_free(m2);
    }
    free(fa);
    free(fb);
    loom_gpt_free(m);
    loom_gpt_free(mc);
    loom_device_free(cnt);
    loom_device_free(cpu);
}

/* One group of dev's over the world (one rank): its memory is dev's, and
 * a bf16 all-reduce through it packs and unpacks with dev's kernels. */
static void check_group_of(loom_device *dev, loom_comm *world, int staged) {
    loom_comm *g = NULL;
    CHECK(loom_device_comm_split(dev, world, 0, 0, "devgroup", &g) == LOOM_OK && g, "split on %s: %s",
          dev->be->name, loom_errmsg());
    if (!g) return;
    CHECK(loom_comm_memory(g)->ctx == loom_device_comm_mem(dev)->ctx,
          "%s: the group is not on the device's memory", dev->be->name);
    CHECK((loom_comm_host(g) != g) == staged, "%s: staged %d, but loom_comm_host is %s", dev->be->name,
          staged, loom_comm_host(g) == g ? "the group" : "another group");
    float *x = loom_device_alloc(dev, 8 * sizeof(float));
    if (x) {
        float h[8] = {1.0f, 2.0f, 3.0f, 1.00390625f, -5.0f, 0.0f, 7.0f, 1e-3f}, back[8];
        loom_tensor_upload(dev, x, h, 8);
        memset(n_calls, 0, sizeof n_calls);
        CHECK(loom_comm_allreduce_as(g, x, 8, LOOM_BF16, LOOM_SUM) == LOOM_OK, "bf16 allreduce: %s",
              loom_errmsg());
        if (dev->be == &counting)
            CHECK(calls("bf16_pack") == 1 && calls("bf16_unpack") == 1 && calls("memcpy_d2h") == 1 &&
                      calls("memcpy_h2d") == 1,
                  "staged bf16 allreduce: pack %ld, unpack %ld, down %ld, up %ld (want 1 each)",
                  calls("bf16_pack"), calls("bf16_unpack"), calls("memcpy_d2h"), calls("memcpy_h2d"));
        loom_tensor_download(dev, back, x, 8);
        CHECK(back[0] == 1.0f && back[3] == 1.0f && back[7] == loom_bf16_round(1e-3f),
              "bf16 allreduce of one rank: %g %g %g", back[0], back[3], back[7]);
        const loom_comm_stats *s = loom_comm_get_stats(g);
        CHECK(s->calls[LOOM_OP_ALLREDUCE] == 1 && s->bytes[LOOM_OP_ALLREDUCE] == 16,
              "%s: %llu calls, %llu bytes counted (want 1, 16: bf16)", dev->be->name,
              (unsigned long long)s->calls[LOOM_OP_ALLREDUCE],
              (unsigned long long)s->bytes[LOOM_OP_ALLREDUCE]);
        loom_device_release(dev, x, 8 * sizeof(float));
    }
    loom_comm_free(g);
}

static void check_device_comm(void) {
    loom_device *cpu = test_cpu_device(1, 0), *cnt = device_on(&counting, 0), *dev = NULL;
    if (!cpu || !cnt) return;
    CHECK(cpu->comm == LOOM_DEVICE_COMM_MPI && cnt->comm == LOOM_DEVICE_COMM_STAGED,
          "auto groups: cpu %s, counting %s", loom_device_comm_name(cpu->comm),
          loom_device_comm_name(cnt->comm));
    loom_device_opts o = {.threads = 1, .comm = LOOM_DEVICE_COMM_NATIVE};
    loom_status st = loom_device_create_with(&counting, &o, &dev);
    CHECK(st == LOOM_EUSAGE && !dev && strstr(loom_errmsg(), "no collective library"),
          "nccl on counting: %d %s", (int)st, loom_errmsg());
    loom_device_comm k;
    CHECK(loom_device_comm_parse("staged", "X", &k) == LOOM_OK && k == LOOM_DEVICE_COMM_STAGED,
          "parse staged");
    st = loom_device_comm_parse("gloo", "LOOM_DEVICE_COMM", &k);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "LOOM_DEVICE_COMM=gloo"), "parse gloo: %s",
          loom_errmsg());
    loom_comm *world = NULL;
    CHECK(loom_comm_init(NULL, NULL, &world) == LOOM_OK, "init: %s", loom_errmsg());
    if (world) {
        check_group_of(cpu, world, 0);
        check_group_of(cnt, world, 1);
        loom_comm_finalize(world);
    }
    /* the validator: staged groups everywhere; NCCL's only where they work */
    loom_train_config c;
    loom_train_config_default(&c);
    c.layout.pp = 2;
    loom_layout_device d = loom_train_device(cnt);
    CHECK(strcmp(d.comm, "staged") == 0 && !d.native_comm &&
              loom_layout_check_device(&c.layout, &d) == LOOM_OK,
          "staged groups, pp=2: %s", loom_errmsg());
    d = (loom_layout_device){.name = "cuda", .comm = "nccl", .native_comm = 1};
    st = loom_layout_check_device(&c.layout, &d);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "pp=2") &&
              strstr(loom_errmsg(), "LOOM_DEVICE_COMM=staged"),
          "nccl groups, pp=2: %d %s", (int)st, loom_errmsg());
    c.layout.pp = 1;
    c.layout.cp = 2;
    st = loom_layout_check_device(&c.layout, &d);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), "cp=2 ring"), "nccl groups, cp ring: %d %s", (int)st,
          loom_errmsg());
    c.layout.cp_impl = LOOM_CP_ULYSSES;
    CHECK(loom_layout_check_device(&c.layout, &d) == LOOM_OK, "nccl groups, ulysses: %s", loom_errmsg());
    loom_device_free(cnt);
    loom_device_free(cpu);
}

int main(void) {
    check_tables();
    check_precision();
    check_routing();
    check_moe_routing();
    check_params_io();
    check_device_comm();
    return check_done();
}
