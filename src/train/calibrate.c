/* calibrate.c - the machine's peaks for MFU (loom/calibrate.h): the chosen
 * kernel's best sgemm and the FMA peak, per thread count, cached per CPU +
 * flags + kernel. loom_peak_flops is the trainer's collective entry: rank 0
 * gets the record and everyone gets the numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/calibrate.h"
#include "loom/cpu.h"
#include "loom/device.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "train/internal.h"

/* GEMM trials per shape and calibration (kern_cal_shapes, best kept) */
#define CAL_TRIALS 7

static unsigned long long cal_fnv(const char *s, unsigned long long h) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x00000100000001b3ull;
    }
    return h;
}

/* The record's identity: CPU, flags, kernel, threads, precision. */
static void cal_identity(loom_peak *p, int threads, int bf16) {
    memset(p, 0, sizeof *p);
    p->threads = threads;
    p->bf16 = bf16;
    snprintf(p->cpu, sizeof p->cpu, "%s", loom_cpu_name());
    loom_cpu_features_str(loom_cpu_features_get(), p->flags, sizeof p->flags);
    char desc[512];
    if (bf16) {
        /* "oneDNN 2.6.3 matmul (brg:avx512_core_bf16), AVX512-BF16": whole */
        loom_bf16_gemm_describe(desc, sizeof desc);
    } else {
        loom_blas_describe(desc, sizeof desc);
        /* "OpenBLAS 0.3.21 sgemm kernels Zen (...)": up to the reason, and
         * where oneDNN takes some products ("...; oneDNN 2.6.3 matmul
         * (brg:avx512_core) for forward ..."), " + " its name and kernel */
        char *semi = strstr(desc, "; "), dnnl[160] = "";
        if (semi) {
            snprintf(dnnl, sizeof dnnl, " + %s", semi + 2);
            char *what = strstr(dnnl, " for ");
            if (what) *what = '\0';
            *semi = '\0';
        }
        char *paren = strstr(desc, " (");
        if (paren) *paren = '\0';
        strncat(desc, dnnl, sizeof desc - strlen(desc) - 1);
    }
    desc[sizeof p->kernel - 1] = '\0';
    memcpy(p->kernel, desc, sizeof p->kernel);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    unsigned long long h = cal_fnv(p->cpu, 0xcbf29ce484222325ull);
    h = cal_fnv(p->flags, h);
    h = cal_fnv(p->kernel, h);
    /* the method: records of the 1024^3-only calibration are measured again */
    h = cal_fnv("gemm 1024^3+2048^3+2048x2304x768", h);
    const char *prec = bf16 ? "-bf16" : "";
    if (xdg && *xdg)
        snprintf(p->path, sizeof p->path, "%s/loom/peak-%016llx-t%d%s.txt", xdg, h, threads, prec);
    else
        snprintf(p->path, sizeof p->path, "%s/.cache/loom/peak-%016llx-t%d%s.txt", home ? home : "/tmp", h,
                 threads, prec);
}

/* A "key: value" line's value (to the end of the line) into out. */
static int cal_field(const char *text, const char *key, char *out, size_t n) {
    size_t kl = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, key, kl) && p[kl] == ':' && p[kl + 1] == ' ') {
            const char *v = p + kl + 2, *e = strchr(v, '\n');
            size_t len = e ? (size_t)(e - v) : strlen(v);
            if (len >= n) len = n - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            return 1;
        }
    return 0;
}

/* The cached record, if it names this CPU, flags, kernel and thread count. */
static int cal_read(loom_peak *p) {
    FILE *f = fopen(p->path, "r");
    if (!f) return 0;
    char text[2048], v[256];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (!cal_field(text, "cpu", v, sizeof v) || strcmp(v, p->cpu)) return 0;
    if (!cal_field(text, "flags", v, sizeof v) || strcmp(v, p->flags)) return 0;
    if (!cal_field(text, "kernel", v, sizeof v) || strcmp(v, p->kernel)) return 0;
    if (!cal_field(text, "threads", v, sizeof v) || atoi(v) != p->threads) return 0;
    if (!cal_field(text, "sgemm_flops", v, sizeof v) || (p->sgemm_flops = atof(v)) <= 0) return 0;
    if (!cal_field(text, "fma_flops", v, sizeof v) || (p->fma_flops = atof(v)) <= 0) return 0;
    if (cal_field(text, "clock_hz", v, sizeof v)) p->clock_hz = atof(v);
    if (!cal_field(text, "flop_per_cycle", v, sizeof v) || (p->flop_per_cycle = atof(v)) <= 0)
        return 0; /* a record from before the FMA rate was measured */
    if (cal_field(text, "trials", v, sizeof v)) p->trials = atoi(v);
    p->from_cache = 1;
    return 1;
}

static void cal_write(const loom_peak *p) {
    char path[sizeof p->path];
    snprintf(path, sizeof path, "%s", p->path);
    for (char *q = path + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(path, 0755);
            *q = '/';
        }
    FILE *f = fopen(path, "w"); /* best effort: a cache we cannot write only costs a re-measure */
    if (!f) return;
    fprintf(f,
            "cpu: %s\nflags: %s\nkernel: %s\nthreads: %d\nsgemm_flops: %.6g\nfma_flops: %.6g\n"
            "clock_hz: %.6g\nflop_per_cycle: %.6g\ntrials: %d\n",
            p->cpu, p->flags, p->kernel, p->threads, p->sgemm_flops, p->fma_flops, p->clock_hz,
            p->flop_per_cycle, p->trials);
    fclose(f);
}

/* FLOP per cycle per core of the units the record's GEMMs run on: the
 * measured fp32 FMA rate; with bf16 products on AVX512-BF16 twice that
 * (VDPBF16PS: two products per fp32 lane), on AMX-BF16 1024 (a 16 x 16 tile
 * of 32-long bf16 dot products every 16 cycles). */
static double cal_flop_per_cycle(int bf16, double clock_hz) {
    const loom_cpu_features *f = loom_cpu_features_get();
    double fp32 = loom_cpu_flop_per_cycle_measured(f, clock_hz);
    if (!bf16 || !loom_kernels_bf16_provider()) return fp32;
    if (f->amx_bf16 && f->os_amx) return 1024.0;
    return f->avx512_bf16 && f->os_avx512 ? 2.0 * fp32 : fp32;
}

loom_status loom_peak_get(int threads, int force, int bf16, loom_peak *out) {
    if (threads < 1) return loom_fail(LOOM_EUSAGE, "calibrate: %d threads: must be >= 1", threads);
    cal_identity(out, threads, bf16);
    if (!force && cal_read(out)) return LOOM_OK;
    /* bf16 without a provider runs on the fp32 kernels: their rate */
    out->sgemm_flops = bf16 && loom_kernels_bf16_provider()
                           ? loom_kernels_calibrate_bf16(threads, CAL_TRIALS)
                           : loom_kernels_calibrate_sgemm(threads, CAL_TRIALS);
    out->trials = CAL_TRIALS;
    if (out->sgemm_flops <= 0) return loom_fail(LOOM_EOS, "calibrate: out of memory for the GEMM buffers");
    out->clock_hz = loom_cpu_clock_hz();
    out->flop_per_cycle = cal_flop_per_cycle(bf16, out->clock_hz);
    out->fma_flops = out->flop_per_cycle * out->clock_hz * threads;
    out->from_cache = 0;
    cal_write(out);
    return LOOM_OK;
}

loom_status loom_peak_flops(loom_comm *world, const loom_device *dev, double given, double *out,
                            double *fma) {
    double v[2] = {given, 0};
    if (given <= 0 && loom_comm_rank(world) == 0) {
        loom_peak p;
        int bf16 = dev->bf16;
        loom_status st = loom_peak_get(dev->threads, 0, bf16, &p);
        if (st == LOOM_OK) {
            v[0] = p.sgemm_flops;
            v[1] = p.fma_flops;
            loom_info("peak per rank: %s %.1f GFLOP/s (best of %d, %s), FMA %.1f GFLOP/s (%.0f flop/cycle x "
                      "%.2f GHz x %d thread(s)); %s",
                      bf16 ? "bf16 gemm" : "sgemm", p.sgemm_flops / 1e9, p.trials,
                      p.from_cache ? "cached" : "measured now", p.fma_flops / 1e9, p.flop_per_cycle,
                      p.clock_hz / 1e9, p.threads, p.path);
        } else {
            loom_warn("%s; MFU against 1 GFLOP/s", loom_errmsg());
            loom_clear_error();
        }
    }
    LOOM_TRY(loom_comm_bcast(world, v, sizeof v, 0));
    *out = v[0] > 0 ? v[0] : 1e9;
    *fma = v[1] > *out ? v[1] : *out; /* the FMA peak bounds every measured rate */
    return LOOM_OK;
}

double loom_mfu(double *peak, double achieved, int *raised) {
    if (achieved > *peak) {
        /* a step ran faster than the calibration: the calibration was taken
         * under worse conditions; the step's own rate is the better peak */
        *peak = achieved;
        if (raised) *raised = 1;
    }
    return *peak > 0 ? achieved / *peak : 0;
}
