/* cli.c - flag parsing, help text and JSON config files for the loom command. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/log.h"

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

static loom_status set_from_string(const cli_opt *o, const char *v, const char *where) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < -2147483647L || x > 2147483647L)
            return loom_fail(LOOM_EUSAGE, "%s --%s: '%s' is not an integer", where, o->name, v);
        *(int *)o->dst = (int)x;
        return LOOM_OK;
    }
    case OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || v[0] == '-')
            return loom_fail(LOOM_EUSAGE, "%s --%s: '%s' is not a non-negative integer", where,
                             o->name, v);
        *(uint64_t *)o->dst = x;
        return LOOM_OK;
    }
    case OPT_FLOAT:
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return loom_fail(LOOM_EUSAGE, "%s --%s: '%s' is not a finite number", where, o->name, v);
        if (o->type == OPT_FLOAT) *(float *)o->dst = (float)x;
        else *(double *)o->dst = x;
        return LOOM_OK;
    }
    case OPT_STR:
        if (strlen(v) >= o->cap)
            return loom_fail(LOOM_EUSAGE, "%s --%s: value longer than %zu characters", where,
                             o->name, o->cap - 1);
        memcpy(o->dst, v, strlen(v) + 1);
        return LOOM_OK;
    case OPT_STRLIST: {
        cli_strlist *l = o->dst;
        if (l->n == CLI_LIST_MAX)
            return loom_fail(LOOM_EUSAGE, "--%s given more than %d times", o->name, CLI_LIST_MAX);
        l->items[l->n++] = v;
        return LOOM_OK;
    }
    case OPT_FLAG:
        *(int *)o->dst = 1;
        return LOOM_OK;
    }
    return LOOM_EINTERNAL;
}

/* A config value must have the flag's JSON type; it is then applied as text. */
static loom_status set_from_json(const cli_opt *o, const cJSON *v, const char *path) {
    char buf[64];
    switch (o->type) {
    case OPT_INT:
    case OPT_U64:
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
            fabs(v->valuedouble) > 9e15)
            return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be an integer", path, v->string);
        snprintf(buf, sizeof buf, "%.0f", v->valuedouble);
        break;
    case OPT_FLOAT:
    case OPT_DOUBLE:
        if (!cJSON_IsNumber(v))
            return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be a number", path, v->string);
        snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
        break;
    case OPT_FLAG:
        if (!cJSON_IsBool(v))
            return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be true or false", path, v->string);
        *(int *)o->dst = cJSON_IsTrue(v);
        return LOOM_OK;
    case OPT_STR:
        if (!cJSON_IsString(v))
            return loom_fail(LOOM_ECONFIG, "%s: \"%s\" must be a string", path, v->string);
        return set_from_string(o, v->valuestring, path) == LOOM_OK
                   ? LOOM_OK
                   : loom_fail(LOOM_ECONFIG, "%s: \"%s\" is too long", path, v->string);
    case OPT_STRLIST:
        return loom_fail(LOOM_ECONFIG, "%s: \"%s\" cannot be set in a config file", path, v->string);
    }
    loom_status st = set_from_string(o, buf, path);
    return st == LOOM_OK ? st : LOOM_ECONFIG;
}

static loom_status apply_config(const cli_cmd *cmd, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "--config %s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int ch; (ch = fgetc(f)) != EOF;) {
        if (len + 2 > cap) {
            char *t = realloc(text, cap = cap ? 2 * cap : 4096);
            if (!t) { free(text); fclose(f); return loom_fail(LOOM_EOS, "out of memory"); }
            text = t;
        }
        text[len++] = (char)ch;
    }
    fclose(f);
    cJSON *root = text ? (text[len] = '\0', cJSON_Parse(text)) : NULL;
    free(text);
    loom_status st = LOOM_OK;
    if (!cJSON_IsObject(root))
        st = loom_fail(LOOM_ECONFIG, "--config %s: not a JSON object", path);
    for (const cJSON *it = root ? root->child : NULL; it && st == LOOM_OK; it = it->next) {
        const cli_opt *o = find_opt(cmd, it->string);
        if (!o || strcmp(o->name, "config") == 0)
            st = loom_fail(LOOM_ECONFIG, "%s: unknown key \"%s\" (keys are `loom %s` flag names)",
                           path, it->string, cmd->name);
        else
            st = set_from_json(o, it, path);
    }
    cJSON_Delete(root);
    return st;
}

loom_status cli_parse(const cli_cmd *cmd, int argc, char **argv, int allow_config, int *help) {
    *help = 0;
    for (int pass = 0; pass < 2; pass++) { /* pass 0: --config and --help only */
        for (int i = 0; i < argc; i++) {
            const char *a = argv[i];
            if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                if (pass == 0) cli_print_help(cmd, stdout);
                *help = 1;
                return LOOM_OK;
            }
            if (strncmp(a, "--", 2) != 0)
                return loom_fail(LOOM_EUSAGE, "unexpected argument '%s' (see loom %s --help)", a,
                                 cmd->name);
            char name[64];
            const char *eq = strchr(a + 2, '='), *val = NULL;
            size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (nlen >= sizeof name) nlen = sizeof name - 1;
            memcpy(name, a + 2, nlen);
            name[nlen] = '\0';
            const int is_config = allow_config && name_eq(name, "config");
            const cli_opt *o = find_opt(cmd, name);
            if (!o && !is_config)
                return loom_fail(LOOM_EUSAGE, "unknown flag --%s (see loom %s --help)", name,
                                 cmd->name);
            int takes_value = is_config || o->type != OPT_FLAG;
            if (takes_value) {
                if (eq) val = eq + 1;
                else if (i + 1 < argc) val = argv[++i];
                else return loom_fail(LOOM_EUSAGE, "--%s needs a value", name);
            }
            if (pass == 0 && is_config) LOOM_TRY(apply_config(cmd, val));
            if (pass == 1 && !is_config) LOOM_TRY(set_from_string(o, val ? val : "", "flag"));
        }
    }
    return LOOM_OK;
}

void cli_print_help(const cli_cmd *cmd, FILE *out) {
    fprintf(out, "usage: %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->n_opts) fprintf(out, "\noptions:\n");
    for (int i = 0; i < cmd->n_opts; i++) {
        const cli_opt *o = &cmd->opts[i];
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        fprintf(out, "  %-26s %s\n", left, o->help);
    }
    if (cmd->details) fprintf(out, "\n%s", cmd->details);
}

int cli_fail(loom_status st) {
    if (st == LOOM_OK) return 0;
    if (loom_errmsg()[0]) loom_error("%s", loom_errmsg());
    return (int)st;
}
