/* cpu.h - what the CPU can do (from CPUID and the OS's saved register state,
 * never from the model name) and the GEMM kernel loom picks from that.
 *
 * GEMMs go to OpenBLAS. Debian's OpenBLAS (DYNAMIC_ARCH) chooses its kernels
 * from the CPU model it recognises, and falls back to older ones on CPUs
 * newer than itself (on an AMD Zen 5 with AVX-512, 0.3.21 takes its AVX2
 * kernels at half the AVX-512 rate). loom decides from the feature flags
 * instead: AVX-512 F/BW/VL/DQ with the OS saving zmm state -> "SkylakeX"
 * (OpenBLAS's own "Cooperlake" or "SapphireRapids" are kept: the same sgemm
 * kernels), AVX2 + FMA -> "Haswell" ("Zen" kept); anything older keeps
 * OpenBLAS's own choice. OpenBLAS reads OPENBLAS_CORETYPE once, in its library constructor,
 * so the choice is applied by re-executing the program with the variable set
 * (loom_blas_select, first thing in main). A user's own OPENBLAS_CORETYPE is
 * always respected.
 *
 * At the end, the CPU kernels' own helpers that do no tensor work and are
 * not dispatched (kernels.h): GEMM calibration, attention tile counts, the
 * KV-cache attention's scratch size. Local; nothing here is collective.
 */
#ifndef LOOM_CPU_H
#define LOOM_CPU_H

#include <stddef.h>

#include "loom/kernel_types.h" /* loom_att_view */

typedef struct loom_cpu_features {
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, amx_tile, amx_bf16;
    int os_avx, os_avx512, os_amx; /* the OS saves ymm / zmm+opmask / tile state (XCR0) */
} loom_cpu_features;

/* CPUID leaves 1 and 7 and XCR0, read once. */
const loom_cpu_features *loom_cpu_features_get(void);
/* Space-separated names of the vector features found, e.g. "avx2 fma avx512f ...". */
void loom_cpu_features_str(const loom_cpu_features *f, char *buf, size_t n);

/* The OpenBLAS core type these features call for, or NULL to keep
 * OpenBLAS's own choice (no AVX2+FMA). */
const char *loom_blas_wanted_coretype(const loom_cpu_features *f);

/* Call first in main, before anything else runs: when neither the user nor an
 * earlier pass set OPENBLAS_CORETYPE and the kernels OpenBLAS picked are not
 * the ones the flags call for, re-execute /proc/self/exe with
 * OPENBLAS_CORETYPE set (and LOOM_BLAS_CHOSEN recording that loom set it).
 * Returns only when no re-exec happened (or it failed, with a warning on
 * stderr). LOOM_BLAS_AUTO=0 turns the choice off. */
void loom_blas_select(char **argv);

/* One line on the GEMM kernel in use: library, core type, why (flags, the
 * user's OPENBLAS_CORETYPE, or OpenBLAS's own), e.g.
 * "OpenBLAS 0.3.21 core SkylakeX (chosen by loom: avx512f avx512bw ...)". */
void loom_blas_describe(char *buf, size_t n);
/* One line on the GEMM that --precision bf16 uses: oneMKL's
 * cblas_gemm_bf16bf16f32 on CPUs with AVX512-BF16 or AMX-BF16 (dlopen'ed
 * libmkl_rt), else the fp32 kernels on bf16-rounded operands, and why.
 * LOOM_BF16_GEMM=mkl|off|auto overrides the choice. */
void loom_bf16_gemm_describe(char *buf, size_t n);
/* How OpenMP's waiting threads wait, and who chose it: loom_blas_select
 * also re-executes with GOMP_SPINCOUNT=20000 (bounded spinning; libgomp's
 * default spins ~1 ms and starves loom's own threads on a shared machine)
 * unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY, or LOOM_OMP_AUTO=0. */
void loom_omp_describe(char *buf, size_t n);
/* The core type OpenBLAS runs ("Haswell", "SkylakeX", ...). */
const char *loom_blas_core(void);

/* The CPU's brand string (CPUID 0x80000002..4), trimmed; "unknown" if absent. */
const char *loom_cpu_name(void);
/* Core clock in Hz measured now: best of several timed chains of dependent
 * integer adds (one cycle each), so turbo and a hypervisor's clock count. */
double loom_cpu_clock_hz(void);
/* FLOP per cycle per core from the flags: 2 FMA pipes x vector lanes (16
 * with AVX-512, 8 with AVX2+FMA, 4 otherwise) x 2 FLOP per FMA. An upper
 * bound for one core; CPUs with one 512-bit FMA pipe reach half of it. */
double loom_cpu_flop_per_cycle(const loom_cpu_features *f);
/* FLOP per cycle per core measured: the best of 20 short runs of twelve
 * independent chains of the widest FMA the flags allow, over clock_hz,
 * rounded to the nearest power of two and capped by the flags' bound. A CPU
 * that splits 512-bit FMAs into two 256-bit halves (AMD Zen 4) reads 32,
 * not the flags' 64. */
double loom_cpu_flop_per_cycle_measured(const loom_cpu_features *f, double clock_hz);

/* ---- the CPU kernels' own helpers (src/kernels/cpu; not dispatched) ------ */

/* Measured single-precision GEMM throughput in FLOP/s on `threads` CPU
 * threads: after a warm-up, the best of `trials` sgemms of 1024^3, 2048^3
 * and 2048 x 2304 x 768, each shape tried while the one before took under
 * 0.1 s (512^3 alone on a CPU too slow for 1024^3 in 0.25 s), threaded as
 * the model's matmuls are. 0 without memory. */
double loom_kernels_calibrate_sgemm(int threads, int trials);
/* The bf16 GEMM provider's throughput the same way (the same shapes,
 * operands already bf16, best of `trials` each); 0 when there is no provider. */
double loom_kernels_calibrate_bf16(int threads, int trials);
/* 1 when bf16 products run on a bf16 GEMM provider (oneDNN or oneMKL), 0
 * when they run as rounded floats on the fp32 kernels; decides it now. */
int loom_kernels_bf16_provider(void);
/* The tiles loom_attention_part_fwd / _bwd compute for view v. */
long loom_attention_tiles(const loom_att_view *v);
/* The scratch floats loom_attention_kv_fwd needs on a CPU device of
 * `threads` threads (its loom_device.threads) for n new rows against a
 * cache of len rows: one (n, len) block per thread. */
size_t loom_attention_kv_scratch_floats(int threads, int n, int len);

#endif
