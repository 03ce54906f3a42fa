/* ckpt.c - sharded, atomically published checkpoints and resume under any
 * layout (every mesh axis; docs/checkpoints.md). A checkpoint is
 * DIR/step_N/: one rank_R.safetensors per rank with what that rank is the
 * one holder of, as 1-D shards of global element runs (ckpt_shards.c), and
 * manifest.json naming every tensor, file (with its SHA-256) and shard and
 * covered by its own SHA-256, published by renames (ckpt_save.c); a
 * directory belongs to one run (ckpt_run.c); resume reads the newest step
 * that verifies under any layout and export consolidates it (ckpt_read.c,
 * ckpt_load.c). This file: SIGTERM/SIGINT, and the save every --save-every
 * steps or after a signal (loom_ckpt_after_step, collective over the world).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/log.h"
#include "train/ckpt_internal.h"

/* ---- signals ---------------------------------------------------------------- */

static volatile sig_atomic_t caught_signal;
static struct sigaction ignore_pipe;

/* Only a flag. Once a stop was asked for, a write to an output the launcher
 * closed (mpirun ending a job closes the ranks' stdout and stderr) fails
 * instead of killing the rank while it saves or leaves. */
static void on_signal(int sig) {
    caught_signal = sig;
    sigaction(SIGPIPE, &ignore_pipe, NULL);
}

void loom_ckpt_signals(void) {
    static int installed;
    if (installed) return; /* a stop asked for before (loom_train_catch_stop_signals) stays */
    ignore_pipe.sa_handler = SIG_IGN;
    sigemptyset(&ignore_pipe.sa_mask);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* system calls inside MPI and I/O carry on */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    installed = 1;
}

void loom_train_catch_stop_signals(int pending) {
    loom_ckpt_signals();
    if (pending) caught_signal = pending;
}

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "?";
}

loom_status loom_ckpt_after_step(loom_train_run_state *s, int step) {
    const loom_train_config *c = s->cfg;
    /* after the last step the end-of-run save follows: a signal now changes nothing */
    if (!c->save_dir[0] || step + 1 == c->steps) return LOOM_OK;
    int32_t sig = caught_signal;
    LOOM_TRY(loom_comm_allreduce(s->mesh->world, &sig, 1, LOOM_I32, LOOM_MAX));
    if (!sig && (c->save_every <= 0 || (step + 1) % c->save_every != 0)) return LOOM_OK;
    loom_status st = loom_ckpt_save(s, step + 1);
    s->failed_together = 1; /* agreed inside the save, or the signal below */
    if (st != LOOM_OK) return st;
    if (sig) {
        st = loom_fail(LOOM_EINTERRUPTED,
                       "stopped by signal %d (%s) after step %d; checkpoint %s/step_%d "
                       "saved: continue with --resume %s",
                       (int)sig, signal_name((int)sig), step + 1, c->save_dir, step + 1, c->save_dir);
        if (s->mesh->rank != 0) loom_clear_error(); /* rank 0 reports */
        return st;
    }
    s->failed_together = 0;
    return LOOM_OK;
}
