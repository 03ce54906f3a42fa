/* ckpt_load_fuzz.c - in-process fuzzer of checkpoint loading (issue 31):
 * the manifest mutated together with valid rank files, every mutation
 * re-hashed and re-signed so it reaches the semantic checks, each loaded
 * through loom_ckpt_load - the function `loom train --resume` calls - into
 * one training state built once (loom_train_state_open). Each load must
 * either give exactly the state the untouched checkpoint gives (every
 * parameter and AdamW moment bit for bit, the step, AdamW's t) or be
 * refused with an error; a different state accepted is a failure.
 *
 *   ckpt_load_fuzz STEP_DIR MODEL DATA STEPS BATCH SEQ LR SEED ITERATIONS FUZZ_SEED [KEEP_DIR]
 *
 * STEP_DIR is a checkpoint written by `loom train --save-dir` (any layout)
 * with --model MODEL --data DATA --steps STEPS --batch BATCH --seq SEQ --lr
 * LR --seed SEED (the run's identity). The files are copied to a directory
 * under /dev/shm (tmpfs) and mutated there; a mutation that loads a wrong
 * state is kept in KEEP_DIR (default: the current directory) as
 * wrong_N.manifest.json. Mutations (1 to 3 stacked per load):
 *   - a random node of the manifest: numbers changed (+-1, 0, negated,
 *     doubled, 2^31, 2^40, fractions), strings replaced by another of the
 *     manifest's strings or edited, array items dropped, duplicated or
 *     swapped, members removed or given another member's value;
 *   - one field (tensor, kind, file, key, numel, range, runs) swapped
 *     between two shards;
 *   - a rank file's own account (safetensors metadata) of a key swapped with
 *     another's, edited, or its step / optimizer step changed; the file's
 *     SHA-256 and size in the manifest follow;
 *   - a byte of the manifest's text flipped, dropped or duplicated;
 *   - none (the re-serialized, re-signed manifest must load equal).
 * Changing a shard and the rank file's account of it the same way is not
 * tried on purpose: that is writing other data (docs/checkpoints.md). It
 * can happen by chance when stacked mutations swap a field of two shards in
 * the manifest and their accounts in a rank file: such a load is counted
 * apart as a consistent rewrite, not judged.
 * Prints the counts; exit 0 when no wrong state was accepted, 1 otherwise. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/device.h"
#include "loom/dp.h"
#include "loom/layout.h"
#include "loom/log.h"
#include "loom/model.h"
#include "loom/sha256.h"
#include "loom/status.h"
#include "train/ckpt.h"
#include "train/internal.h"

/* ---- small helpers ------------------------------------------------------------ */

static uint64_t g_rng;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static int pick(int n) { return n > 0 ? (int)(rnd() % (uint64_t)n) : 0; }

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

static int write_all(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* ---- the checkpoint's files ------------------------------------------------------ */

#define MAX_FILES 64
typedef struct rank_file {
    char name[128];
    unsigned char *orig; /* the file as written */
    size_t orig_len;
    int dirty; /* the work directory holds a mutated copy */
} rank_file;

static rank_file g_files[MAX_FILES];
static int g_n_files;
static char g_work[512]; /* the tmpfs copy of the step directory */

static rank_file *file_named(const char *name) {
    for (int i = 0; i < g_n_files; i++)
        if (strcmp(g_files[i].name, name) == 0) return &g_files[i];
    return NULL;
}

/* "manifest_sha256" set to the SHA-256 of text with its 64 digits read as
 * zeros (what the reader checks); 0 if the member is not there once. */
static int sign(char *text) {
    const char *key = "\"manifest_sha256\":";
    char *at = strstr(text, key);
    if (!at || strstr(at + 1, key)) return 0;
    char *q = strchr(at + strlen(key), '"');
    if (!q || strlen(q + 1) < 65 || q[65] != '"') return 0;
    char *digits = q + 1;
    memset(digits, '0', 64);
    char hex[65];
    loom_sha256_hex(text, strlen(text), hex);
    memcpy(digits, hex, 64);
    return 1;
}

/* ---- the state a load gives --------------------------------------------------------- */

typedef struct snapshot {
    int step, t;
    size_t n;
    float *v; /* every parameter run, then every AdamW run (m, v), in the engine's order */
} snapshot;

/* Walk the DP engine's runs: copy out (take), poison, or compare with snap. */
enum { TAKE, POISON, SAME };
static int walk(loom_train_run_state *s, snapshot *snap, int what) {
    size_t at = 0;
    int same = 1;
    for (int p = 0; p < s->n_parts; p++) {
        int nr;
        const loom_param_run *pr = loom_dp_param_runs(s->dp, p, &nr);
        int no = loom_dp_opt_runs(s->dp, p, NULL, 0);
        loom_opt_run *orun = calloc((size_t)(no > 0 ? no : 1), sizeof *orun);
        loom_dp_opt_runs(s->dp, p, orun, no);
        for (int k = 0; k < nr + 2 * no; k++) {
            float *d = k < nr ? pr[k].data : (k - nr) % 2 == 0 ? orun[(k - nr) / 2].m : orun[(k - nr) / 2].v;
            size_t n = k < nr ? pr[k].n : orun[(k - nr) / 2].n;
            if (what == TAKE) {
                snap->v = realloc(snap->v, (at + n) * sizeof(float));
                memcpy(snap->v + at, d, n * sizeof(float));
            } else if (what == POISON && k >= nr) {
                for (size_t i = 0; i < n; i++) d[i] = -1234.5f;
            } else if (what == POISON) { /* the parameters' elements (not the gaps between them) */
                const loom_gpt *m = s->parts[p];
                for (int q = 0; q < m->n_params; q++) {
                    size_t a = m->params[q].offset > pr[k].lo ? m->params[q].offset : pr[k].lo;
                    size_t b = m->params[q].offset + m->params[q].numel;
                    if (b > pr[k].lo + n) b = pr[k].lo + n;
                    for (size_t i = a; i < b; i++) d[i - pr[k].lo] = -1234.5f;
                }
            } else if (at + n > snap->n || memcmp(snap->v + at, d, n * sizeof(float)) != 0) {
                if (same && getenv("FUZZ_DEBUG")) {
                    size_t i = 0;
                    while (at + i < snap->n && i < n && memcmp(snap->v + at + i, d + i, sizeof(float)) == 0)
                        i++;
                    fprintf(stderr, "  differs: part %d run %d of %d+%d, element %zu: %g vs %g\n", p, k, nr,
                            2 * no, i, at + i < snap->n ? snap->v[at + i] : -1.0, i < n ? d[i] : -1.0);
                }
                same = 0;
            }
            at += n;
        }
        free(orun);
    }
    if (what == TAKE) snap->n = at;
    if (what == POISON) loom_dp_set_steps_taken(s->dp, -777);
    return same && at == snap->n;
}

/* ---- mutations ----------------------------------------------------------------------- */

#define MAX_NODES 65536
static cJSON *g_nodes[MAX_NODES], *g_parent[MAX_NODES];
static int g_n_nodes;
static const char *g_strings[MAX_NODES];
static int g_n_strings;

static void collect(cJSON *n, cJSON *parent) {
    if (g_n_nodes < MAX_NODES) g_nodes[g_n_nodes] = n, g_parent[g_n_nodes++] = parent;
    if (cJSON_IsString(n) && g_n_strings < MAX_NODES) g_strings[g_n_strings++] = n->valuestring;
    for (cJSON *c = n->child; c; c = c->next) collect(c, n);
}

static void set_number(cJSON *n, double v) { cJSON_SetNumberHelper(n, v); }

static void replace_node(cJSON *parent, cJSON *old, cJSON *with) {
    if (!parent) {
        cJSON_Delete(with);
        return;
    }
    cJSON_ReplaceItemViaPointer(parent, old, with);
}

static void mutate_node(char *desc, size_t cap) {
    int i = 1 + pick(g_n_nodes - 1); /* not the root */
    cJSON *n = g_nodes[i], *parent = g_parent[i];
    const char *name = n->string ? n->string : "[item]";
    if (cJSON_IsNumber(n)) {
        double v = n->valuedouble, to[] = {v + 1,
                                           v - 1,
                                           0,
                                           -v,
                                           2 * v,
                                           2147483648.0,
                                           1099511627776.0,
                                           v + 0.5,
                                           -1,
                                           1e300,
                                           (double)pick(100000)};
        double w = to[pick(sizeof to / sizeof *to)];
        snprintf(desc, cap, "number %s %.17g -> %.17g", name, v, w);
        set_number(n, w);
    } else if (cJSON_IsString(n)) {
        const char *other = g_strings[pick(g_n_strings)];
        int how = pick(4);
        char buf[512];
        if (how == 0) snprintf(buf, sizeof buf, "%s", other);
        else if (how == 1) buf[0] = 0;
        else if (how == 2) snprintf(buf, sizeof buf, "%sx", n->valuestring);
        else {
            snprintf(buf, sizeof buf, "%s", n->valuestring);
            if (buf[0]) buf[pick((int)strlen(buf))] ^= (char)(1 << pick(6));
        }
        snprintf(desc, cap, "string %s '%.40s' -> '%.40s'", name, n->valuestring, buf);
        cJSON_SetValuestring(n, buf);
    } else if (cJSON_IsArray(n) || cJSON_IsObject(n)) {
        int len = cJSON_GetArraySize(n), how = pick(3);
        if (len == 0) {
            snprintf(desc, cap, "empty %s replaced by 0", name);
            replace_node(parent, n, cJSON_CreateNumber(0));
        } else if (how == 0) {
            snprintf(desc, cap, "%s: item %d removed", name, len > 0 ? pick(len) : 0);
            cJSON_DeleteItemFromArray(n, pick(len));
        } else if (how == 1 && cJSON_IsArray(n)) {
            cJSON *dup = cJSON_Duplicate(cJSON_GetArrayItem(n, pick(len)), 1);
            snprintf(desc, cap, "%s: an item duplicated", name);
            cJSON_AddItemToArray(n, dup);
        } else if (len >= 2) {
            int a = pick(len), b = pick(len);
            cJSON *x = cJSON_GetArrayItem(n, a), *y = cJSON_GetArrayItem(n, b);
            cJSON *dx = cJSON_Duplicate(x, 1), *dy = cJSON_Duplicate(y, 1);
            snprintf(desc, cap, "%s: values of items %d and %d swapped", name, a, b);
            cJSON_ReplaceItemViaPointer(n, x, dy);
            cJSON_ReplaceItemViaPointer(n, cJSON_GetArrayItem(n, b), dx);
        } else {
            snprintf(desc, cap, "%s replaced by its first item", name);
            replace_node(parent, n, cJSON_Duplicate(n->child, 1));
        }
    } else {
        snprintf(desc, cap, "%s (bool/null) -> 1", name);
        replace_node(parent, n, cJSON_CreateNumber(1));
    }
}

/* The shard pairs this load's mutations swapped: in the manifest (a field of
 * two shards) and in a rank file (the accounts of two shards). Both on the
 * same pair make the two agree again: other data written consistently,
 * which no loader can tell from a checkpoint of that state (not judged). */
static int g_man_pair[2], g_acc_pair[2];

static int same_pair(const int *x, const int *y) {
    return x[0] >= 0 && y[0] >= 0 && x[0] != x[1] &&
           ((x[0] == y[0] && x[1] == y[1]) || (x[0] == y[1] && x[1] == y[0]));
}

static void swap_shards(cJSON *man, char *desc, size_t cap) {
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(man, "shards");
    int n = cJSON_GetArraySize(sh);
    if (n < 2) return;
    const char *fields[] = {"tensor", "kind", "file", "key", "numel", "range", "runs"};
    const char *f = fields[pick(7)];
    int a = pick(n), b = pick(n);
    cJSON *x = cJSON_GetArrayItem(sh, a), *y = cJSON_GetArrayItem(sh, b);
    cJSON *vx = cJSON_GetObjectItemCaseSensitive(x, f), *vy = cJSON_GetObjectItemCaseSensitive(y, f);
    if (!vx || !vy) return;
    cJSON *dx = cJSON_Duplicate(vx, 1), *dy = cJSON_Duplicate(vy, 1);
    cJSON_ReplaceItemInObjectCaseSensitive(x, f, dy);
    cJSON_ReplaceItemInObjectCaseSensitive(y, f, dx);
    if (strcmp(f, "file") != 0 && strcmp(f, "key") != 0) /* fields a rank file's account describes too */
        g_man_pair[0] = a, g_man_pair[1] = b;
    snprintf(desc, cap, "shards %d and %d: %s swapped", a, b, f);
}

/* Rank file rf with header h (the original's was hl bytes; h deleted here)
 * into the work directory, its SHA-256 and size into the manifest's files. */
static void write_rank_file(cJSON *man, rank_file *rf, uint64_t hl, cJSON *h) {
    char *out = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t ol = strlen(out), padded = (ol + 7) / 8 * 8, data = rf->orig_len - 8 - hl,
           total = 8 + padded + data;
    unsigned char *nb = malloc(total);
    for (int i = 0; i < 8; i++) nb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(nb + 8, out, ol);
    memset(nb + 8 + ol, ' ', padded - ol);
    memcpy(nb + 8 + padded, rf->orig + 8 + hl, data);
    free(out);
    char path[2048], hex[65];
    snprintf(path, sizeof path, "%.500s/%.100s", g_work, rf->name);
    write_all(path, nb, total);
    rf->dirty = 1;
    loom_sha256_hex(nb, total, hex);
    free(nb);
    cJSON *fe;
    cJSON_ArrayForEach(fe, cJSON_GetObjectItemCaseSensitive(man, "files")) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(fe, "file");
        if (cJSON_IsString(n) && strcmp(n->valuestring, rf->name) == 0) {
            cJSON_ReplaceItemInObjectCaseSensitive(fe, "sha256", cJSON_CreateString(hex));
            cJSON_ReplaceItemInObjectCaseSensitive(fe, "bytes", cJSON_CreateNumber((double)total));
        }
    }
}

/* A rank file's own account changed; its SHA-256 and size in the manifest follow. */
static void mutate_rank_file(cJSON *man, char *desc, size_t cap) {
    cJSON *files = cJSON_GetObjectItemCaseSensitive(man, "files");
    cJSON *fe = cJSON_GetArrayItem(files, pick(cJSON_GetArraySize(files)));
    const cJSON *fname = cJSON_GetObjectItemCaseSensitive(fe, "file");
    rank_file *rf = cJSON_IsString(fname) ? file_named(fname->valuestring) : NULL;
    if (!rf || rf->orig_len < 8) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | rf->orig[i];
    if (hl > rf->orig_len - 8) return;
    char *htext = malloc(hl + 1);
    memcpy(htext, rf->orig + 8, hl);
    htext[hl] = 0;
    cJSON *h = cJSON_Parse(htext);
    free(htext);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    int nm = cJSON_GetArraySize(meta);
    if (!meta || nm < 2) {
        cJSON_Delete(h);
        return;
    }
    cJSON *a = cJSON_GetArrayItem(meta, pick(nm)), *b = cJSON_GetArrayItem(meta, pick(nm));
    int how = pick(3);
    if (how == 0 && cJSON_IsString(a) && cJSON_IsString(b)) {
        char *va = strdup(a->valuestring);
        cJSON_SetValuestring(a, b->valuestring);
        cJSON_SetValuestring(b, va);
        snprintf(desc, cap, "%.100s: accounts of %.40s and %.40s swapped", rf->name, a->string, b->string);
        if (sscanf(a->string, "s%d", &g_acc_pair[0]) != 1 || sscanf(b->string, "s%d", &g_acc_pair[1]) != 1)
            g_acc_pair[0] = g_acc_pair[1] = -1;
        free(va);
    } else if (cJSON_IsString(a) && a->valuestring[0]) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", a->valuestring);
        size_t at = (size_t)pick((int)strlen(buf));
        if (buf[at] >= '0' && buf[at] <= '8') buf[at]++;
        else if (buf[at] == '9') buf[at] = '0';
        else buf[at] ^= 0x20;
        snprintf(desc, cap, "%.100s: account %.40s '%.200s' -> '%.200s'", rf->name, a->string, a->valuestring,
                 buf);
        cJSON_SetValuestring(a, buf);
    }
    write_rank_file(man, rf, hl, h);
}

/* The control: in one rank file, two tensors of the same size trade their
 * bytes (their data_offsets swapped), the file re-hashed in the manifest.
 * Every account still matches, so this loads - a different state, which the
 * comparison must see (1: done, 0: no such pair). */
static int control_swap(cJSON *man) {
    for (int f = 0; f < g_n_files; f++) {
        rank_file *rf = &g_files[(f + pick(g_n_files)) % g_n_files];
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | rf->orig[i];
        char *htext = strndup((const char *)rf->orig + 8, hl);
        cJSON *h = cJSON_Parse(htext);
        free(htext);
        cJSON *a = NULL, *b = NULL;
        for (cJSON *x = h ? h->child : NULL; x && !b; x = x->next)
            for (cJSON *y = x->next; y && !b; y = y->next) {
                cJSON *sx = cJSON_GetObjectItemCaseSensitive(x, "shape"),
                      *sy = cJSON_GetObjectItemCaseSensitive(y, "shape");
                if (sx && sy && cJSON_Compare(sx, sy, 1) && pick(4) == 0) a = x, b = y;
            }
        if (!b) {
            cJSON_Delete(h);
            continue;
        }
        cJSON *oa = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(a, "data_offsets"), 1);
        cJSON *ob = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(b, "data_offsets"), 1);
        cJSON_ReplaceItemInObjectCaseSensitive(a, "data_offsets", ob);
        cJSON_ReplaceItemInObjectCaseSensitive(b, "data_offsets", oa);
        write_rank_file(man, rf, hl, h);
        return 1;
    }
    return 0;
}

static void restore_files(void) {
    for (int i = 0; i < g_n_files; i++)
        if (g_files[i].dirty) {
            char path[2048];
            snprintf(path, sizeof path, "%.500s/%.100s", g_work, g_files[i].name);
            write_all(path, g_files[i].orig, g_files[i].orig_len);
            g_files[i].dirty = 0;
        }
}

/* ---- main ------------------------------------------------------------------------------ */

static void remove_work(void) {
    for (int i = 0; i < g_n_files; i++) {
        char path[2048];
        snprintf(path, sizeof path, "%.500s/%.100s", g_work, g_files[i].name);
        unlink(path);
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/manifest.json", g_work);
    unlink(path);
    rmdir(g_work);
    char *slash = strrchr(g_work, '/');
    if (slash) *slash = 0, rmdir(g_work);
}

int main(int argc, char **argv) {
    if (argc < 11) {
        fprintf(stderr,
                "usage: ckpt_load_fuzz STEP_DIR MODEL DATA STEPS BATCH SEQ LR SEED ITERATIONS FUZZ_SEED "
                "[KEEP_DIR]\n");
        return 64;
    }
    const char *src = argv[1], *keep = argc > 11 ? argv[11] : ".";
    long iterations = atol(argv[9]);
    g_rng = strtoull(argv[10], NULL, 10);
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "ckpt_load_fuzz: %s\n", loom_errmsg());
        return 69;
    }
    loom_log_set_level(LOOM_LOG_ERROR);

    /* the checkpoint's files, into a tmpfs directory of the same step name */
    char path[2048];
    size_t man_len;
    snprintf(path, sizeof path, "%s/manifest.json", src);
    char *man_text = (char *)read_all(path, &man_len);
    cJSON *man0 = man_text ? cJSON_Parse(man_text) : NULL;
    if (!man0) {
        fprintf(stderr, "ckpt_load_fuzz: cannot read %s\n", path);
        return 66;
    }
    const cJSON *fe;
    cJSON_ArrayForEach(fe, cJSON_GetObjectItemCaseSensitive(man0, "files")) {
        rank_file *rf = &g_files[g_n_files++];
        snprintf(rf->name, sizeof rf->name, "%s", cJSON_GetObjectItemCaseSensitive(fe, "file")->valuestring);
        snprintf(path, sizeof path, "%s/%s", src, rf->name);
        rf->orig = read_all(path, &rf->orig_len);
        if (!rf->orig) {
            fprintf(stderr, "ckpt_load_fuzz: cannot read %s\n", path);
            return 66;
        }
    }
    const char *base = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
    if (!base[0]) base = "step";
    snprintf(g_work, sizeof g_work, "/dev/shm/loom_ckpt_fuzz.%d", (int)getpid());
    mkdir(g_work, 0700);
    snprintf(g_work + strlen(g_work), sizeof g_work - strlen(g_work), "/%s", base);
    if (mkdir(g_work, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "ckpt_load_fuzz: cannot create %s: %s\n", g_work, strerror(errno));
        return 73;
    }
    for (int i = 0; i < g_n_files; i++) g_files[i].dirty = 1;
    restore_files();

    /* the state, built once with the untouched checkpoint as --resume */
    loom_train_config c;
    loom_train_config_default(&c);
    snprintf(c.model, sizeof c.model, "%s", argv[2]);
    snprintf(c.data, sizeof c.data, "%s", argv[3]);
    c.steps = atoi(argv[4]);
    c.batch = atoi(argv[5]);
    c.seq = atoi(argv[6]);
    c.lr = strtof(argv[7], NULL);
    c.seed = strtoull(argv[8], NULL, 10);
    c.threads = 1;
    c.peak_flops = 1e11;
    c.quiet = 1;
    loom_layout_vshape_default(&c.layout);
    snprintf(c.resume, sizeof c.resume, "%s", g_work);
    snprintf(path, sizeof path, "%s/manifest.json", g_work);
    write_all(path, man_text, man_len);
    loom_device *dev = NULL;
    loom_device_opts dopts = {.name = "cpu", .threads = 1};
    loom_train_run_state s;
    loom_status st = loom_device_create(&dopts, &dev);
    if (st == LOOM_OK) st = loom_train_state_open(&s, &c, dev, world);
    if (st != LOOM_OK) {
        fprintf(stderr, "ckpt_load_fuzz: the untouched checkpoint does not load: %s\n", loom_errmsg());
        remove_work();
        return 1;
    }
    snapshot ref = {.step = s.start_step, .t = loom_dp_steps_taken(s.dp)};
    walk(&s, &ref, TAKE);

    long equal = 0, refused = 0, wrong = 0, consistent = 0, by_op[5][2] = {{0}}, controls = 0, seen = 0;
    for (long it = 0; it < iterations; it++) {
        cJSON *man = cJSON_Parse(man_text);
        if (it % 1000 == 1 && control_swap(man)) { /* the comparison must see a different state */
            char *text = cJSON_Print(man);
            cJSON_Delete(man);
            sign(text);
            snprintf(path, sizeof path, "%s/manifest.json", g_work);
            write_all(path, text, strlen(text));
            free(text);
            walk(&s, &ref, POISON);
            int step = -1;
            controls++;
            if (loom_ckpt_load(&s, &step) == LOOM_OK && !walk(&s, &ref, SAME)) seen++;
            loom_clear_error();
            restore_files();
            continue;
        }
        char desc[3][700] = {"", "", ""};
        int n_mut = it == 0 ? 0 : 1 + pick(3), last_op = 4, byte_edit = 0;
        g_man_pair[0] = g_man_pair[1] = g_acc_pair[0] = g_acc_pair[1] = -1;
        for (int m = 0; m < n_mut; m++) {
            int op = pick(100);
            op = op < 45 ? 0 : op < 65 ? 1 : op < 85 ? 2 : op < 95 ? 3 : 4;
            last_op = op;
            if (op == 0) {
                g_n_nodes = g_n_strings = 0;
                collect(man, NULL);
                mutate_node(desc[m], sizeof desc[m]);
            } else if (op == 1) swap_shards(man, desc[m], sizeof desc[m]);
            else if (op == 2) mutate_rank_file(man, desc[m], sizeof desc[m]);
            else if (op == 3) byte_edit = 1;
            else snprintf(desc[m], sizeof desc[m], "none");
        }
        char *text = cJSON_Print(man);
        cJSON_Delete(man);
        if (byte_edit && text && text[0]) {
            size_t len = strlen(text), at = (size_t)pick((int)len);
            int how = pick(3);
            if (how == 0) text[at] = (char)(text[at] ^ (1 << pick(7)));
            else if (how == 1) memmove(text + at, text + at + 1, len - at);
            else {
                text = realloc(text, len + 2);
                memmove(text + at + 1, text + at, len - at + 1);
            }
            snprintf(desc[2], sizeof desc[2], "byte %zu of the text %s", at,
                     how == 0   ? "flipped"
                     : how == 1 ? "dropped"
                                : "duplicated");
        }
        sign(text);
        snprintf(path, sizeof path, "%s/manifest.json", g_work);
        write_all(path, text, strlen(text));
        walk(&s, &ref, POISON);
        int step = -1;
        st = loom_ckpt_load(&s, &step);
        int ok = st == LOOM_OK;
        if (ok) {
            int same = walk(&s, &ref, SAME) && step == ref.step && loom_dp_steps_taken(s.dp) == ref.t;
            if (same) equal++;
            else if (same_pair(g_man_pair, g_acc_pair)) consistent++;
            else {
                char keep_path[2048];
                snprintf(keep_path, sizeof keep_path, "%s/wrong_%ld.manifest.json", keep, wrong);
                write_all(keep_path, text, strlen(text));
                fprintf(stderr, "WRONG STATE accepted at iteration %ld (step %d, t %d): %s | %s | %s\n", it,
                        step, loom_dp_steps_taken(s.dp), desc[0], desc[1], desc[2]);
                wrong++;
            }
        } else {
            refused++;
            loom_clear_error();
        }
        by_op[last_op][ok]++;
        if (it == 0 && !ok) {
            fprintf(stderr, "ckpt_load_fuzz: the re-serialized untouched manifest is refused: %s\n",
                    loom_errmsg());
            wrong++;
        }
        free(text);
        restore_files();
        if ((it + 1) % 5000 == 0)
            fprintf(stderr, "  %ld executions: %ld loaded equal, %ld refused, %ld wrong\n", it + 1, equal,
                    refused, wrong);
    }
    printf("ckpt_load_fuzz: %ld executions of loom_ckpt_load: %ld loaded equal, %ld refused, %ld wrong state "
           "accepted\n",
           equal + refused + wrong + consistent, equal, refused, wrong);
    printf(
        "  consistent rewrites (a field of two shards swapped in the manifest and their accounts swapped in "
        "the rank file: other data, written consistently; not judged): %ld loaded another state\n",
        consistent);
    printf("  controls (two same-size tensors' bytes traded in a rank file, re-hashed: loads another state): "
           "%ld of %ld seen as different\n",
           seen, controls);
    printf("  by the last mutation: node %ld/%ld, shard swap %ld/%ld, rank file %ld/%ld, bytes %ld/%ld, none "
           "%ld/%ld (refused/loaded)\n",
           by_op[0][0], by_op[0][1], by_op[1][0], by_op[1][1], by_op[2][0], by_op[2][1], by_op[3][0],
           by_op[3][1], by_op[4][0], by_op[4][1]);
    loom_train_state_close(&s);
    free(ref.v);
    loom_device_free(dev);
    loom_comm_finalize(world);
    remove_work();
    cJSON_Delete(man0);
    free(man_text);
    for (int i = 0; i < g_n_files; i++) free(g_files[i].orig);
    return wrong || seen != controls ? 1 : 0;
}
