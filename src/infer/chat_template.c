/* chat_template.c - the parsing half of the chat-template engine
 * (include/loom/chat_template.h): the template text is cut into text, {{ }}
 * and {% %} segments with Jinja's whitespace rules as transformers sets them
 * (trim_blocks: the newline after a block tag goes; lstrip_blocks: spaces
 * before a block tag alone on its line go; '-' strips all whitespace on its
 * side, '+' keeps it), then each tag is parsed by recursive descent into the
 * tree of chat_internal.h, which chat_render.c evaluates. Also the default
 * (ChatML) template and tokenizer_config.json. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/chat_internal.h"

const char *const LOOM_CHAT_TEMPLATE_CHATML =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

void *chat_alloc(chat_pool *pl, size_t bytes) {
    if (pl->n == pl->cap) {
        size_t nc = pl->cap ? 2 * pl->cap : 64;
        void **p = realloc(pl->p, nc * sizeof *p);
        if (!p) return NULL;
        pl->p = p;
        pl->cap = nc;
    }
    void *m = calloc(1, bytes ? bytes : 1);
    if (m) pl->p[pl->n++] = m;
    return m;
}

char *chat_strndup(chat_pool *pl, const char *s, size_t n) {
    char *d = chat_alloc(pl, n + 1);
    if (d) memcpy(d, s, n);
    return d;
}

void chat_pool_free(chat_pool *pl) {
    for (size_t i = 0; i < pl->n; i++) free(pl->p[i]);
    free(pl->p);
    memset(pl, 0, sizeof *pl);
}

/* ---- segments ------------------------------------------------------------------- */

typedef enum skind { S_TEXT, S_VAR, S_BLOCK } skind;
typedef struct seg {
    skind k;
    const char *s;
    size_t n;
    int line;
} seg;

typedef struct parser {
    chat_pool *pool;
    const char *src;
    seg *segs;
    int n_segs, at;
    /* the tokens of the current tag */
    const char *t, *end; /* the tag's remaining text */
    int line;
    char err[240];
    int depth;
} parser;

static int line_of(const char *src, const char *p) {
    int l = 1;
    for (const char *c = src; c < p; c++) l += *c == '\n';
    return l;
}

static int perr(parser *p, const char *fmt, const char *what) {
    if (!p->err[0]) {
        char m[160];
        snprintf(m, sizeof m, fmt, what);
        snprintf(p->err, sizeof p->err, "chat template line %d: %s", p->line, m);
    }
    return 0;
}

static int push_seg(parser *p, skind k, const char *s, size_t n, int line, int *cap) {
    if (k == S_TEXT && n == 0) return 1;
    if (p->n_segs == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        seg *ns = realloc(p->segs, sizeof *ns * (size_t)*cap);
        if (!ns) return perr(p, "%s", "out of memory");
        p->segs = ns;
    }
    p->segs[p->n_segs++] = (seg){k, s, n, line};
    return 1;
}

/* End of the tag opened at s (after its 2 characters): the position of the
 * closing delimiter, skipping string literals; NULL if none. */
static const char *tag_end(const char *s, const char *end, char close) {
    for (const char *c = s; c + 1 < end; c++) {
        if (close != '#' && (*c == '\'' || *c == '"')) {
            const char q = *c;
            for (c++; c < end && *c != q; c++)
                if (*c == '\\') c++;
            if (c >= end) return NULL;
            continue;
        }
        if (*c == close && c[1] == '}') return c;
    }
    return NULL;
}

static int lex(parser *p, const char *src, size_t len) {
    const char *end = src + len, *text = src;
    int cap = 0, line_starting = 1, strip_next = 0;
    while (text <= end) {
        const char *tag = text;
        while (tag + 1 < end && !(tag[0] == '{' && (tag[1] == '{' || tag[1] == '%' || tag[1] == '#'))) tag++;
        if (tag + 1 >= end) tag = end;
        const char *ts = text, *te = tag;
        if (strip_next)
            while (ts < te && isspace((unsigned char)*ts)) ts++;
        if (tag == end) return push_seg(p, S_TEXT, ts, (size_t)(te - ts), line_of(src, ts), &cap);
        const char kind = tag[1], mod = tag + 2 < end ? tag[2] : 0;
        if (mod == '-') {
            while (te > ts && isspace((unsigned char)te[-1])) te--;
        } else if (kind != '{' && mod != '+') { /* lstrip_blocks */
            const char *nl = te;
            while (nl > ts && nl[-1] != '\n') nl--;
            int blank = 1;
            for (const char *c = nl; c < te; c++) blank &= *c == ' ' || *c == '\t';
            if (blank && (nl > ts || line_starting)) te = nl;
        }
        if (!push_seg(p, S_TEXT, ts, (size_t)(te - ts), line_of(src, ts), &cap)) return 0;
        const char close = kind == '{' ? '}' : kind;
        const char *body = tag + 2 + (mod == '-' || mod == '+');
        const char *ce = tag_end(body, end, close);
        p->line = line_of(src, tag);
        if (!ce) return perr(p, "%s", "a tag is not closed");
        const char *be = ce;
        const char rmod = ce > body ? ce[-1] : 0;
        if (rmod == '-' || (rmod == '+' && kind != '{')) be--;
        if (kind != '#' &&
            !push_seg(p, kind == '{' ? S_VAR : S_BLOCK, body, (size_t)(be - body), p->line, &cap))
            return 0;
        text = ce + 2;
        strip_next = rmod == '-';
        line_starting = 0;
        if (kind != '{' && rmod != '+' && rmod != '-' && text < end && *text == '\n') { /* trim_blocks */
            text++;
            line_starting = 1;
        }
    }
    return 1;
}

/* ---- expression tokens ---------------------------------------------------------- */

static void skip_ws(parser *p) {
    while (p->t < p->end && isspace((unsigned char)*p->t)) p->t++;
}

static int at_end(parser *p) {
    skip_ws(p);
    return p->t >= p->end;
}

/* Is the next token the word w (a whole name)? Consumes it if so. */
static int word(parser *p, const char *w) {
    skip_ws(p);
    size_t n = strlen(w);
    if ((size_t)(p->end - p->t) < n || strncmp(p->t, w, n) != 0) return 0;
    if (p->t + n < p->end && (isalnum((unsigned char)p->t[n]) || p->t[n] == '_')) return 0;
    p->t += n;
    return 1;
}

static int peek_word(parser *p, const char *w) {
    const char *save = p->t;
    int r = word(p, w);
    p->t = save;
    return r;
}

/* Is the next token the operator op? Consumes it if so. */
static int sym(parser *p, const char *op) {
    skip_ws(p);
    size_t n = strlen(op);
    if ((size_t)(p->end - p->t) < n || strncmp(p->t, op, n) != 0) return 0;
    if (n == 1 && p->t + 1 < p->end) { /* '=' is not '==', '/' not '//', '*' not '**' ... */
        const char a = op[0], b = p->t[1];
        if ((a == '=' || a == '!' || a == '<' || a == '>') && b == '=') return 0;
        if ((a == '/' && b == '/') || (a == '*' && b == '*')) return 0;
    }
    p->t += n;
    return 1;
}

static const char *name(parser *p) {
    skip_ws(p);
    const char *s = p->t;
    if (s >= p->end || !(isalpha((unsigned char)*s) || *s == '_')) return NULL;
    while (p->t < p->end && (isalnum((unsigned char)*p->t) || *p->t == '_')) p->t++;
    return chat_strndup(p->pool, s, (size_t)(p->t - s));
}

static expr *mk(parser *p, ekind k) {
    expr *e = chat_alloc(p->pool, sizeof *e);
    if (!e) return perr(p, "%s", "out of memory"), NULL;
    e->k = k;
    e->line = p->line;
    return e;
}

static int add_arg(parser *p, expr *e, expr *a, const char *kw) {
    if (!a) return 0;
    expr **na = chat_alloc(p->pool, sizeof *na * (size_t)(e->nargs + 1));
    const char **nk = chat_alloc(p->pool, sizeof *nk * (size_t)(e->nargs + 1));
    if (!na || !nk) return perr(p, "%s", "out of memory");
    if (e->nargs) {
        memcpy(na, e->args, sizeof *na * (size_t)e->nargs);
        memcpy(nk, e->kw, sizeof *nk * (size_t)e->nargs);
    }
    na[e->nargs] = a;
    nk[e->nargs] = kw;
    e->args = na;
    e->kw = nk;
    e->nargs++;
    return 1;
}

/* ---- expressions ----------------------------------------------------------------- */

static expr *parse_expr(parser *p);
static expr *parse_or(parser *p);

static expr *string_lit(parser *p) {
    const char q = *p->t++;
    char *buf = chat_alloc(p->pool, (size_t)(p->end - p->t) + 1);
    size_t n = 0;
    if (!buf) return perr(p, "%s", "out of memory"), NULL;
    while (p->t < p->end && *p->t != q) {
        char c = *p->t++;
        if (c == '\\' && p->t < p->end) {
            c = *p->t++;
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        }
        buf[n++] = c;
    }
    if (p->t >= p->end) return perr(p, "%s", "a string is not closed"), NULL;
    p->t++;
    expr *e = mk(p, E_LIT);
    if (e) e->lit = (value){.k = V_STR, .u.str = {buf, n}};
    return e;
}

/* args after '(' up to ')': positional or name=value */
static int call_args(parser *p, expr *e) {
    if (sym(p, ")")) return 1;
    do {
        const char *save = p->t, *kw = name(p);
        if (!kw || !sym(p, "=")) {
            p->t = save;
            kw = NULL;
        }
        if (!add_arg(p, e, parse_expr(p), kw)) return 0;
    } while (sym(p, ","));
    return sym(p, ")") ? 1 : perr(p, "%s", "expected ')'");
}

static expr *primary(parser *p) {
    skip_ws(p);
    if (p->t >= p->end) return perr(p, "%s", "an expression is missing"), NULL;
    const char c = *p->t;
    if (c == '\'' || c == '"') return string_lit(p);
    if (isdigit((unsigned char)c)) {
        char *e_;
        expr *e = mk(p, E_LIT);
        const char *s = p->t;
        while (p->t < p->end && (isdigit((unsigned char)*p->t) || *p->t == '.' || *p->t == '_')) p->t++;
        char *num = chat_strndup(p->pool, s, (size_t)(p->t - s));
        if (!e || !num) return NULL;
        if (strchr(num, '.')) e->lit = (value){.k = V_FLOAT, .u.f = strtod(num, &e_)};
        else e->lit = (value){.k = V_INT, .u.i = strtoll(num, &e_, 10)};
        return e;
    }
    if (sym(p, "(")) {
        expr *e = parse_expr(p);
        if (e && sym(p, ",")) { /* a tuple: a list */
            expr *l = mk(p, E_LIST);
            if (!l || !add_arg(p, l, e, NULL)) return NULL;
            while (!sym(p, ")")) {
                if (!add_arg(p, l, parse_expr(p), NULL)) return NULL;
                if (!sym(p, ",") && !sym(p, ")")) return perr(p, "%s", "expected ')'"), NULL;
                if (p->t[-1] == ')') break;
            }
            return l;
        }
        return e && sym(p, ")") ? e : (perr(p, "%s", "expected ')'"), NULL);
    }
    if (sym(p, "[")) {
        expr *l = mk(p, E_LIST);
        if (!l) return NULL;
        while (!sym(p, "]")) {
            if (!add_arg(p, l, parse_expr(p), NULL)) return NULL;
            if (!sym(p, ",") && !sym(p, "]")) return perr(p, "%s", "expected ']'"), NULL;
            if (p->t[-1] == ']') break;
        }
        return l;
    }
    if (sym(p, "{")) {
        expr *d = mk(p, E_DICT);
        if (!d) return NULL;
        while (!sym(p, "}")) {
            if (!add_arg(p, d, parse_expr(p), NULL)) return NULL;
            if (!sym(p, ":")) return perr(p, "%s", "expected ':' in a dict"), NULL;
            if (!add_arg(p, d, parse_expr(p), NULL)) return NULL;
            if (!sym(p, ",") && !sym(p, "}")) return perr(p, "%s", "expected '}'"), NULL;
            if (p->t[-1] == '}') break;
        }
        return d;
    }
    const char *n = name(p);
    if (!n) return perr(p, "unexpected '%.20s'", p->t), NULL;
    expr *e = mk(p, E_LIT);
    if (!e) return NULL;
    if (!strcmp(n, "true") || !strcmp(n, "True")) e->lit = (value){.k = V_BOOL, .u.b = 1};
    else if (!strcmp(n, "false") || !strcmp(n, "False")) e->lit = (value){.k = V_BOOL, .u.b = 0};
    else if (!strcmp(n, "none") || !strcmp(n, "None")) e->lit = (value){.k = V_NONE};
    else e->k = E_NAME, e->name = n;
    return e;
}

static const char *const FILTERS[] = {"default", "d",     "safe",  "string",     "length",  "count", "tojson",
                                      "int",     "list",  "items", "first",      "last",    "join",  "trim",
                                      "lower",   "upper", "title", "capitalize", "replace", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none",  "string",  "number",   "integer",
                                    "boolean", "true",      "false", "mapping", "iterable", "sequence",
                                    "even",    "odd",       "eq",    "equalto", "sameas",   NULL};

static int known(const char *const *names, const char *n) {
    for (; *names; names++)
        if (!strcmp(*names, n)) return 1;
    return 0;
}

/* primary, then .attr, [index], [a:b], (args), | filter, is test */
static expr *postfix(parser *p) {
    expr *e = primary(p);
    while (e) {
        expr *x;
        if (sym(p, ".")) {
            if (!(x = mk(p, E_ATTR)) || !(x->name = name(p)))
                return perr(p, "%s", "expected a name after '.'"), NULL;
            x->a = e;
        } else if (sym(p, "[")) {
            expr *lo = NULL, *hi = NULL;
            if (!sym(p, ":")) {
                lo = parse_expr(p);
                if (!lo) return NULL;
                if (sym(p, "]")) {
                    if (!(x = mk(p, E_INDEX))) return NULL;
                    x->a = e, x->b = lo;
                    e = x;
                    continue;
                }
                if (!sym(p, ":")) return perr(p, "%s", "expected ']'"), NULL;
            }
            if (!sym(p, "]")) {
                if (!(hi = parse_expr(p)) || !sym(p, "]"))
                    return perr(p, "%s", "expected ']' (slice steps are not supported)"), NULL;
            }
            if (!(x = mk(p, E_SLICE))) return NULL;
            x->a = e, x->b = lo, x->c = hi;
        } else if (sym(p, "(")) {
            if (!(x = mk(p, E_CALL))) return NULL;
            x->a = e;
            if (!call_args(p, x)) return NULL;
        } else if (sym(p, "|")) {
            if (!(x = mk(p, E_FILTER)) || !(x->name = name(p)))
                return perr(p, "%s", "expected a filter name"), NULL;
            if (!known(FILTERS, x->name)) return perr(p, "unsupported filter '%s'", x->name), NULL;
            x->a = e;
            if (sym(p, "(") && !call_args(p, x)) return NULL;
        } else if (word(p, "is")) {
            if (!(x = mk(p, E_TEST))) return NULL;
            x->op = word(p, "not");
            if (!(x->name = name(p))) return perr(p, "%s", "expected a test name after 'is'"), NULL;
            if (!known(TESTS, x->name)) return perr(p, "unsupported test '%s'", x->name), NULL;
            x->a = e;
            if (sym(p, "(") && !call_args(p, x)) return NULL;
        } else {
            break;
        }
        e = x;
    }
    return e;
}

static expr *binary(parser *p, int op, expr *a, expr *b) {
    if (!a || !b) return NULL;
    expr *e = mk(p, E_BINARY);
    if (e) e->op = op, e->a = a, e->b = b;
    return e;
}

static expr *unary(parser *p) {
    if (++p->depth > 200) return perr(p, "%s", "expressions nested too deep"), NULL;
    expr *e;
    if (sym(p, "-") || sym(p, "+")) {
        const int op = p->t[-1];
        if ((e = mk(p, E_UNARY))) e->op = op, e->a = unary(p);
        e = e && e->a ? e : NULL;
    } else {
        e = postfix(p);
    }
    p->depth--;
    return e;
}

static expr *power(parser *p) {
    expr *e = unary(p);
    while (e && sym(p, "**")) e = binary(p, OP_POW, e, unary(p));
    return e;
}

static expr *math2(parser *p) {
    expr *e = power(p);
    for (;;) {
        if (sym(p, "//")) e = binary(p, OP_FLOORDIV, e, power(p));
        else if (sym(p, "*") || sym(p, "/") || sym(p, "%")) {
            const int op = p->t[-1];
            e = binary(p, op, e, power(p));
        } else return e;
    }
}

static expr *concat(parser *p) {
    expr *e = math2(p);
    while (e && sym(p, "~")) e = binary(p, '~', e, math2(p));
    return e;
}

static expr *math1(parser *p) {
    expr *e = concat(p);
    while (e && (sym(p, "+") || sym(p, "-"))) {
        const int op = p->t[-1];
        e = binary(p, op, e, concat(p));
    }
    return e;
}

static expr *compare(parser *p) {
    expr *e = math1(p);
    for (;;) {
        if (!e) return NULL;
        if (sym(p, "==")) e = binary(p, OP_EQ, e, math1(p));
        else if (sym(p, "!=")) e = binary(p, OP_NE, e, math1(p));
        else if (sym(p, "<=")) e = binary(p, OP_LE, e, math1(p));
        else if (sym(p, ">=")) e = binary(p, OP_GE, e, math1(p));
        else if (sym(p, "<")) e = binary(p, '<', e, math1(p));
        else if (sym(p, ">")) e = binary(p, '>', e, math1(p));
        else if (word(p, "in")) e = binary(p, OP_IN, e, math1(p));
        else if (peek_word(p, "not")) {
            const char *save = p->t;
            word(p, "not");
            if (!word(p, "in")) {
                p->t = save;
                return e;
            }
            e = binary(p, OP_NOTIN, e, math1(p));
        } else return e;
    }
}

static expr *parse_not(parser *p) {
    if (word(p, "not")) {
        expr *e = mk(p, E_UNARY);
        if (e) e->op = 'n', e->a = parse_not(p);
        return e && e->a ? e : NULL;
    }
    return compare(p);
}

static expr *parse_and(parser *p) {
    expr *e = parse_not(p);
    while (e && word(p, "and")) e = binary(p, OP_AND, e, parse_not(p));
    return e;
}

static expr *parse_or(parser *p) {
    expr *e = parse_and(p);
    while (e && word(p, "or")) e = binary(p, OP_OR, e, parse_and(p));
    return e;
}

static expr *parse_expr(parser *p) {
    expr *e = parse_or(p);
    if (e && word(p, "if")) {
        expr *c = mk(p, E_COND);
        if (!c) return NULL;
        c->a = e;
        if (!(c->b = parse_or(p))) return NULL;
        if (word(p, "else") && !(c->c = parse_expr(p))) return NULL;
        return c;
    }
    return e;
}

/* ---- statements -------------------------------------------------------------------- */

static int add_node(parser *p, node_list *l, node *n) {
    if (!n) return 0;
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 8;
        node **v = chat_alloc(p->pool, sizeof *v * (size_t)nc);
        if (!v) return perr(p, "%s", "out of memory");
        if (l->n) memcpy(v, l->v, sizeof *v * (size_t)l->n);
        l->v = v;
        l->cap = nc;
    }
    l->v[l->n++] = n;
    return 1;
}

static node *mknode(parser *p, nkind k) {
    node *n = chat_alloc(p->pool, sizeof *n);
    if (!n) return perr(p, "%s", "out of memory"), NULL;
    n->k = k;
    n->line = p->line;
    return n;
}

/* Point the token reader at segment i's tag text. */
static void enter(parser *p, int i) {
    p->t = p->segs[i].s;
    p->end = p->segs[i].s + p->segs[i].n;
    p->line = p->segs[i].line;
}

static int tag_done(parser *p) { return at_end(p) ? 1 : perr(p, "unexpected '%.30s' in a tag", p->t); }

static int parse_body(parser *p, node_list *out, const char *const *ends, const char **which);

static node *parse_if(parser *p) {
    node *n = mknode(p, N_IF);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    if (!n) return NULL;
    n->cond = chat_alloc(p->pool, sizeof *n->cond * 64);
    n->branch = chat_alloc(p->pool, sizeof *n->branch * 64);
    if (!n->cond || !n->branch) return perr(p, "%s", "out of memory"), NULL;
    expr *c = parse_expr(p);
    for (;;) {
        if (!c || !tag_done(p)) return NULL;
        if (n->n_branch == 63) return perr(p, "%s", "more than 63 elif branches"), NULL;
        const char *which;
        n->cond[n->n_branch] = c;
        if (!parse_body(p, &n->branch[n->n_branch++], ends, &which)) return NULL;
        if (!strcmp(which, "endif")) return tag_done(p) ? n : NULL;
        if (!strcmp(which, "else")) {
            if (!tag_done(p)) return NULL;
            static const char *const end_only[] = {"endif", NULL};
            n->cond[n->n_branch] = NULL;
            if (!parse_body(p, &n->branch[n->n_branch++], end_only, &which)) return NULL;
            return tag_done(p) ? n : NULL;
        }
        c = parse_expr(p); /* elif */
    }
}

static node *parse_for(parser *p) {
    node *n = mknode(p, N_FOR);
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *which;
    if (!n || !(n->var = name(p))) return perr(p, "%s", "expected a name after 'for'"), NULL;
    if (sym(p, ",") && !(n->var2 = name(p))) return perr(p, "%s", "expected a second name after ','"), NULL;
    if (!word(p, "in")) return perr(p, "%s", "expected 'in'"), NULL;
    if (!(n->e = parse_or(p))) return NULL;
    if (word(p, "if") && !(n->filter = parse_or(p))) return NULL;
    if (peek_word(p, "recursive")) return perr(p, "%s", "recursive loops are not supported"), NULL;
    if (!tag_done(p) || !parse_body(p, &n->body, ends, &which)) return NULL;
    if (!strcmp(which, "else")) {
        static const char *const end_only[] = {"endfor", NULL};
        if (!tag_done(p) || !parse_body(p, &n->else_body, end_only, &which)) return NULL;
    }
    return tag_done(p) ? n : NULL;
}

static node *parse_set(parser *p) {
    node *n = mknode(p, N_SET);
    if (!n || !(n->var = name(p))) return perr(p, "%s", "expected a name after 'set'"), NULL;
    if (sym(p, ".") && !(n->attr = name(p))) return perr(p, "%s", "expected a name after '.'"), NULL;
    if (!sym(p, "="))
        return perr(p, "%s", "block assignments ({% set x %}...{% endset %}) are not supported"), NULL;
    if (!(n->e = parse_expr(p)) || !tag_done(p)) return NULL;
    return n;
}

/* Segments up to one of ends (NULL: the end of the template); the tag that
 * ended the body is left in the reader, its keyword in *which. */
static int parse_body(parser *p, node_list *out, const char *const *ends, const char **which) {
    while (p->at < p->n_segs) {
        const seg *s = &p->segs[p->at];
        enter(p, p->at++);
        if (s->k == S_TEXT) {
            node *n = mknode(p, N_TEXT);
            if (!n) return 0;
            n->text = s->s;
            n->len = s->n;
            if (!add_node(p, out, n)) return 0;
            continue;
        }
        if (s->k == S_VAR) {
            node *n = mknode(p, N_OUT);
            if (!n || !(n->e = parse_expr(p)) || !tag_done(p) || !add_node(p, out, n)) return 0;
            continue;
        }
        const char *kw = name(p);
        if (!kw) return perr(p, "%s", "a tag without a keyword");
        for (int i = 0; ends && ends[i]; i++)
            if (!strcmp(kw, ends[i])) return (*which = ends[i]), 1;
        node *n = NULL;
        if (!strcmp(kw, "if")) n = parse_if(p);
        else if (!strcmp(kw, "for")) n = parse_for(p);
        else if (!strcmp(kw, "set")) n = parse_set(p);
        else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
            if ((n = mknode(p, kw[0] == 'b' ? N_BREAK : N_CONTINUE)) && !tag_done(p)) n = NULL;
        } else if (!strcmp(kw, "generation") || !strcmp(kw, "endgeneration")) {
            continue; /* transformers' assistant-mask markers: no output */
        } else {
            return perr(p, "unsupported tag '%s'", kw);
        }
        if (!add_node(p, out, n)) return 0;
    }
    if (ends) {
        const char *last = ends[0];
        for (int i = 0; ends[i]; i++) last = ends[i];
        return perr(p, "missing '{%% %s %%}'", last);
    }
    return 1;
}

loom_status loom_chat_template_parse(const char *src, size_t len, loom_chat_template **out) {
    *out = NULL;
    loom_chat_template *t = calloc(1, sizeof *t);
    if (!t) return loom_fail(LOOM_EOS, "chat template: out of memory");
    char *copy = chat_strndup(&t->pool, src, len);
    parser p = {.pool = &t->pool, .src = copy};
    int ok = copy && lex(&p, copy, len) && parse_body(&p, &t->top, NULL, NULL);
    free(p.segs);
    if (!ok) {
        loom_status st = loom_fail(LOOM_EDATA, "%s", p.err[0] ? p.err : "chat template: out of memory");
        loom_chat_template_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

void loom_chat_template_free(loom_chat_template *t) {
    if (!t) return;
    chat_pool_free(&t->pool);
    free(t);
}

/* ---- tokenizer_config.json ------------------------------------------------------------ */

static char *token_string(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

loom_status loom_chat_config_load(const char *dir, char **template_src, char **bos, char **eos) {
    *template_src = *bos = *eos = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return LOOM_OK;
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 65536 > cap) {
            char *nb = realloc(buf, cap = len + 65536 + cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return loom_fail(LOOM_EOS, "%s: out of memory", path);
            }
            buf = nb;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    cJSON *o = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return loom_fail(LOOM_EDATA, "%s: not a JSON object", path);
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(o, "chat_template");
    if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": ...}, ...] */
        const cJSON *pick = NULL;
        for (const cJSON *e = ct->child; e; e = e->next) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default")) pick = e;
        }
        ct = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (cJSON_IsString(ct)) *template_src = strdup(ct->valuestring);
    *bos = token_string(o, "bos_token");
    *eos = token_string(o, "eos_token");
    cJSON_Delete(o);
    return LOOM_OK;
}
