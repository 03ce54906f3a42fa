/* plan_io.c - the planner's inputs: model shapes (built-in or HF config.json
 * of GPT-2, Llama, Mixtral), cluster files (JSON) and layouts as text. */
#include "loom/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/model.h"
#include "loom/version.h"
#include "plan/internal.h"

typedef struct {
    const char *name;
    int layers, hidden, heads, kv_heads, ffn, vocab, max_seq, experts, topk, gated, tied;
} shape;

/* Shapes loom cannot train yet, from the models' published config.json. */
static const shape SHAPES[] = {
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 0, 0, 1, 0},
    {"llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 0, 0, 1, 0},
    {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 0, 0, 1, 0},
    {"llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 0, 0, 1, 0},
    {"gpt3-175b", 96, 12288, 96, 96, 49152, 51200, 2048, 0, 0, 0, 1},
    {"mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, 8, 2, 1, 0},
    {"mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536, 8, 2, 1, 0},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

static void from_loom(const loom_model_config *c, loom_plan_model *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", c->name);
    m->layers = c->n_layer;
    m->hidden = c->n_embd;
    m->heads = m->kv_heads = c->n_head;
    m->ffn = 4 * c->n_embd;
    m->vocab = c->vocab_size;
    m->max_seq = c->n_positions;
    m->tied = m->learned_pos = m->loom_trains = 1;
}

loom_status loom_plan_model_builtin(const char *name, loom_plan_model *m) {
    for (size_t i = 0; i < N_SHAPES; i++) {
        const shape *s = &SHAPES[i];
        if (strcmp(s->name, name) != 0) continue;
        memset(m, 0, sizeof *m);
        snprintf(m->name, sizeof m->name, "%s", s->name);
        m->layers = s->layers, m->hidden = s->hidden, m->heads = s->heads, m->kv_heads = s->kv_heads;
        m->ffn = s->ffn, m->vocab = s->vocab, m->max_seq = s->max_seq;
        m->experts = s->experts, m->topk = s->topk, m->gated = s->gated, m->tied = s->tied;
        m->learned_pos = strncmp(name, "gpt3", 4) == 0;
        return LOOM_OK;
    }
    loom_model_config c;
    if (loom_model_config_builtin(name, &c) == LOOM_OK) {
        from_loom(&c, m);
        return LOOM_OK;
    }
    char known[512] = "tiny, mini, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl";
    for (size_t i = 0; i < N_SHAPES; i++) {
        strncat(known, ", ", sizeof known - strlen(known) - 1);
        strncat(known, SHAPES[i].name, sizeof known - strlen(known) - 1);
    }
    return loom_fail(LOOM_EUSAGE, "--model %s: unknown model (built-in: %s; or a config.json path)", name,
                     known);
}

static int json_int(const cJSON *root, const char *const *keys, int *out) {
    for (int i = 0; keys[i]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!it || cJSON_IsNull(it)) continue;
        if (!cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > 1e9 ||
            it->valuedouble != floor(it->valuedouble))
            return -1 - i;
        *out = (int)it->valuedouble;
        return 1;
    }
    return 0;
}

/* The JSON object of the config file at path (LOOM_ENOINPUT, LOOM_EOS or
 * LOOM_ECONFIG naming it). */
static loom_status read_config(const char *path, cJSON **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "--model %s: cannot open the config file", path);
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return loom_fail(LOOM_EOS, "out of memory reading %s", path);
            }
            text = t;
        }
        size_t k = fread(text + n, 1, 4096, f);
        n += k;
        if (k < 4096) break;
    }
    fclose(f);
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_fail(LOOM_ECONFIG, "--model %s: not a JSON object", path);
    }
    *out = root;
    return LOOM_OK;
}

loom_status loom_plan_model_load(const char *path, loom_plan_model *m) {
    cJSON *root = NULL;
    struct stat sb;
    char file[4200] = "";
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face directory: its config.json */
        if (snprintf(file, sizeof file, "%s/config.json", path) >= (int)sizeof file)
            return loom_fail(LOOM_EUSAGE, "--model %s: path too long", path);
        LOOM_TRY(read_config(file, &root));
    } else {
        LOOM_TRY(read_config(path, &root));
    }
    memset(m, 0, sizeof *m);
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    if (file[0]) /* a directory: its path, as --model takes it */
        snprintf(m->name, sizeof m->name, "%s", path);
    static const char *k_layers[] = {"num_hidden_layers", "n_layer", NULL};
    static const char *k_hidden[] = {"hidden_size", "n_embd", NULL};
    static const char *k_heads[] = {"num_attention_heads", "n_head", NULL};
    static const char *k_kv[] = {"num_key_value_heads", NULL};
    static const char *k_ffn[] = {"intermediate_size", "n_inner", NULL};
    static const char *k_vocab[] = {"vocab_size", NULL};
    static const char *k_seq[] = {"max_position_embeddings", "n_positions", NULL};
    static const char *k_exp[] = {"num_local_experts", "num_experts", NULL};
    static const char *k_topk[] = {"num_experts_per_tok", NULL};
    struct {
        const char *const *keys;
        int *dst, required;
    } want[] = {{k_layers, &m->layers, 1}, {k_hidden, &m->hidden, 1}, {k_heads, &m->heads, 1},
                {k_kv, &m->kv_heads, 0},   {k_ffn, &m->ffn, 0},       {k_vocab, &m->vocab, 1},
                {k_seq, &m->max_seq, 0},   {k_exp, &m->experts, 0},   {k_topk, &m->topk, 0}};
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < sizeof want / sizeof want[0] && st == LOOM_OK; i++) {
        int r = json_int(root, want[i].keys, want[i].dst);
        if (r < 0)
            st = loom_fail(LOOM_ECONFIG, "--model %s: key '%s' must be a positive integer", path,
                           want[i].keys[-r - 1]);
        else if (r == 0 && want[i].required)
            st = loom_fail(LOOM_ECONFIG, "--model %s: missing key '%s' (or '%s')", path, want[i].keys[0],
                           want[i].keys[1] ? want[i].keys[1] : want[i].keys[0]);
    }
    if (st == LOOM_OK) {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
        const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
        const int gpt2 = strcmp(type, "gpt2") == 0 || cJSON_GetObjectItemCaseSensitive(root, "n_embd");
        if (!m->kv_heads) m->kv_heads = m->heads;
        if (!m->ffn) m->ffn = 4 * m->hidden;
        if (!m->max_seq) m->max_seq = 2048;
        m->gated = !gpt2;
        m->learned_pos = gpt2;
        const int llama = !strcmp(type, "llama") || !strcmp(type, "mistral") || !strcmp(type, "qwen2");
        const int moe = !strcmp(type, "mixtral") || !strcmp(type, "qwen2_moe");
        m->loom_trains = gpt2 || (llama && !m->experts) || moe; /* loom train runs these */
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
        m->tied = tie ? cJSON_IsTrue(tie) : gpt2;
        if (m->experts == 1) m->experts = 0;
        if (m->experts && !m->topk) m->topk = 2;
        if (m->hidden % m->heads || m->heads % m->kv_heads)
            st = loom_fail(LOOM_ECONFIG,
                           "--model %s: heads %d must divide hidden %d and kv heads %d divide heads", path,
                           m->heads, m->hidden, m->kv_heads);
        if (m->experts && m->topk > m->experts)
            st = loom_fail(LOOM_ECONFIG, "--model %s: num_experts_per_tok %d > experts %d", path, m->topk,
                           m->experts);
    }
    cJSON_Delete(root);
    return st;
}

loom_status loom_plan_model_resolve(const char *s, loom_plan_model *m) {
    size_t n = strlen(s);
    if (strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0)) return loom_plan_model_load(s, m);
    return loom_plan_model_builtin(s, m);
}

double loom_plan_model_params(const loom_plan_model *m, double *active) {
    const double h = m->hidden, hd = (double)m->hidden / m->heads;
    const double attn = 2 * h * h + 2 * h * hd * m->kv_heads;
    const double mlp = (m->gated ? 3.0 : 2.0) * h * m->ffn;
    const int E = m->experts > 1 ? m->experts : 1, k = m->experts > 1 ? m->topk : 1;
    const double router = m->experts > 1 ? h * E : 0;
    const double embed =
        (double)m->vocab * h * (m->tied ? 1 : 2) + (m->learned_pos ? (double)m->max_seq * h : 0);
    /* GPT-2 has biases (qkv, proj, fc, fc_proj) and a final LayerNorm */
    const double norms = 4 * h + (m->gated ? 0 : h + 2 * hd * m->kv_heads + h + m->ffn + h);
    const double final_norm = m->gated ? h : 2 * h;
    if (active) *active = m->layers * (attn + k * mlp + router + norms) + embed + final_norm;
    return m->layers * (attn + E * mlp + router + norms) + embed + final_norm;
}

/* ---- clusters -------------------------------------------------------- */

double loom_plan_default_slice(double cpus) {
    int n = cpus >= 8 ? 8 : cpus >= 1 ? (int)cpus : 1, lg = 0;
    while (n > 1) n >>= 1, lg++;
    return 0.75e-3 * (1 + lg);
}

static double num(const cJSON *o, const char *key, double def) {
    const cJSON *it = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(it) ? it->valuedouble : def;
}

static const char *COLL_KEYS[LOOM_COLL_COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                 "p2p"};

/* The rates, sizes and efficiencies of a cluster file (absent keys 0 or
 * their defaults; checked by check_cluster). */
static void parse_rates(const char *path, const cJSON *root, loom_plan_cluster *c) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(c->name, sizeof c->name, "%s", cJSON_IsString(nm) ? nm->valuestring : path);
    c->gpus_per_node = (int)num(root, "gpus_per_node", 0);
    c->nodes = (int)num(root, "nodes", 1);
    c->memory = num(root, "memory_gb", 0) * 1e9;
    c->reserved = num(root, "reserved_gb", 0) * 1e9;
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(root, "peak_tflops");
    c->peak_fp32 = num(peak, "fp32", 0) * 1e12;
    c->peak_bf16 = num(peak, "bf16", 0) * 1e12;
    if (c->peak_bf16 <= 0) c->peak_bf16 = c->peak_fp32;
    c->hbm_bw = num(root, "hbm_gbps", 0) * 1e9;
    const cJSON *intra = cJSON_GetObjectItemCaseSensitive(root, "intra_node");
    const cJSON *inter = cJSON_GetObjectItemCaseSensitive(root, "inter_node");
    c->intra_bw = num(intra, "bandwidth_gbps", 0) * 1e9;
    c->intra_lat = num(intra, "latency_us", 0) * 1e-6;
    c->inter_bw = num(inter, "bandwidth_gbps", c->intra_bw / 1e9) * 1e9;
    c->inter_lat = num(inter, "latency_us", c->intra_lat * 1e6) * 1e-6;
    const cJSON *eff = cJSON_GetObjectItemCaseSensitive(root, "efficiency");
    c->gemm_eff = num(eff, "gemm", 1);
    c->coll_eff = num(eff, "collective", 1);
    c->overlap = num(eff, "overlap", 1);
    c->attn_eff = num(eff, "attention", 0);
    /* achievable / datasheet HBM bandwidth (a measured memory-bound kernel,
     * as gemm and collective are measured fractions); absent: 1, hbm_gbps is
     * then taken as achievable (calibrate writes a measured copy bandwidth) */
    c->hbm_eff = num(eff, "hbm", 1);
}

/* cores_per_node and sched_slice_us: devices that time-share processors. */
static loom_status parse_sharing(const char *path, const cJSON *root, loom_plan_cluster *c) {
    const cJSON *cores = cJSON_GetObjectItemCaseSensitive(root, "cores_per_node");
    if (cores) {
        c->cores = cJSON_IsNumber(cores) ? cores->valuedouble : -1;
        if (!(isfinite(c->cores) && c->cores > 0))
            return loom_fail(LOOM_ECONFIG,
                             "cluster %s: 'cores_per_node' must be a positive number (absent: devices do not "
                             "share processors)",
                             path);
    }
    /* the scheduler's time slice (calibrate writes the kernel's); absent:
     * EEVDF's default base slice, 0.75 ms scaled by 1 + ilog2(CPUs, at most
     * 8) (kernel/sched/fair.c, SCHED_TUNABLESCALING_LOG), the cores standing
     * for the CPUs */
    const cJSON *slice = cJSON_GetObjectItemCaseSensitive(root, "sched_slice_us");
    if (slice) {
        c->slice = cJSON_IsNumber(slice) ? slice->valuedouble * 1e-6 : -1;
        if (!(isfinite(c->slice) && c->slice > 0))
            return loom_fail(LOOM_ECONFIG,
                             "cluster %s: 'sched_slice_us' must be a positive number (absent: the "
                             "EEVDF default for cores_per_node)",
                             path);
    } else if (c->cores > 0) {
        c->slice = loom_plan_default_slice(c->cores);
    }
    return LOOM_OK;
}

/* The keys that must be positive numbers and the efficiencies in (0, 1];
 * then the achievable HBM bandwidth (20 x the intra-node link's when
 * absent). */
static loom_status check_cluster(const char *path, loom_plan_cluster *c) {
    if (c->attn_eff < 0 || c->attn_eff > 1)
        return loom_fail(LOOM_ECONFIG, "cluster %s: efficiency.attention must be in (0, 1] (or absent)",
                         path);
    struct {
        const char *key;
        double v;
    } chk[] = {{"gpus_per_node", c->gpus_per_node},
               {"nodes", c->nodes},
               {"memory_gb", c->memory},
               {"peak_tflops.fp32", c->peak_fp32},
               {"intra_node.bandwidth_gbps", c->intra_bw},
               {"efficiency.gemm", c->gemm_eff},
               {"efficiency.collective", c->coll_eff}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        if (!(chk[i].v > 0) || !isfinite(chk[i].v))
            return loom_fail(LOOM_ECONFIG, "cluster %s: '%s' must be a positive number", path, chk[i].key);
    if (c->gemm_eff > 1 || c->coll_eff > 1 || c->overlap < 0 || c->overlap > 1)
        return loom_fail(LOOM_ECONFIG, "cluster %s: efficiencies must be in (0, 1]", path);
    if (!(c->hbm_eff > 0 && c->hbm_eff <= 1))
        return loom_fail(LOOM_ECONFIG, "cluster %s: efficiency.hbm must be in (0, 1] (or absent)", path);
    if (c->hbm_bw <= 0) c->hbm_bw = 20 * c->intra_bw;
    c->hbm_bw *= c->hbm_eff;
    return LOOM_OK;
}

/* GEMM efficiency by size: [{"m", "n", "k", "eff"}, ...] (or "flops"
 * instead of m, n, k); kept sorted by FLOPs */
static loom_status parse_gemm_curve(const char *path, const cJSON *root, loom_plan_cluster *c) {
    const cJSON *curve = cJSON_GetObjectItemCaseSensitive(root, "gemm_curve"), *gp;
    cJSON_ArrayForEach(gp, curve) {
        if (c->n_gemm >= LOOM_PLAN_MAX_POINTS) break;
        double f = num(gp, "flops", 0);
        if (f <= 0) f = 2.0 * num(gp, "m", 0) * num(gp, "n", 0) * num(gp, "k", 0);
        const double ef = num(gp, "eff", 0);
        if (!(f > 0) || !(ef > 0) || ef > 1)
            return loom_fail(LOOM_ECONFIG,
                             "cluster %s: gemm_curve[%d] needs m, n, k > 0 (or flops) and eff in (0, 1]",
                             path, c->n_gemm);
        int i = c->n_gemm++;
        while (i > 0 && c->gemm_flops[i - 1] > f) {
            c->gemm_flops[i] = c->gemm_flops[i - 1], c->gemm_curve[i] = c->gemm_curve[i - 1];
            i--;
        }
        c->gemm_flops[i] = f, c->gemm_curve[i] = ef;
    }
    return LOOM_OK;
}

/* Measured collectives (calibrate): {"all_reduce": [{"group",
 * "latency_us", "bandwidth_gbps"}, ...], ...}. */
static loom_status parse_collectives(const char *path, const cJSON *root, loom_plan_cluster *c) {
    const cJSON *coll = cJSON_GetObjectItemCaseSensitive(root, "collectives");
    for (int op = 0; coll && op < LOOM_COLL_COUNT; op++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(coll, COLL_KEYS[op]);
        const cJSON *p;
        cJSON_ArrayForEach(p, arr) {
            if (c->n[op] >= LOOM_PLAN_MAX_POINTS) break;
            loom_plan_coll_point *q = &c->pts[op][c->n[op]];
            q->group = (int)num(p, "group", 0);
            q->latency = num(p, "latency_us", -1) * 1e-6;
            q->bandwidth = num(p, "bandwidth_gbps", 0) * 1e9;
            if (q->group < 2 || q->latency < 0 || q->bandwidth <= 0)
                return loom_fail(LOOM_ECONFIG,
                                 "cluster %s: collectives.%s[%d] needs group >= 2, latency_us >= 0, "
                                 "bandwidth_gbps > 0",
                                 path, COLL_KEYS[op], c->n[op]);
            c->n[op]++;
        }
    }
    return LOOM_OK;
}

static loom_status parse_cluster(const char *path, const cJSON *root, loom_plan_cluster *c) {
    memset(c, 0, sizeof *c);
    parse_rates(path, root, c);
    LOOM_TRY(parse_sharing(path, root, c));
    LOOM_TRY(check_cluster(path, c));
    LOOM_TRY(parse_gemm_curve(path, root, c));
    LOOM_TRY(plan_parse_hw(path, root, c));
    return parse_collectives(path, root, c);
}

loom_status loom_plan_cluster_load(const char *s, loom_plan_cluster *c) {
    char path[1024];
    size_t n = strlen(s);
    if (strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0)) {
        snprintf(path, sizeof path, "%s", s);
    } else {
        const char *dir = getenv("LOOM_PLAN_DIR");
        snprintf(path, sizeof path, "%s/clusters/%s.json", dir && *dir ? dir : loom_plan_dir(), s);
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_fail(LOOM_ENOINPUT,
                         "--cluster %s: cannot open %s (presets: dgx-a100-80gb, dgx-h100; "
                         "`loom calibrate` writes this machine's)",
                         s, path);
    char *text = malloc(1 << 20);
    if (!text) {
        fclose(f);
        return loom_fail(LOOM_EOS, "out of memory");
    }
    size_t k = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[k] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    loom_status st = root && cJSON_IsObject(root)
                         ? parse_cluster(path, root, c)
                         : loom_fail(LOOM_ECONFIG, "cluster %s: not a JSON object", path);
    cJSON_Delete(root);
    return st;
}

/* ---- layouts as text ------------------------------------------------- */

/* the axes (LOOM_PLAN_TP.. are loom_axis's order) and recompute modes are layout.h's words */
#define AXIS_NAMES loom_axis_names
#define RECOMPUTE_NAMES loom_recompute_names
static const char *CP_IMPL_NAMES[LOOM_PLAN_CP_IMPL_COUNT] = {"ring", "ulysses", "allgather"};

/* loom's recompute words, then the planner's own (LOOM_PLAN_RECOMPUTE_OP, _LAYER2). */
static const char *recompute_name(int r) {
    static const char *const extra[] = {"op", "layer2"};
    return r < 3 ? RECOMPUTE_NAMES[r] : extra[r - 3];
}

/* stages=5.6.6.5: layers per virtual stage (each >= 1). */
static loom_status parse_stages(const char *v, loom_plan_layout *l) {
    l->n_stages = 0;
    for (const char *p = v; *p;) {
        char *end;
        const long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1 << 14 || l->n_stages >= LOOM_PLAN_MAX_STAGES || (*end && *end != '.'))
            return loom_fail(
                LOOM_EUSAGE,
                "--layout stages=%s: layers per virtual stage, each >= 1, '.'-separated, at most %d", v,
                LOOM_PLAN_MAX_STAGES);
        l->stages[l->n_stages++] = (short)x;
        p = *end ? end + 1 : end;
    }
    return LOOM_OK;
}

static loom_status parse_order(const char *s, loom_plan_layout *l) {
    int seen = 0, k = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ".,"); tok; tok = strtok(NULL, ".,")) {
        int a = -1;
        for (int i = 0; i < LOOM_PLAN_NAXES; i++)
            if (strcmp(tok, AXIS_NAMES[i]) == 0) a = i;
        if (a < 0 || (seen & (1 << a)) || k >= LOOM_PLAN_NAXES)
            return loom_fail(LOOM_EUSAGE, "--layout order=%s: need tp, cp, dp, pp each once", s);
        seen |= 1 << a;
        l->order[k++] = a;
    }
    if (k != LOOM_PLAN_NAXES)
        return loom_fail(LOOM_EUSAGE, "--layout order=%s: need tp, cp, dp, pp each once", s);
    return LOOM_OK;
}

loom_status loom_plan_layout_parse(const char *text, const loom_plan_job *job, loom_plan_layout *l) {
    memset(l, 0, sizeof *l);
    l->dp = l->tp = l->pp = l->cp = l->ep = l->v = 1;
    l->sched = LOOM_SCHED_1F1B;
    for (int i = 0; i < LOOM_PLAN_NAXES; i++) l->order[i] = i;
    int m_given = 0, mbs_given = 0;
    char buf[512], order[64] = "";
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            if (order[0] && strlen(order) + strlen(tok) + 2 < sizeof order) { /* order=tp,cp,dp,pp */
                strcat(order, ".");
                strcat(order, tok);
                continue;
            }
            return loom_fail(LOOM_EUSAGE, "--layout: '%s' is not KEY=VALUE", tok);
        }
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        if (strcmp(k, "order") == 0) {
            snprintf(order, sizeof order, "%s", v);
            continue;
        }
        if (strcmp(k, "schedule") == 0) {
            LOOM_TRY(loom_schedule_parse(v, &l->sched));
            continue;
        }
        if (strcmp(k, "recompute") == 0) {
            int f = -1;
            for (int i = 0; i < LOOM_PLAN_RECOMPUTE_COUNT; i++)
                if (strcmp(v, recompute_name(i)) == 0) f = i;
            if (f < 0)
                return loom_fail(LOOM_EUSAGE, "--layout recompute=%s: none, selective, full, op or layer2",
                                 v);
            l->recompute = (loom_recompute)f;
            continue;
        }
        if (strcmp(k, "stages") == 0) {
            LOOM_TRY(parse_stages(v, l));
            continue;
        }
        if (strcmp(k, "cp_impl") == 0) {
            int f = -1;
            for (int i = 0; i < LOOM_PLAN_CP_IMPL_COUNT; i++)
                if (strcmp(v, CP_IMPL_NAMES[i]) == 0) f = i;
            if (f < 0) return loom_fail(LOOM_EUSAGE, "--layout cp_impl=%s: ring, ulysses or allgather", v);
            l->cp_impl = (loom_plan_cp_impl)f;
            continue;
        }
        char *end;
        long x = strtol(v, &end, 10);
        if (*end || end == v || x < 0 || x > 1 << 24)
            return loom_fail(LOOM_EUSAGE, "--layout %s=%s: not a non-negative integer", k, v);
        int *dst = strcmp(k, "dp") == 0         ? &l->dp
                   : strcmp(k, "tp") == 0       ? &l->tp
                   : strcmp(k, "pp") == 0       ? &l->pp
                   : strcmp(k, "cp") == 0       ? &l->cp
                   : strcmp(k, "ep") == 0       ? &l->ep
                   : strcmp(k, "zero") == 0     ? &l->zero
                   : strcmp(k, "sp") == 0       ? &l->sp
                   : strcmp(k, "mbs") == 0      ? &l->mbs
                   : strcmp(k, "m") == 0        ? &l->m
                   : strcmp(k, "v") == 0        ? &l->v
                   : strcmp(k, "async_tp") == 0 ? &l->async_tp
                                                : NULL;
        if (!dst)
            return loom_fail(LOOM_EUSAGE,
                             "--layout: unknown key '%s' (dp, tp, pp, cp, cp_impl, ep, zero, sp, "
                             "schedule, mbs, m, v, recompute, order, async_tp, stages)",
                             k);
        if (dst != &l->zero && dst != &l->sp && dst != &l->async_tp && x < 1)
            return loom_fail(LOOM_EUSAGE, "--layout %s=%ld: must be >= 1", k, x);
        *dst = (int)x;
        m_given |= dst == &l->m;
        mbs_given |= dst == &l->mbs;
    }
    if (order[0]) LOOM_TRY(parse_order(order, l));
    if (l->zero > 3) return loom_fail(LOOM_EUSAGE, "--layout zero=%d: 0..3", l->zero);
    if (l->sp > 1) return loom_fail(LOOM_EUSAGE, "--layout sp=%d: 0 or 1", l->sp);
    if (l->async_tp > 1) return loom_fail(LOOM_EUSAGE, "--layout async_tp=%d: 0 or 1", l->async_tp);
    const int local = job->batch / l->dp;
    if (!m_given && !mbs_given) l->m = l->pp;
    if (!m_given && mbs_given) l->m = local / l->mbs > 0 ? local / l->mbs : 1;
    if (!mbs_given) l->mbs = local / l->m > 0 ? local / l->m : 1;
    return LOOM_OK;
}

void loom_plan_layout_format(const loom_plan_layout *l, char *buf, size_t cap) {
    char cpi[32] = "", atp[16] = "";
    if (l->cp > 1) snprintf(cpi, sizeof cpi, "cp_impl=%s,", CP_IMPL_NAMES[l->cp_impl]);
    if (l->async_tp) snprintf(atp, sizeof atp, "async_tp=1,");
    int n =
        snprintf(buf, cap,
                 "dp=%d,tp=%d,pp=%d,cp=%d,%sep=%d,zero=%d,sp=%d,%sschedule=%s,mbs=%d,m=%d,v=%d,recompute=%s,"
                 "order=%s.%s.%s.%s",
                 l->dp, l->tp, l->pp, l->cp, cpi, l->ep, l->zero, l->sp, atp, loom_schedule_name(l->sched),
                 l->mbs, l->m, l->v, recompute_name(l->recompute), AXIS_NAMES[l->order[0]],
                 AXIS_NAMES[l->order[1]], AXIS_NAMES[l->order[2]], AXIS_NAMES[l->order[3]]);
    for (int i = 0; i < l->n_stages && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - n, "%s%d", i ? "." : ",stages=", l->stages[i]);
}

/* --fix: the keys given, as LOOM_PLAN_FIX_* bits. */
loom_status loom_plan_fix_parse(const char *text, unsigned *mask, loom_plan_layout *l) {
    static const struct {
        const char *key;
        unsigned bit;
    } KEYS[] = {{"dp", LOOM_PLAN_FIX_DP},
                {"tp", LOOM_PLAN_FIX_TP},
                {"pp", LOOM_PLAN_FIX_PP},
                {"cp", LOOM_PLAN_FIX_CP},
                {"ep", LOOM_PLAN_FIX_EP},
                {"zero", LOOM_PLAN_FIX_ZERO},
                {"sp", LOOM_PLAN_FIX_SP},
                {"schedule", LOOM_PLAN_FIX_SCHEDULE},
                {"mbs", LOOM_PLAN_FIX_MBS},
                {"m", LOOM_PLAN_FIX_M},
                {"v", LOOM_PLAN_FIX_V},
                {"recompute", LOOM_PLAN_FIX_RECOMPUTE},
                {"cp_impl", LOOM_PLAN_FIX_CP_IMPL},
                {"order", LOOM_PLAN_FIX_ORDER},
                {"async_tp", LOOM_PLAN_FIX_ASYNC_TP}};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue; /* order=tp,cp,dp,pp's tail */
        *eq = '\0';
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
            if (strcmp(tok, KEYS[i].key) == 0) bit = KEYS[i].bit;
        if (!bit) return loom_fail(LOOM_EUSAGE, "--fix %s: '%s' is not a knob the search varies", text, tok);
        *mask |= bit;
    }
    const loom_plan_job none = {.batch = 1};
    loom_plan_layout one;
    LOOM_TRY(loom_plan_layout_parse(text, &none, &one));
    const unsigned m = *mask;
#define TAKE(bit, f)                                                                                         \
    if (m & (bit)) l->f = one.f
    TAKE(LOOM_PLAN_FIX_DP, dp);
    TAKE(LOOM_PLAN_FIX_TP, tp);
    TAKE(LOOM_PLAN_FIX_PP, pp);
    TAKE(LOOM_PLAN_FIX_CP, cp);
    TAKE(LOOM_PLAN_FIX_EP, ep);
    TAKE(LOOM_PLAN_FIX_ZERO, zero);
    TAKE(LOOM_PLAN_FIX_SP, sp);
    TAKE(LOOM_PLAN_FIX_SCHEDULE, sched);
    TAKE(LOOM_PLAN_FIX_MBS, mbs);
    TAKE(LOOM_PLAN_FIX_M, m);
    TAKE(LOOM_PLAN_FIX_V, v);
    TAKE(LOOM_PLAN_FIX_RECOMPUTE, recompute);
    TAKE(LOOM_PLAN_FIX_CP_IMPL, cp_impl);
    TAKE(LOOM_PLAN_FIX_ASYNC_TP, async_tp);
#undef TAKE
    if (m & LOOM_PLAN_FIX_ORDER) memcpy(l->order, one.order, sizeof l->order);
    return LOOM_OK;
}

/* ---- the rules ----------------------------------------------------------- */

/* The planner's layout as loom_layout: m micro-batches of mbs sequences are
 * the pipeline's micro-batches, or the accumulation steps at pp = 1; the
 * all-gather CP the planner models has the ring's rules. */
loom_status loom_plan_layout_validate(const loom_plan_model *m, const loom_plan_job *j, int devices,
                                      const loom_plan_layout *p) {
    loom_layout l;
    loom_layout_default(&l);
    l.dp = p->dp, l.tp = p->tp, l.pp = p->pp, l.cp = p->cp, l.ep = p->ep;
    for (int i = 0; i < LOOM_PLAN_NAXES; i++) l.order[i] = (loom_axis)p->order[i];
    l.zero = p->zero;
    l.sp = p->sp;
    l.cp_impl = p->cp_impl == LOOM_PLAN_CP_ULYSSES ? LOOM_CP_ULYSSES : LOOM_CP_RING;
    l.schedule = p->sched;
    l.virtual_stages = p->v;
    l.micro_batches = p->m;
    l.grad_accum = p->pp > 1 ? 1 : p->m;
    l.micro_batch_size = p->mbs;
    /* the planner's op-level and alternate-block recompute keep what
     * selective and full keep at most: checked as those */
    l.recompute = (loom_recompute_mode)(p->recompute == LOOM_PLAN_RECOMPUTE_OP ? LOOM_RECOMPUTE_SELECTIVE
                                        : p->recompute == LOOM_PLAN_RECOMPUTE_LAYER2 ? LOOM_RECOMPUTE_FULL
                                                                                     : p->recompute);
    l.n_stage_layers = p->n_stages;
    for (int i = 0; i < p->n_stages; i++) l.stage_layers[i] = p->stages[i];
    l.precision = j->bf16 ? LOOM_PRECISION_BF16 : LOOM_PRECISION_FP32;
    const loom_layout_model shape = {.name = m->name,
                                     .n_layer = m->layers,
                                     .n_head = m->heads,
                                     .ffn = m->ffn,
                                     .n_positions = m->max_seq,
                                     .n_expert = m->experts > 1 ? m->experts : 0};
    const loom_layout_job job = {.purpose =
                                     j->serve ? LOOM_LAYOUT_FOR_PLAN_SERVE : LOOM_LAYOUT_FOR_PLAN_TRAIN,
                                 .world = devices,
                                 .batch = j->batch,
                                 .seq = j->seq};
    return loom_layout_validate(&l, &shape, &job);
}
