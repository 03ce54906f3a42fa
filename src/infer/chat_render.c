/* chat_render.c - the evaluating half of the chat-template engine
 * (include/loom/chat_template.h): runs the tree chat_template.c built over
 * the messages, with Jinja's semantics where chat templates rely on them
 * (Python truthiness and string forms, `and`/`or` returning an operand, an
 * undefined name printing nothing and failing when used, variables set in a
 * loop staying in it, loop filters counted by `loop`). Every value of a
 * rendering lives in one pool freed at the end; a rendering is bounded
 * (16 MiB of output, 10 million steps). */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/chat_internal.h"

#define OUT_MAX (16u << 20)
#define STEPS_MAX 10000000L

typedef struct scope {
    vdict d; /* the names bound here */
    struct scope *up;
} scope;

typedef struct rctx {
    chat_pool pool;
    char *out;
    size_t len, cap;
    char err[300];
    int failed, ctl; /* ctl: 1 break, 2 continue */
    long steps;
    scope *sc;
} rctx;

static const value UNDEF = {.k = V_UNDEF};

__attribute__((format(printf, 3, 4))) static value fail(rctx *x, int line, const char *fmt, ...) {
    if (!x->failed) {
        char m[240];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        if (line > 0) snprintf(x->err, sizeof x->err, "line %d: %s", line, m);
        else snprintf(x->err, sizeof x->err, "%s", m);
        x->failed = 1;
    }
    return UNDEF;
}

static value str_val(rctx *x, const char *s, size_t n) {
    char *d = chat_strndup(&x->pool, s, n);
    if (!d) return fail(x, 0, "out of memory");
    return (value){.k = V_STR, .u.str = {d, n}};
}

static value int_val(long long i) { return (value){.k = V_INT, .u.i = i}; }
static value bool_val(int b) { return (value){.k = V_BOOL, .u.b = !!b}; }

static vlist *new_list(rctx *x) {
    vlist *l = chat_alloc(&x->pool, sizeof *l);
    if (!l) fail(x, 0, "out of memory");
    return l;
}

static int list_push(rctx *x, vlist *l, value v) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 8;
        value *nv = chat_alloc(&x->pool, sizeof *nv * (size_t)nc);
        if (!nv) return fail(x, 0, "out of memory"), 0;
        if (l->n) memcpy(nv, l->v, sizeof *nv * (size_t)l->n);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 1;
}

static int dict_set(rctx *x, vdict *d, const char *k, value v) {
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->keys[i], k)) return (d->vals[i] = v), 1;
    if (d->n == d->cap) {
        int nc = d->cap ? 2 * d->cap : 8;
        const char **nk = chat_alloc(&x->pool, sizeof *nk * (size_t)nc);
        value *nv = chat_alloc(&x->pool, sizeof *nv * (size_t)nc);
        if (!nk || !nv) return fail(x, 0, "out of memory"), 0;
        if (d->n)
            memcpy(nk, d->keys, sizeof *nk * (size_t)d->n), memcpy(nv, d->vals, sizeof *nv * (size_t)d->n);
        d->keys = nk;
        d->vals = nv;
        d->cap = nc;
    }
    d->keys[d->n] = k;
    d->vals[d->n++] = v;
    return 1;
}

static value dict_get(const vdict *d, const char *k) {
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->keys[i], k)) return d->vals[i];
    return UNDEF;
}

static int truthy(value v) {
    switch (v.k) {
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.str.n > 0;
    case V_LIST: return v.u.list->n > 0;
    case V_DICT: return v.u.dict->n > 0;
    case V_FUNC: return 1;
    default: return 0;
    }
}

/* ---- Python's str() ---------------------------------------------------------------- */

typedef struct sbuf {
    char *b;
    size_t n, cap;
} sbuf;

static int sb_add(rctx *x, sbuf *s, const char *p, size_t n) {
    if (s->n + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 64;
        while (nc < s->n + n + 1) nc *= 2;
        if (nc > OUT_MAX + 1) return fail(x, 0, "the rendered text passes 16 MiB"), 0;
        char *nb = realloc(s->b, nc);
        if (!nb) return fail(x, 0, "out of memory"), 0;
        s->b = nb;
        s->cap = nc;
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
    s->b[s->n] = '\0';
    return 1;
}

static void repr(rctx *x, sbuf *s, value v, int quote);

static void float_str(rctx *x, sbuf *s, double f) {
    char b[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, f);
        if (strtod(b, NULL) == f) break;
    }
    sb_add(x, s, b, strlen(b));
    if (!strpbrk(b, ".eni")) sb_add(x, s, ".0", 2);
}

static void repr(rctx *x, sbuf *s, value v, int quote) {
    char b[32];
    switch (v.k) {
    case V_UNDEF: break;
    case V_NONE: sb_add(x, s, "None", 4); break;
    case V_BOOL: sb_add(x, s, v.u.b ? "True" : "False", v.u.b ? 4 : 5); break;
    case V_INT: snprintf(b, sizeof b, "%lld", v.u.i), sb_add(x, s, b, strlen(b)); break;
    case V_FLOAT: float_str(x, s, v.u.f); break;
    case V_STR:
        if (quote) sb_add(x, s, "'", 1);
        sb_add(x, s, v.u.str.s, v.u.str.n);
        if (quote) sb_add(x, s, "'", 1);
        break;
    case V_LIST:
        sb_add(x, s, "[", 1);
        for (int i = 0; i < v.u.list->n; i++) {
            if (i) sb_add(x, s, ", ", 2);
            repr(x, s, v.u.list->v[i], 1);
        }
        sb_add(x, s, "]", 1);
        break;
    case V_DICT:
        sb_add(x, s, "{", 1);
        for (int i = 0; i < v.u.dict->n; i++) {
            if (i) sb_add(x, s, ", ", 2);
            sb_add(x, s, "'", 1), sb_add(x, s, v.u.dict->keys[i], strlen(v.u.dict->keys[i])),
                sb_add(x, s, "': ", 3);
            repr(x, s, v.u.dict->vals[i], 1);
        }
        sb_add(x, s, "}", 1);
        break;
    case V_FUNC: sb_add(x, s, "<function>", 10); break;
    }
}

static value to_str(rctx *x, value v) {
    if (v.k == V_STR) return v;
    sbuf s = {0};
    repr(x, &s, v, 0);
    value r = str_val(x, s.b ? s.b : "", s.n);
    free(s.b);
    return r;
}

/* JSON as Python's json.dumps(ensure_ascii=False) writes it. */
static void to_json(rctx *x, sbuf *s, value v) {
    switch (v.k) {
    case V_UNDEF:
    case V_NONE: sb_add(x, s, "null", 4); break;
    case V_BOOL: sb_add(x, s, v.u.b ? "true" : "false", v.u.b ? 4 : 5); break;
    case V_STR:
        sb_add(x, s, "\"", 1);
        for (size_t i = 0; i < v.u.str.n; i++) {
            const unsigned char c = (unsigned char)v.u.str.s[i];
            char e[8];
            if (c == '"' || c == '\\') e[0] = '\\', e[1] = (char)c, e[2] = 0;
            else if (c == '\n') strcpy(e, "\\n");
            else if (c == '\t') strcpy(e, "\\t");
            else if (c == '\r') strcpy(e, "\\r");
            else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c);
            else e[0] = (char)c, e[1] = 0;
            sb_add(x, s, e, strlen(e));
        }
        sb_add(x, s, "\"", 1);
        break;
    case V_LIST:
        sb_add(x, s, "[", 1);
        for (int i = 0; i < v.u.list->n; i++) {
            if (i) sb_add(x, s, ", ", 2);
            to_json(x, s, v.u.list->v[i]);
        }
        sb_add(x, s, "]", 1);
        break;
    case V_DICT:
        sb_add(x, s, "{", 1);
        for (int i = 0; i < v.u.dict->n; i++) {
            if (i) sb_add(x, s, ", ", 2);
            to_json(x, s, (value){.k = V_STR, .u.str = {v.u.dict->keys[i], strlen(v.u.dict->keys[i])}});
            sb_add(x, s, ": ", 2);
            to_json(x, s, v.u.dict->vals[i]);
        }
        sb_add(x, s, "}", 1);
        break;
    default: repr(x, s, v, 0);
    }
}

/* ---- operators -------------------------------------------------------------------- */

static int is_num(value v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }
static double num(value v) { return v.k == V_FLOAT ? v.u.f : v.k == V_INT ? (double)v.u.i : v.u.b; }
static long long inum(value v) { return v.k == V_INT ? v.u.i : v.k == V_BOOL ? v.u.b : (long long)v.u.f; }

static int equal(value a, value b) {
    if (is_num(a) && is_num(b)) return num(a) == num(b);
    if (a.k != b.k) return 0;
    switch (a.k) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a.u.str.n == b.u.str.n && !memcmp(a.u.str.s, b.u.str.s, a.u.str.n);
    case V_LIST:
        if (a.u.list->n != b.u.list->n) return 0;
        for (int i = 0; i < a.u.list->n; i++)
            if (!equal(a.u.list->v[i], b.u.list->v[i])) return 0;
        return 1;
    case V_DICT: return a.u.dict == b.u.dict;
    default: return 0;
    }
}

static const char *kind_name(value v) {
    static const char *const n[] = {"undefined", "none", "bool", "int",     "float",
                                    "str",       "list", "dict", "function"};
    return n[v.k];
}

static int compare(rctx *x, int line, value a, value b, int *out) {
    if (is_num(a) && is_num(b)) return (*out = (num(a) > num(b)) - (num(a) < num(b))), 1;
    if (a.k == V_STR && b.k == V_STR) {
        size_t n = a.u.str.n < b.u.str.n ? a.u.str.n : b.u.str.n;
        int c = memcmp(a.u.str.s, b.u.str.s, n);
        *out = c ? (c > 0) - (c < 0) : (a.u.str.n > b.u.str.n) - (a.u.str.n < b.u.str.n);
        return 1;
    }
    fail(x, line, "cannot compare %s with %s", kind_name(a), kind_name(b));
    return 0;
}

static int contains(rctx *x, int line, value hay, value needle) {
    if (hay.k == V_STR && needle.k == V_STR)
        return needle.u.str.n == 0 || (needle.u.str.n <= hay.u.str.n &&
                                       memmem(hay.u.str.s, hay.u.str.n, needle.u.str.s, needle.u.str.n));
    if (hay.k == V_LIST) {
        for (int i = 0; i < hay.u.list->n; i++)
            if (equal(hay.u.list->v[i], needle)) return 1;
        return 0;
    }
    if (hay.k == V_DICT && needle.k == V_STR) {
        char *k = chat_strndup(&x->pool, needle.u.str.s, needle.u.str.n);
        return k && dict_get(hay.u.dict, k).k != V_UNDEF;
    }
    fail(x, line, "'in' needs a string, list or dict, not %s", kind_name(hay));
    return 0;
}

static value concat_str(rctx *x, value a, value b) {
    a = to_str(x, a);
    b = to_str(x, b);
    char *d = chat_alloc(&x->pool, a.u.str.n + b.u.str.n + 1);
    if (!d) return fail(x, 0, "out of memory");
    memcpy(d, a.u.str.s, a.u.str.n);
    memcpy(d + a.u.str.n, b.u.str.s, b.u.str.n);
    return (value){.k = V_STR, .u.str = {d, a.u.str.n + b.u.str.n}};
}

static value arith(rctx *x, int line, int op, value a, value b) {
    if (op == '+' && a.k == V_STR && b.k == V_STR) return concat_str(x, a, b);
    if (op == '+' && a.k == V_LIST && b.k == V_LIST) {
        vlist *l = new_list(x);
        for (int i = 0; l && i < a.u.list->n; i++) list_push(x, l, a.u.list->v[i]);
        for (int i = 0; l && i < b.u.list->n; i++) list_push(x, l, b.u.list->v[i]);
        return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
    }
    if (op == '*' && a.k == V_STR && b.k == V_INT) {
        value r = str_val(x, "", 0);
        for (long long i = 0; i < b.u.i && !x->failed && i < 100000; i++) r = concat_str(x, r, a);
        return r;
    }
    if (!is_num(a) || !is_num(b))
        return fail(x, line, "unsupported operand types for '%c': %s and %s", op < 256 ? op : '/',
                    kind_name(a), kind_name(b));
    const int ints = a.k != V_FLOAT && b.k != V_FLOAT;
    const long long i = inum(a), j = inum(b);
    const double f = num(a), g = num(b);
    switch (op) {
    case '+': return ints ? int_val(i + j) : (value){.k = V_FLOAT, .u.f = f + g};
    case '-': return ints ? int_val(i - j) : (value){.k = V_FLOAT, .u.f = f - g};
    case '*': return ints ? int_val(i * j) : (value){.k = V_FLOAT, .u.f = f * g};
    case '/': return g == 0 ? fail(x, line, "division by zero") : (value){.k = V_FLOAT, .u.f = f / g};
    case OP_FLOORDIV:
    case '%':
        if (!ints) return fail(x, line, "'//' and '%%' take integers here");
        if (j == 0) return fail(x, line, "division by zero");
        {
            long long q = i / j, r = i % j;
            if (r != 0 && ((r < 0) != (j < 0))) q--, r += j; /* Python's floor semantics */
            return int_val(op == '%' ? r : q);
        }
    default: return fail(x, line, "unsupported operator");
    }
}

/* ---- names --------------------------------------------------------------------- */

static value lookup(rctx *x, const char *name) {
    for (scope *s = x->sc; s; s = s->up)
        for (int i = s->d.n - 1; i >= 0; i--)
            if (!strcmp(s->d.keys[i], name)) return s->d.vals[i];
    return UNDEF;
}

static void bind(rctx *x, const char *name, value v) { dict_set(x, &x->sc->d, name, v); }

/* ---- filters, tests, methods ---------------------------------------------------- */

static value eval(rctx *x, const expr *e);

static value strip(rctx *x, value v, const char *chars, int left, int right) {
    const char *set = chars ? chars : " \t\n\r\f\v";
    size_t a = 0, b = v.u.str.n;
    while (left && a < b && strchr(set, v.u.str.s[a])) a++;
    while (right && b > a && strchr(set, v.u.str.s[b - 1])) b--;
    return str_val(x, v.u.str.s + a, b - a);
}

/* Case mapping of one code point: ASCII, Latin-1, Latin Extended-A,
 * Greek and Cyrillic letters (Python maps every script; others stay). */
static unsigned case_map(unsigned c, int upper, int *letter) {
    *letter = 1;
    if (c < 0x80) {
        *letter = isalpha((int)c) != 0;
        return upper ? (unsigned)toupper((int)c) : (unsigned)tolower((int)c);
    }
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) ||
        (c >= 0x410 && c <= 0x42F))
        return upper ? c : c + 0x20;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) ||
        (c >= 0x430 && c <= 0x44F))
        return upper ? c - 0x20 : c;
    if (c >= 0x400 && c <= 0x40F) return upper ? c : c + 0x50;
    if (c >= 0x450 && c <= 0x45F) return upper ? c - 0x50 : c;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
        const int odd_upper =
            (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E); /* pairs start odd there */
        const int is_upper = odd_upper ? (c & 1) : !(c & 1);
        return upper == is_upper ? c : upper ? c - 1 : c + 1;
    }
    *letter = 0;
    return c;
}

static value map_case(rctx *x, value v, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    sbuf o = {0};
    int start = 1, first = 1;
    for (size_t i = 0; i < v.u.str.n;) {
        const unsigned char b = (unsigned char)v.u.str.s[i];
        const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        if (n > 2 || i + (size_t)n > v.u.str.n) { /* beyond the mapped ranges: as is */
            const size_t k = i + (size_t)n > v.u.str.n ? v.u.str.n - i : (size_t)n;
            sb_add(x, &o, v.u.str.s + i, k);
            i += k;
            start = 1;
            first = 0;
            continue;
        }
        unsigned c = n == 1 ? b : ((b & 0x1Fu) << 6) | ((unsigned char)v.u.str.s[i + 1] & 0x3Fu);
        int letter;
        const int up = mode == 1 || (mode == 2 && start) || (mode == 3 && first);
        c = case_map(c, up, &letter);
        char e[2];
        if (c < 0x80) e[0] = (char)c;
        else e[0] = (char)(0xC0 | (c >> 6)), e[1] = (char)(0x80 | (c & 0x3F));
        sb_add(x, &o, e, c < 0x80 ? 1 : 2);
        start = !letter;
        first = 0;
        i += (size_t)n;
    }
    value r = str_val(x, o.b ? o.b : "", o.n);
    free(o.b);
    return r;
}

static value replace(rctx *x, value s, value a, value b) {
    if (s.k != V_STR || a.k != V_STR || b.k != V_STR || a.u.str.n == 0) return s;
    sbuf o = {0};
    for (size_t i = 0; i < s.u.str.n;) {
        if (i + a.u.str.n <= s.u.str.n && !memcmp(s.u.str.s + i, a.u.str.s, a.u.str.n)) {
            sb_add(x, &o, b.u.str.s, b.u.str.n);
            i += a.u.str.n;
        } else {
            sb_add(x, &o, s.u.str.s + i++, 1);
        }
    }
    value r = str_val(x, o.b ? o.b : "", o.n);
    free(o.b);
    return r;
}

static value items(rctx *x, value d) {
    vlist *l = new_list(x);
    for (int i = 0; l && i < d.u.dict->n; i++) {
        vlist *p = new_list(x);
        if (!p) break;
        list_push(x, p, str_val(x, d.u.dict->keys[i], strlen(d.u.dict->keys[i])));
        list_push(x, p, d.u.dict->vals[i]);
        list_push(x, l, (value){.k = V_LIST, .u.list = p});
    }
    return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
}

static value arg(rctx *x, const expr *e, int i, const char *kw) {
    for (int k = 0; k < e->nargs; k++)
        if (e->kw[k] && kw && !strcmp(e->kw[k], kw)) return eval(x, e->args[k]);
    int pos = 0;
    for (int k = 0; k < e->nargs; k++)
        if (!e->kw[k] && pos++ == i) return eval(x, e->args[k]);
    return UNDEF;
}

static value length(rctx *x, int line, value v) {
    if (v.k == V_STR) { /* characters, not bytes */
        long long n = 0;
        for (size_t i = 0; i < v.u.str.n; i++) n += ((unsigned char)v.u.str.s[i] & 0xC0) != 0x80;
        return int_val(n);
    }
    if (v.k == V_LIST) return int_val(v.u.list->n);
    if (v.k == V_DICT) return int_val(v.u.dict->n);
    return fail(x, line, "%s has no length", kind_name(v));
}

static value filter(rctx *x, const expr *e) {
    value v = eval(x, e->a);
    const char *f = e->name;
    if (x->failed) return UNDEF;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const int boolean = truthy(arg(x, e, 1, "boolean"));
        return v.k == V_UNDEF || (boolean && !truthy(v)) ? arg(x, e, 0, "default_value") : v;
    }
    if (v.k == V_UNDEF) return fail(x, e->line, "filter '%s' on an undefined value", f);
    if (!strcmp(f, "safe")) return v;
    if (!strcmp(f, "string")) return to_str(x, v);
    if (!strcmp(f, "length") || !strcmp(f, "count")) return length(x, e->line, v);
    if (!strcmp(f, "tojson")) {
        sbuf s = {0};
        to_json(x, &s, v);
        value r = str_val(x, s.b ? s.b : "", s.n);
        free(s.b);
        return r;
    }
    if (!strcmp(f, "int")) return v.k == V_STR ? int_val(strtoll(v.u.str.s, NULL, 10)) : int_val(inum(v));
    if (!strcmp(f, "list")) {
        if (v.k == V_LIST) return v;
        if (v.k == V_DICT) return items(x, v);
    }
    if (!strcmp(f, "items") && v.k == V_DICT) return items(x, v);
    if ((!strcmp(f, "first") || !strcmp(f, "last")) && v.k == V_LIST)
        return v.u.list->n ? v.u.list->v[f[0] == 'f' ? 0 : v.u.list->n - 1] : UNDEF;
    if (!strcmp(f, "join") && v.k == V_LIST) {
        value sep = arg(x, e, 0, "d"), r = str_val(x, "", 0);
        for (int i = 0; i < v.u.list->n && !x->failed; i++) {
            if (i && sep.k == V_STR) r = concat_str(x, r, sep);
            r = concat_str(x, r, v.u.list->v[i]);
        }
        return r;
    }
    if (v.k == V_STR) {
        if (!strcmp(f, "trim")) return strip(x, v, NULL, 1, 1);
        if (!strcmp(f, "lower")) return map_case(x, v, 0);
        if (!strcmp(f, "upper")) return map_case(x, v, 1);
        if (!strcmp(f, "title")) return map_case(x, v, 2);
        if (!strcmp(f, "capitalize")) return map_case(x, v, 3);
        if (!strcmp(f, "replace")) return replace(x, v, arg(x, e, 0, "old"), arg(x, e, 1, "new"));
    }
    return fail(x, e->line, "unsupported filter '%s' on %s", f, kind_name(v));
}

static value test(rctx *x, const expr *e) {
    value v = eval(x, e->a);
    const char *t = e->name;
    int r;
    if (!strcmp(t, "defined")) r = v.k != V_UNDEF;
    else if (!strcmp(t, "undefined")) r = v.k == V_UNDEF;
    else if (!strcmp(t, "none")) r = v.k == V_NONE;
    else if (!strcmp(t, "string")) r = v.k == V_STR;
    else if (!strcmp(t, "number")) r = v.k == V_INT || v.k == V_FLOAT;
    else if (!strcmp(t, "integer")) r = v.k == V_INT;
    else if (!strcmp(t, "boolean")) r = v.k == V_BOOL;
    else if (!strcmp(t, "true") || !strcmp(t, "false")) r = v.k == V_BOOL && v.u.b == (t[0] == 't');
    else if (!strcmp(t, "mapping")) r = v.k == V_DICT;
    else if (!strcmp(t, "iterable")) r = v.k == V_LIST || v.k == V_DICT || v.k == V_STR;
    else if (!strcmp(t, "sequence")) r = v.k == V_LIST || v.k == V_STR || v.k == V_DICT;
    else if (!strcmp(t, "even") || !strcmp(t, "odd")) r = v.k == V_INT && (v.u.i % 2 != 0) == (t[0] == 'o');
    else if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "sameas"))
        r = equal(v, arg(x, e, 0, NULL));
    else return fail(x, e->line, "unsupported test '%s'", t);
    return bool_val(r != e->op);
}

static value method(rctx *x, const expr *e, value obj, const char *m) {
    if (obj.k == V_STR) {
        value a = arg(x, e, 0, NULL);
        const char *chars = a.k == V_STR ? chat_strndup(&x->pool, a.u.str.s, a.u.str.n) : NULL;
        if (!strcmp(m, "strip")) return strip(x, obj, chars, 1, 1);
        if (!strcmp(m, "lstrip")) return strip(x, obj, chars, 1, 0);
        if (!strcmp(m, "rstrip")) return strip(x, obj, chars, 0, 1);
        if (!strcmp(m, "lower")) return map_case(x, obj, 0);
        if (!strcmp(m, "upper")) return map_case(x, obj, 1);
        if (!strcmp(m, "title")) return map_case(x, obj, 2);
        if (!strcmp(m, "capitalize")) return map_case(x, obj, 3);
        if (!strcmp(m, "replace")) return replace(x, obj, a, arg(x, e, 1, NULL));
        if ((!strcmp(m, "startswith") || !strcmp(m, "endswith")) && a.k == V_STR) {
            if (a.u.str.n > obj.u.str.n) return bool_val(0);
            const char *at = m[0] == 's' ? obj.u.str.s : obj.u.str.s + obj.u.str.n - a.u.str.n;
            return bool_val(!memcmp(at, a.u.str.s, a.u.str.n));
        }
        if (!strcmp(m, "split")) {
            vlist *l = new_list(x);
            const char *s = obj.u.str.s, *end = s + obj.u.str.n;
            while (l && s <= end && !x->failed) {
                if (a.k == V_STR && a.u.str.n) {
                    const char *hit = memmem(s, (size_t)(end - s), a.u.str.s, a.u.str.n);
                    const char *stop = hit ? hit : end;
                    list_push(x, l, str_val(x, s, (size_t)(stop - s)));
                    if (!hit) break;
                    s = hit + a.u.str.n;
                } else { /* on runs of whitespace */
                    while (s < end && isspace((unsigned char)*s)) s++;
                    if (s == end) break;
                    const char *w = s;
                    while (s < end && !isspace((unsigned char)*s)) s++;
                    list_push(x, l, str_val(x, w, (size_t)(s - w)));
                }
            }
            return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
        }
    }
    if (obj.k == V_DICT) {
        if (!strcmp(m, "items")) return items(x, obj);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            vlist *l = new_list(x);
            for (int i = 0; l && i < obj.u.dict->n; i++)
                list_push(x, l,
                          m[0] == 'k' ? str_val(x, obj.u.dict->keys[i], strlen(obj.u.dict->keys[i]))
                                      : obj.u.dict->vals[i]);
            return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
        }
        if (!strcmp(m, "get")) {
            value k = to_str(x, arg(x, e, 0, NULL)), d = arg(x, e, 1, NULL);
            if (x->failed) return UNDEF;
            value r = dict_get(obj.u.dict, chat_strndup(&x->pool, k.u.str.s, k.u.str.n));
            return r.k == V_UNDEF ? (d.k == V_UNDEF ? (value){.k = V_NONE} : d) : r;
        }
    }
    return fail(x, e->line, "unsupported method '%s' of %s", m, kind_name(obj));
}

static value call(rctx *x, const expr *e) {
    if (e->a->k == E_ATTR) {
        value obj = eval(x, e->a->a);
        if (x->failed) return UNDEF;
        if (obj.k != V_DICT || dict_get(obj.u.dict, e->a->name).k == V_UNDEF)
            return method(x, e, obj, e->a->name);
    }
    value f = eval(x, e->a);
    if (x->failed) return UNDEF;
    if (f.k != V_FUNC) return fail(x, e->line, "calling %s, which is not a function", kind_name(f));
    if (f.u.fn == F_RAISE) {
        value m = to_str(x, arg(x, e, 0, NULL));
        return fail(x, -1, "%.*s", (int)(m.k == V_STR ? m.u.str.n : 0), m.k == V_STR ? m.u.str.s : "");
    }
    if (f.u.fn == F_NAMESPACE) {
        vdict *d = chat_alloc(&x->pool, sizeof *d);
        if (!d) return fail(x, 0, "out of memory");
        for (int i = 0; i < e->nargs; i++)
            if (e->kw[i]) dict_set(x, d, e->kw[i], eval(x, e->args[i]));
        return (value){.k = V_DICT, .u.dict = d};
    }
    value a = arg(x, e, 0, NULL), b = arg(x, e, 1, NULL); /* range */
    long long lo = b.k == V_UNDEF ? 0 : inum(a), hi = b.k == V_UNDEF ? inum(a) : inum(b);
    vlist *l = new_list(x);
    if (hi - lo > 1000000) return fail(x, e->line, "range too long");
    for (long long i = lo; l && i < hi; i++) list_push(x, l, int_val(i));
    return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
}

static value subscript(rctx *x, const expr *e) {
    value a = eval(x, e->a), b = e->b ? eval(x, e->b) : UNDEF;
    if (x->failed) return UNDEF;
    if (a.k == V_UNDEF) return fail(x, e->line, "indexing an undefined value");
    if (e->k == E_SLICE) {
        long long n = a.k == V_LIST ? a.u.list->n : a.k == V_STR ? (long long)a.u.str.n : -1;
        if (n < 0) return fail(x, e->line, "slicing %s", kind_name(a));
        value c = e->c ? eval(x, e->c) : UNDEF;
        long long lo = b.k == V_UNDEF || b.k == V_NONE ? 0 : inum(b),
                  hi = c.k == V_UNDEF || c.k == V_NONE ? n : inum(c);
        if (lo < 0) lo += n;
        if (hi < 0) hi += n;
        lo = lo < 0 ? 0 : lo > n ? n : lo;
        hi = hi < lo ? lo : hi > n ? n : hi;
        if (a.k == V_STR) return str_val(x, a.u.str.s + lo, (size_t)(hi - lo));
        vlist *l = new_list(x);
        for (long long i = lo; l && i < hi; i++) list_push(x, l, a.u.list->v[i]);
        return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
    }
    if (a.k == V_DICT && b.k == V_STR)
        return dict_get(a.u.dict, chat_strndup(&x->pool, b.u.str.s, b.u.str.n));
    if ((a.k == V_LIST || a.k == V_STR) && (b.k == V_INT || b.k == V_BOOL)) {
        long long n = a.k == V_LIST ? a.u.list->n : (long long)a.u.str.n, i = inum(b);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return UNDEF;
        return a.k == V_LIST ? a.u.list->v[i] : str_val(x, a.u.str.s + i, 1);
    }
    return fail(x, e->line, "cannot index %s with %s", kind_name(a), kind_name(b));
}

static value eval(rctx *x, const expr *e) {
    if (x->failed) return UNDEF;
    if (++x->steps > STEPS_MAX) return fail(x, e->line, "the template runs too long");
    value a, b;
    int c;
    switch (e->k) {
    case E_LIT: return e->lit;
    case E_NAME: return lookup(x, e->name);
    case E_ATTR:
        a = eval(x, e->a);
        if (a.k == V_DICT) return dict_get(a.u.dict, e->name);
        if (a.k == V_UNDEF && !x->failed) return fail(x, e->line, "'%s' of an undefined value", e->name);
        return UNDEF;
    case E_INDEX:
    case E_SLICE: return subscript(x, e);
    case E_CALL: return call(x, e);
    case E_FILTER: return filter(x, e);
    case E_TEST: return test(x, e);
    case E_UNARY:
        a = eval(x, e->a);
        if (e->op == 'n') return bool_val(!truthy(a));
        if (!is_num(a)) return fail(x, e->line, "unary '%c' on %s", e->op, kind_name(a));
        return e->op == '+' ? a : a.k == V_FLOAT ? (value){.k = V_FLOAT, .u.f = -a.u.f} : int_val(-inum(a));
    case E_COND: return truthy(eval(x, e->b)) ? eval(x, e->a) : e->c ? eval(x, e->c) : UNDEF;
    case E_LIST: {
        vlist *l = new_list(x);
        for (int i = 0; l && i < e->nargs; i++) list_push(x, l, eval(x, e->args[i]));
        return l ? (value){.k = V_LIST, .u.list = l} : UNDEF;
    }
    case E_DICT: {
        vdict *d = chat_alloc(&x->pool, sizeof *d);
        if (!d) return fail(x, 0, "out of memory");
        for (int i = 0; i + 1 < e->nargs && !x->failed; i += 2) {
            value k = to_str(x, eval(x, e->args[i]));
            if (k.k == V_STR)
                dict_set(x, d, chat_strndup(&x->pool, k.u.str.s, k.u.str.n), eval(x, e->args[i + 1]));
        }
        return (value){.k = V_DICT, .u.dict = d};
    }
    case E_BINARY: break;
    }
    a = eval(x, e->a);
    if (e->op == OP_AND) return truthy(a) ? eval(x, e->b) : a;
    if (e->op == OP_OR) return truthy(a) ? a : eval(x, e->b);
    b = eval(x, e->b);
    if (x->failed) return UNDEF;
    switch (e->op) {
    case OP_EQ: return bool_val(equal(a, b));
    case OP_NE: return bool_val(!equal(a, b));
    case OP_IN: return bool_val(contains(x, e->line, b, a));
    case OP_NOTIN: return bool_val(!contains(x, e->line, b, a));
    case '~': return concat_str(x, a, b);
    case '<': return compare(x, e->line, a, b, &c) ? bool_val(c < 0) : UNDEF;
    case '>': return compare(x, e->line, a, b, &c) ? bool_val(c > 0) : UNDEF;
    case OP_LE: return compare(x, e->line, a, b, &c) ? bool_val(c <= 0) : UNDEF;
    case OP_GE: return compare(x, e->line, a, b, &c) ? bool_val(c >= 0) : UNDEF;
    case OP_POW: {
        long long r = 1;
        for (long long i = 0; i < inum(b) && i < 64; i++) r *= inum(a);
        return int_val(r);
    }
    default: return arith(x, e->line, e->op, a, b);
    }
}

/* ---- statements ------------------------------------------------------------------- */

static void exec(rctx *x, const node_list *l);

static void emit(rctx *x, const char *s, size_t n) {
    sbuf b = {x->out, x->len, x->cap};
    sb_add(x, &b, s, n);
    x->out = b.b, x->len = b.n, x->cap = b.cap;
}

static void run_for(rctx *x, const node *n) {
    value seq = eval(x, n->e);
    if (x->failed) return;
    if (seq.k == V_DICT) { /* a dict iterates over its keys */
        vlist *keys = new_list(x);
        for (int i = 0; keys && i < seq.u.dict->n; i++)
            list_push(x, keys, str_val(x, seq.u.dict->keys[i], strlen(seq.u.dict->keys[i])));
        seq = keys ? (value){.k = V_LIST, .u.list = keys} : UNDEF;
    }
    if (seq.k == V_UNDEF || seq.k == V_NONE) seq = (value){.k = V_LIST, .u.list = new_list(x)};
    if (seq.k != V_LIST) {
        fail(x, n->line, "cannot loop over %s", kind_name(seq));
        return;
    }
    scope sc = {.up = x->sc};
    x->sc = &sc;
    vlist *items_ = new_list(x); /* the items the loop filter keeps */
    for (int i = 0; items_ && i < seq.u.list->n && !x->failed; i++) {
        value it = seq.u.list->v[i];
        if (n->var2) {
            if (it.k != V_LIST || it.u.list->n != 2) {
                fail(x, n->line, "cannot unpack %s into two names", kind_name(it));
                break;
            }
            bind(x, n->var, it.u.list->v[0]);
            bind(x, n->var2, it.u.list->v[1]);
        } else {
            bind(x, n->var, it);
        }
        if (!n->filter || truthy(eval(x, n->filter))) list_push(x, items_, it);
    }
    const int len = items_ ? items_->n : 0;
    for (int i = 0; i < len && !x->failed; i++) {
        value it = items_->v[i];
        if (n->var2) bind(x, n->var, it.u.list->v[0]), bind(x, n->var2, it.u.list->v[1]);
        else bind(x, n->var, it);
        vdict *lp = chat_alloc(&x->pool, sizeof *lp);
        if (!lp) {
            fail(x, 0, "out of memory");
            break;
        }
        dict_set(x, lp, "index", int_val(i + 1));
        dict_set(x, lp, "index0", int_val(i));
        dict_set(x, lp, "revindex", int_val(len - i));
        dict_set(x, lp, "revindex0", int_val(len - i - 1));
        dict_set(x, lp, "first", bool_val(i == 0));
        dict_set(x, lp, "last", bool_val(i == len - 1));
        dict_set(x, lp, "length", int_val(len));
        dict_set(x, lp, "previtem", i > 0 ? items_->v[i - 1] : UNDEF);
        dict_set(x, lp, "nextitem", i + 1 < len ? items_->v[i + 1] : UNDEF);
        bind(x, "loop", (value){.k = V_DICT, .u.dict = lp});
        exec(x, &n->body);
        if (x->ctl == 1) {
            x->ctl = 0;
            break;
        }
        x->ctl = 0;
    }
    x->sc = sc.up;
    if (len == 0 && !x->failed) exec(x, &n->else_body);
}

static void exec(rctx *x, const node_list *l) {
    for (int i = 0; i < l->n && !x->failed && !x->ctl; i++) {
        const node *n = l->v[i];
        if (++x->steps > STEPS_MAX) {
            fail(x, n->line, "the template runs too long");
            return;
        }
        switch (n->k) {
        case N_TEXT: emit(x, n->text, n->len); break;
        case N_OUT: {
            value v = to_str(x, eval(x, n->e));
            if (!x->failed) emit(x, v.u.str.s, v.u.str.n);
            break;
        }
        case N_IF:
            for (int b = 0; b < n->n_branch && !x->failed; b++)
                if (!n->cond[b] || truthy(eval(x, n->cond[b]))) {
                    exec(x, &n->branch[b]);
                    break;
                }
            break;
        case N_FOR: run_for(x, n); break;
        case N_SET: {
            value v = eval(x, n->e);
            if (!n->attr) {
                bind(x, n->var, v);
                break;
            }
            value ns = lookup(x, n->var);
            if (ns.k != V_DICT) fail(x, n->line, "'%s' is not a namespace", n->var);
            else dict_set(x, ns.u.dict, n->attr, v);
            break;
        }
        case N_BREAK: x->ctl = 1; break;
        case N_CONTINUE: x->ctl = 2; break;
        }
    }
}

loom_status loom_chat_template_render(const loom_chat_template *t, const loom_chat_message *m, int n,
                                      const loom_chat_vars *v, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    rctx x = {0};
    scope globals = {0};
    x.sc = &globals;
    vlist *msgs = new_list(&x);
    for (int i = 0; msgs && i < n && !x.failed; i++) {
        vdict *d = chat_alloc(&x.pool, sizeof *d);
        if (!d) {
            fail(&x, 0, "out of memory");
            break;
        }
        dict_set(&x, d, "role", str_val(&x, m[i].role, strlen(m[i].role)));
        dict_set(&x, d, "content",
                 m[i].content ? str_val(&x, m[i].content, strlen(m[i].content)) : (value){.k = V_NONE});
        if (m[i].name) dict_set(&x, d, "name", str_val(&x, m[i].name, strlen(m[i].name)));
        list_push(&x, msgs, (value){.k = V_DICT, .u.dict = d});
    }
    if (msgs) bind(&x, "messages", (value){.k = V_LIST, .u.list = msgs});
    bind(&x, "add_generation_prompt", bool_val(v->add_generation_prompt));
    if (v->bos_token) bind(&x, "bos_token", str_val(&x, v->bos_token, strlen(v->bos_token)));
    if (v->eos_token) bind(&x, "eos_token", str_val(&x, v->eos_token, strlen(v->eos_token)));
    bind(&x, "raise_exception", (value){.k = V_FUNC, .u.fn = F_RAISE});
    bind(&x, "namespace", (value){.k = V_FUNC, .u.fn = F_NAMESPACE});
    bind(&x, "range", (value){.k = V_FUNC, .u.fn = F_RANGE});
    if (!x.failed) exec(&x, &t->top);
    if (!x.failed && !x.out) emit(&x, "", 0);
    chat_pool_free(&x.pool);
    if (x.failed) {
        free(x.out);
        return loom_fail(LOOM_EUSAGE, "%s", x.err);
    }
    *out = x.out;
    *len = x.len;
    return LOOM_OK;
}
