/* gemm_mkl.c - the bf16 GEMM providers and the choice between them.
 *
 * Chosen at the first bf16 GEMM, from the CPU flags (cpu.h). With
 * AVX512-BF16 or AMX-BF16 (and the OS saving their registers):
 *   1. oneDNN's matmul (gemm_dnnl.c), which picks its bf16 kernels from the
 *      flags on any vendor's CPU;
 *   2. else oneMKL's cblas_gemm_bf16bf16f32, loaded here with dlopen. oneMKL
 *      runs its bf16 kernels on Intel CPUs only: on an AMD Zen 4 it converts
 *      the operands to fp32 and runs its fp32 kernels, slower than OpenBLAS
 *      (docs/performance.md).
 * Anywhere else, or when neither loads, bf16 products run as bf16-rounded
 * operands on the fp32 kernels (bf16.c): the same numerics, no speed-up.
 * LOOM_BF16_GEMM=dnnl or =mkl forces that provider on any CPU (mkl then
 * emulates: that is how kernels_bf16_mkl checks its numerics on a CPU without
 * bf16 units), =off turns both off, =auto (default) decides from the flags.
 *
 * oneMKL's library: $LOOM_MKL_LIB if set, else libmkl_rt.so.3 / .so.2 on the
 * loader's path or in /usr/local/lib (where `pip install mkl` puts it;
 * scripts/setup.sh installs it). oneMKL runs sequentially inside each of
 * loom's OpenMP threads (MKL_Set_Threading_Layer(SEQUENTIAL) before any other
 * call), as OpenBLAS does.
 */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_internal.h"
#include "loom/cpu.h"

typedef void (*mkl_gemm_bf16_fn)(int layout, int ta, int tb, int m, int n, int k, float alpha,
                                 const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c,
                                 int ldc);

static struct {
    int decided;
    int kind; /* KERN_BF16_NONE, _SLICES (oneMKL) or _WHOLE (oneDNN) */
    mkl_gemm_bf16_fn gemm;
    char why[320]; /* the describe line */
} mkl;

static void *mkl_open(char *path, size_t n) {
    const char *env = getenv("LOOM_MKL_LIB");
    const char *cands[] = {env, "libmkl_rt.so.3", "/usr/local/lib/libmkl_rt.so.3", "libmkl_rt.so.2",
                           "/usr/local/lib/libmkl_rt.so.2"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        if (!cands[i] || !*cands[i]) continue;
        void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(path, n, "%s", cands[i]);
            return h;
        }
        if (i == 0) return NULL; /* the user's choice fails: no silent substitute */
    }
    return NULL;
}

/* oneMKL's bf16 GEMM, or 0 with the reason in why. */
static int mkl_load(const char *how, char *why, size_t wn) {
    char path[256] = "";
    void *h = mkl_open(path, sizeof path);
    mkl_gemm_bf16_fn g = h ? (mkl_gemm_bf16_fn)dlsym(h, "cblas_gemm_bf16bf16f32") : NULL;
    int (*layer)(int) = h ? (int (*)(int))dlsym(h, "MKL_Set_Threading_Layer") : NULL;
    void (*ver)(char *, int) = h ? (void (*)(char *, int))dlsym(h, "mkl_get_version_string") : NULL;
    if (!g || !layer) {
        snprintf(why, wn, "oneMKL (libmkl_rt) %s (scripts/setup.sh installs it)",
                 h ? "lacks cblas_gemm_bf16bf16f32" : "not found");
        return 0;
    }
    layer(1); /* MKL_THREADING_SEQUENTIAL: loom's threads split the GEMM */
    char v[128] = "oneMKL";
    if (ver) {
        char full[256] = "";
        ver(full, sizeof full);
        /* "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product ..." -> "oneMKL 2026.2" */
        const char *p = strstr(full, "Version ");
        if (p) {
            int len = 0;
            p += 8;
            while (p[len] && p[len] != '-' && p[len] != ' ') len++;
            snprintf(v, sizeof v, "oneMKL %.*s", len, p);
        }
    }
    mkl.gemm = g;
    int n = snprintf(why, wn, "%s cblas_gemm_bf16bf16f32 (%s; %s)", v, how, path);
    if (n >= (int)wn) /* a long library path: keep the start, mark the cut */
        memcpy(why + wn - 4, "...", 4);
    return 1;
}

static void mkl_decide(void) {
    mkl.decided = 1;
    const loom_cpu_features *f = loom_cpu_features_get();
    int avx512bf16 = f->avx512_bf16 && f->os_avx512, amx = f->amx_bf16 && f->os_amx;
    const char *mode = getenv("LOOM_BF16_GEMM");
    const char *units = amx ? "AMX-BF16" : "AVX512-BF16";
    const char *fallback = "bf16-rounded operands on the fp32 kernels";
    if (mode && !strcmp(mode, "off")) {
        snprintf(mkl.why, sizeof mkl.why, "none (LOOM_BF16_GEMM=off): %s", fallback);
        return;
    }
    int want_dnnl = mode && !strcmp(mode, "dnnl"), want_mkl = mode && !strcmp(mode, "mkl");
    if (!want_dnnl && !want_mkl && !avx512bf16 && !amx) {
        snprintf(mkl.why, sizeof mkl.why, "none on this CPU (no AVX512-BF16 or AMX-BF16): %s", fallback);
        return;
    }
    char dwhy[160] = "", mwhy[200] = "";
    if (!want_mkl) {
        if (kern_dnnl_open(dwhy, sizeof dwhy)) {
            mkl.kind = KERN_BF16_WHOLE;
            snprintf(mkl.why, sizeof mkl.why, "%s, %s", dwhy,
                     want_dnnl ? "forced by LOOM_BF16_GEMM=dnnl" : units);
            return;
        }
        if (want_dnnl) {
            snprintf(mkl.why, sizeof mkl.why, "none: %s (LOOM_BF16_GEMM=dnnl); %s", dwhy, fallback);
            return;
        }
    }
    if (mkl_load(want_mkl && !avx512bf16 && !amx ? "forced by LOOM_BF16_GEMM=mkl, emulated on this CPU"
                                                 : units,
                 mwhy, sizeof mwhy)) {
        mkl.kind = KERN_BF16_SLICES;
        snprintf(mkl.why, sizeof mkl.why, "%s", mwhy);
        return;
    }
    int n = want_mkl ? snprintf(mkl.why, sizeof mkl.why, "none: %s; %s", mwhy, fallback)
                     : snprintf(mkl.why, sizeof mkl.why, "none: %s; %s; %s", dwhy, mwhy, fallback);
    if (n >= (int)sizeof mkl.why) memcpy(mkl.why + sizeof mkl.why - 4, "...", 4);
}

int kern_bf16_gemm_ready(void) {
    if (!mkl.decided) mkl_decide();
    return mkl.kind;
}

int loom_kernels_bf16_provider(void) { return kern_bf16_gemm_ready() != KERN_BF16_NONE; }

void kern_bf16_gemm_call(int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                         const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    mkl.gemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void loom_bf16_gemm_describe(char *buf, size_t n) {
    if (!mkl.decided) mkl_decide();
    char wg[96];
    kern_bf16_head_describe(wg, sizeof wg);
    if (mkl.kind != KERN_BF16_NONE && wg[0]) snprintf(buf, n, "%s; %s", mkl.why, wg);
    else snprintf(buf, n, "%s", mkl.why);
}
