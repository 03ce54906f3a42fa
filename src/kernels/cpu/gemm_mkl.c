/* gemm_mkl.c - the bf16 GEMM provider: oneMKL's cblas_gemm_bf16bf16f32,
 * loaded with dlopen, so neither the build nor a CPU without bf16 units
 * depends on it.
 *
 * Chosen at the first bf16 GEMM, from the CPU flags (cpu.h): with
 * AVX512-BF16 or AMX-BF16 (and the OS saving their registers) oneMKL runs
 * bf16 x bf16 -> fp32 products on those units, at twice the fp32 rate or
 * more. Anywhere else oneMKL would emulate them with conversions and fp32
 * FMAs, slower than loom's fallback (bf16-rounded operands kept as floats on
 * the fp32 kernels, bf16.c), so it is not used. LOOM_BF16_GEMM=mkl forces the
 * provider on any CPU (emulated: that is how kernels_bf16_mkl checks its
 * numerics on a CPU without bf16 units), =off turns it off, =auto (default)
 * decides from the flags.
 *
 * The library: $LOOM_MKL_LIB if set, else libmkl_rt.so.3 / .so.2 on the
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
                                 const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                                 float *c, int ldc);

static struct {
    int decided;
    mkl_gemm_bf16_fn gemm;
    char why[256]; /* the describe line */
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

static void mkl_decide(void) {
    mkl.decided = 1;
    const loom_cpu_features *f = loom_cpu_features_get();
    int avx512bf16 = f->avx512_bf16 && f->os_avx512, amx = f->amx_bf16 && f->os_amx;
    const char *mode = getenv("LOOM_BF16_GEMM");
    int force = mode && !strcmp(mode, "mkl");
    if (mode && !strcmp(mode, "off")) {
        snprintf(mkl.why, sizeof mkl.why, "none (LOOM_BF16_GEMM=off): bf16-rounded operands on the fp32 kernels");
        return;
    }
    if (!force && !avx512bf16 && !amx) {
        snprintf(mkl.why, sizeof mkl.why,
                 "none on this CPU (no AVX512-BF16 or AMX-BF16): bf16-rounded operands on the fp32 kernels");
        return;
    }
    char path[256] = "";
    void *h = mkl_open(path, sizeof path);
    mkl_gemm_bf16_fn g = h ? (mkl_gemm_bf16_fn)dlsym(h, "cblas_gemm_bf16bf16f32") : NULL;
    int (*layer)(int) = h ? (int (*)(int))dlsym(h, "MKL_Set_Threading_Layer") : NULL;
    void (*ver)(char *, int) = h ? (void (*)(char *, int))dlsym(h, "mkl_get_version_string") : NULL;
    if (!g || !layer) {
        snprintf(mkl.why, sizeof mkl.why,
                 "none: oneMKL (libmkl_rt) %s (scripts/setup.sh installs it); bf16-rounded operands on the fp32 kernels",
                 h ? "lacks cblas_gemm_bf16bf16f32" : "not found");
        return;
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
    int n = snprintf(mkl.why, sizeof mkl.why, "%s cblas_gemm_bf16bf16f32 (%s; %s)", v,
                     amx ? "AMX-BF16" : avx512bf16 ? "AVX512-BF16" : "forced by LOOM_BF16_GEMM=mkl, emulated on this CPU",
                     path);
    if (n >= (int)sizeof mkl.why) /* a long library path: keep the start, mark the cut */
        memcpy(mkl.why + sizeof mkl.why - 4, "...", 4);
}

int kern_bf16_gemm_ready(void) {
    if (!mkl.decided) mkl_decide();
    return mkl.gemm != NULL;
}

void kern_bf16_gemm_call(int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                         const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    mkl.gemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void loom_bf16_gemm_describe(char *buf, size_t n) {
    if (!mkl.decided) mkl_decide();
    snprintf(buf, n, "%s", mkl.why);
}
