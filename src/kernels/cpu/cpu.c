/* cpu.c - CPU features from CPUID/XCR0 and the OpenBLAS core type they call
 * for; see include/loom/cpu.h.
 *
 * Measured on a 2-core AMD EPYC (Zen 3, AVX2, no AVX-512), one thread,
 * GFLOP/s for 1024^3 / (256,2304,768) / (256,50257,768) sgemms: OpenBLAS
 * Haswell 91/88/58 (what 0.3.21 picks there), Zen 61/64/57, oneDNN 2.6
 * dnnl_sgemm 55/72/58 (busy machine: the spread is the noise); SkylakeX dies
 * with SIGILL, which is why the choice must come from the flags. On AVX-512
 * CPUs the issue measured SkylakeX at 229 vs 117 GFLOP/s for the AVX2 kernels
 * (2048^3, Zen 5). So: OpenBLAS, with the widest kernels the flags allow.
 */
#include "loom/cpu.h"
#include "kern_internal.h"

#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

char *openblas_get_corename(void);
char *openblas_get_config(void);

static loom_cpu_features cpu_feat;
static int cpu_feat_done;

static unsigned long long cpu_xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (unsigned long long)hi << 32 | lo;
}

const loom_cpu_features *loom_cpu_features_get(void) {
    if (cpu_feat_done) return &cpu_feat;
    loom_cpu_features f;
    memset(&f, 0, sizeof f);
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        f.fma = (c >> 12) & 1;
        int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
        if (osxsave && avx) {
            unsigned long long x = cpu_xcr0();
            f.os_avx = (x & 0x6) == 0x6;
            f.os_avx512 = f.os_avx && (x & 0xe0) == 0xe0;
            f.os_amx = (x & 0x60000) == 0x60000;
        }
    }
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f.avx2 = (b >> 5) & 1;
        f.avx512f = (b >> 16) & 1;
        f.avx512dq = (b >> 17) & 1;
        f.avx512bw = (b >> 30) & 1;
        f.avx512vl = (b >> 31) & 1;
        f.amx_bf16 = (d >> 22) & 1;
        f.amx_tile = (d >> 24) & 1;
        unsigned max_sub = a;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            f.avx512_bf16 = (a >> 5) & 1;
        }
    }
    cpu_feat = f;
    cpu_feat_done = 1;
    return &cpu_feat;
}

void loom_cpu_features_str(const loom_cpu_features *f, char *buf, size_t n) {
    const struct {
        int on;
        const char *name;
    } k[] = {
        {f->avx2 && f->os_avx, "avx2"},
        {f->fma && f->os_avx, "fma"},
        {f->avx512f && f->os_avx512, "avx512f"},
        {f->avx512bw && f->os_avx512, "avx512bw"},
        {f->avx512vl && f->os_avx512, "avx512vl"},
        {f->avx512dq && f->os_avx512, "avx512dq"},
        {f->avx512_bf16 && f->os_avx512, "avx512_bf16"},
        {f->amx_tile && f->os_amx, "amx_tile"},
        {f->amx_bf16 && f->os_amx, "amx_bf16"},
    };
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].on && used < n) {
            int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", k[i].name);
            if (w > 0) used += (size_t)w;
        }
    if (!buf[0]) snprintf(buf, n, "no avx2");
}

static int has_avx512(const loom_cpu_features *f) {
    return f->os_avx512 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
}

const char *loom_blas_wanted_coretype(const loom_cpu_features *f) {
    if (has_avx512(f)) return "SkylakeX"; /* Cooperlake/SapphireRapids: the same sgemm */
    if (f->os_avx && f->avx2 && f->fma) return "Haswell";
    return NULL;
}

/* Whether OpenBLAS's core `have` already runs kernels as wide as `want`. */
static int core_good_enough(const char *have, const char *want) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    int have512 = 0, have2 = 0;
    for (size_t i = 0; i < 3; i++) have512 |= !strcasecmp(have, avx512[i]);
    for (size_t i = 0; i < 2; i++) have2 |= !strcasecmp(have, avx2[i]);
    if (!strcasecmp(want, "SkylakeX")) return have512;
    return have512 || have2;
}

/* The OpenBLAS core to re-execute with, or NULL. */
static const char *blas_reexec_core(void) {
    const char *user = getenv("OPENBLAS_CORETYPE"), *ours = getenv("LOOM_BLAS_CHOSEN");
    const char *autosel = getenv("LOOM_BLAS_AUTO");
    if (autosel && !strcmp(autosel, "0")) return NULL;
    if (ours) return NULL;          /* already re-executed once: never loop */
    if (user && *user) return NULL; /* the user's choice */
    const char *want = loom_blas_wanted_coretype(loom_cpu_features_get());
    const char *have = openblas_get_corename();
    if (!want || !have || core_good_enough(have, want)) return NULL;
    return want;
}

/* libgomp's waiting threads spin GOMP_SPINCOUNT times before they sleep:
 * 300000 by default, about a millisecond. When another process holds a core
 * the spinning thread takes time slices from loom's own threads: on a shared
 * 2-core Zen 3 an empty 2-thread region averaged 835 us, 10 us with 20000
 * spins, and 2-thread training runs fell below one thread's speed; on a quiet
 * machine 20000 spins (tens of microseconds) still cover the gaps between
 * loom's parallel loops. libgomp reads the variable before main, hence the
 * re-execution. Not when the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY, or
 * LOOM_OMP_AUTO=0. */
#define LOOM_GOMP_SPINCOUNT "20000"
static int omp_wants_spincount(void) {
    const char *autosel = getenv("LOOM_OMP_AUTO");
    if (autosel && !strcmp(autosel, "0")) return 0;
    return !getenv("GOMP_SPINCOUNT") && !getenv("OMP_WAIT_POLICY");
}

/* GOMP_SPINCOUNT is the value loom set (LOOM_OMP_CHOSEN records it). */
static int omp_spin_is_ours(void) {
    const char *ours = getenv("LOOM_OMP_CHOSEN"), *spin = getenv("GOMP_SPINCOUNT");
    return ours && spin && !strcmp(ours, spin);
}

void loom_omp_describe(char *buf, size_t n) {
    const char *spin = getenv("GOMP_SPINCOUNT"), *policy = getenv("OMP_WAIT_POLICY");
    if (policy && *policy) snprintf(buf, n, "OMP_WAIT_POLICY=%s (set by the user)", policy);
    else if (spin && !strcmp(spin, LOOM_GOMP_SPINCOUNT) && omp_spin_is_ours())
        snprintf(buf, n, "GOMP_SPINCOUNT=%s (set by loom: bounded spinning of waiting threads)", spin);
    else if (spin && *spin) snprintf(buf, n, "GOMP_SPINCOUNT=%s (set by the user)", spin);
    else snprintf(buf, n, "the OpenMP runtime's default waiting");
}

void loom_blas_select(char **argv) {
    const char *want = blas_reexec_core();
    int spin = omp_wants_spincount();
    if (!want && !spin) return;
    if (want) {
        setenv("OPENBLAS_CORETYPE", want, 1);
        setenv("LOOM_BLAS_CHOSEN", want, 1);
    }
    if (spin) { /* set now: never loops */
        setenv("GOMP_SPINCOUNT", LOOM_GOMP_SPINCOUNT, 1);
        setenv("LOOM_OMP_CHOSEN", LOOM_GOMP_SPINCOUNT, 1);
    }
    execv("/proc/self/exe", argv);
    if (want) {
        fprintf(stderr,
                "loom: warning: could not re-execute with OPENBLAS_CORETYPE=%s; sgemm stays on "
                "OpenBLAS's %s kernels\n",
                want, openblas_get_corename());
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("LOOM_BLAS_CHOSEN");
    }
}

const char *loom_blas_core(void) {
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

void loom_blas_describe(char *buf, size_t n) {
    const loom_cpu_features *f = loom_cpu_features_get();
    char flags[160], ver[64] = "OpenBLAS";
    loom_cpu_features_str(f, flags, sizeof flags);
    const char *cfg = openblas_get_config();
    /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ...": keep the name and version */
    if (cfg) {
        const char *sp = strchr(cfg, ' ');
        sp = sp ? strchr(sp + 1, ' ') : NULL;
        size_t len = sp ? (size_t)(sp - cfg) : strlen(cfg);
        if (len >= sizeof ver) len = sizeof ver - 1;
        memcpy(ver, cfg, len);
        ver[len] = '\0';
    }
    const char *user = getenv("OPENBLAS_CORETYPE"), *ours = getenv("LOOM_BLAS_CHOSEN");
    const char *want = loom_blas_wanted_coretype(f);
    const char *core = loom_blas_core();
    if (ours && user && !strcmp(ours, user))
        snprintf(buf, n, "%s sgemm kernels %s (chosen by loom from the CPU flags: %s)", ver, core, flags);
    else if (user && *user && want && !core_good_enough(core, want))
        /* some hosts set it for every process (Haswell on an AVX-512 Zen 5 halved the sgemm rate) */
        snprintf(buf, n,
                 "%s sgemm kernels %s (OPENBLAS_CORETYPE=%s set by the user, narrower than the %s "
                 "kernels the flags allow: unset it to let loom choose; flags: %s)",
                 ver, core, user, want, flags);
    else if (user && *user)
        snprintf(buf, n, "%s sgemm kernels %s (OPENBLAS_CORETYPE=%s set by the user; flags: %s)", ver, core,
                 user, flags);
    else
        snprintf(buf, n, "%s sgemm kernels %s (OpenBLAS's own choice, %s for the CPU flags: %s)", ver, core,
                 want && core_good_enough(core, want) ? "as wide as needed" : "kept", flags);
    if (kern_dnnl_f32_ready()) { /* the products gemm.c sends to oneDNN instead */
        size_t used = strlen(buf);
        char dnnl[200];
        kern_dnnl_f32_describe(dnnl, sizeof dnnl);
        if (used + 2 < n) snprintf(buf + used, n - used, "; %s", dnnl);
    }
}

const char *loom_cpu_name(void) {
    static char name[49];
    if (name[0]) return name;
    unsigned r[12];
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) < 0x80000004u) return strcpy(name, "unknown");
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    char raw[49];
    memcpy(raw, r, 48);
    raw[48] = '\0';
    const char *p = raw;
    while (*p == ' ') p++;
    snprintf(name, sizeof name, "%s", *p ? p : "unknown");
    for (size_t n = strlen(name); n > 0 && name[n - 1] == ' '; n--) name[n - 1] = '\0';
    return name;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 8 dependent adds per iteration: 8 cycles, whatever the loop costs beside.
 * Many short trials (about 1 ms each): on a shared machine the best one
 * ran without being descheduled. */
#define CLOCK_ITERS 500000L
#define CLOCK_TRIALS 40

double loom_cpu_clock_hz(void) {
    double best = 1e30;
    for (int trial = 0; trial < CLOCK_TRIALS; trial++) {
        unsigned long x = 0;
        double t0 = cpu_now();
        for (long i = 0; i < CLOCK_ITERS; i++)
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                             : "+r"(x));
        double dt = cpu_now() - t0;
        if (dt < best) best = dt;
    }
    return 8.0 * (double)CLOCK_ITERS / best;
}

double loom_cpu_flop_per_cycle(const loom_cpu_features *f) {
    int lanes = has_avx512(f) ? 16 : (f->os_avx && f->avx2 && f->fma) ? 8 : 4;
    return 2.0 * lanes * 2.0;
}

/* fma_loop512 / fma_loop256: twelve independent FMA chains (more than pipes x
 * latency on any x86 core), `iters` rounds; return the seconds. The
 * accumulators start different so the compiler cannot fold the chains into
 * one. */
#define FMA_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define FMA_DECL(i) VEC c##i = SET1((float)(i));
#define FMA_STEP(i) c##i = FMADD(a, b, c##i);
#define FMA_SUM(i) s = ADD(s, c##i);
#define FMA_LOOP(name, isa)                                                                                  \
    __attribute__((target(isa))) static double name(long iters) {                                            \
        FMA_CHAINS(FMA_DECL)                                                                                 \
        VEC a = SET1(1e-9f), b = SET1(1.0f), s = SET1(0.0f);                                                 \
        double t0 = cpu_now();                                                                               \
        for (long i = 0; i < iters; i++) {                                                                   \
            FMA_CHAINS(FMA_STEP)                                                                             \
            __asm__ volatile("" : "+v"(a));                                                                  \
        }                                                                                                    \
        double dt = cpu_now() - t0;                                                                          \
        FMA_CHAINS(FMA_SUM)                                                                                  \
        __asm__ volatile("" : : "v"(s));                                                                     \
        return dt;                                                                                           \
    }
#define VEC __m512
#define SET1 _mm512_set1_ps
#define FMADD _mm512_fmadd_ps
#define ADD _mm512_add_ps
FMA_LOOP(fma_loop512, "avx512f")
#undef VEC
#undef SET1
#undef FMADD
#undef ADD
#define VEC __m256
#define SET1 _mm256_set1_ps
#define FMADD _mm256_fmadd_ps
#define ADD _mm256_add_ps
FMA_LOOP(fma_loop256, "avx2,fma")
#undef VEC
#undef SET1
#undef FMADD
#undef ADD

double loom_cpu_flop_per_cycle_measured(const loom_cpu_features *f, double clock_hz) {
    double bound = loom_cpu_flop_per_cycle(f);
    int wide = has_avx512(f), avx2 = f->os_avx && f->avx2 && f->fma;
    if ((!wide && !avx2) || clock_hz <= 0) return bound;
    const long iters = 200000; /* ~1 ms a trial */
    double best = 1e30;
    for (int trial = 0; trial < 20; trial++) {
        double dt = wide ? fma_loop512(iters) : fma_loop256(iters);
        if (dt < best) best = dt;
    }
    double flop = 12.0 * 2.0 * (wide ? 16 : 8) * (double)iters;
    double per_cycle = flop / best / clock_hz;
    double p2 = 1; /* the nearest power of two: pipes x lanes x 2 */
    while (p2 * 1.5 < per_cycle) p2 *= 2;
    return p2 < bound ? p2 : bound;
}
