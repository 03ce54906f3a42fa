/* device_check.c - training features that need the backend's memory to be
 * host memory, refused up front on any other backend (--device).
 *
 * Sharded checkpoints (ckpt.c) read and write parameters, ZeRO shards,
 * optimizer state and expert storage in place, element by element; on a
 * backend whose memory the host cannot read (CUDA) they would need host
 * copies first, as params_io.c makes for --save-params / --load-params.
 * Until then --save-dir and --resume are refused there with a message, before
 * anything runs or is written. Local, config only: every rank agrees.
 */
#include "loom/backend.h"
#include "train/internal.h"

loom_status loom_train_check_device(const loom_train_config *c) {
    const loom_backend *be = loom_backend_current();
    if (be->host_memory) return LOOM_OK;
    if (c->save_dir[0] || c->resume[0])
        return loom_fail(LOOM_EUSAGE,
                         "--%s with --device %s: sharded checkpoints are not supported on this "
                         "backend yet (they need host memory); use --save-params / --load-params",
                         c->save_dir[0] ? "save-dir" : "resume", be->name);
    return LOOM_OK;
}
