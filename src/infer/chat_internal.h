/* chat_internal.h - between the two halves of the chat-template engine
 * (include/loom/chat_template.h): the syntax tree chat_template.c parses
 * and chat_render.c evaluates, and the values of a rendering. Not public. */
#ifndef LOOM_CHAT_INTERNAL_H
#define LOOM_CHAT_INTERNAL_H

#include <stddef.h>

#include "loom/chat_template.h"

/* Every allocation of a template (or of one rendering) is kept here and
 * freed at once. */
typedef struct chat_pool {
    void **p;
    size_t n, cap;
} chat_pool;
void *chat_alloc(chat_pool *pl, size_t bytes); /* zeroed; NULL when out of memory */
char *chat_strndup(chat_pool *pl, const char *s, size_t n);
void chat_pool_free(chat_pool *pl);

/* ---- values ------------------------------------------------------------------ */

typedef enum vkind { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC } vkind;
typedef enum vfunc { F_RAISE, F_NAMESPACE, F_RANGE } vfunc;

struct vlist;
struct vdict;
typedef struct value {
    vkind k;
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *s;
            size_t n;
        } str;
        struct vlist *list;
        struct vdict *dict;
        vfunc fn;
    } u;
} value;

typedef struct vlist {
    value *v;
    int n, cap;
} vlist;

typedef struct vdict {
    const char **keys;
    value *vals;
    int n, cap;
} vdict;

/* ---- the tree ----------------------------------------------------------------- */

typedef enum ekind {
    E_LIT,
    E_NAME,
    E_ATTR,   /* a.name */
    E_INDEX,  /* a[b] */
    E_SLICE,  /* a[b:c] (b, c may be NULL) */
    E_CALL,   /* a(args) */
    E_FILTER, /* a | name(args) */
    E_TEST,   /* a is [not] name(args); op: negated */
    E_UNARY,  /* op a: '-', '+', 'n' (not) */
    E_BINARY, /* a op b */
    E_COND,   /* a if b else c */
    E_LIST,
    E_DICT /* args: key, value, key, value... */
} ekind;

/* binary operators: the characters, or these for the two-character ones */
enum { OP_EQ = 256, OP_NE, OP_LE, OP_GE, OP_FLOORDIV, OP_POW, OP_AND, OP_OR, OP_IN, OP_NOTIN };

typedef struct expr {
    ekind k;
    int op, line;
    struct expr *a, *b, *c;
    struct expr **args;
    const char **kw; /* (nargs) keyword of each argument, or NULL */
    int nargs;
    const char *name;
    value lit;
} expr;

typedef enum nkind { N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_BREAK, N_CONTINUE } nkind;

struct node;
typedef struct node_list {
    struct node **v;
    int n, cap;
} node_list;

typedef struct node {
    nkind k;
    int line;
    const char *text; /* N_TEXT */
    size_t len;
    expr *e; /* N_OUT, N_SET's value, N_FOR's sequence */
    /* N_IF: branch i runs body[i] when cond[i] (the else branch: cond NULL) */
    expr **cond;
    node_list *branch;
    int n_branch;
    node_list body, else_body; /* N_FOR */
    const char *var, *var2;    /* N_FOR: for var[, var2] in; N_SET: set var[.attr] */
    const char *attr;
    expr *filter; /* N_FOR: for x in xs if filter */
} node;

struct loom_chat_template {
    chat_pool pool;
    node_list top;
};

#endif
