/* recompute.c - the --recompute flag (loom_gpt_opts.recompute, model.h). */
#include <string.h>

#include "loom/model.h"
#include "train/internal.h"

loom_status loom_recompute_parse(const char *name, int *mode) {
    static const struct { const char *name; int mode; } modes[] = {
        {"none", LOOM_RECOMPUTE_NONE}, {"selective", LOOM_RECOMPUTE_SELECTIVE}, {"full", LOOM_RECOMPUTE_FULL}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(name, modes[i].name)) {
            *mode = modes[i].mode;
            return LOOM_OK;
        }
    *mode = LOOM_RECOMPUTE_NONE;
    return loom_fail(LOOM_EUSAGE, "--recompute %s: expected none, selective or full", name);
}
