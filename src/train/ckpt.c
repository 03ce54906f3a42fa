/* ckpt.c - sharded, atomically published checkpoints and resume under any
 * layout (every mesh axis; docs/checkpoints.md). A checkpoint is
 * DIR/step_N/: one rank_R.safetensors per rank with what that rank is the
 * one holder of, as 1-D shards of global element runs (ckpt_shards.c), and
 * manifest.json naming every tensor, file (with its SHA-256) and shard,
 * published by renames (ckpt_save.c); resume reads it under any layout and
 * export consolidates it (ckpt_load.c). This file: the files (atomic text
 * writes, fsync, the step_N directories), resolving --resume to a complete
 * checkpoint whose hashes verify (local), and the save every --save-every
 * steps or after SIGTERM/SIGINT (loom_ckpt_after_step, collective over the
 * world).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/log.h"
#include "loom/sha256.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_manifest.h"

/* ---- files ---------------------------------------------------------------- */

loom_status ckpt_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return loom_fail(LOOM_EIO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return loom_fail(LOOM_EIO, "%s: fsync failed: %s", path, strerror(err));
    return LOOM_OK;
}

loom_status ckpt_write_text(const char *path, const char *text) {
    char tmp[CKPT_PATH];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return loom_fail(LOOM_ECANTCREAT, "%s: cannot create: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int err = errno;
    if (fclose(f) != 0) bad = 1;
    if (bad) {
        remove(tmp);
        return loom_fail(LOOM_EIO, "%s: write failed: %s", tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        remove(tmp);
        return loom_fail(LOOM_ECANTCREAT, "cannot rename %s to %s: %s", tmp, path, strerror(err));
    }
    return LOOM_OK;
}

void ckpt_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[CKPT_PATH];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(dir);
}

/* step_N directory names in DIR (published ones only), newest first. */
int ckpt_list_steps(const char *dir, int *steps, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int st, len = 0;
        if (sscanf(e->d_name, "step_%d%n", &st, &len) == 1 && e->d_name[len] == '\0' && st >= 0 && n < cap)
            steps[n++] = st;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

/* ---- resolve and verify --------------------------------------------------- */

static loom_status read_text(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return loom_fail(LOOM_EOS, "out of memory reading %s", path);
    if (bad) {
        free(buf);
        return loom_fail(LOOM_EIO, "%s: read failed", path);
    }
    buf[n] = '\0';
    *out = buf;
    return LOOM_OK;
}

/* The manifest of checkpoint `dir`, validated (ckpt_manifest.c), not its files. */
loom_status ckpt_manifest_open(const char *dir, cJSON **out) {
    char path[CKPT_PATH];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text;
    LOOM_TRY(read_text(path, &text));
    loom_status st = ckpt_manifest_parse(text, path, out);
    free(text);
    return st;
}

static loom_status verify_files(const char *dir, const cJSON *man) {
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(man, "files")) {
        char path[CKPT_PATH], hex[65];
        snprintf(path, sizeof path, "%s/%s", dir, jstr(f, "file"));
        LOOM_TRY(loom_sha256_file(path, hex));
        if (strcmp(hex, jstr(f, "sha256")) != 0)
            return loom_fail(LOOM_EDATA, "%s: SHA-256 %s does not match the manifest's %s", path, hex,
                             jstr(f, "sha256"));
    }
    return LOOM_OK;
}

static loom_status check_dir(const char *dir) {
    cJSON *man;
    LOOM_TRY(ckpt_manifest_open(dir, &man));
    loom_status st = verify_files(dir, man);
    cJSON_Delete(man);
    return st;
}

loom_status loom_ckpt_resolve(const char *arg, char *out, size_t cap) {
    char path[CKPT_DIR];
    snprintf(path, sizeof path, "%s/manifest.json", arg);
    if (access(path, F_OK) == 0) { /* a step directory named directly */
        LOOM_TRY(check_dir(arg));
        snprintf(out, cap, "%s", arg);
        return LOOM_OK;
    }
    char *latest = NULL;
    snprintf(path, sizeof path, "%s/latest", arg);
    if (read_text(path, &latest) == LOOM_OK) {
        latest[strcspn(latest, "\r\n")] = '\0';
        snprintf(path, sizeof path, "%s/%s", arg, latest);
        int plain = strchr(latest, '/') == NULL;
        free(latest);
        if (plain && check_dir(path) == LOOM_OK) {
            snprintf(out, cap, "%s", path);
            return LOOM_OK;
        }
        loom_warn("%s: %s is not a complete checkpoint (%s); trying older ones", arg, path, loom_errmsg());
    }
    int steps[4096];
    int n = ckpt_list_steps(arg, steps, 4096);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/step_%d", arg, steps[i]);
        if (check_dir(path) == LOOM_OK) {
            snprintf(out, cap, "%s", path);
            return LOOM_OK;
        }
        loom_warn("%s: skipping %s: %s", arg, path, loom_errmsg());
    }
    return loom_fail(LOOM_ENOINPUT,
                     "%s: no complete checkpoint (a step_N directory with a "
                     "manifest whose files match their SHA-256)",
                     arg);
}

/* ---- signals ---------------------------------------------------------------- */

static volatile sig_atomic_t caught_signal;
static struct sigaction old_term, old_int;

static void on_signal(int sig) { caught_signal = sig; }

void loom_ckpt_signals(int on) {
    if (on) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESTART; /* system calls inside MPI and I/O carry on */
        sigemptyset(&sa.sa_mask);
        caught_signal = 0;
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
    } else {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
}

loom_status loom_ckpt_after_step(loom_train_run_state *s, int step) {
    const loom_train_config *c = s->cfg;
    if (!c->save_dir[0]) return LOOM_OK;
    int32_t sig = caught_signal;
    LOOM_TRY(loom_comm_allreduce(s->mesh->world, &sig, 1, LOOM_I32, LOOM_MAX));
    const int last = step + 1 == c->steps; /* the end-of-run save follows */
    if (!sig && (last || c->save_every <= 0 || (step + 1) % c->save_every != 0)) return LOOM_OK;
    loom_status st = loom_ckpt_save(s, step + 1);
    s->failed_together = 1; /* agreed inside the save, or the signal below */
    if (st != LOOM_OK) return st;
    if (sig) {
        st = loom_fail(LOOM_EINTERRUPTED,
                       "stopped by signal %d after step %d; checkpoint %s/step_%d "
                       "saved: continue with --resume %s",
                       (int)sig, step + 1, c->save_dir, step + 1, c->save_dir);
        if (s->mesh->rank != 0) loom_clear_error(); /* rank 0 reports */
        return st;
    }
    s->failed_together = 0;
    return LOOM_OK;
}
