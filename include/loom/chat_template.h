/* chat_template.h - a model's chat template: the Jinja template of a
 * Hugging Face tokenizer_config.json ("chat_template") that turns a list of
 * messages into the prompt text, rendered as `transformers`'
 * apply_chat_template does (Jinja with trim_blocks and lstrip_blocks, the
 * variables messages, add_generation_prompt, bos_token, eos_token and the
 * function raise_exception).
 *
 * loom implements the part of Jinja chat templates use, in C
 * (src/infer/chat_template.c parses, chat_render.c renders): text, {{ }},
 * {% if / elif / else %}, {% for x in xs [if cond] %} with loop.index,
 * index0, first, last, length, revindex, {% set %} (and namespace()
 * attributes), {% break %} / {% continue %}, comments and whitespace
 * control ({%- -%}); expressions with literals, lists, dicts, attribute and
 * item access, slices, + - * / // % ~, comparisons, in, and / or / not,
 * `x if c else y`, the tests defined, undefined, none, string, number,
 * iterable, mapping, sequence, boolean, even, odd, the filters trim,
 * length, count, upper, lower, title, capitalize, first, last, join,
 * default, string, int, list, tojson, replace, safe, items, and the string
 * and dict methods strip, lstrip, rstrip, upper, lower, title, startswith,
 * endswith, split, replace, items, keys, values, get. A template using
 * anything else fails to parse (or to render) with a message naming it.
 *
 * When a tokenizer has no template, loom uses LOOM_CHAT_TEMPLATE_CHATML:
 * the ChatML template `transformers` used as its default before 4.43.
 */
#ifndef LOOM_CHAT_TEMPLATE_H
#define LOOM_CHAT_TEMPLATE_H

#include <stddef.h>

#include "loom/status.h"

typedef struct loom_chat_template loom_chat_template;

typedef struct loom_chat_message {
    const char *role;
    const char *content; /* NULL: none */
    const char *name;    /* NULL: absent */
} loom_chat_message;

typedef struct loom_chat_vars {
    int add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: undefined */
} loom_chat_vars;

extern const char *const LOOM_CHAT_TEMPLATE_CHATML;

/* Compile src[0..len). LOOM_EDATA naming the line and what is wrong. */
loom_status loom_chat_template_parse(const char *src, size_t len, loom_chat_template **out);
void loom_chat_template_free(loom_chat_template *t);

/* Render the n messages into a malloc'd NUL-terminated string (*out,
 * *len). LOOM_EUSAGE with the template's raise_exception message, or naming
 * what failed (an undefined function, a type error, output over 16 MiB).
 * Thread-safe: a compiled template is read-only. */
loom_status loom_chat_template_render(const loom_chat_template *t, const loom_chat_message *m, int n,
                                      const loom_chat_vars *v, char **out, size_t *len);

/* From a Hugging Face tokenizer directory's tokenizer_config.json: the
 * chat_template (a string, or the entry named "default" of a list), and the
 * bos_token / eos_token (strings or {"content": ...}); each malloc'd, NULL
 * when absent (also when the file is). LOOM_EDATA for malformed JSON. */
loom_status loom_chat_config_load(const char *dir, char **template_src, char **bos, char **eos);

#endif
