/* chat_tool.c - render chat templates with loom's engine for
 * test_chat_template.py.
 *
 *   chat_tool IN OUT   IN: a JSON list of cases {"template", "messages":
 *                      [{"role", "content", "name"?}], "add_generation_prompt",
 *                      "bos_token", "eos_token"}; OUT gets a JSON list with,
 *                      per case, {"text": ...} or {"error": message}. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/chat_template.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) == (size_t)n) b[n] = '\0';
    fclose(f);
    return b;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: chat_tool IN OUT\n");
        return 2;
    }
    char *in = slurp(argv[1]);
    cJSON *cases = in ? cJSON_Parse(in) : NULL, *out = cJSON_CreateArray();
    if (!cJSON_IsArray(cases)) return 2;
    for (const cJSON *c = cases->child; c; c = c->next) {
        cJSON *r = cJSON_CreateObject();
        const char *src = str(c, "template");
        loom_chat_template *t = NULL;
        if (loom_chat_template_parse(src, strlen(src), &t) != LOOM_OK) {
            cJSON_AddStringToObject(r, "error", loom_errmsg());
            cJSON_AddItemToArray(out, r);
            continue;
        }
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c, "messages");
        int n = cJSON_GetArraySize(ms), i = 0;
        loom_chat_message *m = calloc((size_t)n + 1, sizeof *m);
        for (const cJSON *e = ms->child; e; e = e->next, i++)
            m[i] = (loom_chat_message){str(e, "role"), str(e, "content"), str(e, "name")};
        loom_chat_vars v = {cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")),
                            str(c, "bos_token"), str(c, "eos_token")};
        char *text;
        size_t len;
        if (loom_chat_template_render(t, m, n, &v, &text, &len) == LOOM_OK) {
            cJSON_AddStringToObject(r, "text", text);
            free(text);
        } else {
            cJSON_AddStringToObject(r, "error", loom_errmsg());
        }
        cJSON_AddItemToArray(out, r);
        free(m);
        loom_chat_template_free(t);
    }
    char *js = cJSON_PrintUnformatted(out);
    FILE *f = fopen(argv[2], "wb");
    if (!f || !js) return 2;
    fputs(js, f);
    fclose(f);
    free(js);
    free(in);
    cJSON_Delete(cases);
    cJSON_Delete(out);
    return 0;
}
