/* version.c - the build's version, commit and compiler (version.h), and the
 * installed data directory found from the library's own location. Local. */
#include "loom/version.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom_build_info.h" /* generated: LOOM_BUILD_VERSION, _COMMIT, _COMPILER, _TYPE */

_Static_assert(LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH >= 0,
               "version.h holds the version");

const char *loom_version(void) { return LOOM_BUILD_VERSION; }
const char *loom_version_commit(void) { return LOOM_BUILD_COMMIT; }
const char *loom_version_compiler(void) { return LOOM_BUILD_COMPILER " (" LOOM_BUILD_TYPE ")"; }

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* <prefix>/share/loom/plan for the file (library or program) holding this
 * code at <prefix>/lib (lib64) or <prefix>/bin; "" when that directory is absent. */
static void installed_plan_dir(char *out, size_t cap) {
    out[0] = '\0';
    Dl_info info;
    char real[PATH_MAX];
    if (!dladdr((void *)installed_plan_dir, &info) || !info.dli_fname || !realpath(info.dli_fname, real))
        return;
    char *slash = strrchr(real, '/');
    if (!slash) return;
    *slash = '\0'; /* <prefix>/lib or <prefix>/bin */
    slash = strrchr(real, '/');
    if (!slash) return;
    *slash = '\0'; /* <prefix> */
    if (snprintf(out, cap, "%s/share/loom/plan", real) >= (int)cap || !is_dir(out)) out[0] = '\0';
}

const char *loom_plan_dir(void) {
    const char *env = getenv("LOOM_PLAN_DIR");
    if (env && *env) return env;
    static char dir[PATH_MAX + 32];
    static int found;
    if (!found) {
        installed_plan_dir(dir, sizeof dir);
        found = 1;
    }
    return dir[0] ? dir : LOOM_PLAN_SOURCE_DIR;
}
