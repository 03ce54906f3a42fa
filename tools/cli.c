/* cli.c - flag parsing, help text and JSON config files for the loom command. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/device.h"
#include "loom/comm.h"
#include "loom/kernels.h"
#include "loom/log.h"

#define LOOM_CLI_WHAT 1200 /* a config path and a key */

/* "grad-clip" and "grad_clip" name the same flag. */
static int name_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a == '_' ? '-' : *a, y = *b == '_' ? '-' : *b;
        if (x != y) return 0;
    }
    return *a == *b;
}

static const cli_opt *find_opt(const cli_cmd *cmd, const char *name) {
    for (int i = 0; i < cmd->n_opts; i++)
        if (name_eq(cmd->opts[i].name, name)) return &cmd->opts[i];
    return NULL;
}

/* An enum flag's word -> its index. "--precision fp16: expected fp32 or bf16". */
typedef enum { CLI_ENUM_PROBE } cli_enum_probe;
static loom_status set_enum(const cli_enum *e, const char *v, const char *what) {
    _Static_assert(sizeof(cli_enum_probe) == sizeof(int), "enums are stored as int");
    int n = 0;
    while (e->words[n]) n++;
    for (int i = 0; i < n; i++)
        if (strcmp(v, e->words[i]) == 0) {
            *(int *)e->value = i;
            return LOOM_OK;
        }
    char list[256];
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s",
                              i == 0       ? ""
                              : i == n - 1 ? " or "
                                           : ", ",
                              e->words[i]);
    return loom_fail(LOOM_EUSAGE, "%s %s: expected %s", what, v, list);
}

/* `what` names the setting in messages: "--steps" for a flag, or
 * "FILE: \"steps\"" for a config key. */
static loom_status set_from_string(const cli_opt *o, const char *v, const char *what) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end) return loom_fail(LOOM_EUSAGE, "%s '%s': not an integer", what, v);
        if (errno || x < -2147483647L || x > 2147483647L)
            return loom_fail(LOOM_EUSAGE, "%s '%s': out of range (at most 2147483647)", what, v);
        *(int *)o->dst = (int)x;
        return LOOM_OK;
    }
    case OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || v[0] == '-' || v[0] == '+')
            return loom_fail(LOOM_EUSAGE, "%s '%s': not a non-negative integer", what, v);
        if (errno) return loom_fail(LOOM_EUSAGE, "%s '%s': out of range", what, v);
        *(uint64_t *)o->dst = x;
        return LOOM_OK;
    }
    case OPT_FLOAT:
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || (errno && x != 0) || !isfinite(x) || (o->type == OPT_FLOAT && fabs(x) > 3.4e38))
            return loom_fail(LOOM_EUSAGE, "%s '%s': not a finite number", what, v);
        if (o->type == OPT_FLOAT) *(float *)o->dst = (float)x;
        else *(double *)o->dst = x;
        return LOOM_OK;
    }
    case OPT_STR:
        if (strlen(v) >= o->cap)
            return loom_fail(LOOM_EUSAGE, "%s: value longer than %zu characters", what, o->cap - 1);
        memcpy(o->dst, v, strlen(v) + 1);
        return LOOM_OK;
    case OPT_STRLIST: {
        cli_strlist *l = o->dst;
        if (l->n == CLI_LIST_MAX)
            return loom_fail(LOOM_EUSAGE, "%s given more than %d times", what, CLI_LIST_MAX);
        l->items[l->n++] = v;
        return LOOM_OK;
    }
    case OPT_FLAG: *(int *)o->dst = 1; return LOOM_OK;
    case OPT_ENUM: return set_enum(o->dst, v, what);
    }
    return LOOM_EINTERNAL;
}

/* A config value must have the flag's JSON type; it is then applied as text. */
static loom_status set_from_json(const cli_opt *o, const cJSON *v, const char *path) {
    char buf[64], what[LOOM_CLI_WHAT];
    snprintf(what, sizeof what, "%s: \"%s\"", path, v->string);
    switch (o->type) {
    case OPT_INT:
    case OPT_U64:
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
            return loom_fail(LOOM_ECONFIG, "%s must be an integer", what);
        if (fabs(v->valuedouble) > 9e15)
            return loom_fail(LOOM_ECONFIG, "%s: %g is out of range", what, v->valuedouble);
        snprintf(buf, sizeof buf, "%.0f", v->valuedouble);
        break;
    case OPT_FLOAT:
    case OPT_DOUBLE:
        if (!cJSON_IsNumber(v)) return loom_fail(LOOM_ECONFIG, "%s must be a number", what);
        snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
        break;
    case OPT_FLAG:
        if (!cJSON_IsBool(v)) return loom_fail(LOOM_ECONFIG, "%s must be true or false", what);
        *(int *)o->dst = cJSON_IsTrue(v);
        return LOOM_OK;
    case OPT_STR:
    case OPT_ENUM:
        if (!cJSON_IsString(v)) return loom_fail(LOOM_ECONFIG, "%s must be a string", what);
        return set_from_string(o, v->valuestring, what) == LOOM_OK ? LOOM_OK : LOOM_ECONFIG;
    case OPT_STRLIST: return loom_fail(LOOM_ECONFIG, "%s cannot be set in a config file", what);
    }
    /* the value had the right JSON type but not a valid value: still the file's fault */
    return set_from_string(o, buf, what) == LOOM_OK ? LOOM_OK : LOOM_ECONFIG;
}

/* Line and column of byte `at` in text (1-based), for parse errors. */
static void line_col(const char *text, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && text[i]; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static loom_status read_config_text(const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "--config %s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    loom_status st = LOOM_OK;
    for (int ch; (ch = fgetc(f)) != EOF;) {
        if (len + 2 > cap) {
            if (cap >= (1u << 24)) {
                st = loom_fail(LOOM_ECONFIG, "--config %s: larger than 16 MiB: not a config file", path);
                break;
            }
            char *t = realloc(text, cap = cap ? 2 * cap : 4096);
            if (!t) {
                st = loom_fail(LOOM_EOS, "--config %s: out of memory", path);
                break;
            }
            text = t;
        }
        text[len++] = (char)ch;
    }
    if (st == LOOM_OK && ferror(f))
        st = loom_fail(LOOM_ENOINPUT, "--config %s: cannot read: %s", path, strerror(errno));
    fclose(f);
    if (st != LOOM_OK) {
        free(text);
        return st;
    }
    if (!text) return loom_fail(LOOM_ECONFIG, "--config %s: empty file, expected a JSON object", path);
    text[len] = '\0';
    if (strlen(text) != len) {
        free(text);
        return loom_fail(LOOM_ECONFIG, "--config %s: contains a NUL byte: not a JSON file", path);
    }
    *out = text;
    return LOOM_OK;
}

static loom_status apply_config(const cli_cmd *cmd, const char *path) {
    char *text;
    LOOM_TRY(read_config_text(path, &text));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1); /* trailing text is an error too */
    loom_status st = LOOM_OK;
    if (!root) {
        int line, col;
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        line_col(text, at, &line, &col);
        st = loom_fail(LOOM_ECONFIG, "--config %s: not valid JSON (line %d, column %d)", path, line, col);
    } else if (!cJSON_IsObject(root)) {
        st = loom_fail(LOOM_ECONFIG, "--config %s: not a JSON object ({\"flag-name\": value, ...})", path);
    }
    for (const cJSON *it = root ? root->child : NULL; it && st == LOOM_OK; it = it->next) {
        const cli_opt *o = find_opt(cmd, it->string);
        if (!o || strcmp(o->name, "config") == 0) {
            st = loom_fail(LOOM_ECONFIG, "%s: unknown key \"%s\" (keys are `loom %s` flag names)", path,
                           it->string, cmd->name);
            break;
        }
        for (const cJSON *prev = root->child; prev != it; prev = prev->next)
            if (name_eq(prev->string, it->string)) {
                st = loom_fail(LOOM_ECONFIG, "%s: key \"%s\" appears twice", path, it->string);
                break;
            }
        if (st == LOOM_OK) st = set_from_json(o, it, path);
    }
    cJSON_Delete(root);
    free(text);
    return st;
}

loom_status cli_parse(const cli_cmd *cmd, int argc, char **argv, int allow_config, int *help) {
    *help = 0;
    for (int pass = 0; pass < 2; pass++) { /* pass 0: --config and --help only */
        for (int i = 0; i < argc; i++) {
            const char *a = argv[i];
            if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                *help = 1;
                return LOOM_OK;
            }
            if (strncmp(a, "--", 2) != 0 || a[2] == '\0' || a[2] == '=')
                return loom_fail(LOOM_EUSAGE, "unexpected argument '%s' (see loom %s --help)", a, cmd->name);
            char name[64];
            const char *eq = strchr(a + 2, '='), *val = NULL;
            size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (nlen >= sizeof name)
                return loom_fail(LOOM_EUSAGE, "unknown flag %.*s... (see loom %s --help)", 40, a, cmd->name);
            memcpy(name, a + 2, nlen);
            name[nlen] = '\0';
            const int is_config = allow_config && name_eq(name, "config");
            const cli_opt *o = find_opt(cmd, name);
            if (!o && !is_config)
                return loom_fail(LOOM_EUSAGE, "unknown flag --%s (see loom %s --help)", name, cmd->name);
            int takes_value = is_config || o->type != OPT_FLAG;
            if (!takes_value && eq)
                return loom_fail(LOOM_EUSAGE, "--%s takes no value (got '%s')", name, eq + 1);
            if (takes_value) {
                if (eq) val = eq + 1;
                else if (i + 1 < argc) val = argv[++i];
                else return loom_fail(LOOM_EUSAGE, "--%s needs a value", name);
            }
            if (pass == 0 && is_config) LOOM_TRY(apply_config(cmd, val));
            if (pass == 1 && !is_config) {
                char what[80];
                snprintf(what, sizeof what, "--%s", o->name);
                LOOM_TRY(set_from_string(o, val ? val : "", what));
            }
        }
    }
    return LOOM_OK;
}

void cli_print_help(const cli_cmd *cmd, FILE *out) {
    if (cli_help_man) {
        cli_print_man(cmd, out);
        return;
    }
    fprintf(out, "usage: %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->n_opts) fprintf(out, "\noptions:\n");
    for (int i = 0; i < cmd->n_opts; i++) {
        const cli_opt *o = &cmd->opts[i];
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        fprintf(out, "  %-26s %s\n", left, o->help);
    }
    if (cmd->details) fprintf(out, "\n%s", cmd->details);
}

int cli_parse_local(const cli_cmd *cmd, int argc, char **argv) {
    int help;
    loom_status st = cli_parse(cmd, argc, argv, 0, &help);
    if (st != LOOM_OK) return cli_fail(st);
    if (help) cli_print_help(cmd, stdout);
    return help ? 0 : -1;
}

int cli_fail(loom_status st) {
    if (st == LOOM_OK) return 0;
    if (loom_errmsg()[0]) loom_error("%s", loom_errmsg());
    return (int)st;
}

/* Canonical "dir/name" of a path whose file may not exist yet. */
static int canonical(const char *path, char *out, size_t cap) {
    char dir[4096];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    char real[PATH_MAX];
    if (!realpath(dir, real)) return 0;
    return snprintf(out, cap, "%s/%s", real, base) < (int)cap;
}

int cli_same_file(const char *a, const char *b) {
    if (!a[0] || !b[0]) return 0;
    struct stat sa, sb;
    int ha = stat(a, &sa) == 0, hb = stat(b, &sb) == 0;
    if (ha && hb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ha != hb) return 0;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    if (!canonical(a, ca, sizeof ca) || !canonical(b, cb, sizeof cb)) return strcmp(a, b) == 0;
    return strcmp(ca, cb) == 0;
}

int cli_pick_threads(int asked, int world) {
    if (asked > 0) return asked;
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return world == 1 && cores > 0 ? (int)cores : 1;
}

loom_status cli_device_create(const char *name, int threads, int world, int bf16, loom_device **dev) {
    loom_device_opts o = {.name = name, .threads = cli_pick_threads(threads, world), .bf16 = bf16};
    const char *comm = getenv("LOOM_DEVICE_COMM"), *aware = getenv("LOOM_CUDA_AWARE_MPI");
    *dev = NULL;
    if (comm && comm[0]) LOOM_TRY(loom_device_comm_parse(comm, "LOOM_DEVICE_COMM", &o.comm));
    else if (aware && strcmp(aware, "1") == 0) o.comm = LOOM_DEVICE_COMM_MPI; /* MPI reads device memory */
    return loom_device_create(&o, dev);
}

loom_status cli_mpi_start(int *argc, char ***argv, loom_comm **world) {
    LOOM_TRY(loom_comm_init(argc, argv, world));
    loom_log_set_rank(loom_comm_rank(*world), loom_comm_size(*world));
    return LOOM_OK;
}

int cli_mpi_finish(loom_comm *world, loom_status st) {
    int code = cli_fail(st);
    if (world) loom_comm_finalize(world);
    return code;
}

void cli_help_once(loom_comm *world, const cli_cmd *cmd) {
    if (loom_comm_rank(world) == 0) cli_print_help(cmd, stdout);
}

int cli_mpi_command(int argc, char **argv, const cli_cmd *cmd, const void *cfg, const char *device,
                    const int *threads, loom_status (*check)(const void *cfg, int ranks),
                    loom_status (*run)(const void *cfg, loom_device *dev, loom_comm *world)) {
    loom_comm *world = NULL;
    loom_device *dev = NULL;
    loom_status st = cli_mpi_start(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    int help;
    st = cli_parse(cmd, argc, argv, 0, &help);
    if (st == LOOM_OK && help) {
        cli_help_once(world, cmd);
        return cli_mpi_finish(world, LOOM_OK);
    }
    if (st == LOOM_OK) st = check(cfg, loom_comm_size(world));
    if (st == LOOM_OK) st = cli_device_create(device, *threads, loom_comm_size(world), 0, &dev);
    st = loom_comm_agree(world, st);
    if (st == LOOM_OK) st = run(cfg, dev, world);
    loom_device_free(dev);
    return cli_mpi_finish(world, st);
}
