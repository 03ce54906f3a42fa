/* device_check.c - training features that need the backend's memory to be
 * host memory, refused up front on any other backend (--device).
 *
 * Sharded checkpoints (ckpt.c) read and write parameters, ZeRO shards,
 * optimizer state and expert storage in place, element by element; on a
 * backend whose memory the host cannot read (CUDA) they would need host
 * copies first, as params_io.c makes for --save-params / --load-params.
 * Until then --save-dir and --resume are refused there with a message, before
 * anything runs or is written. So is --comm-precision bf16: the groups are
 * MPI groups on host memory, whose wire format packs bf16 with host loops.
 *
 * Several ranks: the groups the mesh makes are MPI groups (comm_mpi.c),
 * which hand tensor pointers to MPI: on device memory that works only with a
 * CUDA-aware MPI. The NCCL and host-staged implementations of loom_comm
 * (src/comm/comm_nccl.c, comm_staged.c) are not chosen by any device yet,
 * so more than one rank is refused unless
 * LOOM_CUDA_AWARE_MPI=1 says the MPI can read device pointers (the CPU
 * emulation of CUDA used by tests/backend/test_model_emu.sh, whose device
 * memory is host memory, is such a case). Local, config and environment
 * only: every rank agrees.
 */
#include <stdlib.h>
#include <string.h>

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
