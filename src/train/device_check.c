/* device_check.c - training features that need the backend's memory to be
 * host memory, refused up front on any other backend (--device).
 *
 * Sharded checkpoints (ckpt.c) read and write parameters, ZeRO shards,
 * optimizer state and expert storage in place, element by element; on a
 * backend whose memory the host cannot read (CUDA) they would need host
 * copies first, as params_io.c makes for --save-params / --load-params.
 * Until then --save-dir and --resume are refused there with a message, before
 * anything runs or is written. So is --comm-precision bf16: the data-parallel
 * engine packs each gradient bucket into bf16 with host loops.
 *
 * Several ranks: loom's communicator (comm_mpi.c) hands tensor pointers to
 * MPI, which on device memory works only with a CUDA-aware MPI. The NCCL and
 * host-staged communicators (src/backend/cuda/comm_nccl.c, comm_staged.c)
 * are not wired into it yet, so more than one rank is refused unless
 * LOOM_CUDA_AWARE_MPI=1 says the MPI can read device pointers (the CPU
 * emulation of CUDA used by tests/backend/test_model_emu.sh, whose device
 * memory is host memory, is such a case). Local, config and environment
 * only: every rank agrees.
 */
#include <stdlib.h>
#include <string.h>

#include "loom/device.h"
#include "train/internal.h"

loom_status loom_train_check_device(const loom_train_config *c, const loom_device *dev) {
    const loom_backend *be = dev->be;
    if (dev->bf16 != (strcmp(c->precision, "bf16") == 0))
        return loom_fail(LOOM_EINTERNAL, "--precision %s on a device made for %s GEMMs", c->precision,
                         dev->bf16 ? "bf16" : "fp32");
    if (be->host_memory) return LOOM_OK;
    if (c->save_dir[0] || c->resume[0])
        return loom_fail(LOOM_EUSAGE,
                         "--%s with --device %s: sharded checkpoints are not supported on this "
                         "backend yet (they need host memory); use --save-params / --load-params",
                         c->save_dir[0] ? "save-dir" : "resume", be->name);
    if (strcmp(c->comm_precision, "fp32") != 0)
        return loom_fail(LOOM_EUSAGE,
                         "--comm-precision %s with --device %s: the gradients are converted to bf16 on "
                         "the host (dp.c), and this backend's memory is not host memory; use "
                         "--comm-precision fp32",
                         c->comm_precision, be->name);
    const int ranks = c->layout.dp * c->layout.tp * c->layout.pp * c->layout.cp;
    const char *aware = getenv("LOOM_CUDA_AWARE_MPI");
    if (ranks > 1 && !(aware && strcmp(aware, "1") == 0))
        return loom_fail(LOOM_EUSAGE,
                         "--device %s on %d ranks: loom's communicator passes tensor pointers to MPI, "
                         "and NCCL / host staging are not wired into it yet; run one rank, or set "
                         "LOOM_CUDA_AWARE_MPI=1 if this MPI reads device memory",
                         be->name, ranks);
    return LOOM_OK;
}
