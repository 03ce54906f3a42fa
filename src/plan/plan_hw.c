/* plan_hw.c - the hardware terms of the planner's cost model, each from a
 * measurement the cluster file cites (docs/planning.md): attention kernels'
 * throughput by kernel, head size and sequence length, forward and backward
 * apart; GEMMs by size (the curve), bounded by the bytes they move, in bf16
 * or FP8; and collectives over the links their group crosses (NVLink inside
 * a node, the NICs of the group's ranks between nodes). Also the cluster
 * keys these read. Pure: nothing here is collective. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/internal.h"

const char *const loom_plan_attn_names[LOOM_PLAN_ATTN_COUNT] = {
    "default", "materialized", "flash", "flash2", "flash3", "triton", "cudnn", "xformers"};

static double num(const cJSON *o, const char *key, double def) {
    const cJSON *it = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(it) ? it->valuedouble : def;
}

/* ---- cluster keys ------------------------------------------------------- */

static const int HEAD_SIZES[3] = {64, 128, 256};

/* n numbers of a JSON array into out (n = the table's sequence count). */
static int read_row(const cJSON *arr, int n, double *out) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n) return 0;
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(arr, i);
        if (!cJSON_IsNumber(x) || !(x->valuedouble > 0)) return 0;
        out[i] = x->valuedouble * 1e12;
    }
    return 1;
}

/* One kernel's head sizes: "fwd" and/or "fwd_bwd" rows. Both: the backward
 * from them (fwd + bwd speed = 3.5 F / (F / fwd + 2.5 F / bwd)); fwd_bwd
 * only: forward and backward at that speed; fwd only: left for
 * finish_tables (the backward by FlashAttention-2's ratio on this GPU). */
static loom_status read_kernel(const char *path, const char *kname, const cJSON *k, loom_plan_attn_table *t,
                               int *fwd_only) {
    for (int h = 0; h < 3; h++) {
        char key[8];
        snprintf(key, sizeof key, "%d", HEAD_SIZES[h]);
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(k, key);
        if (!hd) continue;
        double fb[LOOM_PLAN_ATTN_SEQS];
        const int has_f = read_row(cJSON_GetObjectItemCaseSensitive(hd, "fwd"), t->n_seq, t->fwd[h]);
        const int has_fb = read_row(cJSON_GetObjectItemCaseSensitive(hd, "fwd_bwd"), t->n_seq, fb);
        if (!has_f && !has_fb)
            return loom_fail(LOOM_ECONFIG,
                             "cluster %s: attention_tflops.kernels.%s.%s needs \"fwd\" or \"fwd_bwd\": %d "
                             "positive numbers (one per seq)",
                             path, kname, key, t->n_seq);
        t->have[h] = 1;
        for (int i = 0; i < t->n_seq; i++) {
            if (has_f && has_fb) {
                const double rest = 3.5 / fb[i] - 1 / t->fwd[h][i];
                t->bwd[h][i] = rest > 0 ? 2.5 / rest : fb[i];
            } else if (has_fb) {
                t->fwd[h][i] = t->bwd[h][i] = fb[i];
            }
        }
        if (has_f && !has_fb) fwd_only[h] = 1;
    }
    return LOOM_OK;
}

/* Kernels measured forward only: the backward at the forward's speed times
 * FlashAttention-2's backward/forward ratio on the same GPU, head size and
 * length (a stated assumption: the FlashAttention-3 paper reports the
 * forward of FA3, cuDNN and Triton; their backward relative to FA2's is not
 * in the figures read); the forward alone when FA2 has no split. */
static void finish_tables(loom_plan_cluster *c, int fwd_only[][3]) {
    const loom_plan_attn_table *ref = &c->attn[LOOM_PLAN_ATTN_FLASH2];
    for (int k = 0; k < LOOM_PLAN_ATTN_COUNT; k++)
        for (int h = 0; h < 3; h++) {
            if (!fwd_only[k][h]) continue;
            loom_plan_attn_table *t = &c->attn[k];
            int rh = ref->have[h] && !fwd_only[LOOM_PLAN_ATTN_FLASH2][h] ? h : -1;
            for (int o = 0; o < 3 && rh < 0; o++)
                if (ref->have[o] && !fwd_only[LOOM_PLAN_ATTN_FLASH2][o]) rh = o;
            for (int i = 0; i < t->n_seq; i++)
                t->bwd[h][i] = rh >= 0 && ref->n_seq == t->n_seq
                                   ? t->fwd[h][i] * ref->bwd[rh][i] / ref->fwd[rh][i]
                                   : t->fwd[h][i];
        }
}

/* "attention_tflops": {"seq": [...], "kernels": {"flash2": {"128": {"fwd":
 * [...], "fwd_bwd": [...]}, ...}, ...}} (TFLOP/s), scaled by clock_scale. */
static loom_status parse_attention(const char *path, const cJSON *root, loom_plan_cluster *c) {
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(root, "attention_tflops");
    if (!at) return LOOM_OK;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(at, "seq");
    const int n = cJSON_GetArraySize(seq);
    if (!cJSON_IsArray(seq) || n < 1 || n > LOOM_PLAN_ATTN_SEQS)
        return loom_fail(LOOM_ECONFIG, "cluster %s: attention_tflops.seq must list 1..%d lengths", path,
                         LOOM_PLAN_ATTN_SEQS);
    int fwd_only[LOOM_PLAN_ATTN_COUNT][3];
    memset(fwd_only, 0, sizeof fwd_only);
    const cJSON *ks = cJSON_GetObjectItemCaseSensitive(at, "kernels"), *k;
    cJSON_ArrayForEach(k, ks) {
        int id = -1;
        for (int i = LOOM_PLAN_ATTN_FLASH; i < LOOM_PLAN_ATTN_COUNT; i++)
            if (strcmp(k->string, loom_plan_attn_names[i]) == 0) id = i;
        if (id < 0)
            return loom_fail(LOOM_ECONFIG, "cluster %s: attention_tflops: unknown kernel '%s'", path,
                             k->string);
        loom_plan_attn_table *t = &c->attn[id];
        t->n_seq = n;
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(seq, i);
            t->seq[i] = cJSON_IsNumber(x) ? x->valuedouble : 0;
            if (!(t->seq[i] > 0) || (i && t->seq[i] <= t->seq[i - 1]))
                return loom_fail(LOOM_ECONFIG, "cluster %s: attention_tflops.seq must be increasing lengths",
                                 path);
        }
        LOOM_TRY(read_kernel(path, k->string, k, t, fwd_only[id]));
    }
    finish_tables(c, fwd_only);
    const double cs = c->clock_scale;
    for (int id = 0; id < LOOM_PLAN_ATTN_COUNT; id++)
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < c->attn[id].n_seq; i++)
                c->attn[id].fwd[h][i] *= cs, c->attn[id].bwd[h][i] *= cs;
    return LOOM_OK;
}

loom_status plan_parse_hw(const char *path, const cJSON *root, loom_plan_cluster *c) {
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(root, "peak_tflops");
    c->peak_fp8 = num(peak, "fp8", 0) * 1e12;
    c->fp8_top = num(root, "gemm_fp8_top", 0);
    c->clock_scale = num(root, "clock_scale", 1);
    const cJSON *inter = cJSON_GetObjectItemCaseSensitive(root, "inter_node");
    c->nics = (int)num(inter, "nics_per_node", 0);
    c->nic_bw = num(inter, "nic_gbps", 0) * 1e9;
    const cJSON *rail = inter ? cJSON_GetObjectItemCaseSensitive(inter, "rail_optimized") : NULL;
    c->rail = rail ? cJSON_IsTrue(rail) : 1;
    c->oversub = num(inter, "oversubscription", 1);
    if (c->nics < 0 || (c->nics > 0 && !(c->nic_bw > 0)) || !(c->clock_scale > 0) || c->fp8_top < 0 ||
        c->oversub < 1 || c->fp8_top > 1 || c->peak_fp8 < 0)
        return loom_fail(
            LOOM_ECONFIG,
            "cluster %s: inter_node.nics_per_node needs nic_gbps > 0, oversubscription >= 1; clock_scale > 0; "
            "gemm_fp8_top in [0, 1]; peak_tflops.fp8 >= 0",
            path);
    return parse_attention(path, root, c);
}

/* ---- attention ------------------------------------------------------------ */

/* Linear in log(seq) between measured lengths, clamped at the ends. */
static double along_seq(const loom_plan_attn_table *t, const double *row, double s) {
    const int n = t->n_seq;
    if (s <= t->seq[0]) return row[0];
    if (s >= t->seq[n - 1]) return row[n - 1];
    int i = 1;
    while (t->seq[i] < s) i++;
    const double w = (log(s) - log(t->seq[i - 1])) / (log(t->seq[i]) - log(t->seq[i - 1]));
    return row[i - 1] + w * (row[i] - row[i - 1]);
}

int plan_attn_speed(const loom_plan_cluster *c, loom_plan_attn k, double hd, double s, double *fwd,
                    double *bwd) {
    const loom_plan_attn_table *t = &c->attn[k];
    if (t->n_seq == 0 && k == LOOM_PLAN_ATTN_CUDNN)
        t = &c->attn[LOOM_PLAN_ATTN_FLASH2]; /* TE falls back to FA2 */
    if (t->n_seq == 0) return 0;
    /* linear in the head size between measured ones, clamped */
    int lo = -1, hi = -1;
    for (int h = 0; h < 3; h++) {
        if (!t->have[h]) continue;
        if (HEAD_SIZES[h] <= hd) lo = h;
        if (HEAD_SIZES[h] >= hd && hi < 0) hi = h;
    }
    if (lo < 0) lo = hi;
    if (hi < 0) hi = lo;
    if (lo < 0) return 0;
    const double f0 = along_seq(t, t->fwd[lo], s), f1 = along_seq(t, t->fwd[hi], s);
    const double b0 = along_seq(t, t->bwd[lo], s), b1 = along_seq(t, t->bwd[hi], s);
    const double w = hi == lo ? 0 : (hd - HEAD_SIZES[lo]) / (HEAD_SIZES[hi] - HEAD_SIZES[lo]);
    *fwd = f0 + w * (f1 - f0), *bwd = b0 + w * (b1 - b0);
    return 1;
}

/* ---- GEMMs ---------------------------------------------------------------- */

double loom_plan_gemm_eff(const loom_plan_cluster *c, double flops) {
    const int n = c->n_gemm;
    if (n == 0) return c->gemm_eff;
    if (flops <= c->gemm_flops[0]) return c->gemm_eff * c->gemm_curve[0];
    if (flops >= c->gemm_flops[n - 1]) return c->gemm_eff * c->gemm_curve[n - 1];
    int i = 1;
    while (c->gemm_flops[i] < flops) i++;
    const double x0 = log(c->gemm_flops[i - 1]), x1 = log(c->gemm_flops[i]);
    const double w = x1 > x0 ? (log(flops) - x0) / (x1 - x0) : 1;
    return c->gemm_eff * (c->gemm_curve[i - 1] + w * (c->gemm_curve[i] - c->gemm_curve[i - 1]));
}

/* Time of an M x N x K GEMM: the curve's efficiency at its FLOPs (FP8: the
 * bf16 curve at equal time, a GEMM of F FP8 FLOPs where one of F/2 bf16
 * FLOPs is, topped at gemm_fp8_top of the FP8 peak), no faster than its
 * operands and result at HBM bandwidth (roofline; 2-byte elements, FP8
 * operands 1 byte). */
double plan_gemm_time(const loom_plan_cluster *c, double M, double N, double K, int fp8, double peak) {
    const double F = 2 * M * N * K;
    if (!(F > 0)) return 0;
    double t;
    if (fp8 && c->peak_fp8 > 0) {
        const double top = c->n_gemm ? c->gemm_curve[c->n_gemm - 1] * c->gemm_eff : c->gemm_eff;
        const double e = loom_plan_gemm_eff(c, F / 2) * (c->fp8_top > 0 ? c->fp8_top / top : 1);
        t = F / (c->peak_fp8 * e);
    } else {
        t = F / (peak * loom_plan_gemm_eff(c, F));
    }
    const double bytes = (fp8 && c->peak_fp8 > 0 ? 1.0 : 2.0) * (M * K + K * N) + 2.0 * M * N;
    return c->hbm_bw > 0 ? fmax(t, bytes / c->hbm_bw) : t;
}

/* ---- collectives over the network ----------------------------------------- */

/* One device's share of its node's NICs, bytes/s. */
static double nic_share(const loom_plan_cluster *c) {
    return c->nics > 0 ? c->nics * c->nic_bw / c->gpus_per_node : c->inter_bw;
}

/* A measured point (`loom calibrate`) for this op and group, or NULL. */
static const loom_plan_coll_point *measured(const loom_plan_cluster *c, loom_coll_op op, int g, int inter) {
    const loom_plan_coll_point *best = NULL;
    for (int i = 0; i < c->n[op]; i++) {
        const loom_plan_coll_point *p = &c->pts[op][i];
        if (p->group <= g && (!best || p->group > best->group)) best = p;
    }
    return best && (best->group == g || !inter) ? best : NULL;
}

double loom_plan_coll_time_k(const loom_plan_cluster *c, loom_coll_op op, int g, int k, double bytes) {
    if (g <= 1 && op != LOOM_COLL_P2P) return 0;
    if (k < 1) k = 1;
    if (k > g) k = g;
    const int inter = k < g;
    const loom_plan_coll_point *p = measured(c, op, g, inter);
    if (p) {
        const double gf = op == LOOM_COLL_P2P ? 1 : (double)(g - 1) / g * p->group / (p->group - 1);
        return p->latency + bytes * gf / p->bandwidth;
    }
    const double bi = c->intra_bw * c->coll_eff, be = nic_share(c) * c->coll_eff;
    const double lat = inter ? c->inter_lat : c->intra_lat, frac = (double)(g - 1) / g;
    if (op == LOOM_COLL_P2P) return lat + bytes / (inter ? be : bi);
    /* a ring over the group, node by node, one ring per rank of a node so
     * that each rank's NIC carries 1/k of what crosses the node boundary:
     * each rank passes on frac x bytes, (k-1)/k of it over NVLink and 1/k
     * over its NIC (k = g: all over NVLink); all-to-all sends (g-k)/g of its
     * bytes off the node over the k ranks' NICs and (k-1)/g over NVLink.
     * Groups of one rank per node (k = 1) are the old model's exactly. */
    /* traffic that leaves its rail (every inter-node byte without a
     * rail-optimised fabric, all-to-all's cross-rail bytes with one) goes
     * over the spine: its bandwidth divided by the oversubscription */
    const double spine = !c->rail || op == LOOM_COLL_ALLTOALL ? c->oversub : 1;
    double t;
    if (!inter) t = frac * bytes / bi;
    else if (op == LOOM_COLL_ALLTOALL) t = fmax(bytes * (k - 1) / g / bi, bytes * (g - k) / g / (be / spine));
    else t = fmax(frac * bytes * (k - 1) / k / bi, frac * bytes / k / (be / spine));
    const double steps = g - 1.0;
    return op == LOOM_COLL_ALLREDUCE ? 2 * (steps * lat + t) : steps * lat + t;
}

double loom_plan_coll_time(const loom_plan_cluster *c, loom_coll_op op, int g, int inter, double bytes) {
    return loom_plan_coll_time_k(c, op, g, inter ? 1 : g, bytes);
}
