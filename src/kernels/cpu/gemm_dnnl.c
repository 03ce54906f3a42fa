/* gemm_dnnl.c - oneDNN's matmul as a bf16 GEMM provider, and for some fp32
 * products.
 *
 * oneDNN picks its kernels from the CPU's feature flags (AVX512-BF16, AMX),
 * not from the vendor: on an AMD Zen 4 (AVX512-BF16 on 256-bit units) its
 * bf16 matmul ran at 181-219 GFLOP/s on one thread for the shapes of a
 * GPT-2 124M step, twice OpenBLAS's fp32 sgemm there (84-105), where oneMKL's
 * cblas_gemm_bf16bf16f32 converts to fp32 on such a CPU and runs its fp32
 * kernels (docs/performance.md). So oneDNN comes first (gemm_mkl.c decides).
 *
 * The library is Debian's libdnnl2 (python3-torch depends on it), loaded
 * with dlopen at the first bf16 GEMM; only its header (libdnnl-dev) is
 * needed to build, for the types. Without the header this file builds a
 * provider that is never ready.
 *
 * One primitive per GEMM shape (transposes, sizes, leading dimensions, alpha,
 * beta, threads), created at its first use and kept: a training step runs a
 * dozen shapes again and again. The product runs on loom's OpenMP threads
 * (oneDNN is built on the same libgomp), called once for the whole of C from
 * the thread that runs the model; C = alpha op(A) op(B) + beta C is oneDNN's
 * output scale alpha and a sum post-op of scale beta. Calls come from one
 * thread at a time (loom's compute thread).
 *
 * fp32: on a CPU with AVX-512, oneDNN's fp32 matmul (brg:avx512_core) ran
 * the forward and input-gradient products of a GPT-2 step 5-17 % faster than
 * OpenBLAS's AVX-512 sgemm on an AMD Zen 4, and lost on the weight gradients
 * (A transposed) and on the LM head's input gradient, whose K is the whole
 * vocabulary (docs/performance.md has the table). gemm.c sends it the
 * products it won (kern_dnnl_f32_ready says whether it is there).
 * LOOM_FP32_GEMM=openblas keeps every fp32 product on OpenBLAS, =dnnl uses
 * oneDNN on any CPU, =auto (default) uses it with AVX-512.
 */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_internal.h"
#include "loom/cpu.h"

#if defined(__has_include)
#if __has_include(<oneapi/dnnl/dnnl.h>)
#define LOOM_HAVE_DNNL 1
#endif
#endif

#ifdef LOOM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static struct {
    dnnl_status_t (*engine_create)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
    dnnl_status_t (*stream_create)(dnnl_stream_t *, dnnl_engine_t, unsigned);
    dnnl_status_t (*md_init_by_strides)(dnnl_memory_desc_t *, int, const dnnl_dims_t, dnnl_data_type_t,
                                        const dnnl_dims_t);
    dnnl_status_t (*matmul_desc_init)(dnnl_matmul_desc_t *, const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *, const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *);
    dnnl_status_t (*attr_create)(dnnl_primitive_attr_t *);
    dnnl_status_t (*attr_destroy)(dnnl_primitive_attr_t);
    dnnl_status_t (*attr_set_output_scales)(dnnl_primitive_attr_t, dnnl_dim_t, int, const float *);
    dnnl_status_t (*attr_set_post_ops)(dnnl_primitive_attr_t, const_dnnl_post_ops_t);
    dnnl_status_t (*post_ops_create)(dnnl_post_ops_t *);
    dnnl_status_t (*post_ops_destroy)(dnnl_post_ops_t);
    dnnl_status_t (*post_ops_append_sum)(dnnl_post_ops_t, float);
    dnnl_status_t (*pd_create)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t, const_dnnl_primitive_attr_t,
                               dnnl_engine_t, const_dnnl_primitive_desc_t);
    dnnl_status_t (*pd_destroy)(dnnl_primitive_desc_t);
    dnnl_status_t (*pd_query)(const_dnnl_primitive_desc_t, dnnl_query_t, int, void *);
    dnnl_status_t (*primitive_create)(dnnl_primitive_t *, const_dnnl_primitive_desc_t);
    dnnl_status_t (*primitive_destroy)(dnnl_primitive_t);
    dnnl_status_t (*memory_destroy)(dnnl_memory_t);
    dnnl_status_t (*memory_create)(dnnl_memory_t *, const dnnl_memory_desc_t *, dnnl_engine_t, void *);
    dnnl_status_t (*memory_set_data_handle)(dnnl_memory_t, void *);
    dnnl_status_t (*execute)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
    dnnl_status_t (*stream_wait)(dnnl_stream_t);
    const dnnl_version_t *(*version)(void);
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    char impl[2][64]; /* the kernel oneDNN chose for the first primitive of each type, bf16 then f32,
                         e.g. brg:avx512_core_bf16 */
    int loaded;       /* 0 not tried, 1 loaded, -1 failed (load_why says why) */
    char load_why[96];
} dn;

/* Operand types: bf16 (C in f32) or f32 throughout. */
enum { DT_BF16 = 0, DT_F32 = 1 };

/* One cached primitive. */
typedef struct {
    int dt, ta, tb, m, n, k, lda, ldb, ldc, nth;
    float alpha, beta;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
    unsigned long used; /* the call count at its last use */
} dnnl_entry;

/* A training step runs a few dozen shapes; a Mixture-of-Experts layer's
 * expert products take as many rows as tokens were routed to the expert,
 * a new M nearly every step, so the least recently used entry makes room
 * and its objects are destroyed. */
#define DNNL_CACHE 64
static dnnl_entry cache[DNNL_CACHE];
static int ncache;
static unsigned long ncalls;

/* The library, its symbols and a CPU engine: 1, or 0 with the reason in
 * dn.load_why. */
static int dnnl_load_once(void) {
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(dn.load_why, sizeof dn.load_why, "oneDNN (libdnnl.so.2) not found");
        return 0;
    }
    struct {
        void **fn;
        const char *name;
    } syms[] = {
        {(void **)&dn.engine_create, "dnnl_engine_create"},
        {(void **)&dn.stream_create, "dnnl_stream_create"},
        {(void **)&dn.md_init_by_strides, "dnnl_memory_desc_init_by_strides"},
        {(void **)&dn.matmul_desc_init, "dnnl_matmul_desc_init"},
        {(void **)&dn.attr_create, "dnnl_primitive_attr_create"},
        {(void **)&dn.attr_destroy, "dnnl_primitive_attr_destroy"},
        {(void **)&dn.attr_set_output_scales, "dnnl_primitive_attr_set_output_scales"},
        {(void **)&dn.attr_set_post_ops, "dnnl_primitive_attr_set_post_ops"},
        {(void **)&dn.post_ops_create, "dnnl_post_ops_create"},
        {(void **)&dn.post_ops_destroy, "dnnl_post_ops_destroy"},
        {(void **)&dn.post_ops_append_sum, "dnnl_post_ops_append_sum"},
        {(void **)&dn.pd_create, "dnnl_primitive_desc_create"},
        {(void **)&dn.pd_destroy, "dnnl_primitive_desc_destroy"},
        {(void **)&dn.pd_query, "dnnl_primitive_desc_query"},
        {(void **)&dn.primitive_create, "dnnl_primitive_create"},
        {(void **)&dn.primitive_destroy, "dnnl_primitive_destroy"},
        {(void **)&dn.memory_create, "dnnl_memory_create"},
        {(void **)&dn.memory_destroy, "dnnl_memory_destroy"},
        {(void **)&dn.memory_set_data_handle, "dnnl_memory_set_data_handle"},
        {(void **)&dn.execute, "dnnl_primitive_execute"},
        {(void **)&dn.stream_wait, "dnnl_stream_wait"},
        {(void **)&dn.version, "dnnl_version"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        *syms[i].fn = dlsym(h, syms[i].name);
        if (!*syms[i].fn) {
            snprintf(dn.load_why, sizeof dn.load_why, "oneDNN (libdnnl.so.2) lacks %s", syms[i].name);
            return 0;
        }
    }
    if (dn.engine_create(&dn.engine, dnnl_cpu, 0) != dnnl_success ||
        dn.stream_create(&dn.stream, dn.engine, dnnl_stream_default_flags) != dnnl_success) {
        snprintf(dn.load_why, sizeof dn.load_why, "oneDNN: no CPU engine");
        return 0;
    }
    return 1;
}

/* dnnl_load_once, tried once for the bf16 and the fp32 products alike; 0
 * with the reason in why. */
static int dnnl_load(char *why, size_t n) {
    if (!dn.loaded) dn.loaded = dnnl_load_once() ? 1 : -1;
    if (dn.loaded < 0) snprintf(why, n, "%s", dn.load_why);
    return dn.loaded > 0;
}

static int dnnl_run(int nth, int dt, int ta, int tb, int m, int n, int k, float alpha, const void *a, int lda,
                    const void *b, int ldb, float beta, float *c, int ldc);

/* The threads a probe's primitive is made for: OpenMP's default as the
 * last device set it (the probe changes nothing). */
static int probe_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* "oneDNN 2.6.3 matmul (brg:avx512_core)" for type dt into buf. */
static void dnnl_name(int dt, char *buf, size_t n) {
    const dnnl_version_t *v = dn.version();
    snprintf(buf, n, "oneDNN %d.%d.%d matmul (%s)", v->major, v->minor, v->patch, dn.impl[dt]);
}

int kern_dnnl_open(char *why, size_t n) {
    if (!dnnl_load(why, n)) return 0;
    /* Does this CPU run bf16 matmul natively? oneDNN names the kernel it
     * chose; a reference ("ref") kernel would be far slower than the fp32
     * fallback, so it is refused - unless LOOM_BF16_GEMM=dnnl forces it (the
     * kernels_bf16_dnnl test checks the numerics that way on any CPU). */
    if (!dnnl_run(probe_threads(), DT_BF16, CblasNoTrans, CblasTrans, 64, 64, 64, 1.0f, NULL, 64, NULL, 64,
                  0.0f, NULL, 64)) {
        snprintf(why, n, "oneDNN: no bf16 matmul on this CPU");
        return 0;
    }
    const char *mode = getenv("LOOM_BF16_GEMM");
    int forced = mode && !strcmp(mode, "dnnl");
    if (strstr(dn.impl[DT_BF16], "ref") && !forced) {
        snprintf(why, n, "oneDNN: only its reference bf16 matmul (%s) on this CPU", dn.impl[DT_BF16]);
        return 0;
    }
    dnnl_name(DT_BF16, why, n);
    return 1;
}

/* The fp32 decision, made once: 1 (oneDNN takes the products gemm.c sends
 * it) or 0, with the describe line in f32.why either way. */
static struct {
    int decided, ready;
    char why[200];
} f32;

static void f32_decide(void) {
    f32.decided = 1;
    const char *mode = getenv("LOOM_FP32_GEMM");
    const loom_cpu_features *f = loom_cpu_features_get();
    int forced = mode && !strcmp(mode, "dnnl");
    if (mode && *mode && strcmp(mode, "auto") && strcmp(mode, "openblas") && !forced)
        fprintf(stderr, "loom: warning: LOOM_FP32_GEMM=%s is not auto, openblas or dnnl; auto is used\n",
                mode);
    if (mode && !strcmp(mode, "openblas")) {
        snprintf(f32.why, sizeof f32.why, "OpenBLAS for every product (LOOM_FP32_GEMM=openblas)");
        return;
    }
    if (!forced && !(f->avx512f && f->os_avx512)) {
        snprintf(f32.why, sizeof f32.why,
                 "OpenBLAS for every product (no AVX-512: oneDNN's fp32 matmul not measured faster)");
        return;
    }
    char why[128] = "";
    if (!dnnl_load(why, sizeof why) || !dnnl_run(probe_threads(), DT_F32, CblasNoTrans, CblasTrans, 64, 64,
                                                 64, 1.0f, NULL, 64, NULL, 64, 0.0f, NULL, 64)) {
        snprintf(f32.why, sizeof f32.why, "OpenBLAS for every product (%s)",
                 why[0] ? why : "oneDNN: no fp32 matmul");
        return;
    }
    if (strstr(dn.impl[DT_F32], "ref") && !forced) {
        snprintf(f32.why, sizeof f32.why,
                 "OpenBLAS for every product (oneDNN has only its reference fp32 matmul here)");
        return;
    }
    char name[128];
    dnnl_name(DT_F32, name, sizeof name);
    snprintf(f32.why, sizeof f32.why, "%s for forward and input-gradient products%s", name,
             forced ? " (forced by LOOM_FP32_GEMM=dnnl)" : "");
    f32.ready = 1;
}

int kern_dnnl_f32_ready(void) {
    if (!f32.decided) f32_decide();
    return f32.ready;
}

void kern_dnnl_f32_describe(char *buf, size_t n) {
    if (!f32.decided) f32_decide();
    snprintf(buf, n, "%s", f32.why);
}

static dnnl_entry *dnnl_find(int dt, int ta, int tb, int m, int n, int k, float alpha, int lda, int ldb,
                             float beta, int ldc, int nth) {
    for (int i = 0; i < ncache; i++) {
        dnnl_entry *e = &cache[i];
        if (e->dt == dt && e->ta == ta && e->tb == tb && e->m == m && e->n == n && e->k == k &&
            e->lda == lda && e->ldb == ldb && e->ldc == ldc && e->alpha == alpha && e->beta == beta &&
            e->nth == nth)
            return e;
    }
    return NULL;
}

/* A free slot of the cache: a new one, or the least recently used entry's,
 * its objects destroyed. */
static dnnl_entry *dnnl_slot(void) {
    if (ncache < DNNL_CACHE) return &cache[ncache++];
    dnnl_entry *old = &cache[0];
    for (int i = 1; i < DNNL_CACHE; i++)
        if (cache[i].used < old->used) old = &cache[i];
    dn.primitive_destroy(old->prim);
    dn.memory_destroy(old->src);
    dn.memory_destroy(old->wei);
    dn.memory_destroy(old->dst);
    return old;
}

/* A new primitive for this shape, in the cache. NULL if oneDNN refuses the
 * shape. */
static dnnl_entry *dnnl_make(int dt, int ta, int tb, int m, int n, int k, float alpha, int lda, int ldb,
                             float beta, int ldc, int nth) {
    /* op(A) (m x k): element (i, p) at i*lda + p, or p*lda + i transposed;
     * op(B) (k x n): (p, j) at p*ldb + j, or j*ldb + p transposed. */
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_dims_t as = {ta == CblasNoTrans ? lda : 1, ta == CblasNoTrans ? 1 : lda};
    dnnl_dims_t bs = {tb == CblasNoTrans ? ldb : 1, tb == CblasNoTrans ? 1 : ldb};
    dnnl_dims_t cs = {ldc, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t md;
    const dnnl_data_type_t in = dt == DT_BF16 ? dnnl_bf16 : dnnl_f32;
    if (dn.md_init_by_strides(&amd, 2, ad, in, as) != dnnl_success ||
        dn.md_init_by_strides(&bmd, 2, bd, in, bs) != dnnl_success ||
        dn.md_init_by_strides(&cmd, 2, cd, dnnl_f32, cs) != dnnl_success ||
        dn.matmul_desc_init(&md, &amd, &bmd, NULL, &cmd) != dnnl_success)
        return NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    int ok = dn.attr_create(&attr) == dnnl_success;
    if (ok && alpha != 1.0f) ok = dn.attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
    if (ok && beta != 0.0f)
        ok = dn.post_ops_create(&po) == dnnl_success && dn.post_ops_append_sum(po, beta) == dnnl_success &&
             dn.attr_set_post_ops(attr, po) == dnnl_success;
    dnnl_primitive_desc_t pd = NULL;
    if (ok) ok = dn.pd_create(&pd, &md, attr, dn.engine, NULL) == dnnl_success;
    if (po) dn.post_ops_destroy(po);
    if (attr) dn.attr_destroy(attr);
    if (!ok) return NULL;
    if (!dn.impl[dt][0]) {
        const char *impl = NULL;
        if (dn.pd_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
            snprintf(dn.impl[dt], sizeof dn.impl[dt], "%s", impl);
    }
    dnnl_entry e = {dt, ta, tb, m, n, k, lda, ldb, ldc, nth, alpha, beta, NULL, NULL, NULL, NULL, 0};
    ok = dn.primitive_create(&e.prim, pd) == dnnl_success &&
         dn.memory_create(&e.src, &amd, dn.engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dn.memory_create(&e.wei, &bmd, dn.engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dn.memory_create(&e.dst, &cmd, dn.engine, DNNL_MEMORY_NONE) == dnnl_success;
    dn.pd_destroy(pd);
    if (!ok) { /* what was made of it */
        if (e.prim) dn.primitive_destroy(e.prim);
        if (e.src) dn.memory_destroy(e.src);
        if (e.wei) dn.memory_destroy(e.wei);
        return NULL;
    }
    dnnl_entry *slot = dnnl_slot();
    *slot = e;
    return slot;
}

static int dnnl_run(int nth, int dt, int ta, int tb, int m, int n, int k, float alpha, const void *a, int lda,
                    const void *b, int ldb, float beta, float *c, int ldc) {
    dnnl_entry *e = dnnl_find(dt, ta, tb, m, n, k, alpha, lda, ldb, beta, ldc, nth);
#ifdef _OPENMP
    omp_set_num_threads(nth); /* oneDNN threads by omp_get_max_threads() */
#endif
    if (!e) e = dnnl_make(dt, ta, tb, m, n, k, alpha, lda, ldb, beta, ldc, nth);
    if (!e) return 0;
    e->used = ++ncalls;
    if (!a) return 1; /* the probe: the primitive exists */
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei}, {DNNL_ARG_DST, e->dst}};
    if (dn.memory_set_data_handle(e->src, (void *)a) != dnnl_success ||
        dn.memory_set_data_handle(e->wei, (void *)b) != dnnl_success ||
        dn.memory_set_data_handle(e->dst, c) != dnnl_success ||
        dn.execute(e->prim, dn.stream, 3, args) != dnnl_success || dn.stream_wait(dn.stream) != dnnl_success)
        return 0;
    return 1;
}

int kern_dnnl_gemm(int nth, int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                   const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    return dnnl_run(nth, DT_BF16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int kern_dnnl_sgemm(int nth, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc) {
    return dnnl_run(nth, DT_F32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#else /* no oneDNN header at build time */

int kern_dnnl_open(char *why, size_t n) {
    snprintf(why, n, "oneDNN not built in (no oneapi/dnnl/dnnl.h; install libdnnl-dev)");
    return 0;
}

int kern_dnnl_gemm(int nth, int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                   const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    (void)nth, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
        (void)ldb, (void)beta, (void)c, (void)ldc;
    return 0;
}

int kern_dnnl_sgemm(int nth, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc) {
    (void)nth, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
        (void)ldb, (void)beta, (void)c, (void)ldc;
    return 0;
}

int kern_dnnl_f32_ready(void) { return 0; }

void kern_dnnl_f32_describe(char *buf, size_t n) {
    snprintf(buf, n, "OpenBLAS for every product (oneDNN not built in: install libdnnl-dev)");
}

#endif
