/* version.h - what this build of loom is, and where its installed data lives.
 *
 * The version, the git commit and the compiler are fixed when the library is
 * built (cmake/LoomBuildInfo.cmake). The data loom reads at run time (the
 * cluster presets of `loom plan`) is found next to the library that holds
 * this code: <prefix>/lib/libloom.so or <prefix>/bin/loom -> <prefix>/share/loom;
 * a build tree that was never installed uses its source tree's copy. Local;
 * nothing here needs MPI.
 */
#ifndef LOOM_VERSION_H
#define LOOM_VERSION_H

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

const char *loom_version(void); /* "0.1.0" */
const char *
loom_version_commit(void); /* 12 hex digits, "+dirty" when built from a changed tree, or "unknown" */
const char *loom_version_compiler(void); /* "GNU 12.2.0 (Release)" */

/* The directory of the cluster presets (`loom plan --cluster NAME` reads
 * DIR/clusters/NAME.json): $LOOM_PLAN_DIR when set, else the installed
 * <prefix>/share/loom/plan when it exists, else the source tree's plan/. */
const char *loom_plan_dir(void);

#endif
