/* ckpt_state.c - a model part's state as the checkpoint code walks it
 * (ckpt_internal.h: ckpt_state): the DP engine's parameter runs and AdamW
 * runs, and the expert engine's storage (edp.h), every pointer host memory. On a
 * device whose memory is host memory (the CPU) they are the engines' own
 * buffers, read and written in place; on any other (CUDA) they are host
 * copies, downloaded through the device when the state is opened and, after
 * a load, uploaded when it is closed - what params_io.c does for parameter
 * files. Every mesh axis (it covers what this rank holds); local, not
 * collective.
 */
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "loom/edp.h"
#include "train/ckpt_internal.h"
#include "train/internal.h"

/* Gives back every host copy (after uploading it when `upload`). */
void ckpt_state_close(ckpt_state *st, int upload) {
    loom_device *dev = st->dev;
    for (int r = 0; st->pr && st->pr != st->dev_pr && r < st->nr; r++)
        loom_train_host_view_done(dev, st->dev_pr[r].data, st->pr[r].data, st->dev_pr[r].n, upload);
    for (int r = 0; st->orun && st->dev_or && r < st->no; r++) {
        loom_train_host_view_done(dev, st->dev_or[r].m, st->orun[r].m, st->dev_or[r].n, upload);
        loom_train_host_view_done(dev, st->dev_or[r].v, st->orun[r].v, st->dev_or[r].n, upload);
    }
    for (int k = 0; k < K_COUNT; k++)
        loom_train_host_view_done(dev, st->dev_ea[k], st->ea[k], st->en, upload);
    if (st->pr != st->dev_pr) free(st->pr);
    free(st->orun);
    free(st->dev_or);
    memset(st, 0, sizeof *st);
}

/* The host views of every run and array (NULL entries where one failed). */
static int state_views(ckpt_state *st) {
    loom_device *dev = st->dev;
    int ok = 1;
    for (int r = 0; st->pr != st->dev_pr && r < st->nr; r++) {
        st->pr[r] = st->dev_pr[r];
        st->pr[r].data = loom_train_host_view(dev, st->dev_pr[r].data, st->dev_pr[r].n);
        ok &= st->pr[r].data != NULL;
    }
    for (int r = 0; r < st->no; r++) {
        st->orun[r] = st->dev_or[r];
        st->orun[r].m = loom_train_host_view(dev, st->dev_or[r].m, st->dev_or[r].n);
        st->orun[r].v = loom_train_host_view(dev, st->dev_or[r].v, st->dev_or[r].n);
        ok &= st->orun[r].m && st->orun[r].v;
    }
    for (int k = 0; st->en && k < K_COUNT; k++) {
        st->ea[k] = loom_train_host_view(dev, st->dev_ea[k], st->en);
        ok &= st->ea[k] != NULL;
    }
    return ok;
}

loom_status ckpt_state_open(const loom_train_run_state *s, int part, ckpt_state *st) {
    memset(st, 0, sizeof *st);
    st->dev = s->parts[part]->dev;
    st->dev_pr = loom_dp_param_runs(s->dp, part, &st->nr);
    st->no = loom_dp_opt_runs(s->dp, part, NULL, 0);
    st->en = loom_edp_state(s->edp, part, &st->dev_ea[K_PARAM], &st->dev_ea[K_EXP_AVG],
                            &st->dev_ea[K_EXP_AVG_SQ], &st->elo);
    st->dev_or = calloc((size_t)(st->no ? st->no : 1), sizeof *st->dev_or);
    st->orun = calloc((size_t)(st->no ? st->no : 1), sizeof *st->orun);
    st->pr = st->dev->be->host_memory ? (loom_param_run *)st->dev_pr
                                      : calloc((size_t)(st->nr ? st->nr : 1), sizeof *st->pr);
    if (!st->dev_or || !st->orun || !st->pr) {
        ckpt_state_close(st, 0);
        return loom_fail(LOOM_EOS, "out of memory for the checkpoint's run tables");
    }
    loom_dp_opt_runs(s->dp, part, st->dev_or, st->no);
    if (!state_views(st)) {
        ckpt_state_close(st, 0);
        return loom_fail(LOOM_EOS, "out of memory for host copies of the checkpoint's state (--device %s)",
                         st->dev->be->name);
    }
    return LOOM_OK;
}
